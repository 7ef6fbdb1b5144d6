"""``bench compare``: train several strategies on the same data and seed, side by side.

Each strategy is one ``train(cfg)`` call with a config composed from ``conf/`` exactly as
``train.py`` would compose it, plus the bench's shared settings (dataset, model, epochs, seed,
partition cache). All configs are composed and validated before the first run starts, so a bad
override fails in seconds rather than after an hour of training.
"""

from __future__ import annotations

import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from ..comm import CATEGORIES
from ..files import write_json_atomic
from ..preflight import validate
from ..run import train
from .report import command_line, environment, environment_lines, fmt, markdown_table

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

# Their yaml pins trainer.devices=1; overriding it would make the config invalid.
SINGLE_PROCESS_STRATEGIES = frozenset({"single"})

MB = 1e6


def compose_configs(
    strategies: list[str],
    *,
    model: str,
    dataset: str,
    epochs: int,
    devices: int,
    seed: int,
    overrides: list[str],
    out: Path,
    cache_dir: Path,
) -> dict[str, DictConfig]:
    """One validated run config per strategy; raises before any training on a bad setting.

    The user's ``overrides`` come last, so they win over the bench's own choices; the ``paths``
    keys are set by the bench (``${hydra:...}`` interpolations do not resolve under compose).
    """
    configs = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for strategy in strategies:
            run_overrides = [
                f"strategy={strategy}",
                f"model={model}",
                f"dataset={dataset}",
                f"trainer.max_epochs={epochs}",
                f"seed={seed}",
                "logger=csv",
                "trainer.enable_progress_bar=false",
            ]
            if strategy not in SINGLE_PROCESS_STRATEGIES:
                run_overrides.append(f"trainer.devices={devices}")
            cfg = compose("config", overrides=run_overrides + overrides)
            cfg.paths.root = str(Path.cwd())
            cfg.paths.cache_dir = str(cache_dir)
            cfg.paths.output_dir = str(out / "runs" / strategy)
            validate(cfg)
            configs[strategy] = cfg
    return configs


def run_compare(configs: dict[str, DictConfig], baseline: str, out: Path, argv: list[str]) -> dict:
    """Train every config in turn, then write ``results.md``, ``results.json`` and the plots."""
    env = environment()  # the date is the start of the invocation
    summaries = {}
    for i, (strategy, cfg) in enumerate(configs.items(), 1):
        world = int(cfg.trainer.devices) * int(cfg.trainer.num_nodes)
        print(
            f"[bench compare {i}/{len(configs)}] {strategy}: {cfg.trainer.max_epochs} epochs on "
            f"{world} process(es) -> {cfg.paths.output_dir}",
            flush=True,
        )
        start = time.perf_counter()
        metrics, _ = train(cfg)
        if not metrics:
            raise RuntimeError(
                f"strategy={strategy} wrote no summary.json; bench compare runs "
                "every process on this machine (no multi-node launches)"
            )
        metrics["run_wall_s"] = time.perf_counter() - start
        summaries[strategy] = metrics
        print(
            f"[bench compare {i}/{len(configs)}] {strategy}: done in "
            f"{metrics['run_wall_s']:.1f} s, best val acc {fmt(metrics['best_val_acc'])}, "
            f"{fmt(sum(metrics['comm_bytes_per_epoch'].values()) / MB)} MB/epoch",
            flush=True,
        )

    out.mkdir(parents=True, exist_ok=True)
    results = {
        "command": command_line(argv),
        "environment": env,
        "baseline": baseline,
        "summaries": summaries,
    }
    write_json_atomic(str(out / "results.json"), results)
    (out / "results.md").write_text(results_markdown(summaries, baseline, results["command"], env))
    plot_accuracy_vs_time(summaries, out / "accuracy_vs_time.png")
    plot_bytes_by_category(summaries, out / "bytes_by_category.png")
    print(f"[bench compare] wrote {out / 'results.md'}, results.json and two plots", flush=True)
    return results


def _total_bytes(summary: dict) -> float:
    return float(sum(summary["comm_bytes_per_epoch"].values()))


def _ratio(value: float | None, base: float | None) -> str:
    """``value / base`` as ``1.23x``; ``-`` when undefined (missing value or zero baseline)."""
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def _delta(value: float | None, base: float | None) -> str:
    return "-" if value is None or base is None else f"{value - base:+.4f}"


