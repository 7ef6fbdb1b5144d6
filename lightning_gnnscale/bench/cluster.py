"""``bench cluster``: each system against its own baseline, measured over an emulated cluster.

Every run is one ``train.py`` job on 2 emulated hosts (:mod:`lightning_gnnscale.cluster`:
network namespaces on a bridge, each host's egress shaped with ``tbf``), 1 rank per host (2 for
GraNNDIS, which needs workers inside a server), on the same ``sbm`` graph, model and steps, at
each link rate. Per run it reads the training part of each epoch after the warm-up
(``summary.json`` ``history[].train_epoch_s``; evaluation excluded) and takes the median, and
the modelled communication time of the same epochs at the same rate (``modeled_comm_time_s``
under the ``network`` profile of that rate: ``100mbe``, ``1gbe``; ``10gbe`` for the unshaped
link). Speed-up = baseline time / system time, at the same rate. Beside it, the whole-run
speed-up from the fit's ``train_time_s`` per epoch (warm-up and evaluation included): a system
that prefetches batches in its first epoch (ByteGNN) looks faster in the steady epochs than
over the run, and only the whole-run figure counts that work.

Each run's ``summary.json`` is kept under ``--out/runs/<run>/``; a run already there (same
settings) is read back instead of run again, so an interrupted bench resumes. A run that fails
is reported with its reason and does not stop the bench.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..cluster import ClusterJob, ClusterJobFailed, run_job
from ..cluster.job import host_cpus
from ..errors import ConfigError
from ..files import write_json_atomic
from ..systems.registry import SYSTEMS
from ..systems.spec import SystemSpec
from .report import command_line, environment, environment_lines, fmt, markdown_table

UNLIMITED = None
RATE_PROFILES = {None: "10gbe", 1000.0: "1gbe", 100.0: "100mbe"}


def _variants() -> dict[str, tuple[SystemSpec, tuple[str, ...]]]:
    """Every variant a pair may name -> its spec and train.py overrides: each strategy name,
    and the further variants its spec declares (``bench_variants``)."""
    variants = {}
    for name, spec in SYSTEMS.items():
        variants[name] = (spec, (f"strategy={name}",))
        for label, overrides in spec.bench_variants:
            variants[label] = (spec, (f"strategy={name}", *overrides))
    return variants


VARIANTS = _variants()
# (system, baseline): each system against what it exists to beat (its spec's bench_baseline)
PAIRS: tuple[tuple[str, str], ...] = tuple(
    (name, spec.bench_baseline) for name, spec in SYSTEMS.items() if spec.bench_baseline
)
# the variants whose runs differ from the bench's own: ranks per host, model
RANKS_PER_HOST = {v: s.ranks_per_host for v, (s, _) in VARIANTS.items() if s.ranks_per_host != 1}
MODEL_OF = {v: s.bench_model for v, (s, _) in VARIANTS.items() if s.bench_model}


@dataclass(frozen=True)
class ClusterBenchConfig:
    pairs: tuple[tuple[str, str], ...] = PAIRS
    rates: tuple[float | None, ...] = (UNLIMITED, 1000.0, 100.0)
    hosts: int = 2
    nodes: int = 20_000
    model: str = "sage"
    epochs: int = 4
    warmup: int = 1
    seed: int = 0
    timeout_s: float = 900.0
    overrides: tuple[str, ...] = ()
    task: str = "node_classification"


def rate_label(rate: float | None) -> str:
    return "unlimited" if rate is None else f"{rate:g} Mbit/s"


def run_name(variant: str, rate: float | None) -> str:
    slug = variant.replace(" (", "_").replace(")", "").replace(" ", "_")
    return f"{slug}@{'unlimited' if rate is None else f'{rate:g}mbit'}"


def variant_overrides(settings: ClusterBenchConfig, variant: str, rate, out: Path) -> list:
    return [
        *VARIANTS[variant][1],
        f"model={MODEL_OF.get(variant, settings.model)}",
        "dataset=sbm",
        f"dataset.num_nodes={settings.nodes}",
        f"trainer.devices={RANKS_PER_HOST.get(variant, 1)}",
        f"trainer.max_epochs={settings.epochs}",
        f"seed={settings.seed}",
        f"task={settings.task}",
        f"network={RATE_PROFILES[rate]}",
        "trainer.enable_progress_bar=false",
        "logger=none",
        f"launcher.timeout_s={settings.timeout_s}",
        f"paths.cache_dir={out / 'cache'}",
        *settings.overrides,
    ]


def epoch_time(summary: dict, warmup: int) -> float | None:
    """Median training time of the epochs after ``warmup`` (all epochs if there are no more)."""
    times = [row["train_epoch_s"] for row in summary["history"] if row.get("train_epoch_s")]
    kept = times[warmup:] or times
    return statistics.median(kept) if kept else None


def run_epoch_time(summary: dict) -> float:
    """The fit's time per epoch, everything included (``train_time_s`` / epochs)."""
    return summary["train_time_s"] / summary["epochs"]


