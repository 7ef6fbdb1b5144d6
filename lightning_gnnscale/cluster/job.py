"""One ``train.py`` job over emulated hosts, through the ordinary multi-node launch path.

Each host runs ``python train.py <overrides> trainer.num_nodes=<hosts>`` with ``NODE_RANK``,
``MASTER_ADDR`` (host 0's address), ``MASTER_PORT`` and ``GLOO_SOCKET_IFNAME=eth0`` set, exactly
as a user sets them on a real cluster (docs/quickstart.md, "Several machines"); each launcher
then starts its ``trainer.devices`` local ranks. Every host writes its own folder
``<run dir>/host<i>`` (a real cluster's nodes write their own disks); node 0's ``summary.json``
is copied to ``<run dir>/summary.json`` and the cluster's settings to ``cluster.json``.

With ``-m`` the hosts run a Hydra multirun: each host's launcher imports once and runs the
sweep's jobs in order, job k in ``<run dir>/host<i>/<k>`` (its ranks meet at ``MASTER_PORT`` + k,
:func:`lightning_gnnscale.run.sweep_rendezvous`). A host stops at its first failed job.

When a host fails, the others are stopped at once (they would wait for it until the collective
time-out); the whole job has a time-out; and the cluster is removed on every way out.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ..errors import ConfigError
from ..files import write_json_atomic
from ..launch import signals_raise
from ..store_secret import SECRET_ENV, SECRET_FILE_ENV, new_secret
from ..warm_client import DISABLE_ENV
from .memory import check_cap
from .network import (
    INTERFACE,
    ClusterLeftovers,
    EmulatedCluster,
    check_prefix_free,
    default_prefix,
    preflight,
)

TRAIN_PY = Path(__file__).resolve().parents[2] / "train.py"
MASTER_PORT = 29500  # each host has its own port space: concurrent clusters never collide
STOP_GRACE_S = 10.0
_FORBIDDEN = (  # set by the cluster: the world, each host's folders, how the hosts sweep
    "trainer.num_nodes",
    "paths.output_dir",
    "hydra.mode",
    "hydra.sweep.subdir",
    "hydra.sweeper",
    "hydra.launcher",
    "hydra/sweeper",
    "hydra/launcher",
)
_RUN_DIR = ("hydra.run.dir", "hydra.sweep.dir")
_LAUNCH_ENV = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID")


def host_cpus(hosts: int, cpus: list[int] | None = None) -> list[list[int]]:
    """The cores each emulated host runs on: ``cpus`` (default: the cores this process may use)
    in ``hosts`` disjoint equal shares, the first cores to host 0, as separate machines have
    cores of their own; the remainder stays with this process. With fewer cores than hosts,
    host ``i`` gets core ``i mod cores``: hosts then share cores, as no real cluster does."""
    if hosts < 1:
        raise ValueError(f"hosts must be >= 1, got {hosts}")
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if not cpus:
        raise ValueError("no cores to share between the hosts")
    if len(cpus) < hosts:
        return [[cpus[host % len(cpus)]] for host in range(hosts)]
    share = len(cpus) // hosts
    return [cpus[host * share : (host + 1) * share] for host in range(hosts)]


def warn_if_shared(cores: list[list[int]]) -> bool:
    """Whether hosts share cores (:func:`host_cpus` with fewer cores than hosts); if so, say
    on stderr that the times are not those of separate machines."""
    distinct = {core for share in cores for core in share}
    shared = len(distinct) < sum(map(len, cores))
    if shared:
        print(
            f"warning: {len(cores)} emulated hosts share {len(distinct)} core(s) "
            f"(host cores {cores}): hosts compete for cores, so times are not those of "
            "separate machines",
            file=sys.stderr,
        )
    return shared


def host_threads(cores: list[list[int]], ranks_per_host: int) -> list[int]:
    """Torch threads of each host's ranks: ``$GNNSCALE_NUM_THREADS`` when set, else the
    host's cores shared by its ranks (at least 1). Not capped by the machine's load, which
    the other hosts' ranks raise on cores that are not this host's."""
    from ..run import THREADS_ENV, rank_threads

    if os.environ.get(THREADS_ENV):  # the user's, checked as the ranks will
        return [rank_threads(ranks_per_host)] * len(cores)
    return [max(1, len(share) // ranks_per_host) for share in cores]


class ClusterJobFailed(RuntimeError):
    """A job failed: the message names every host whose launcher failed, with its log's tail."""