def results_markdown(summaries: dict[str, dict], baseline: str, command: str, env: dict) -> str:
    """The human report: main table, bytes by category, ratios against the baseline."""
    network = next(iter(summaries.values()))["network"]
    main_rows = [
        [
            name,
            str(s["world_size"]),
            fmt(s["best_val_acc"]),
            fmt(s["test_acc"]),
            fmt(s["epoch_time_s"]),
            fmt(s["train_time_s"]),
            fmt(_total_bytes(s) / MB),
            fmt(s["inter_server_bytes_per_epoch"] / MB),
            fmt(s["modeled_comm_time_s"]),
            fmt(s["input_rows_per_epoch"]),
            fmt(s["peak_rss_mb"]),
        ]
        for name, s in summaries.items()
    ]
    category_rows = [
        [
            name,
            *(fmt(s["comm_bytes_per_epoch"].get(c, 0.0) / MB) for c in CATEGORIES),
            fmt(_total_bytes(s) / MB),
        ]
        for name, s in summaries.items()
    ]
    base = summaries[baseline]
    ratio_rows = [
        [
            name,
            _ratio(s["epoch_time_s"], base["epoch_time_s"]),
            _ratio(s["train_time_s"], base["train_time_s"]),
            _ratio(_total_bytes(s), _total_bytes(base)),
            _ratio(s["modeled_comm_time_s"], base["modeled_comm_time_s"]),
            _ratio(s["input_rows_per_epoch"], base["input_rows_per_epoch"]),
            _ratio(s["peak_rss_mb"], base["peak_rss_mb"]),
            _delta(s["best_val_acc"], base["best_val_acc"]),
            _delta(s["test_acc"], base["test_acc"]),
        ]
        for name, s in summaries.items()
    ]
    first = next(iter(summaries.values()))
    lines = [
        f"# bench compare: {first['model']} on {first['dataset']}, {first['epochs']} epochs",
        "",
        "Command:",
        "",
        f"    {command}",
        "",
        *environment_lines(env),
        "",
        "All figures are measured on this machine except the modelled communication time, which "
        f"is the counted bytes and messages put through the `{network}` network model (what the "
        "traffic would cost on that cluster network; not a measurement). Bytes are counted by "
        "the communication meter and summed over ranks. Test accuracy is taken at the epoch of "
        "best validation accuracy.",
        "",
        *markdown_table(
            [
                "strategy",
                "world size",
                "best val acc",
                "test acc",
                "epoch time, median (s)",
                "train time (s)",
                "comm MB/epoch (measured)",
                "inter-server MB/epoch (measured)",
                f"comm time/epoch, modelled {network} (s)",
                "input rows loaded/epoch (all ranks)",
                "peak RSS/process (MB, measured)",
            ],
            main_rows,
        ),
        "",
        "## Bytes per epoch by category (MB, measured)",
        "",
        *markdown_table(["strategy", *CATEGORIES, "total"], category_rows),
        "",
        f"## Relative to the baseline `{baseline}` (same invocation)",
        "",
        "Ratios are strategy / baseline (below 1x = less time, bytes or memory); accuracy "
        "columns are differences. `-` where the baseline value is zero or missing.",
        "",
        *markdown_table(
            [
                "strategy",
                "epoch time",
                "train time",
                "comm bytes",
                "modelled comm time",
                "input rows",
                "peak RSS",
                "best val acc (diff)",
                "test acc (diff)",
            ],
            ratio_rows,
        ),
        "",
    ]
    return "\n".join(lines)


def plot_accuracy_vs_time(summaries: dict[str, dict], path: Path) -> None:
    """Validation accuracy against cumulative epoch wall time, one line per strategy."""
    from matplotlib.figure import Figure  # only the plots need it (a slow import)

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    for name, s in summaries.items():
        points = [(r["elapsed_s"], r["val_acc"]) for r in s["history"] if r["val_acc"] is not None]
        if points:
            ax.plot(*zip(*points), marker="o", label=f"{name} (world {s['world_size']})")
    ax.set_xlabel("cumulative epoch wall time (s, measured)")
    ax.set_ylabel("validation accuracy")
    ax.set_title("Validation accuracy vs training time (measured)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=120)


def plot_bytes_by_category(summaries: dict[str, dict], path: Path) -> None:
    """Stacked bars of counted bytes per epoch by category, one bar per strategy."""
    from matplotlib.figure import Figure  # only the plots need it (a slow import)

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    names = list(summaries)
    bottom = [0.0] * len(names)
    for category in CATEGORIES:
        heights = [summaries[n]["comm_bytes_per_epoch"].get(category, 0.0) / MB for n in names]
        if any(heights):
            ax.bar(names, heights, bottom=bottom, label=category)
            bottom = [b + h for b, h in zip(bottom, heights)]
    if any(bottom):
        ax.legend()
    else:
        ax.bar(names, bottom)  # no traffic at all: still one (empty) slot per strategy
    for i, total in enumerate(bottom):
        ax.annotate(f"{total:.3g} MB", (i, total), ha="center", va="bottom")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("MB per epoch (measured, summed over ranks)")
    ax.set_title("Communication per epoch by category (measured)")
    fig.savefig(path, dpi=120)
