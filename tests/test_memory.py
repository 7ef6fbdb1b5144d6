"""Memory accounting: the launcher's own peak RSS in ``summary.json``, the ``/proc`` samplers of
a process tree, and ``bench memory`` (its table, and one tiny run end to end)."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from lightning_gnnscale.callbacks import format_table
from lightning_gnnscale.proc_memory import (
    TreeSampler,
    parent_map,
    peak_rss_mb_of,
    process_tree,
    pss_mb_of,
    rank_server_pid,
)
from lightning_gnnscale.run import train
from tests.helpers.config import make_cfg

linux_only = pytest.mark.skipif(
    not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux /proc smaps_rollup"
)
BALLAST_MB = 512
# Linux reads RSS from per-CPU counters approximately (6.2+): two reads of one process's peak
# may differ by a few MiB even in the right order
SLACK_MB = 8


def _touch_ballast() -> float:
    """Raise this process's peak RSS by ``BALLAST_MB`` (freed again); the peak after it."""
    ballast = torch.ones(BALLAST_MB * 2**18)  # float32: BALLAST_MB MiB, every page written
    peak = peak_rss_mb_of("self")
    del ballast
    return peak


# ------------------------------------------------------------------ summary.json: the launcher
@linux_only
@pytest.mark.e2e
def test_summary_records_the_launchers_own_peak_rss(tmp_path):
    """Two forked ranks: ``launcher_peak_rss_mb`` is this (launching) process's peak, taken
    after the ranks ended, not a rank's (the ballast lives in the launcher only), and
    ``rank_server_peak_rss_mb`` is the server's."""
    before = _touch_ballast()
    metrics, objects = train(make_cfg(tmp_path, "trainer.max_epochs=1"))
    after = peak_rss_mb_of("self")
    on_disk = json.loads((objects["output_dir"] / "summary.json").read_text())
    assert on_disk["launcher_peak_rss_mb"] == metrics["launcher_peak_rss_mb"]
    assert before - SLACK_MB <= metrics["launcher_peak_rss_mb"] <= after + SLACK_MB
    assert metrics["world_size"] == 2
    # the ranks never held the ballast: a rank's peak is far below the launcher's
    assert metrics["peak_rss_mb"] < metrics["launcher_peak_rss_mb"] - BALLAST_MB / 2
    server = rank_server_pid()
    assert server is not None and server != os.getpid()
    assert 0 < on_disk["rank_server_peak_rss_mb"] <= peak_rss_mb_of(server) + SLACK_MB
    table = format_table(metrics)
    assert "launcher's own peak RSS (MB)" in table and "rank server's peak RSS" in table


@linux_only
@pytest.mark.e2e
def test_one_process_run_records_its_own_peak_as_the_launchers(tmp_path):
    """``strategy=single`` trains in the launching process: the launcher's number is that
    process's peak, and there is no rank server."""
    before = _touch_ballast()
    metrics, objects = train(make_cfg(tmp_path, "strategy=single", "trainer.max_epochs=1"))
    on_disk = json.loads((objects["output_dir"] / "summary.json").read_text())
    after = peak_rss_mb_of("self")
    assert before - SLACK_MB <= on_disk["launcher_peak_rss_mb"] <= after + SLACK_MB
    assert on_disk["rank_server_peak_rss_mb"] is None


# ------------------------------------------------------------------ /proc samplers
def _fake_process(proc, pid, ppid, cmd, hwm_kb, pss_kb):
    folder = proc / str(pid)
    folder.mkdir()
    (folder / "stat").write_text(f"{pid} (py thon) S {ppid} 1 1 0\n")
    (folder / "status").write_text(f"Name:\tpython\nVmHWM:\t{hwm_kb} kB\nVmRSS:\t1 kB\n")
    (folder / "smaps_rollup").write_text(f"Rss:\t{hwm_kb} kB\nPss:\t{pss_kb} kB\n")
    (folder / "cmdline").write_bytes(cmd.replace(" ", "\0").encode())


