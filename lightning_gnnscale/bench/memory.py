"""``bench memory``: the memory of every system at several world sizes on one graph.

Each job is ``python train.py ...`` in a process of its own (the launcher), as a user runs it:
the launcher starts its rank server and ranks. While a job runs, the bench samples every process
of its tree (:class:`~lightning_gnnscale.proc_memory.TreeSampler`): each process's peak RSS
(``VmHWM``, exact up to the last sample) and the job's PSS total (shared pages counted once,
the largest sum seen). A system whose config sets ``supports_partition_dir`` trains from a
partition directory (written first by ``python -m lightning_gnnscale.partition``, reused when
present); every other system trains in memory. Each job trains ``steps`` steps of one epoch,
then validates and tests as the run's defaults do (``evaluation``; without it, training
steps only), so a rank's peak includes its evaluation.

The table splits each rank's peak into the terms of the issue's target:

- **graph share**: single's graph memory / P, where single's graph memory is ``single``'s peak
  RSS on the graph less its peak on a tiny graph;
- **halo / replication share**: partition directories: the bytes of the rank's part less 1/P
  of the bytes of the same system's one-part directory (the whole graph in that system's
  format), the largest over the parts; in memory it is not known ("-"), and counts 0; plus
  the data a system replicates by design where its ``summary.json`` reports it (SANCUS's
  staleness caches, ``system.cache_bytes_by_rank``) and the batches it prefetches by design
  (ByteGNN's budget, ``system.prefetch_budget_bytes``);
- **runtime**: the system's rank peak on a tiny graph (``runtime_nodes``), same source and P.

A job's largest rank peak is the larger of the sampled one and the ``peak_rss_mb`` its ranks
report in ``summary.json`` (their ``VmHWM`` at the epoch's end): a short job can end between
two samples after its last growth.

Target: rank peak RSS <= (graph share + halo share + runtime) x (1 + ``TOLERANCE``); the
launcher's peak with a partition directory and P > 1 (at P = 1 the launcher is the rank) <=
``LAUNCHER_TARGET_MB`` and within ``TOLERANCE`` of its tiny-graph peak (independent of the
graph).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hydra import compose, initialize_config_dir

from ..errors import ConfigError
from ..files import write_json_atomic
from ..preflight import validate
from ..proc_memory import TreeSampler
from ..systems.registry import SYSTEMS
from ..warm_client import DISABLE_ENV
from .report import command_line, environment, environment_lines, fmt, markdown_table

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "conf"
TRAIN_PY = REPO / "train.py"
REFERENCE = "single"
LAUNCHER_TARGET_MB = 600.0
TOLERANCE = 0.10  # "about": 10 % over the sum of the terms still meets the target


def default_strategies() -> tuple[str, ...]:
    """Each system folder's own name (``strategy=<folder>``), in the registry's order; its
    presets and aliases are left out: they hold the same data."""
    return tuple(name for name, spec in SYSTEMS.items() if name == spec.system)


@dataclass(frozen=True)
class MemorySettings:
    """What ``bench memory`` runs: the systems, world sizes, the graph and the sampling."""

    strategies: tuple[str, ...] = field(default_factory=default_strategies)
    parts: tuple[int, ...] = (1, 2, 4)
    nodes: int = 200_000
    features: int = 128
    avg_degree: float = 10.0
    runtime_nodes: int = 2_000
    steps: int = 5
    interval_s: float = 0.2
    timeout_s: float = 900.0
    seed: int = 0
    overrides: tuple[str, ...] = ()
    evaluation: bool = True  # validation and test after the training steps


def job_overrides(settings: MemorySettings, strategy: str, parts: int, nodes: int) -> list[str]:
    """The ``train.py`` overrides of one job (the partition command takes the same)."""
    overrides = [
        f"strategy={strategy}",
        "dataset=sbm",
        f"dataset.num_nodes={nodes}",
        f"dataset.num_features={settings.features}",
        f"dataset.avg_degree={settings.avg_degree}",
        f"seed={settings.seed}",
        "trainer.max_epochs=1",
        f"trainer.limit_train_batches={settings.steps}",
        *([] if settings.evaluation else ["trainer.check_val_every_n_epoch=1000"]),
        "logger=none",
        "trainer.enable_progress_bar=false",
    ]
    if strategy != REFERENCE:  # single's yaml pins one process
        overrides.append(f"trainer.devices={parts}")
    return [*overrides, *settings.overrides]


def compose_job(overrides: list[str], out: Path):
    """The validated run config of ``overrides`` (raises ConfigError / Hydra's errors)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    cfg.paths.root = str(Path.cwd())
    cfg.paths.cache_dir = str(out / "cache")
    cfg.paths.output_dir = str(out / "runs" / "check")
    return validate(cfg)


@dataclass
class Job:
    """One training job of the bench (``kind``: ``graph`` or ``runtime``, the tiny graph)."""

    strategy: str
    parts: int
    kind: str
    nodes: int
    source: str = "in memory"  # or "partition_dir"
    status: str = "planned"  # ok | refused | failed
    message: str = ""
    overrides: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.strategy}-P{self.parts}-{self.kind}"