@dataclass
class ClusterJob:
    """``train.py overrides`` on ``hosts`` emulated hosts linked at ``rate_mbit`` (None: unshaped);
    a Hydra multirun with ``multirun=True`` or ``-m`` among the overrides."""

    hosts: int
    rate_mbit: float | None
    overrides: list[str] = field(default_factory=list)
    run_dir: Path | None = None  # None: hydra.run.dir from the overrides, else outputs/cluster/...
    timeout_s: float = 3600.0
    prefix: str = field(default_factory=default_prefix)
    echo: bool = True  # stream host 0's output to this process's stdout
    multirun: bool = False
    memory_mb: int | None = None  # each host's memory cap (a cgroup); None: no cap
    store_secret: str = field(default_factory=new_secret, repr=False)  # one per job, every host

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.memory_mb is not None:
            check_cap(self.memory_mb)
        overrides = []
        for item in self.overrides:
            key = item.split("=", 1)[0].lstrip("+~")
            if item in ("-m", "--multirun"):
                self.multirun = True
            elif key.startswith(_FORBIDDEN):
                raise ConfigError(
                    f"{item!r}: the cluster sets trainer.num_nodes, each host's folders and "
                    f"how the hosts sweep itself; give the run folder as hydra.run.dir=... "
                    f"or --run-dir"
                )
            elif key in _RUN_DIR:
                self.run_dir = Path(item.split("=", 1)[1])
            else:
                overrides.append(item)
        self.overrides = overrides
        if self.run_dir is None:
            stamp = datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
            self.run_dir = Path("outputs/cluster") / f"{stamp}_{self.prefix}"
        self.run_dir = Path(self.run_dir)

    def host_dir(self, host: int) -> Path:
        """Host ``host``'s Hydra folder (of a multirun: its sweep folder)."""
        return self.run_dir / f"host{host}"

    def output_dir(self, host: int, num: int = 0) -> Path:
        """Host ``host``'s folder of job ``num``: jobs are numbered from 0 in sweep order, and
        a run that is not a multirun is job 0."""
        if self.multirun:
            return self.host_dir(host) / str(num)
        if num != 0:
            raise ValueError(f"job {num}: a run that is not a multirun has job 0 only")
        return self.host_dir(host)

    def host_argv(self, host: int) -> list[str]:
        if self.multirun:  # a host stops at its first failed job (batches of one job)
            folders = [
                f"hydra.sweep.dir={self.host_dir(host)}",
                "hydra.sweep.subdir=${hydra.job.num}",
                "hydra.sweeper.max_batch_size=1",
            ]
        else:
            folders = [f"hydra.run.dir={self.host_dir(host)}"]
        return [
            sys.executable,
            str(TRAIN_PY),
            *(["-m"] if self.multirun else []),
            *self.overrides,
            f"trainer.num_nodes={self.hosts}",
            *folders,
        ]

    def host_env(self, cluster: EmulatedCluster, host: int, threads: int) -> dict[str, str]:
        """Host ``host``'s launcher environment; its ranks run ``threads`` torch threads."""
        from ..run import THREADS_ENV

        env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
        env.update(
            NODE_RANK=str(host),
            MASTER_ADDR=cluster.address(0),
            MASTER_PORT=str(MASTER_PORT),
            GLOO_SOCKET_IFNAME=INTERFACE,
            PYTHONUNBUFFERED="1",
        )
        env[THREADS_ENV] = str(threads)
        env.pop(SECRET_FILE_ENV, None)
        env[SECRET_ENV] = self.store_secret  # the hosts' launchers share it (store_secret.py)
        env[DISABLE_ENV] = "0"  # a host's run stays in its host: never handed to a warm server
        return env


