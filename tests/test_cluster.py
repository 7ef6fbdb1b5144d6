"""The emulated cluster (lightning_gnnscale/cluster): real shaping, clean teardown, and every
strategy on 2 emulated hosts (ranks that do not share a network stack) giving the same float64
result as on one host (all strategies in one 2-host multirun, so each host imports once).

These need root, ``ip``/``tc`` and network namespaces; elsewhere they are skipped, and the
reason is printed (a warning in pytest's summary) so a skip is never mistaken for a pass.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from lightning_gnnscale.cluster import (
    ClusterJob,
    ClusterJobFailed,
    ClusterLeftovers,
    ClusterUnavailable,
    EmulatedCluster,
    PrefixInUse,
    leftovers,
    memory,
    network,
    preflight,
    run_job,
)
from lightning_gnnscale.cluster.__main__ import build_parser
from lightning_gnnscale.cluster.job import host_cpus, host_threads, warn_if_shared
from lightning_gnnscale.cluster.network import namespace_pids
from lightning_gnnscale.run import THREADS_ENV, train
from tests.helpers.config import TINY, make_cfg

pytestmark = pytest.mark.cluster


def _unavailable() -> str | None:
    try:
        preflight(rate_mbit=1.0)
    except ClusterUnavailable as err:
        return str(err)
    return None


UNAVAILABLE = _unavailable()
if UNAVAILABLE:
    warnings.warn(f"tests/test_cluster.py skipped: {UNAVAILABLE}", stacklevel=1)
needs_cluster = pytest.mark.skipif(
    UNAVAILABLE is not None, reason=f"emulated cluster unavailable: {UNAVAILABLE}"
)


def _memory_unavailable() -> str | None:
    try:
        memory.check_available()
    except memory.MemoryCapUnavailable as err:
        return str(err)
    return None


MEMORY_UNAVAILABLE = UNAVAILABLE or _memory_unavailable()
needs_memory_cap = pytest.mark.skipif(
    MEMORY_UNAVAILABLE is not None, reason=f"memory caps unavailable: {MEMORY_UNAVAILABLE}"
)


def _prefix(tag: str) -> str:
    return f"t{tag}{os.getpid() % 100000}"


def _state() -> tuple[set[str], set[str]]:
    """The machine's namespaces and links, as ``ip`` lists them."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, timeout=10)
    return (
        {line.split()[0] for line in netns.stdout.splitlines() if line.strip()},
        {line.split()[0].split("@")[0] for line in links.stdout.splitlines() if line.strip()},
    )


def _assert_nothing_left(prefix: str, before: tuple[set[str], set[str]]) -> None:
    after = _state()
    assert leftovers(prefix) == []
    # Other jobs on a shared machine may add or remove their own meanwhile: compare only what
    # this cluster could have left.
    for was, now in zip(before, after):
        assert not {n for n in now - was if n.startswith(prefix)}


def test_preflight_without_root_fails_before_creating_anything(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterUnavailable, match="needs root"):
        EmulatedCluster(2, 100.0, prefix="tnoroot").open()
    if not UNAVAILABLE:
        assert leftovers("tnoroot") == []


def test_default_prefixes_are_unique_valid_and_fit_interface_names():
    """Random, not the pid (pid namespaces reuse pids); each valid as a prefix, and its longest
    name (host 199's link) within Linux's 15 characters."""
    prefixes = {network.default_prefix() for _ in range(50)}
    assert len(prefixes) == 50
    for prefix in prefixes:
        cluster = EmulatedCluster(200, prefix=prefix)  # validates the prefix; creates nothing
        assert len(f"{cluster.prefix}v199") <= 15 and str(os.getpid()) not in prefix
    assert EmulatedCluster(1).prefix != EmulatedCluster(1).prefix


def test_a_prefix_owns_only_its_own_names():
    owned = network._owned_name("ab")
    assert all(owned.match(n) for n in ("abbr", "abh0", "abv12", "abh199"))
    assert not any(owned.match(n) for n in ("abh1br", "abhh0", "abcbr", "ab", "abh", "xabbr"))


