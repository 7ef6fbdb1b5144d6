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


def test_tree_sampler_names_a_process_seen_before_its_exec_later(tmp_path):
    """The rank server is forked from the launcher, then execs: a sample between the two sees
    the launcher's command line. The next sample names it."""
    _fake_process(tmp_path, 10, 1, "python train.py", 400 * 1024, 300 * 1024)
    _fake_process(tmp_path, 11, 10, "python train.py", 300 * 1024, 10 * 1024)
    sampler = TreeSampler(10, proc=tmp_path)
    sampler.sample()
    assert sampler.processes[11].role == "other"
    server = "python -c from multiprocessing.forkserver import main; main(3, 4)"
    (tmp_path / "11" / "cmdline").write_bytes(server.replace(" ", "\0").encode())
    sampler.sample()
    assert [p.pid for p in sampler.by_role("rank server")] == [11]


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


# ------------------------------------------------------------------ bench memory
def _record(ranks, launcher, node, server=None):
    return {
        "status": "ok",
        "rank_peak_rss_mb": ranks,
        "launcher_peak_rss_mb": launcher,
        "rank_server_peak_rss_mb": server,
        "node_peak_pss_mb": node,
        "summary": {"launcher_peak_rss_mb": launcher},
    }


def test_memory_rows_hold_each_term_of_the_target():
    from lightning_gnnscale.bench.memory import Job, assemble_rows, memory_table

    jobs = [
        Job("single", 1, "graph", 1000),
        Job("single", 1, "runtime", 10),
        Job("distdgl", 2, "graph", 1000, source="partition_dir"),
        Job("distdgl", 2, "runtime", 10, source="partition_dir"),
        Job("ddp", 4, "graph", 1000),
        Job("ddp", 4, "runtime", 10),
        Job("granndis", 1, "graph", 1000, status="refused", message="topology.servers=2 ..."),
        Job("granndis", 1, "runtime", 10, status="refused", message="topology.servers=2 ..."),
    ]
    records = {
        "single-P1-graph": _record([1400.0], 1400.0, 1300.0),
        "single-P1-runtime": _record([400.0], 400.0, 350.0),
        # graph share 1000 / 2 = 500, halo 60, runtime 380: target 940
        "distdgl-P2-graph": _record([900.0, 1100.0], 450.0, 2600.0, server=420.0),
        "distdgl-P2-runtime": _record([380.0, 381.0], 455.0, 1200.0, server=420.0),
        # graph share 250, no halo term, runtime 390: target 640; 1500 is far over it
        "ddp-P4-graph": _record([1500.0] * 4, 1450.0, 3250.0, server=430.0),
        "ddp-P4-runtime": _record([390.0] * 4, 470.0, 1800.0, server=430.0),
    }
    halo = {"distdgl-P2-graph": {"share_mb": 60.0}}
    rows = {(r["strategy"], r["parts"]): r for r in assemble_rows(jobs, records, halo)}
    assert len(rows) == 4  # the graph jobs only
    single, dist, ddp = rows["single", 1], rows["distdgl", 2], rows["ddp", 4]
    assert single["graph_share_mb"] == 1000.0 and single["ratio_to_single"] == 1.0
    assert dist["graph_share_mb"] == 500.0 and dist["halo_share_mb"] == 60.0
    assert dist["runtime_mb"] == 381.0 and dist["target_mb"] == 941.0
    assert dist["rank_peak_rss_mb"] == 1100.0 and dist["rank_peak_rss_min_mb"] == 900.0
    assert dist["over_target_mb"] == pytest.approx(159.0)
    assert dist["rank_meets"] is False  # 1100 > 941 x 1.1
    assert dist["ratio_to_single"] == pytest.approx(2.0)
    assert dist["launcher_meets"] is True  # 450 <= 600 and <= 455 x 1.1
    assert ddp["halo_share_mb"] is None and ddp["target_mb"] == 640.0
    assert ddp["rank_meets"] is False and "launcher_meets" not in ddp  # in memory: no target
    assert rows["granndis", 1]["status"] == "refused"
    table = memory_table(list(rows.values()))
    assert len(table) == 2 + 4
    (dist_line,) = [line for line in table if line.startswith("| distdgl")]
    cells = [c.strip() for c in dist_line.strip("|").split("|")]
    assert cells[3:] == ["1100 (900)", "450 (455)", "420", "2600", "2.00", "500", "60", "381"] + [
        "941",
        "+159",
        "**no**",
        "yes",
    ]
    assert "refused: topology.servers=2" in [line for line in table if "granndis" in line][0]


