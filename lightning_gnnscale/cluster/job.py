"""One ``train.py`` job over emulated hosts, through the ordinary multi-node launch path.

Each host runs ``python train.py <overrides> trainer.num_nodes=<hosts>`` with ``NODE_RANK``,
``MASTER_ADDR`` (host 0's address), ``MASTER_PORT`` and ``GLOO_SOCKET_IFNAME=eth0`` set, exactly
as a user sets them on a real cluster (docs/quickstart.md, "Several machines"); each launcher
then starts its ``trainer.devices`` local ranks. Every host writes its own folder
``<run dir>/host<i>`` (a real cluster's nodes write their own disks); node 0's ``summary.json``
is copied to ``<run dir>/summary.json`` and the cluster's settings to ``cluster.json``.

When a host fails, the others are stopped at once (they would wait for it until the collective
time-out); the whole job has a time-out; and the cluster is removed on every way out.
"""

from __future__ import annotations

import contextlib
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
from .network import INTERFACE, EmulatedCluster, default_prefix, preflight

TRAIN_PY = Path(__file__).resolve().parents[2] / "train.py"
MASTER_PORT = 29500  # each host has its own port space: concurrent clusters never collide
STOP_GRACE_S = 10.0
_FORBIDDEN = ("trainer.num_nodes", "hydra.sweep", "paths.output_dir")
_LAUNCH_ENV = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID")


class ClusterJobFailed(RuntimeError):
    """A host's launcher failed; the message names it and ends with its log's tail."""


@dataclass
class ClusterJob:
    """``train.py overrides`` on ``hosts`` emulated hosts linked at ``rate_mbit`` (None: unshaped)."""

    hosts: int
    rate_mbit: float | None
    overrides: list[str] = field(default_factory=list)
    run_dir: Path | None = None  # None: hydra.run.dir from the overrides, else outputs/cluster/...
    timeout_s: float = 3600.0
    prefix: str = field(default_factory=default_prefix)
    echo: bool = True  # stream host 0's output to this process's stdout

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        overrides = []
        for item in self.overrides:
            key = item.split("=", 1)[0].lstrip("+~")
            if item in ("-m", "--multirun") or key.startswith(_FORBIDDEN):
                raise ConfigError(
                    f"{item!r}: the cluster sets trainer.num_nodes and each host's folder "
                    f"itself, and runs one job (no multirun); give the run folder as "
                    f"hydra.run.dir=... or --run-dir"
                )
            if key == "hydra.run.dir":
                self.run_dir = Path(item.split("=", 1)[1])
            else:
                overrides.append(item)
        self.overrides = overrides
        if self.run_dir is None:
            stamp = datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
            self.run_dir = Path("outputs/cluster") / f"{stamp}_{self.prefix}"
        self.run_dir = Path(self.run_dir)

    def host_dir(self, host: int) -> Path:
        return self.run_dir / f"host{host}"

    def host_argv(self, host: int) -> list[str]:
        return [
            sys.executable,
            str(TRAIN_PY),
            *self.overrides,
            f"trainer.num_nodes={self.hosts}",
            f"hydra.run.dir={self.host_dir(host)}",
        ]

    def host_env(self, cluster: EmulatedCluster, host: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
        env.update(
            NODE_RANK=str(host),
            MASTER_ADDR=cluster.address(0),
            MASTER_PORT=str(MASTER_PORT),
            GLOO_SOCKET_IFNAME=INTERFACE,
            PYTHONUNBUFFERED="1",
        )
        return env


def check_overrides(job: ClusterJob) -> None:
    """Compose and validate the run config the hosts will compose, so a bad setting fails
    before anything is created (as ``train.py`` itself does before spawning ranks)."""
    from hydra import compose, initialize_config_dir

    from ..config import validate

    overrides = [
        *job.overrides,
        f"trainer.num_nodes={job.hosts}",
        f"paths.root={Path.cwd()}",
        f"paths.output_dir={job.host_dir(0)}",
    ]
    launch_env = {"MASTER_ADDR": "198.18.0.1", "MASTER_PORT": str(MASTER_PORT), "NODE_RANK": "0"}
    saved = {k: os.environ.get(k) for k in launch_env}
    os.environ.update(launch_env)  # what each host's launcher will see
    try:
        with initialize_config_dir(config_dir=str(TRAIN_PY.parent / "conf"), version_base="1.3"):
            validate(compose("config", overrides=overrides))
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


def run_job(job: ClusterJob, *, on_started=None) -> dict:
    """Run ``job``; return node 0's ``summary.json`` (also copied to ``<run dir>``).

    ``on_started(cluster, processes)``, if given, is called once every host's launcher runs
    (tests use it to kill a rank). Raises :class:`ClusterJobFailed` when a host fails,
    ``TimeoutError`` past ``job.timeout_s``; the cluster is removed in every case.
    """
    preflight(job.rate_mbit)
    check_overrides(job)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    cluster = EmulatedCluster(job.hosts, job.rate_mbit, prefix=job.prefix)
    processes: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    started = time.monotonic()
    with signals_raise(StopRequested), cluster:
        try:
            for host in range(job.hosts):
                job.host_dir(host).mkdir(parents=True, exist_ok=True)
                process = cluster.popen(
                    host,
                    job.host_argv(host),
                    env=job.host_env(cluster, host),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    errors="replace",
                )
                processes.append(process)
                reader = threading.Thread(
                    target=_copy_output,
                    args=(process.stdout, job.run_dir / f"host{host}.log", job.echo and host == 0),
                    daemon=True,
                )
                reader.start()
                readers.append(reader)
            if on_started is not None:
                on_started(cluster, processes)
            _wait(job, processes, started)
        finally:
            _stop(processes)
            for reader in readers:
                reader.join(timeout=STOP_GRACE_S)
    return _collect(job, cluster, time.monotonic() - started)


def _wait(job: ClusterJob, processes: list[subprocess.Popen], started: float) -> None:
    while True:
        codes = [p.poll() for p in processes]
        for host, code in enumerate(codes):
            if code not in (None, 0):
                log = job.run_dir / f"host{host}.log"
                time.sleep(0.2)  # let the reader drain the last lines
                raise ClusterJobFailed(
                    f"host {host} failed (exit code {code}); its log: {log}\n{_tail(log)}"
                )
        if all(code == 0 for code in codes):
            return
        if time.monotonic() - started > job.timeout_s:
            raise TimeoutError(f"the cluster job did not finish within {job.timeout_s:g} s")
        time.sleep(0.2)


def _collect(job: ClusterJob, cluster: EmulatedCluster, wall_s: float) -> dict:
    source = job.host_dir(0) / "summary.json"
    if not source.exists():
        raise ClusterJobFailed(f"node 0 finished without writing {source}")
    shutil.copyfile(source, job.run_dir / "summary.json")
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
            "overrides": job.overrides,
            "wall_s": wall_s,
        },
    )
    return json.loads(source.read_text())