@needs_cluster
def test_a_second_cluster_with_a_prefix_in_use_is_refused_and_the_first_left_alone(monkeypatch):
    """Refused before it creates anything, naming what exists; and when the names are taken
    only after its check (two clusters starting together), its clean-up deletes nothing of the
    first cluster's."""
    prefix, before = _prefix("dup"), _state()
    with EmulatedCluster(2, prefix=prefix) as first:
        owned = leftovers(prefix)
        assert first.bridge in owned and first.namespace(1) in owned
        with pytest.raises(PrefixInUse, match=f"prefix '{prefix}' is in use.*{first.bridge}"):
            EmulatedCluster(1, prefix=prefix).open()
        assert leftovers(prefix) == owned
        monkeypatch.setattr(network, "check_prefix_free", lambda prefix: None)
        with pytest.raises(PrefixInUse, match=f"{first.bridge} was created by someone else"):
            EmulatedCluster(1, prefix=prefix).open()
        assert leftovers(prefix) == owned
        ports = subprocess.run(
            ["ip", "-br", "link", "show", "master", first.bridge],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        assert {line.split()[0].split("@")[0] for line in ports.splitlines()} == {
            f"{prefix}v0",
            f"{prefix}v1",
        }  # the first cluster's hosts are still plugged into its bridge
    _assert_nothing_left(prefix, before)


_RECEIVER = """
import socket, sys, time
server = socket.socket(); server.bind(("0.0.0.0", 5001)); server.listen(1)
print("ready", flush=True)
conn, _ = server.accept(); start = time.perf_counter(); total = 0
while chunk := conn.recv(1 << 16):
    total += len(chunk)
print(total, time.perf_counter() - start, flush=True)
"""
_SENDER = """
import socket, sys
with socket.create_connection((sys.argv[1], 5001), timeout=30) as s:
    s.sendall(b"x" * int(sys.argv[2]))
"""


def test_hosts_get_disjoint_equal_shares_of_the_cores():
    assert host_cpus(2, [0, 1]) == [[0], [1]]
    assert host_cpus(2, [7, 2, 3, 5, 4]) == [[2, 3], [4, 5]]  # the remainder stays out
    assert host_cpus(3, [0, 1]) == [[0], [1], [0]]  # fewer cores than hosts: shared
    assert host_cpus(1, [0, 1]) == [[0, 1]]
    with pytest.raises(ValueError, match="hosts"):
        host_cpus(0, [0, 1])


def test_hosts_that_share_cores_are_warned_about(capsys):
    assert warn_if_shared(host_cpus(3, [0, 1])) is True
    err = capsys.readouterr().err
    assert "3 emulated hosts share 2 core(s)" in err
    assert "times are not those of separate machines" in err
    assert warn_if_shared(host_cpus(2, [0, 1])) is False
    assert capsys.readouterr().err == ""


def test_each_host_s_ranks_share_its_own_cores_whatever_the_load(monkeypatch, tmp_path):
    """Not capped by the machine's load average (which the other hosts raise); the user's
    ``$GNNSCALE_NUM_THREADS`` is kept; each launcher gets its host's count."""
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (100.0, 100.0, 100.0))
    cores = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    assert host_threads(cores, 1) == [4, 4, 3]
    assert host_threads(cores, 2) == [2, 2, 1]
    assert host_threads(cores, 8) == [1, 1, 1]
    monkeypatch.setenv(THREADS_ENV, "3")
    assert host_threads(cores, 2) == [3, 3, 3]
    job = ClusterJob(2, None, [], run_dir=tmp_path)
    assert job.host_env(EmulatedCluster(2, prefix="tenv"), 1, 5)[THREADS_ENV] == "5"


def test_the_memory_cap_has_one_rule_and_message(capsys):
    message = "memory cap must be an integer >= 64 (MiB), got 63"
    for make in (
        lambda: ClusterJob(2, None, [], memory_mb=63),
        lambda: EmulatedCluster(2, memory_mb=63),
    ):
        with pytest.raises(ValueError) as err:
            make()
        assert str(err.value) == message
    for text, shown in (("63", "63"), ("big", "'big'")):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--hosts", "2", "--bandwidth", "1", "--memory-mb", text])
        assert message.replace("63", shown) in capsys.readouterr().err
    assert (
        build_parser().parse_args(["--hosts=2", "--bandwidth=1", "--memory-mb=64"]).memory_mb == 64
    )


def test_a_memory_cgroup_is_found_where_its_hierarchy_is_mounted():
    """The folder is the v1 memory mount plus the cgroup's path below the mount's root: the
    whole hierarchy on a host, the container's own cgroup as the root inside a container
    without a cgroup namespace; a cgroup outside the mount, or no memory line, is named."""
    mount = "35 31 0:32 {root} /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    other = "30 25 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    folder = memory.cgroup_folder
    assert folder("4:memory:/a/b\n", other + mount.format(root="/")) == Path(
        "/sys/fs/cgroup/memory/a/b"
    )
    assert folder("4:memory:/docker/c1\n", mount.format(root="/docker/c1")) == Path(
        "/sys/fs/cgroup/memory"
    )
    assert folder("5:cpu:/x\n4:memory:/docker/c1/y\n", mount.format(root="/docker/c1")) == Path(
        "/sys/fs/cgroup/memory/y"
    )
    with pytest.raises(memory.MemoryCapUnavailable, match="outside the memory mount"):
        folder("4:memory:/elsewhere\n", mount.format(root="/docker/c1"))
    with pytest.raises(memory.MemoryCapUnavailable, match="names no memory cgroup"):
        folder("0::/\n", mount.format(root="/"))
    with pytest.raises(memory.MemoryCapUnavailable, match="no cgroup mount"):
        folder("4:memory:/\n", other)