def plan_jobs(settings: MemorySettings, out: Path) -> list[Job]:
    """Every job, each composed and validated now: a system that refuses a world size (or a
    setting) is a ``refused`` row with the reason, before anything runs."""
    jobs = []
    strategies = [REFERENCE, *(s for s in settings.strategies if s != REFERENCE)]
    for strategy in strategies:
        sizes = [1] if strategy == REFERENCE else list(settings.parts)
        for parts in sizes:
            for kind, nodes in (("graph", settings.nodes), ("runtime", settings.runtime_nodes)):
                job = Job(strategy, parts, kind, nodes)
                job.overrides = job_overrides(settings, strategy, parts, nodes)
                try:
                    run = compose_job(job.overrides, out)
                except (ConfigError, ValueError) as err:
                    job.status, job.message = "refused", str(err).splitlines()[0]
                else:
                    if run.strategy.supports_partition_dir:
                        job.source = "partition_dir"
                jobs.append(job)
    return jobs


def partition_dir(out: Path, job: Job, parts: int | None = None) -> Path:
    parts = job.parts if parts is None else parts
    return out / "parts" / f"{job.strategy}-n{job.nodes}-P{parts}"


def ensure_partition(settings: MemorySettings, job: Job, parts: int, out: Path, log) -> Path:
    """The job's partition directory for ``parts`` parts, written as the partition command
    writes it (in this process, which has imported everything already: a fresh interpreter
    would add its imports to every job) unless a finished one is there; returns it."""
    from ..partition import partition

    folder = partition_dir(out, job, parts)
    if (folder / "partition.json").is_file():
        return folder
    if folder.exists():  # unfinished: the partition command refuses a used folder
        shutil.rmtree(folder)
    overrides = job_overrides(settings, job.strategy, parts, job.nodes)
    log(f"partitioning {job.strategy} for P={parts} ({job.nodes:,} nodes)")
    try:
        partition(
            [f"paths.root={REPO}", *overrides, f"paths.cache_dir={out / 'cache'}"],
            folder,
            log=lambda *_: None,
        )
    except Exception as err:
        raise RuntimeError(f"partition command failed: {_last_line(str(err))}") from err
    return folder


def one_part_reference(settings: MemorySettings, job: Job, out: Path, log) -> Path | None:
    """The system's one-part directory of the job's graph (the whole graph in its format), or
    ``None`` when its config refuses one part (GraNNDIS: its servers must divide the world
    size); the halo share is then unknown, and said so."""
    try:
        compose_job(job_overrides(settings, job.strategy, 1, job.nodes), out)
    except (ConfigError, ValueError) as err:
        log(f"{job.strategy}: no one-part directory ({str(err).splitlines()[0]}): halo unknown")
        return None
    return ensure_partition(settings, job, 1, out, log)


