"""``bench sancus``: every SANCUS staleness policy against the exact broadcast baseline.

One ``train(cfg)`` per variant on the same dataset, seed and row blocks; the report splits the
broadcast bytes into the input features X (``feature``: saved by caching X, exact), the hidden
embeddings (``activation``: saved by skipping stale blocks) and the backward δ
(``activation_grad``), and gives the accuracy change against bound 0 and the cache memory
(measured and by the formula of docs/systems/sancus.md#cache-memory).
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from ..config_types import RunConfig
from ..files import write_json_atomic
from ..preflight import validate
from ..run import train
from .compare import CONF_DIR, MB
from .report import command_line, environment, environment_lines, fmt, markdown_table

BASELINE = "bound 0 (cagnet)"
UNCACHED = "cagnet, X every epoch"
VARIANTS: dict[str, list[str]] = {
    UNCACHED: ["strategy=cagnet", "strategy.input_policy=same_as_hidden"],
    BASELINE: ["strategy=cagnet"],
    **{
        f"SCS-E{e}": ["strategy=sancus", "strategy.policy=epoch_fixed", f"strategy.epoch_bound={e}"]
        for e in (1, 2, 3)
    },
    "SCS-A1": ["strategy=sancus", "strategy.policy=adaptive", "strategy.epoch_bound=1"],
    **{
        f"SCS-H {gap}": [
            "strategy=sancus",
            "strategy.policy=variation",
            f"strategy.variation_gap={gap}",
        ]
        for gap in (0.01, 0.02, 0.03)
    },
    "SkipG1": ["strategy=sancus", "strategy.policy=skipg", "strategy.epoch_bound=1"],
}
BROADCAST = ("feature", "activation", "activation_grad")


def compose_variants(
    *, dataset: str, epochs: int, devices: int, seed: int, overrides: list[str], out: Path
) -> dict[str, RunConfig]:
    """One validated run config per variant (user overrides last); raises before any
    training."""
    configs = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for i, (name, variant) in enumerate(VARIANTS.items()):
            cfg = compose(
                "config",
                overrides=[
                    *variant,
                    f"dataset={dataset}",
                    f"trainer.max_epochs={epochs}",
                    f"trainer.devices={devices}",
                    f"seed={seed}",
                    "logger=none",
                    "trainer.enable_progress_bar=false",
                    *overrides,
                ],
            )
            cfg.paths.root = str(Path.cwd())
            cfg.paths.cache_dir = str(out / "cache")
            cfg.paths.output_dir = str(out / "runs" / f"{i:02d}")
            configs[name] = validate(cfg)
    return configs


def _bytes(summary: dict, categories) -> float:
    return sum(summary["comm_bytes_per_epoch"].get(c, 0.0) for c in categories)


def _saved(value: float, base: float) -> str:
    return "-" if not base else f"{1 - value / base:.1%}"


def sancus_markdown(summaries: dict[str, dict], command: str, env: dict) -> str:
    """Per variant: broadcast MB/epoch by kind, savings against bound 0 and against
    re-broadcasting X, all traffic (with the weight-gradient all-reduce), accuracy, cache."""
    base = summaries[BASELINE]
    uncached = summaries[UNCACHED]
    everything = list(base["comm_bytes_per_epoch"])
    rows = []
    for name, s in summaries.items():
        system = s["system"]
        own = name == UNCACHED  # X re-broadcast: more than bound 0, not a saving
        rows.append(
            [
                name,
                fmt(_bytes(s, ["feature"]) / MB),
                fmt(_bytes(s, ["activation"]) / MB),
                fmt(_bytes(s, ["activation_grad"]) / MB),
                fmt(_bytes(s, BROADCAST) / MB),
                _saved(_bytes(s, ["activation"]), _bytes(base, ["activation"])),
                "-" if own else _saved(_bytes(s, BROADCAST), _bytes(base, BROADCAST)),
                _saved(_bytes(s, BROADCAST), _bytes(uncached, BROADCAST)),
                fmt(_bytes(s, everything) / MB),
                "-" if own else _saved(_bytes(s, everything), _bytes(base, everything)),
                fmt(s["test_acc"]),
                f"{s['test_acc'] - base['test_acc']:+.4f}",
                fmt(system["cache_bytes_by_rank"][0] / MB),
                fmt(system["cache_bytes_formula_by_rank"][0] / MB),
            ]
        )
    first = next(iter(summaries.values()))
    return "\n".join(
        [
            f"# bench sancus: gcn on {first['dataset']}, {first['epochs']} epochs, "
            f"{first['world_size']} ranks",
            "",
            "Command:",
            "",
            f"    {command}",
            "",
            *environment_lines(env),
            "",
            "Training bytes per epoch summed over ranks, counted by the communication meter "
            "(X = input features, `feature`; hidden = forward embeddings, `activation`; "
            "δ = backward, `activation_grad`; broadcast = the three; all = every category, "
            "weight gradients included). Savings are 1 - variant / reference. Test accuracy at "
            "the epoch of best validation accuracy. Cache = rank 0's historical embeddings at "
            "the end of training, measured and by the formula.",
            "",
            *markdown_table(
                [
                    "variant",
                    "X MB",
                    "hidden MB",
                    "δ MB",
                    "broadcast MB",
                    "hidden saved vs bound 0",
                    "broadcast saved vs bound 0",
                    "broadcast saved vs X every epoch",
                    "all MB",
                    "all saved vs bound 0",
                    "test acc",
                    "test acc change vs bound 0",
                    "cache MB rank 0 (measured)",
                    "cache MB rank 0 (formula)",
                ],
                rows,
            ),
            "",
        ]
    )


def run_sancus_bench(configs: dict[str, RunConfig], out: Path, argv: list[str]) -> dict:
    """Train every variant, then write ``results.md`` and ``results.json`` into ``out``."""
    env = environment()
    summaries = {}
    for i, (name, run) in enumerate(configs.items(), 1):
        print(f"[bench sancus {i}/{len(configs)}] {name}", flush=True)
        metrics, _ = train(run)
        if not metrics:
            raise RuntimeError(f"variant {name!r} wrote no summary.json")
        summaries[name] = metrics
    out.mkdir(parents=True, exist_ok=True)
    command = command_line(argv)
    results = {"command": command, "environment": env, "summaries": summaries}
    write_json_atomic(str(out / "results.json"), results)
    (out / "results.md").write_text(sancus_markdown(summaries, command, env))
    print(f"[bench sancus] wrote {out / 'results.md'} and results.json", flush=True)
    return results