def test_memory_launcher_target_fails_when_it_grows_with_the_graph():
    from lightning_gnnscale.bench.memory import Job, assemble_rows

    jobs = [
        Job("distdgl", 2, k, n, source="partition_dir") for k, n in (("graph", 9), ("runtime", 1))
    ]
    records = {
        "distdgl-P2-graph": _record([500.0, 500.0], 580.0, 1500.0),  # under 600 but 16 % over
        "distdgl-P2-runtime": _record([400.0, 400.0], 500.0, 1300.0),  # its tiny-graph peak
    }
    (row,) = assemble_rows(jobs, records, {})
    assert row["launcher_meets"] is False
    assert row["graph_share_mb"] is None and "target_mb" not in row  # no single: no target


def test_memory_rows_count_the_replicated_data_a_run_reports():
    """SANCUS's staleness caches (``summary.json``: ``system.cache_bytes_by_rank``) join the
    halo term, in the target and in the table's cell."""
    from lightning_gnnscale.bench.memory import Job, assemble_rows, memory_table, summary_extract

    jobs = [Job("single", 1, k, n) for k, n in (("graph", 9), ("runtime", 1))]
    jobs += [
        Job("sancus", 2, k, n, source="partition_dir") for k, n in (("graph", 9), ("runtime", 1))
    ]
    graph = _record([700.0, 650.0], 460.0, 1500.0)
    graph["summary"] = summary_extract(
        {"launcher_peak_rss_mb": 460.0, "system": {"cache_bytes_by_rank": [2**20 * 70, 2**20 * 80]}}
    )
    records = {
        "single-P1-graph": _record([800.0], 800.0, 700.0),
        "single-P1-runtime": _record([400.0], 400.0, 350.0),
        "sancus-P2-graph": graph,
        "sancus-P2-runtime": _record([390.0, 390.0], 455.0, 1100.0),
    }
    halo = {"sancus-P2-graph": {"share_mb": 1.0}}
    row = assemble_rows(jobs, records, halo)[1]
    assert row["replicated_mb"] == 80.0
    assert row["target_mb"] == 200.0 + 1.0 + 80.0 + 390.0
    assert row["rank_meets"] is True  # 700 <= 671 x 1.1
    assert "| 1 + 80 cache |" in memory_table([row])[2]


def test_memory_rows_count_the_prefetch_budget_a_run_reports():
    """ByteGNN's prefetch budget (``summary.json``: ``system.prefetch_budget_bytes``) joins
    the halo term, in the target and in the table's cell, beside no cache term; a target past
    1,000 MB reads in whole MB (3 significant digits wrote ``1e+03``)."""
    from lightning_gnnscale.bench.memory import Job, assemble_rows, memory_table, summary_extract

    jobs = [Job("single", 1, k, n) for k, n in (("graph", 9), ("runtime", 1))]
    jobs += [
        Job("bytegnn", 2, k, n, source="partition_dir") for k, n in (("graph", 9), ("runtime", 1))
    ]
    graph = _record([1050.0, 880.0], 460.0, 2000.0)
    graph["summary"] = summary_extract(
        {"launcher_peak_rss_mb": 460.0, "system": {"prefetch_budget_bytes": 2.0**20 * 256}}
    )
    records = {
        "single-P1-graph": _record([1000.0], 1000.0, 700.0),
        "single-P1-runtime": _record([400.0], 400.0, 350.0),
        "bytegnn-P2-graph": graph,
        "bytegnn-P2-runtime": _record([450.0, 450.0], 455.0, 1100.0),
    }
    row = assemble_rows(jobs, records, {"bytegnn-P2-graph": {"share_mb": 1.0}})[1]
    assert row["prefetch_mb"] == 256.0 and row["replicated_mb"] is None
    assert row["target_mb"] == 300.0 + 1.0 + 256.0 + 450.0
    assert row["rank_meets"] is True  # 1050 <= 1007 x 1.1; without the budget, 751 x 1.1
    cells = [c.strip() for c in memory_table([row])[2].strip("|").split("|")]
    assert cells[8:13] == ["300", "1 + 256 prefetch", "450", "1007", "+43"]