def part_bytes(folder: Path) -> list[int]:
    """Bytes each rank of a partition directory maps, from ``partition.json``: its part's files
    and those of the shared groups its part lists (a rank's RSS counts shared pages whole)."""
    meta = json.loads((folder / "partition.json").read_text())
    shared = {
        name: sum(f["bytes"] for f in group["files"].values())
        for name, group in meta.get("shared", {}).items()
    }
    return [
        sum(f["bytes"] for f in part["files"].values())
        + sum(shared[name] for name in part.get("shared", ()))
        for part in meta["parts"]
    ]


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def run_job(job: Job, settings: MemorySettings, out: Path, extra: list[str]) -> dict:
    """Run one ``train.py`` job, sampling its process tree; its memory record."""
    run_dir = out / "runs" / job.name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    log_path = out / "logs" / f"{job.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        str(TRAIN_PY),
        *job.overrides,
        *extra,
        f"paths.cache_dir={out / 'cache'}",
        f"hydra.run.dir={run_dir}",
    ]
    start = time.perf_counter()
    with open(log_path, "w") as log_file:
        # the job's own process tree is what is measured: never one handed to a warm server
        env = {**os.environ, DISABLE_ENV: "0"}
        proc = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO, env=env
        )
        sampler = TreeSampler(proc.pid)
        timed_out = False
        try:
            while proc.poll() is None:
                sampler.sample()
                if time.perf_counter() - start > settings.timeout_s:
                    proc.kill()  # its ranks die with it (their death signal)
                    timed_out = True
                    break
                time.sleep(settings.interval_s)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    record = sampled_record(sampler)
    record.update(wall_s=time.perf_counter() - start, returncode=proc.returncode, log=str(log_path))
    summary_path = run_dir / "summary.json"
    if proc.returncode == 0 and summary_path.is_file():
        record["summary"] = summary_extract(json.loads(summary_path.read_text()))
        record["status"] = "ok"
    else:
        record["status"] = "failed"
        if timed_out:
            record["message"] = f"stopped after --timeout {settings.timeout_s:g} s"
        elif proc.returncode < 0:
            record["message"] = f"killed by signal {-proc.returncode}"
        else:
            record["message"] = _last_line(log_path.read_text()) or f"exit {proc.returncode}"
    return record


def summary_extract(summary: dict) -> dict:
    """What the bench keeps of a job's ``summary.json``: the run's own memory figures, the data
    a system replicates by design where its report states it (SANCUS's staleness caches,
    ``system.cache_bytes_by_rank``) and its prefetch budget (ByteGNN's
    ``system.prefetch_budget_bytes``)."""
    keep = ("world_size", "peak_rss_mb", "launcher_peak_rss_mb", "rank_server_peak_rss_mb")
    extract = {k: summary.get(k) for k in (*keep, "train_time_s")}
    system = summary.get("system") or {}
    extract["replicated_bytes_by_rank"] = system.get("cache_bytes_by_rank")
    extract["prefetch_budget_bytes"] = system.get("prefetch_budget_bytes")
    return extract


def sampled_record(sampler: TreeSampler) -> dict:
    """What a job's samples say: the launcher's, the rank server's and each rank's peaks, and
    the node total. A one-process job's launcher is its rank."""
    launcher = sampler.by_role("launcher")
    server = sampler.by_role("rank server")
    ranks = sampler.by_role("rank") or launcher
    return {
        "samples": sampler.samples,
        "launcher_peak_rss_mb": launcher[0].peak_rss_mb if launcher else None,
        "rank_server_peak_rss_mb": server[0].peak_rss_mb if server else None,
        "rank_peak_rss_mb": [p.peak_rss_mb for p in ranks],
        "rank_peak_pss_mb": [p.peak_pss_mb for p in ranks],
        "node_peak_pss_mb": sampler.peak_pss_total_mb,
        "processes": {str(p.pid): asdict(p) for p in sampler.processes.values()},
    }