def measure(settings: ClusterBenchConfig, variant: str, rate, out: Path) -> dict:
    """One run (or its kept result): time per epoch, modelled comm time, bytes, or the error."""
    run_dir = out / "runs" / run_name(variant, rate)
    overrides = variant_overrides(settings, variant, rate, out)
    cores = host_cpus(settings.hosts)
    record_path = run_dir / "record.json"
    if record_path.exists():
        record = json.loads(record_path.read_text())
        summary_path = run_dir / "job" / "summary.json"
        if "run_epoch_s" not in record and not record.get("error") and summary_path.is_file():
            # recorded before the whole-run figure existed: its kept summary.json has it
            summary = json.loads(summary_path.read_text())
            if summary.get("epochs"):
                record["run_epoch_s"] = run_epoch_time(summary)
                write_json_atomic(record_path, record)
        complete = "run_epoch_s" in record or record.get("error")  # a failure is kept too
        same = record.get("overrides") == overrides and record.get("host_cpus") == cores
        if same and complete:  # a run from before hosts had cores of their own is run again
            print(f"[bench cluster] {variant} @ {rate_label(rate)}: kept from {run_dir}")
            return record
    print(f"[bench cluster] {variant} @ {rate_label(rate)} ...", flush=True)
    shutil.rmtree(run_dir / "job", ignore_errors=True)  # an interrupted attempt's files
    started = time.monotonic()
    record = {"variant": variant, "rate_mbit": rate, "overrides": overrides, "host_cpus": cores}
    try:
        job = ClusterJob(
            settings.hosts, rate, overrides, run_dir=run_dir / "job", timeout_s=settings.timeout_s
        )
        job.echo = False
        [summary] = run_job(job)
        record.update(
            epoch_s=epoch_time(summary, settings.warmup),
            run_epoch_s=run_epoch_time(summary),
            modeled_comm_s=summary["modeled_comm_time_s"],
            inter_server_mb=summary["inter_server_bytes_per_epoch"] / 1e6,
            world_size=summary["world_size"],
            epochs=summary["epochs"],
            train_loss=summary["train_loss"],
            error=None,
        )
    except (ClusterJobFailed, TimeoutError, ConfigError) as err:
        record.update(error=_reason(str(err)))
    record["wall_s"] = time.monotonic() - started
    state = f"{fmt(record.get('epoch_s'))} s/epoch" if not record["error"] else record["error"]
    print(f"[bench cluster] {variant} @ {rate_label(rate)}: {state} ({record['wall_s']:.0f} s)")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(record_path, record)
    return record