def test_memory_rank_peak_is_the_ranks_own_where_the_samples_ended_early():
    """A short job can end between two samples after its last growth: the ranks' own peak in
    ``summary.json`` (their ``VmHWM`` at the epoch's end) is the rank peak where it is larger,
    in the row and in the runtime term (SANCUS at P = 2: sampled 368 MB, its own 394 MB)."""
    from lightning_gnnscale.bench.memory import Job, assemble_rows

    jobs = [Job("single", 1, k, n) for k, n in (("graph", 9), ("runtime", 1))]
    jobs += [
        Job("sancus", 2, k, n, source="partition_dir") for k, n in (("graph", 9), ("runtime", 1))
    ]
    runtime = _record([368.0, 366.0], 455.0, 1100.0)
    runtime["summary"]["peak_rss_mb"] = 394.0
    graph = _record([619.0, 594.0], 460.0, 1300.0)
    graph["summary"]["peak_rss_mb"] = 612.0  # read before the sampler's last sample: lower
    records = {
        "single-P1-graph": _record([780.0], 780.0, 700.0),
        "single-P1-runtime": _record([480.0], 480.0, 350.0),
        "sancus-P2-graph": graph,
        "sancus-P2-runtime": runtime,
    }
    row = assemble_rows(jobs, records, {})[1]
    assert row["runtime_mb"] == 394.0 and row["rank_peak_rss_mb"] == 619.0
    assert row["target_mb"] == 150.0 + 394.0
    assert row["rank_peak_rss_min_mb"] == 594.0


@linux_only
@pytest.mark.e2e
@pytest.mark.timeout(900)  # 4 train.py jobs, 3 partition commands: 2 min idle, 7 at load 11
def test_bench_memory_tiny_end_to_end(tmp_path, capsys):
    """``bench memory`` on a tiny graph: single and DistDGL (from partition directories) at
    P = 2, every process of each job sampled, the files written; run again, it keeps them."""
    from lightning_gnnscale.bench import main

    out = tmp_path / "memory"
    argv = ["memory", "--strategies", "distdgl", "--parts", "2", "--nodes", "2000"]
    argv += ["--features", "16", "--runtime-nodes", "300", "--steps", "2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "[bench memory] 1/4 single P=1 graph (in memory): training" in printed
    results = json.loads((out / "memory.json").read_text())
    rows = {(r["strategy"], r["parts"]): r for r in results["rows"]}
    assert set(rows) == {("single", 1), ("distdgl", 2)}
    single, dist = rows["single", 1], rows["distdgl", 2]
    assert single["status"] == dist["status"] == "ok", results["rows"]
    assert dist["source"] == "partition_dir" and single["source"] == "in memory"
    (job,) = [j for j in results["jobs"] if j["strategy"] == "distdgl" and j["kind"] == "graph"]
    record = job["record"]
    assert len(record["rank_peak_rss_mb"]) == 2  # both ranks seen, apart from the launcher
    assert record["rank_server_peak_rss_mb"] > 0
    roles = sorted(p["role"] for p in record["processes"].values())
    assert roles.count("launcher") == 1 and roles.count("rank server") == 1
    # the node total counts every process: more than any one's PSS, less than the RSS sum
    assert record["node_peak_pss_mb"] > max(record["rank_peak_pss_mb"])
    rss_sum = sum(record["rank_peak_rss_mb"]) + record["launcher_peak_rss_mb"]
    assert record["node_peak_pss_mb"] < rss_sum + record["rank_server_peak_rss_mb"]
    # the launcher's sampled peak is the one its summary.json records (sampling may miss the end)
    assert record["launcher_peak_rss_mb"] <= record["summary"]["launcher_peak_rss_mb"] + SLACK_MB
    assert dist["halo_share_mb"] > 0 and dist["graph_share_mb"] is not None
    assert dist["target_mb"] == pytest.approx(
        dist["graph_share_mb"] + dist["halo_share_mb"] + dist["runtime_mb"]
    )
    markdown = (out / "memory.md").read_text()
    assert "python -m lightning_gnnscale.bench memory --strategies distdgl" in markdown
    assert [line for line in markdown.splitlines() if line.startswith("| distdgl | 2 |")]
    assert (out / "memory.png").is_file() == (results["png"] is not None)
    # the report again from the files alone, nothing run: the same table
    (out / "memory.md").unlink()
    assert main(["memory", "--report-only", "--out", str(out)]) == 0
    assert (out / "memory.md").read_text() == markdown
    # the same bench again: every finished job is read back, none runs, the same rows
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.count("kept from an earlier run") == 4 and "training ..." not in printed
    assert json.loads((out / "memory.json").read_text())["rows"] == results["rows"]


def test_a_rank_maps_its_part_and_the_shared_groups_it_lists(tmp_path):
    """``part_bytes``: a part's files plus the shared groups it lists (RSS counts them whole)."""
    from lightning_gnnscale.bench.memory import part_bytes
    from lightning_gnnscale.graph.partition_dir import PartitionDirWriter

    writer = PartitionDirWriter(tmp_path / "dir")
    group = writer.write_shared("topology", {"indices": torch.arange(1000)})
    first = writer.write_part(0, {"x": torch.ones(10, 4)}, {"nodes": 10}, shared=["topology"])
    second = writer.write_part(1, {"x": torch.ones(20, 4)}, {"nodes": 20})
    writer.finish({"num_parts": 2, "node_offsets": [0, 10, 30], "system": "t", "dataset": {}})

    def size(record):
        return sum(entry["bytes"] for entry in record["files"].values())

    assert part_bytes(tmp_path / "dir") == [size(first) + size(group), size(second)]


def test_a_kept_job_is_valid_for_its_command_and_its_partition_directory(tmp_path):
    """``kept_record``: a finished job is read back (marked kept) for the same overrides,
    sampling period and partition directory content; another period or a rebuilt directory
    (another digest) runs it again."""
    from lightning_gnnscale.bench.memory import (
        Job,
        MemorySettings,
        job_key,
        kept_path,
        kept_record,
    )

    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "partition.json").write_text(json.dumps({"blake2b": "one"}))
    settings, job = MemorySettings(), Job("distdgl", 2, "graph", 300, overrides=["seed=0"])
    extra = [f"data.partition_dir={folder}"]
    kept_path(tmp_path, job).parent.mkdir()
    record = {"status": "ok", "rank_peak_rss_mb": [1.0]}
    command = job_key(job, settings, extra)
    kept_path(tmp_path, job).write_text(json.dumps({"command": command, **record}))
    assert kept_record(job, settings, tmp_path, extra) == {**record, "kept": True}
    other = MemorySettings(interval_s=settings.interval_s * 2)
    assert kept_record(job, other, tmp_path, extra) is None
    (folder / "partition.json").write_text(json.dumps({"blake2b": "two"}))
    assert kept_record(job, settings, tmp_path, extra) is None


