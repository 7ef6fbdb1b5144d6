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
    ClusterUnavailable,
    EmulatedCluster,
    leftovers,
    preflight,
    run_job,
)
from lightning_gnnscale.cluster.job import host_cpus
from lightning_gnnscale.cluster.network import namespace_pids
from lightning_gnnscale.run import train
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


def _long_job(tmp_path: Path, prefix: str) -> ClusterJob:
    overrides = [*TINY, "strategy=ddp", "trainer.devices=1", "trainer.max_epochs=1000"]
    return ClusterJob(2, 100.0, overrides, run_dir=tmp_path / "run", prefix=prefix, echo=False)


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
    """SIGKILL one rank of host 1 mid-run: the job fails at once with that host named, and the
    namespaces, links and qdiscs are all gone."""
    prefix, before, launchers = _prefix("k"), _state(), []

    def kill_a_rank(cluster, processes):
        launchers.extend(processes)
        os.kill(_rank_pid(cluster.namespace(1)), signal.SIGKILL)

    started = time.monotonic()
    with pytest.raises(ClusterJobFailed, match="host 1 failed"):
        run_job(_long_job(tmp_path, prefix), on_started=kill_a_rank)
    assert time.monotonic() - started < 240  # not the 1000 epochs, nor a collective time-out
    assert all(p.poll() is not None for p in launchers)
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
        memory_mb=4096,  # machines of 4 GiB: what each host holds is charged to it
    )
    summaries = run_job(job)
    _assert_nothing_left(prefix, before)
    return references, job, summaries


@needs_cluster
def test_each_host_is_charged_its_own_memory(two_hosts):
    """Every process of a host is charged to its cgroup: both hosts' peaks hold at least a
    launcher and a rank (each over 200 MiB with torch imported), and none was killed."""
    _, job, _ = two_hosts
    usage = json.loads((job.run_dir / "cluster.json").read_text())["host_memory"]
    assert [u["limit_mb"] for u in usage] == [4096, 4096]
    assert all(u["peak_mb"] > 400 and u["oom_kills"] == 0 for u in usage)


@needs_cluster
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
    assert summary["torch_threads"] <= summary["rank_cpus"]
    reference = _final_weights(references[strategy])
    got = _final_weights(job.output_dir(0, num))
    assert reference.keys() == got.keys()
    for name in reference:
        torch.testing.assert_close(got[name], reference[name], rtol=0, atol=1e-12)