def check_overrides(job: ClusterJob) -> tuple[list[list[str]], int]:
    """Each job's overrides (one job unless a multirun), its run config composed and validated
    as the hosts will, so a bad setting fails before anything is created (as ``train.py``
    itself does before spawning ranks); and the ranks per host (``trainer.devices``; of a
    multirun, its jobs' largest)."""
    from hydra import compose, initialize_config_dir

    from ..preflight import validate

    cluster = [f"trainer.num_nodes={job.hosts}", f"paths.root={Path.cwd()}"]
    launch_env = {
        "MASTER_ADDR": "198.18.0.1",
        "MASTER_PORT": str(MASTER_PORT),
        "NODE_RANK": "0",
        SECRET_ENV: job.store_secret,
        SECRET_FILE_ENV: None,
    }
    saved = {k: os.environ.get(k) for k in launch_env}
    for key, value in launch_env.items():  # what each host's launcher will see
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        with initialize_config_dir(config_dir=str(TRAIN_PY.parent / "conf"), version_base="1.3"):
            jobs = _sweep(job.overrides) if job.multirun else [job.overrides]
            ranks = 1
            for num, overrides in enumerate(jobs):
                output_dir = f"paths.output_dir={job.output_dir(0, num)}"
                run = validate(compose("config", overrides=[*overrides, *cluster, output_dir]))
                ranks = max(ranks, run.trainer.devices)
    except ConfigError:
        raise
    except Exception as err:  # Hydra's override and composition errors
        raise ConfigError(f"bad train.py overrides {job.overrides}: {err}") from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return jobs, ranks


def _sweep(overrides: list[str]) -> list[list[str]]:
    """The jobs of ``-m overrides`` in the order Hydra's basic sweeper runs them (the cartesian
    product of the swept values, first override outermost); each job's overrides."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    loader = GlobalHydra.instance().config_loader()  # for sweeps over a config group's options
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(overrides)
    fixed = [o.input_line for o in parsed if o.is_hydra_override()]
    choices: dict[str, list[str]] = {}  # by key: a key given twice keeps its last value
    for override in parsed:
        if override.is_hydra_override():
            continue
        key = override.get_key_element()
        if override.is_sweep_override():
            choices[key] = [f"{key}={v}" for v in override.sweep_string_iterator()]
        else:
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
    return [[*fixed, *job] for job in itertools.product(*choices.values())]


class StopRequested(RuntimeError):
    """SIGTERM or SIGHUP reached the cluster runner; the hosts are being removed."""


def _copy_output(pipe, log_path: Path, echo: bool) -> None:
    with open(log_path, "w") as log:
        for line in pipe:
            log.write(line)
            log.flush()
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()


def _stop(processes: list[subprocess.Popen]) -> None:
    """SIGTERM each launcher's session (its ranks follow), then SIGKILL what is left."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=STOP_GRACE_S)


def _tail(path: Path, lines: int = 40) -> str:
    with contextlib.suppress(OSError):
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    return ""


def run_job(job: ClusterJob, *, on_started=None) -> list[dict]:
    """Run ``job``; return node 0's ``summary.json`` of each job, in job order (one for a run
    that is not a multirun, also copied to ``<run dir>/summary.json``).

    ``on_started(cluster, processes)``, if given, is called once every host's launcher runs
    (tests use it to kill a rank). Raises :class:`ClusterJobFailed` when a host fails (in a
    multirun: at a host's first failed job), ``TimeoutError`` past ``job.timeout_s`` (all jobs
    together); the cluster is removed in every case.
    """
    preflight(job.rate_mbit, memory_cap=job.memory_mb is not None)
    check_prefix_free(job.prefix)  # before the run folder: a refused job creates nothing
    jobs, ranks_per_host = check_overrides(job)
    cores = host_cpus(job.hosts)
    threads = host_threads(cores, ranks_per_host)
    shared = warn_if_shared(cores)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    cluster = EmulatedCluster(job.hosts, job.rate_mbit, prefix=job.prefix, memory_mb=job.memory_mb)
    processes: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    started = time.monotonic()
    left_behind = None
    try:
        with signals_raise(StopRequested), cluster:
            try:
                for host in range(job.hosts):
                    _start_host(job, cluster, host, cores[host], threads[host], processes, readers)
                if on_started is not None:
                    on_started(cluster, processes)
                _wait(job, processes, started, cluster)
            finally:
                _stop(processes)
                for reader in readers:
                    reader.join(timeout=STOP_GRACE_S)
            usage = [cluster.memory_usage(host) for host in range(job.hosts)]  # before removal
    except ClusterLeftovers as err:  # the job succeeded: keep its results, then say so
        left_behind = err
    hosts = {"host_cpus": cores, "shared_cores": shared, "host_threads": threads}
    wall_s = time.monotonic() - started
    summaries = _collect(job, jobs, cluster, hosts, usage, wall_s, left_behind)
    if left_behind is not None:
        raise left_behind
    return summaries