def _reason(message: str) -> str:
    """The first line of a failure and the last error line of its log."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    detail = errors[-1] if errors else ""
    return f"{lines[0]}: {detail}" if detail and detail != lines[0] else lines[0]


def run_cluster_bench(settings: ClusterBenchConfig, out: Path, argv: list[str]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    variants = list(dict.fromkeys(v for pair in settings.pairs for v in pair))
    records = {
        (variant, rate): measure(settings, variant, rate, out)
        for variant in variants
        for rate in settings.rates
    }
    rows = []
    for system, baseline in settings.pairs:
        for rate in settings.rates:
            sys_rec, base_rec = records[(system, rate)], records[(baseline, rate)]
            ok = not sys_rec["error"] and not base_rec["error"]
            rows.append(
                {
                    "system": system,
                    "baseline": baseline,
                    "rate_mbit": rate,
                    "system_epoch_s": sys_rec.get("epoch_s"),
                    "baseline_epoch_s": base_rec.get("epoch_s"),
                    "speedup": base_rec["epoch_s"] / sys_rec["epoch_s"] if ok else None,
                    "system_run_epoch_s": sys_rec.get("run_epoch_s"),
                    "baseline_run_epoch_s": base_rec.get("run_epoch_s"),
                    "run_speedup": base_rec["run_epoch_s"] / sys_rec["run_epoch_s"] if ok else None,
                    "system_modeled_comm_s": sys_rec.get("modeled_comm_s"),
                    "baseline_modeled_comm_s": base_rec.get("modeled_comm_s"),
                    "system_inter_mb": sys_rec.get("inter_server_mb"),
                    "baseline_inter_mb": base_rec.get("inter_server_mb"),
                    "error": sys_rec["error"] or base_rec["error"],
                }
            )
    result = {
        "command": command_line(argv),
        "environment": environment(),
        "settings": asdict(settings),
        "bench_wall_s": time.monotonic() - started,
        "runs": [records[key] for key in records],
        "rows": rows,
    }
    write_json_atomic(out / "cluster.json", result)
    text = "\n".join(report_lines(result, rows, settings))
    (out / "cluster.md").write_text(text + "\n")
    _plot(rows, settings, out / "cluster.png")
    print(text)
    return result


def _predicted(rows: list[dict], row: dict, who: str) -> float | None:
    """Measured unlimited epoch + modelled comm at this rate - modelled comm unshaped."""
    base = next(
        (
            r
            for r in rows
            if r["system"] == row["system"] and r["rate_mbit"] is None and not r["error"]
        ),
        None,
    )
    if base is None or row["error"]:
        return None
    return base[f"{who}_epoch_s"] + row[f"{who}_modeled_comm_s"] - base[f"{who}_modeled_comm_s"]


def report_lines(result: dict, rows: list[dict], settings: ClusterBenchConfig) -> list[str]:
    table = []
    for row in rows:
        if row["error"]:
            cells = ["failed: " + row["error"].replace("|", "/")] + ["-"] * 7
        else:
            predicted = (_predicted(rows, row, "system"), _predicted(rows, row, "baseline"))
            cells = [
                fmt(row["system_epoch_s"], 3),
                fmt(row["baseline_epoch_s"], 3),
                f"**{row['speedup']:.2f}x**",
                f"{fmt(row['system_run_epoch_s'], 3)} / {fmt(row['baseline_run_epoch_s'], 3)}",
                f"**{row['run_speedup']:.2f}x**",
                f"{fmt(predicted[0], 3)} / {fmt(predicted[1], 3)}",
                f"{fmt(row['system_modeled_comm_s'], 3)} / "
                f"{fmt(row['baseline_modeled_comm_s'], 3)}",
                f"{fmt(row['system_inter_mb'], 3)} / {fmt(row['baseline_inter_mb'], 3)}",
            ]
        table.append([row["system"], row["baseline"], rate_label(row["rate_mbit"]), *cells])
    ranks = ", ".join(f"{v}: {n}" for v, n in RANKS_PER_HOST.items())
    models = ", ".join(f"{v}: {m}" for v, m in MODEL_OF.items())
    return [
        "# bench cluster: measured time per epoch over an emulated 2-host cluster",
        "",
        f"Command: `{result['command']}` (total {result['bench_wall_s'] / 60:.1f} min)",
        "",
        *environment_lines(result["environment"]),
        "",
        f"task {settings.task}, sbm, {settings.nodes} nodes, model {settings.model} ({models}), "
        f"{settings.epochs} epochs, "
        f"seed {settings.seed}; {settings.hosts} hosts x 1 rank ({ranks} ranks per host), "
        f"cores per host (taskset): {host_cpus(settings.hosts)} (docs/cluster.md). "
        f"Epoch time: median of the training part of epochs {settings.warmup + 1}.."
        f"{settings.epochs} (epoch 1 is warm-up; evaluation excluded). Speed-up = baseline / "
        f"system at the same rate. Whole run: the fit's train_time_s / epochs (warm-up, "
        f"evaluation and any prefetching included), and its speed-up. "
        f"Predicted = measured unlimited epoch + modelled comm at the "
        f"rate - modelled comm at 10 GbE (the model's own error shows against the measured). "
        f"Modelled comm: bytes / link rate + messages x 20 us, max over ranks. MB: bytes "
        f"crossing hosts per epoch, all ranks.",
        "",
        *markdown_table(
            [
                "system",
                "baseline",
                "link",
                "system s/epoch",
                "baseline s/epoch",
                "speed-up",
                "whole run s/epoch (sys / base)",
                "speed-up (whole run)",
                "predicted s/epoch (sys / base)",
                "modelled comm s (sys / base)",
                "inter-host MB/epoch (sys / base)",
            ],
            table,
        ),
    ]


def _plot(rows: list[dict], settings: ClusterBenchConfig, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench cluster] matplotlib not importable: no cluster.png")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    positions = {rate: i for i, rate in enumerate(settings.rates)}
    for system, baseline in settings.pairs:
        points = [
            (positions[r["rate_mbit"]], r["speedup"])
            for r in rows
            if r["system"] == system and r["speedup"] is not None
        ]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", label=f"{system} vs {baseline}")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(settings.rates)), [rate_label(r) for r in settings.rates])
    ax.set_xlabel("link rate per host (tbf egress)")
    ax.set_ylabel("speed-up over baseline (measured s/epoch)")
    ax.set_title(f"bench cluster: {settings.hosts} emulated hosts, sbm {settings.nodes} nodes")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _rates(text: str) -> tuple[float | None, ...]:
    from ..cluster.__main__ import parse_rate

    return tuple(parse_rate(part.strip()) for part in text.split(","))


def add_cluster_parser(commands) -> None:
    """The ``cluster`` subcommand of ``python -m lightning_gnnscale.bench``."""
    cluster = commands.add_parser(
        "cluster",
        help="each system against its baseline, measured over emulated hosts with shaped links",
        description="Run each system and its baseline on the same graph and steps over 2 "
        "emulated hosts (network namespaces, tbf) at each link rate; write cluster.md, "
        "cluster.json and cluster.png into --out. Needs root (docs/cluster.md).",
    )
    names = [f"{s}:{b}" for s, b in PAIRS]
    cluster.add_argument(
        "--pairs",
        default="all",
        help=f"comma-separated system:baseline pairs, or all (default); valid: {','.join(names)}",
    )
    cluster.add_argument(
        "--rates",
        type=_rates,
        default=(UNLIMITED, 1000.0, 100.0),
        help="comma-separated Mbit/s or 'unlimited' (default: unlimited,1000,100)",
    )
    cluster.add_argument("--nodes", type=int, default=20_000, help="sbm nodes (default 20000)")
    cluster.add_argument("--model", default="sage", help="model config group (default: sage)")
    cluster.add_argument("--epochs", type=int, default=4, help="epochs per run (default 4)")
    cluster.add_argument(
        "--warmup", type=int, default=1, help="epochs left out of the median (default 1)"
    )
    cluster.add_argument("--seed", type=int, default=0, help="seed of every run (default 0)")
    cluster.add_argument(
        "--task",
        default="node_classification",
        help="what every run trains (default node_classification; e.g. link_prediction)",
    )
    cluster.add_argument(
        "--timeout-s", type=float, default=900.0, help="per-run time-out (default 900)"
    )
    cluster.add_argument(
        "--out", type=Path, default=Path("results/cluster"), help="output directory"
    )
    cluster.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra train.py override for every run (repeatable)",
    )


def run_cluster_command(parser, args, argv: list[str]) -> int:
    """Check ``bench cluster``'s arguments and the machine, then run it."""
    from ..cluster import ClusterUnavailable, preflight

    by_name = {f"{s}:{b}": (s, b) for s, b in PAIRS}
    if args.pairs == "all":
        pairs = PAIRS
    else:
        unknown = [p for p in args.pairs.split(",") if p not in by_name]
        if unknown:
            parser.error(f"--pairs: unknown {unknown}; valid: {','.join(by_name)}")
        pairs = tuple(by_name[p] for p in args.pairs.split(","))
    from ..tasks import TASKS

    if args.task not in TASKS:
        parser.error(f"--task {args.task!r}: unknown; valid: {sorted(TASKS)}")
    unable = sorted({v for pair in pairs for v in pair if args.task not in VARIANTS[v][0].tasks})
    if unable:
        parser.error(f"--task {args.task}: {unable} do not train it; pick --pairs without them")
    if args.nodes < 100 or args.epochs < 1 or not 0 <= args.warmup < args.epochs:
        parser.error("need --nodes >= 100, --epochs >= 1 and 0 <= --warmup < --epochs")
    if args.timeout_s <= 0:
        parser.error(f"--timeout-s {args.timeout_s} must be > 0")
    try:
        preflight(100.0 if any(args.rates) else None)
    except ClusterUnavailable as err:
        parser.error(str(err))
    settings = ClusterBenchConfig(
        pairs=pairs,
        rates=args.rates,
        nodes=args.nodes,
        model=args.model,
        epochs=args.epochs,
        warmup=args.warmup,
        seed=args.seed,
        timeout_s=args.timeout_s,
        overrides=tuple(args.override),
        task=args.task,
    )
    run_cluster_bench(settings, args.out.resolve(), argv)
    return 0