@needs_memory_cap
def test_host_cgroups_nest_in_the_callers_own_and_cap_swap_too():
    """Inside the caller's memory cgroup (whose limits then bound the hosts); with swap
    accounting, memory plus swap is capped at the same size; leftovers() looks there."""
    prefix, before = _prefix("g"), _state()
    with EmulatedCluster(1, prefix=prefix, memory_mb=64) as cluster:
        path = cluster.cgroup(0)
        assert path.is_dir()  # and its parent holds this process:
        assert str(os.getpid()) in (path.parent / "cgroup.procs").read_text().split()
        assert int((path / "memory.limit_in_bytes").read_text()) == 64 * 2**20
        memsw = path / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            assert int(memsw.read_text()) == 64 * 2**20
        assert f"cgroup:{cluster.namespace(0)}" in leftovers(prefix)
    assert not path.exists()
    _assert_nothing_left(prefix, before)


@needs_memory_cap
def test_a_cgroup_that_cannot_be_removed_is_named_with_its_pids(monkeypatch):
    path = memory.create(_prefix("r"), 64)
    member = subprocess.Popen(memory.joined(path, ["sleep", "60"]))
    try:
        deadline = time.monotonic() + 10
        while str(member.pid) not in (path / "cgroup.procs").read_text().split():
            assert time.monotonic() < deadline, "sleep did not join its cgroup"
            time.sleep(0.01)
        monkeypatch.setattr(memory, "REMOVE_TIMEOUT_S", 0.2)
        with monkeypatch.context() as patched:
            patched.setattr(os, "kill", lambda pid, sig: None)  # a process that will not die
            with pytest.raises(memory.CgroupNotRemoved) as err:
                memory.remove(path)
        assert str(path) in str(err.value) and str(member.pid) in str(err.value)
    finally:
        member.kill()
        member.wait()
        memory.remove(path)
    assert not path.exists()


@needs_memory_cap
def test_a_cgroup_left_behind_still_removes_the_network_and_is_reported(monkeypatch):
    prefix, before = _prefix("l"), _state()
    cluster = EmulatedCluster(2, prefix=prefix, memory_mb=64).open()
    cgroups = [cluster.cgroup(h) for h in range(2)]

    def stuck(path):
        raise memory.CgroupNotRemoved(f"cannot remove the memory cgroup {path}")

    monkeypatch.setattr(network, "remove", stuck)
    with pytest.raises(ClusterLeftovers) as err:
        cluster.close()
    assert all(str(path) in str(err.value) for path in cgroups)
    assert leftovers(prefix) == sorted(f"cgroup:{path.name}" for path in cgroups)
    for path in cgroups:
        memory.remove(path)
    _assert_nothing_left(prefix, before)


def test_leftovers_do_not_replace_the_error_already_leaving(monkeypatch, capsys):
    """A failed job's own error survives a close that leaves something behind: the leftovers
    are printed and noted on it; with no error on its way, close raises them."""
    cluster = EmulatedCluster(2, prefix=_prefix("x"))

    def close():
        raise ClusterLeftovers("the cluster was not fully removed: netns xh0 is still there")

    monkeypatch.setattr(cluster, "close", close)
    failure = ValueError("host 1 failed")
    cluster.__exit__(ValueError, failure, None)  # returns: the caller re-raises ``failure``
    assert "netns xh0 is still there" in capsys.readouterr().err
    assert any("netns xh0" in note for note in failure.__notes__)
    with pytest.raises(ClusterLeftovers):
        cluster.__exit__(None, None, None)