def run_memory(
    settings: MemorySettings,
    out: Path,
    argv: list[str],
    jobs: list[Job] | None = None,
    *,
    fresh: bool = False,
) -> dict:
    """Run every job (``jobs``: :func:`plan_jobs`' plan, made here when not given) that
    ``out`` does not already hold finished with the same command (all of them if ``fresh``);
    write ``memory.json``, ``memory.md`` and (matplotlib) ``memory.png``."""
    out = out.resolve()
    if fresh:
        shutil.rmtree(out / "kept", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    jobs = plan_jobs(settings, out) if jobs is None else jobs
    todo = [j for j in jobs if j.status == "planned"]

    def log(text: str) -> None:
        print(f"[bench memory] {text}", flush=True)

    log(f"{len(todo)} jobs ({len(jobs) - len(todo)} refused by their config), writing into {out}")

    def results_of(records: dict) -> dict:
        return {
            "command": command_line(argv),
            "environment": environment(),
            "load_average": os.getloadavg(),
            "settings": asdict(settings),
            "targets": {"launcher_mb": LAUNCHER_TARGET_MB, "tolerance": TOLERANCE},
            "jobs": [{**asdict(j), "record": records.get(j.name)} for j in jobs],
            "halo": halo,
            "rows": [],
            "wall_s": time.perf_counter() - started,
        }

    records: dict[str, dict] = {}
    halo: dict[str, dict] = {}
    for i, job in enumerate(todo, 1):
        prefix = f"{i}/{len(todo)} {job.strategy} P={job.parts} {job.kind} ({job.source})"
        extra: list[str] = []
        try:
            if job.source == "partition_dir":
                folder = ensure_partition(settings, job, job.parts, out, log)
                extra.append(f"data.partition_dir={folder}")
                if job.kind == "graph":  # the tiny graph's runtime has no halo term
                    reference = one_part_reference(settings, job, out, log)
                    whole = part_bytes(reference) if reference is not None else None
                    halo[job.name] = halo_share(part_bytes(folder), whole, job.parts)
        except RuntimeError as err:
            records[job.name] = {"status": "failed", "message": str(err)}
            log(f"{prefix}: failed: {err}")
            continue
        kept = kept_record(job, settings, out, extra)
        if kept is not None:
            records[job.name] = kept
            log(f"{prefix}: kept from an earlier run of the same command ({kept_path(out, job)})")
            continue
        log(f"{prefix}: training ...")
        record = run_job(job, settings, out, extra)
        records[job.name] = record
        record["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if record["status"] == "ok":
            write_json_atomic(
                kept_path(out, job), {"command": job_key(job, settings, extra), **record}
            )
        # so far: an interrupted bench leaves its finished jobs (``--report-only`` shows them)
        write_json_atomic(out / "memory.json", results_of(records))
        if record["status"] == "ok":
            log(
                f"{prefix}: rank peak {largest_rank_peak(record):.0f} MB, launcher "
                f"{record['launcher_peak_rss_mb']:.0f} MB, node PSS "
                f"{record['node_peak_pss_mb']:.0f} MB ({record['wall_s']:.0f} s)"
            )
        else:
            log(f"{prefix}: failed: {record['message']}")
    return write_report(results_of(records), out, log)


def kept_path(out: Path, job: Job) -> Path:
    return out / "kept" / f"{job.name}.json"


def job_key(job: Job, settings: MemorySettings, extra: list[str]) -> dict:
    """What a finished job's record is valid for: its overrides, the sampling period and the
    digest of the partition directory it trained from (a rebuilt directory is another job)."""
    digests = [
        json.loads((Path(e.split("=", 1)[1]) / "partition.json").read_text())["blake2b"]
        for e in extra
        if e.startswith("data.partition_dir=")
    ]
    return {
        "overrides": [*job.overrides, *extra],
        "interval_s": settings.interval_s,
        "partition_digests": digests,
    }


def kept_record(job: Job, settings: MemorySettings, out: Path, extra: list[str]) -> dict | None:
    """A finished job's record from an earlier bench into the same ``--out`` with the same
    command (an interrupted or extended bench runs only what is missing; ``--fresh`` runs
    everything again)."""
    path = kept_path(out, job)
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    if record.pop("command", None) != job_key(job, settings, extra):
        return None
    return {**record, "kept": True}


def write_report(results: dict, out: Path, log) -> dict:
    """The rows of ``results``' jobs; ``memory.json``, ``memory.md`` and ``memory.png``."""
    jobs = [Job(**{k: v for k, v in j.items() if k != "record"}) for j in results["jobs"]]
    records = {job.name: j["record"] for job, j in zip(jobs, results["jobs"]) if j["record"]}
    results["rows"] = rows = assemble_rows(jobs, records, results["halo"])
    png = plot_memory(rows, out / "memory.png")
    results["png"] = str(png) if png else None
    write_json_atomic(out / "memory.json", results)
    markdown = memory_markdown(results)
    (out / "memory.md").write_text(markdown)
    print(markdown, flush=True)
    log(f"wrote {out / 'memory.md'}, memory.json{' and memory.png' if png else ''}")
    return results


def rebuild_report(out: Path) -> dict:
    """The report of an earlier ``bench memory`` in ``out`` again, from its ``memory.json`` and
    its jobs' ``summary.json`` files (``--report-only``): nothing runs."""
    out = out.resolve()
    results = json.loads((out / "memory.json").read_text())
    for job in results["jobs"]:
        record = job["record"]
        name = f"{job['strategy']}-P{job['parts']}-{job['kind']}"
        summary = out / "runs" / name / "summary.json"
        if record and record.get("status") == "ok" and summary.is_file():
            record["summary"] = summary_extract(json.loads(summary.read_text()))
    return write_report(results, out, lambda text: print(f"[bench memory] {text}", flush=True))


def halo_share(parts: list[int], whole: list[int] | None, num_parts: int) -> dict:
    """The halo / replication share of a partition: the largest part's bytes beyond 1/P of the
    one-part directory's (MiB), with both sizes; ``None`` without a one-part directory."""
    largest = max(parts) / 2**20
    if whole is None:
        return {"largest_part_mb": largest, "whole_mb": None, "share_mb": None}
    whole_mb = sum(whole) / 2**20
    return {
        "largest_part_mb": largest,
        "whole_mb": whole_mb,
        "share_mb": max(0.0, largest - whole_mb / num_parts),
    }


def _ok(records: dict, job: Job | None) -> dict | None:
    if job is None:
        return None
    record = records.get(job.name)
    return record if record and record.get("status") == "ok" else None


def largest_rank_peak(record: dict) -> float:
    """The largest rank's peak RSS: sampled, or the ranks' own (``summary.json``'s
    ``peak_rss_mb``, their ``VmHWM`` at the epoch's end) where the last sample came earlier."""
    reported = (record.get("summary") or {}).get("peak_rss_mb")
    return max(max(record["rank_peak_rss_mb"]), reported or 0.0)


def assemble_rows(jobs: list[Job], records: dict, halo: dict) -> list[dict]:
    """One row per (system, P) of the graph: the measured peaks, the ratio to single's node
    total and the target's terms. Pure: reads only its arguments."""
    find = {(j.strategy, j.parts, j.kind): j for j in jobs}
    single = _ok(records, find.get((REFERENCE, 1, "graph")))
    single_rt = _ok(records, find.get((REFERENCE, 1, "runtime")))
    single_graph = (
        largest_rank_peak(single) - largest_rank_peak(single_rt) if single and single_rt else None
    )
    rows = []
    for job in jobs:
        if job.kind != "graph":
            continue
        row = {
            "strategy": job.strategy,
            "parts": job.parts,
            "source": job.source,
            "status": job.status,
            "message": job.message,
        }
        rows.append(row)
        record = records.get(job.name)
        if job.status == "refused" or record is None:
            continue
        row["status"] = record.get("status", "failed")
        if row["status"] != "ok":
            row["message"] = record.get("message", "")
            continue
        runtime = _ok(records, find.get((job.strategy, job.parts, "runtime")))
        share = halo.get(job.name)
        summary = record.get("summary") or {}
        replicated = summary.get("replicated_bytes_by_rank")
        prefetch = summary.get("prefetch_budget_bytes")
        rank_peak = largest_rank_peak(record)
        row.update(
            rank_peak_rss_mb=rank_peak,
            rank_peak_rss_min_mb=min(record["rank_peak_rss_mb"]),
            launcher_peak_rss_mb=record["launcher_peak_rss_mb"],
            launcher_summary_mb=summary.get("launcher_peak_rss_mb"),
            rank_server_peak_rss_mb=record["rank_server_peak_rss_mb"],
            node_peak_pss_mb=record["node_peak_pss_mb"],
            ratio_to_single=record["node_peak_pss_mb"] / single["node_peak_pss_mb"]
            if single
            else None,
            graph_share_mb=None if single_graph is None else single_graph / job.parts,
            halo_share_mb=share["share_mb"] if share else None,
            replicated_mb=max(replicated) / 2**20 if replicated else None,
            prefetch_mb=prefetch / 2**20 if prefetch else None,
            runtime_mb=largest_rank_peak(runtime) if runtime else None,
            runtime_launcher_mb=runtime["launcher_peak_rss_mb"] if runtime else None,
        )
        terms = (row["graph_share_mb"], row["runtime_mb"])
        if None not in terms:
            held = ("halo_share_mb", "replicated_mb", "prefetch_mb")
            target = sum(terms) + sum(row[k] or 0.0 for k in held)
            row["target_mb"] = target
            row["over_target_mb"] = rank_peak - target
            row["rank_meets"] = rank_peak <= target * (1 + TOLERANCE)
        if job.source == "partition_dir" and job.parts > 1:  # at P = 1 the launcher is the rank
            launcher, tiny = row["launcher_peak_rss_mb"], row["runtime_launcher_mb"]
            row["launcher_meets"] = launcher <= LAUNCHER_TARGET_MB and (
                tiny is None or launcher <= tiny * (1 + TOLERANCE)
            )
    return rows


def _mb(value: float | None) -> str:
    """MiB to 3 significant digits, whole MiB from 100 on (``1e+03`` is no table cell)."""
    return fmt(value, 3) if value is None or abs(value) < 100 else f"{value:.0f}"


def _halo_cell(row: dict) -> str:
    """The halo share (partition metadata), and the replicated data and the prefetch budget
    the run reports."""
    cell = _mb(row.get("halo_share_mb"))
    for key, label in (("replicated_mb", "cache"), ("prefetch_mb", "prefetch")):
        if row.get(key) is not None:
            cell += f" + {_mb(row[key])} {label}"
    return cell


def _yes(value) -> str:
    return "-" if value is None else ("yes" if value else "**no**")


def memory_table(rows: list[dict]) -> list[str]:
    """The markdown table: measured peaks, node total, ratio, the terms and the verdicts."""
    headers = [
        "system",
        "P",
        "source",
        "rank peak RSS, max (min)",
        "launcher peak RSS (tiny graph)",
        "rank server peak RSS",
        "node PSS",
        "× single",
        "graph share",
        "halo / repl. share",
        "runtime",
        "target",
        "rank − target",
        "rank meets",
        "launcher meets",
    ]
    lines = []
    for r in rows:
        head = [r["strategy"], str(r["parts"]), r["source"]]
        if r["status"] != "ok":
            lines.append([*head, f"{r['status']}: {r['message'][:120]}", *[""] * 11])
            continue
        lines.append(
            [
                *head,
                f"{r['rank_peak_rss_mb']:.0f} ({r['rank_peak_rss_min_mb']:.0f})",
                f"{r['launcher_peak_rss_mb']:.0f} ({_mb(r['runtime_launcher_mb'])})",
                _mb(r["rank_server_peak_rss_mb"]),
                f"{r['node_peak_pss_mb']:.0f}",
                "-" if r["ratio_to_single"] is None else f"{r['ratio_to_single']:.2f}",
                _mb(r["graph_share_mb"]),
                _halo_cell(r),
                _mb(r["runtime_mb"]),
                _mb(r.get("target_mb")),
                "-" if r.get("over_target_mb") is None else f"{r['over_target_mb']:+.0f}",
                _yes(r.get("rank_meets")),
                _yes(r.get("launcher_meets")),
            ]
        )
    return markdown_table(headers, lines)


def memory_markdown(results: dict) -> str:
    s = results["settings"]
    load = ", ".join(f"{x:.2f}" for x in results["load_average"])
    return "\n".join(
        [
            f"# bench memory: sbm {s['nodes']:,} nodes × {s['features']} features "
            f"(runtime: {s['runtime_nodes']:,} nodes), {s['steps']} training steps per job, "
            + ("then validation and test" if s.get("evaluation", False) else "without evaluation"),
            "",
            "Command:",
            "",
            f"    {results['command']}",
            "",
            *environment_lines(results["environment"]),
            f"- load average at the end (1, 5, 15 min): {load}; bench wall time "
            f"{results['wall_s']:.0f} s",
            "",
            "MB = MiB. Peak RSS: `VmHWM` of each process (launcher: `train.py`; rank server: "
            "the forkserver the ranks fork from; a one-process job's launcher is its rank). "
            "Node PSS: the largest sum of PSS over the job's processes while sampling "
            f"(every {s['interval_s']} s), shared pages counted once. × single: node PSS over "
            "`single`'s. Graph share: (single's peak − single's peak on the tiny graph) / P. "
            "Halo / repl. share: the largest rank's mapped bytes (its part and the shared groups "
            "it lists) beyond 1/P of the one-part directory's (partition directories only; '-' "
            "in memory or where the system refuses one part, counted 0), plus what the run "
            "reports it holds by design: `cache` (SANCUS's staleness caches) and `prefetch` "
            "(ByteGNN's prefetch budget). Rank peaks: sampled, or the ranks' own `summary.json` "
            "peak where larger (a short job can end between samples). Runtime: the "
            "system's rank peak on the "
            f"tiny graph at the same P. Target: graph share + halo share + runtime, met within "
            f"{TOLERANCE:.0%}; launcher (partition_dir, P > 1; at P = 1 it is the rank): "
            f"≤ {LAUNCHER_TARGET_MB:.0f} MB and "
            f"within {TOLERANCE:.0%} of its tiny-graph peak.",
            "",
            *memory_table(results["rows"]),
            "",
            f"PNG: `{Path(results['png']).name}`"
            if results.get("png")
            else "PNG: skipped (matplotlib is not importable).",
            "",
        ]
    )


def plot_memory(rows: list[dict], path: Path) -> Path | None:
    """Per system against P: the largest rank's peak RSS (solid) with its target (dotted), and
    the node PSS total (right); ``None`` without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(11, 4.5))
    rank_ax, node_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        ok = [r for r in rows if r["strategy"] == strategy and r["status"] == "ok"]
        if not ok:
            continue
        ps = [r["parts"] for r in ok]
        line = rank_ax.plot(ps, [r["rank_peak_rss_mb"] for r in ok], "o-", label=strategy)[0]
        targets = [(r["parts"], r["target_mb"]) for r in ok if r.get("target_mb") is not None]
        if targets:
            rank_ax.plot(*zip(*targets), ":", color=line.get_color())
        node_ax.plot(ps, [r["node_peak_pss_mb"] for r in ok], "o-", label=strategy)
    for ax, title in (
        (rank_ax, "largest rank's peak RSS (MiB); dotted: target"),
        (node_ax, "node total, PSS over the job's processes (MiB)"),
    ):
        ax.set_xlabel("P (ranks)")
        ax.set_xticks(sorted({r["parts"] for r in rows}))
        ax.set_title(title, fontsize="medium")
    node_ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    return path