def test_tree_sampler_on_a_fake_proc(tmp_path):
    """A launcher (10), its rank server (11) and resource tracker (12), two ranks forked from
    the server (20, 21), a loader worker of rank 0 (30), and processes outside the job (1, 40):
    roles, peaks and the job's PSS total, over two samples."""
    py = "/usr/bin/python"
    _fake_process(tmp_path, 1, 0, "init", 9_999_000, 9_999_000)
    _fake_process(tmp_path, 10, 1, f"{py} train.py strategy=ddp", 400 * 1024, 300 * 1024)
    server = f"{py} -c from multiprocessing.forkserver import main; main(3, 4)"
    _fake_process(tmp_path, 11, 10, server, 350 * 1024, 100 * 1024)
    tracker = f"{py} -c from multiprocessing.resource_tracker import main;main(5)"
    _fake_process(tmp_path, 12, 10, tracker, 20 * 1024, 10 * 1024)
    _fake_process(tmp_path, 20, 11, server, 600 * 1024, 250 * 1024)
    _fake_process(tmp_path, 21, 11, server, 700 * 1024, 260 * 1024)
    _fake_process(tmp_path, 30, 20, server, 50 * 1024, 5 * 1024)
    _fake_process(tmp_path, 40, 1, "other job", 9_000_000, 9_000_000)
    (tmp_path / "self").mkdir()  # not a pid: ignored

    assert parent_map(tmp_path)[21] == 11
    assert process_tree(10, parent_map(tmp_path)) == {10: 0, 11: 1, 12: 1, 20: 2, 21: 2, 30: 3}
    sampler = TreeSampler(10, proc=tmp_path)
    assert sampler.sample() == pytest.approx(925.0)  # MiB: 300 + 100 + 10 + 250 + 260 + 5
    roles = {p.pid: p.role for p in sampler.processes.values()}
    assert roles == {10: "launcher", 11: "rank server", 12: "helper", 20: "rank", 21: "rank"} | {
        30: "other"
    }
    # rank 1 grows, then the launcher's PSS falls: peaks per process and of the total
    _fake_process_update(tmp_path, 21, hwm_kb=900 * 1024, pss_kb=460 * 1024)
    _fake_process_update(tmp_path, 10, hwm_kb=400 * 1024, pss_kb=50 * 1024)
    assert sampler.sample() == pytest.approx(875.0)
    assert sampler.peak_pss_total_mb == pytest.approx(925.0)
    assert [p.peak_rss_mb for p in sampler.by_role("rank")] == [600.0, 900.0]
    assert sampler.by_role("launcher")[0].peak_pss_mb == 300.0
    # a rank that exits is kept with what was seen of it
    for name in ("stat", "status", "smaps_rollup", "cmdline"):
        (tmp_path / "20" / name).unlink()
    (tmp_path / "20").rmdir()
    sampler.sample()
    assert sampler.by_role("rank")[0].peak_rss_mb == 600.0 and sampler.samples == 3


def _fake_process_update(proc, pid, hwm_kb, pss_kb):
    (proc / str(pid) / "status").write_text(f"VmHWM:\t{hwm_kb} kB\n")
    (proc / str(pid) / "smaps_rollup").write_text(f"Pss:\t{pss_kb} kB\n")


SHARED_CHILD = """
import mmap, os, sys, time
size = 200 * 2**20
shared = mmap.mmap(-1, size)  # anonymous, shared with the child after fork
shared.write(b"x" * size)
if os.fork() == 0:
    touched = sum(shared[i] for i in range(0, size, 4096))  # reads every page: still shared
    time.sleep(60)
    os._exit(0)
print("ready", flush=True)
time.sleep(60)
"""


@linux_only
def test_tree_sampler_counts_shared_pages_once(tmp_path):
    """A real process tree: a parent holding 200 MiB of shared memory and a forked child that
    maps the same pages. Each RSS counts them; the PSS total counts them once."""
    proc = subprocess.Popen([sys.executable, "-c", SHARED_CHILD], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        sampler = TreeSampler(proc.pid)
        deadline = time.monotonic() + 20
        while len(sampler.processes) < 2 and time.monotonic() < deadline:
            sampler.sample()
            time.sleep(0.05)
        sampler.sample()
        parent = sampler.by_role("launcher")[0]
        (child,) = [p for p in sampler.processes.values() if p.pid != proc.pid]
        assert parent.peak_rss_mb >= 200 and child.peak_rss_mb >= 200
        rss_sum = parent.peak_rss_mb + child.peak_rss_mb
        assert sampler.peak_pss_total_mb < rss_sum - 150  # the 200 MiB once, not twice
        assert sampler.peak_pss_total_mb >= 200
        assert pss_mb_of(proc.pid) < parent.peak_rss_mb - 50  # shared pages split between two
    finally:
        proc.kill()
        proc.wait()