def _transfer_seconds(cluster: EmulatedCluster, size: int) -> float:
    """Seconds host 1 takes to receive ``size`` bytes that host 0 sends over a plain socket."""
    receiver = cluster.popen(
        1, [sys.executable, "-S", "-c", _RECEIVER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert receiver.stdout.readline().strip() == "ready"
        sender = [sys.executable, "-S", "-c", _SENDER, cluster.address(1), str(size)]
        subprocess.run(
            ["ip", "netns", "exec", cluster.namespace(0), *sender], check=True, timeout=60
        )
        received, seconds = receiver.communicate(timeout=60)[0].split()
    finally:
        receiver.kill()
        receiver.wait()
    assert int(received) == size
    return float(seconds)


@needs_cluster
def test_shaping_is_real():
    """1 MB at 20 Mbit/s takes at least 0.9 x 0.4 s; the same link unshaped is far faster
    (so the bound is the shaping's doing, not the set-up's)."""
    size, rate = 1_000_000, 20.0
    bound = 0.9 * size * 8 / (rate * 1e6)
    before = _state()
    with EmulatedCluster(2, rate, prefix=_prefix("sh")) as shaped:
        shaped_s = _transfer_seconds(shaped, size)
    with EmulatedCluster(2, None, prefix=_prefix("un")) as unshaped:
        unshaped_s = _transfer_seconds(unshaped, size)
    assert shaped_s >= bound, f"{size} B at {rate} Mbit/s took {shaped_s:.3f} s < {bound:.3f} s"
    assert unshaped_s < bound / 2, f"unshaped: {unshaped_s:.3f} s"
    _assert_nothing_left(_prefix("sh"), before)
    _assert_nothing_left(_prefix("un"), before)


def _long_job(tmp_path: Path, prefix: str, memory_mb: int | None = None) -> ClusterJob:
    overrides = [*TINY, "strategy=ddp", "trainer.devices=1", "trainer.max_epochs=1000"]
    return ClusterJob(
        2,
        100.0,
        overrides,
        run_dir=tmp_path / "run",
        prefix=prefix,
        echo=False,
        memory_mb=memory_mb,
    )


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _rank_pid(namespace: str, timeout_s: float = 180.0) -> int:
    """A rank inside ``namespace``, once it exists: a spawned interpreter, or a process forked
    from the host's warm rank server (whose command line it shares)."""
    server = b"multiprocessing.forkserver"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in namespace_pids(namespace):
            cmdline = _cmdline(pid)
            if b"spawn_main" in cmdline or (server in cmdline and server in _cmdline(_parent(pid))):
                return pid
        time.sleep(0.2)
    raise AssertionError(f"no rank started in {namespace} within {timeout_s} s")


@needs_cluster
def test_teardown_after_a_rank_is_killed(tmp_path):
    """SIGKILL one rank of host 1 mid-run, hosts with memory caps (where cgroups can be made):
    the job fails at once with that host named, and the namespaces, links, qdiscs and cgroups
    are all gone."""
    prefix, before, launchers, cgroups = _prefix("k"), _state(), [], []
    capped = MEMORY_UNAVAILABLE is None

    def kill_a_rank(cluster, processes):
        launchers.extend(processes)
        cgroups.extend(cluster.cgroup(h) for h in range(2) if capped)
        assert all(path.is_dir() for path in cgroups)
        os.kill(_rank_pid(cluster.namespace(1)), signal.SIGKILL)

    started = time.monotonic()
    with pytest.raises(ClusterJobFailed, match="host 1 failed"):
        run_job(_long_job(tmp_path, prefix, 4096 if capped else None), on_started=kill_a_rank)
    assert time.monotonic() - started < 240  # not the 1000 epochs, nor a collective time-out
    assert all(p.poll() is not None for p in launchers)
    assert len(cgroups) == (2 if capped else 0) and not any(p.exists() for p in cgroups)
    assert memory.leftovers(prefix) == []
    _assert_nothing_left(prefix, before)


@needs_cluster
def test_teardown_after_ctrl_c(tmp_path):
    """Ctrl-C while the hosts run: every launcher is stopped and nothing is left."""
    prefix, before, launchers = _prefix("c"), _state(), []

    def interrupt(cluster, processes):
        launchers.extend(processes)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_job(_long_job(tmp_path, prefix), on_started=interrupt)
    assert all(p.poll() is not None for p in launchers)
    _assert_nothing_left(prefix, before)


def _final_weights(output_dir: Path) -> dict:
    ckpt = torch.load(output_dir / "checkpoints" / "last.ckpt", weights_only=True)
    return ckpt["state_dict"]


STRATEGIES = [
    "ddp",
    "distdgl",
    "gsplit",
    "grappa",
    "sancus",
    "cagnet",
    "hopgnn",
    "hopgnn_mc",
    "granndis",
    "granndis_fb_base",
    "bytegnn",  # each rank publishes the address its peers reach (GLOO_SOCKET_IFNAME)
]


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """Each strategy's one-host run (2 ranks), then ONE multirun over every strategy on 2 hosts
    x 1 rank: each host's launcher imports once and runs the strategies' jobs in order. Returns
    ``(reference output folder by strategy, the cluster job, node 0's summaries in job order)``."""
    tmp = tmp_path_factory.mktemp("two_hosts")
    run = [
        "dtype=float64",
        "trainer.max_epochs=1",
        "topology.servers=2",  # one server per host in both runs
        f"paths.cache_dir={tmp / 'cache'}",  # the cluster's hosts reuse the preparation
        "launcher.timeout_s=600",  # TINY's 240 s is too short for a one-host run under load
    ]
    references = {}
    for strategy in STRATEGIES:
        cfg = make_cfg(tmp / strategy, f"strategy={strategy}", *run, "trainer.devices=2")
        references[strategy] = train(cfg)[1]["output_dir"]
    prefix, before = _prefix("e"), _state()
    job = ClusterJob(
        2,
        None,
        ["-m", *TINY, *run, "trainer.devices=1", f"strategy={','.join(STRATEGIES)}"],
        run_dir=tmp / "two",
        prefix=prefix,
        echo=False,
        timeout_s=900,
        # machines of 4 GiB (what each host holds is charged to it), where caps can be set
        memory_mb=4096 if MEMORY_UNAVAILABLE is None else None,
    )
    summaries = run_job(job)
    _assert_nothing_left(prefix, before)
    return references, job, summaries


@needs_cluster
@needs_memory_cap
def test_each_host_is_charged_its_own_memory(two_hosts):
    """Every process of a host is charged to its cgroup: both hosts' peaks hold at least a
    launcher and a rank (each over 200 MiB with torch imported), and none was killed."""
    _, job, _ = two_hosts
    usage = json.loads((job.run_dir / "cluster.json").read_text())["host_memory"]
    assert [u["limit_mb"] for u in usage] == [4096, 4096]
    assert all(u["peak_mb"] > 400 and u["oom_kills"] == 0 for u in usage)


@needs_cluster
def test_each_host_s_ranks_run_the_threads_the_cluster_chose(two_hosts):
    """Every job's rank 0 runs the torch threads the cluster set for its host (its cores per
    rank, not capped by the machine's load), recorded in cluster.json."""
    _, job, summaries = two_hosts
    record = json.loads((job.run_dir / "cluster.json").read_text())
    assert record["host_cpus"] == host_cpus(2)
    assert record["shared_cores"] is (len(os.sched_getaffinity(0)) < 2)
    assert record["host_threads"] == host_threads(host_cpus(2), 1)
    assert [s["torch_threads"] for s in summaries] == [record["host_threads"][0]] * len(STRATEGIES)


@needs_cluster
@needs_memory_cap
def test_a_host_over_its_memory_cap_fails_naming_the_oom_killer(tmp_path):
    """A launcher cannot import torch and Lightning within 200 MiB: the kernel kills it inside
    its host, the job fails saying so, and the cgroups go with the cluster."""
    prefix, before = _prefix("m"), _state()
    job = ClusterJob(
        2,
        None,
        ["strategy=ddp", *TINY],
        run_dir=tmp_path,
        prefix=prefix,
        echo=False,
        timeout_s=300,
        memory_mb=200,
    )
    with pytest.raises(ClusterJobFailed, match="OOM killer at the host's memory cap of 200 MiB"):
        run_job(job)
    _assert_nothing_left(prefix, before)


@needs_cluster
@pytest.mark.timeout(1200)  # the first test builds two_hosts: ~1 min on an idle machine
@pytest.mark.parametrize("num, strategy", enumerate(STRATEGIES), ids=STRATEGIES)
def test_two_hosts_equal_one_host(two_hosts, num, strategy):
    """One epoch on 2 emulated hosts x 1 rank (unshaped) gives the float64 weights of the same
    run on one host with 2 ranks: the multi-node path (NODE_RANK, MASTER_ADDR,
    GLOO_SOCKET_IFNAME) changes where bytes travel, never what is computed. Job ``num`` of the
    2-host multirun is this strategy's."""
    references, job, summaries = two_hosts
    summary = summaries[num]
    assert summary["strategy"] == strategy
    assert summary["world_size"] == 2 and summary["inter_server_bytes_per_epoch"] > 0
    # host 0 runs on its own share of the cores, and its one rank keeps to them
    assert summary["rank_cpus"] == len(host_cpus(2)[0])
    reference = _final_weights(references[strategy])
    got = _final_weights(job.output_dir(0, num))
    assert reference.keys() == got.keys()
    for name in reference:
        torch.testing.assert_close(got[name], reference[name], rtol=0, atol=1e-12)