def _start_host(
    job: ClusterJob,
    cluster: EmulatedCluster,
    host: int,
    cores: list[int],
    threads: int,
    processes: list[subprocess.Popen],
    readers: list[threading.Thread],
) -> None:
    """Start host ``host``'s launcher on its ``cores`` (its ranks run ``threads`` threads),
    its output copied to ``host<i>.log``; appends to ``processes`` and ``readers``."""
    job.host_dir(host).mkdir(parents=True, exist_ok=True)
    process = cluster.popen(
        host,
        ["taskset", "--cpu-list", ",".join(map(str, cores)), *job.host_argv(host)],
        env=job.host_env(cluster, host, threads),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
    )
    processes.append(process)
    log = job.run_dir / f"host{host}.log"
    reader = threading.Thread(
        target=_copy_output, args=(process.stdout, log, job.echo and host == 0), daemon=True
    )
    reader.start()
    readers.append(reader)


def _wait(
    job: ClusterJob, processes: list[subprocess.Popen], started: float, cluster: EmulatedCluster
) -> None:
    while True:
        codes = [p.poll() for p in processes]
        if any(code not in (None, 0) for code in codes):
            _fail(job, processes, cluster)
        if all(code == 0 for code in codes):
            return
        if time.monotonic() - started > job.timeout_s:
            raise TimeoutError(f"the cluster job did not finish within {job.timeout_s:g} s")
        time.sleep(0.2)


def _fail(job: ClusterJob, processes: list[subprocess.Popen], cluster: EmulatedCluster) -> None:
    """Raise :class:`ClusterJobFailed` naming every host that failed. A failure on one host
    fails the others within moments (their peers' connections reset), and which launcher exits
    first is a race, not the cause: the other hosts get :data:`STOP_GRACE_S` to exit, and each
    failed host is named with its log's tail."""
    deadline = time.monotonic() + STOP_GRACE_S
    while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.2)  # let the readers drain the last lines
    failed = [(h, p.returncode) for h, p in enumerate(processes) if p.poll() not in (None, 0)]
    usage = [cluster.memory_usage(host) for host in range(job.hosts)]
    raise ClusterJobFailed(
        "; ".join(f"host {host} failed (exit code {code})" for host, code in failed)
        + "".join(
            f"\nhost {host}: {u['oom_kills']} process(es) killed by the kernel's OOM killer at "
            f"the host's memory cap of {u['limit_mb']} MiB (--memory-mb)"
            for host, u in enumerate(usage)
            if u and u["oom_kills"]
        )
        + "".join(
            f"\nhost {host}'s log: {job.run_dir / f'host{host}.log'}\n"
            + _tail(job.run_dir / f"host{host}.log")
            for host, _ in failed
        )
    )


def _collect(
    job: ClusterJob,
    jobs: list[list[str]],
    cluster: EmulatedCluster,
    hosts: dict,
    usage: list[dict | None],
    wall_s: float,
    left_behind: Exception | None,
) -> list[dict]:
    sources = [job.output_dir(0, num) / "summary.json" for num in range(len(jobs))]
    for source in sources:
        if not source.exists():
            raise ClusterJobFailed(f"node 0 finished without writing {source}")
    if not job.multirun:
        shutil.copyfile(sources[0], job.run_dir / "summary.json")
    write_json_atomic(
        job.run_dir / "cluster.json",
        {
            "hosts": job.hosts,
            "rate_mbit": job.rate_mbit,
            "shaping": "tbf on each host's egress" if job.rate_mbit else "none",
            "interface": INTERFACE,
            "addresses": [cluster.address(h) for h in range(job.hosts)],
            "master": f"{cluster.address(0)}:{MASTER_PORT}",
            "prefix": job.prefix,
            "host_dirs": [str(job.host_dir(h)) for h in range(job.hosts)],
            **hosts,  # each host's cores, whether hosts share them, its ranks' threads
            "host_memory": usage,  # per host: cap, peak charge (RSS + page cache), OOM kills
            "overrides": job.overrides,
            "multirun": job.multirun,
            "jobs": [
                {"overrides": overrides, "summary": str(source)}
                for overrides, source in zip(jobs, sources)
            ],
            "wall_s": wall_s,
            "leftovers": None if left_behind is None else str(left_behind),
        },
    )
    return [json.loads(source.read_text()) for source in sources]