def test_a_system_that_refuses_one_part_has_an_unknown_halo_share(tmp_path):
    """GraNNDIS's servers must divide the world size: no one-part directory is written, the
    halo share is unknown (``None``, shown '-') rather than the job failing."""
    from lightning_gnnscale.bench.memory import (
        Job,
        MemorySettings,
        halo_share,
        one_part_reference,
    )

    settings, lines = MemorySettings(), []
    job = Job("granndis", 2, "graph", 300)
    assert one_part_reference(settings, job, tmp_path, lines.append) is None
    assert "no one-part directory" in lines[0] and not (tmp_path / "parts").exists()
    assert halo_share([3 * 2**20, 2**20], None, 2)["share_mb"] is None
    assert halo_share([3 * 2**20, 2**20], [2**20, 2**20], 2)["share_mb"] == 2.0


def test_the_default_strategies_are_each_system_folders_own_name():
    """One job per system folder, named as the folder (``sancus``, not its alias ``cagnet``)."""
    from lightning_gnnscale.bench.memory import default_strategies
    from lightning_gnnscale.systems.registry import SYSTEMS

    names = default_strategies()
    assert sorted(names) == sorted({spec.system for spec in SYSTEMS.values()})
    assert "sancus" in names and "cagnet" not in names


def test_a_memory_job_evaluates_unless_told_not_to(tmp_path):
    """``bench memory`` measures with the run's default validation and test; ``evaluation``
    off (``--no-evaluation``) pushes validation past the job's one epoch."""
    from lightning_gnnscale.bench.memory import MemorySettings, compose_job, job_overrides

    on = job_overrides(MemorySettings(), "distdgl", 2, 300)
    off = job_overrides(MemorySettings(evaluation=False), "distdgl", 2, 300)
    assert compose_job(on, tmp_path).trainer.check_val_every_n_epoch == 1
    assert compose_job(off, tmp_path).trainer.check_val_every_n_epoch == 1000
