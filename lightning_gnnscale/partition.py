"""``python -m lightning_gnnscale.partition <train.py overrides> out=<dir>``: partition once,
to disk (docs/partitioning.md).

Composes the run config as ``train.py`` does, runs the strategy's one-off preprocessing for
``trainer.devices x trainer.num_nodes`` ranks, and writes the partition directory ``out``,
which ``train.py ... data.partition_dir=<dir>`` then trains from. Prints progress and a
summary (parts, sizes, bytes, seconds).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

USAGE = (
    "usage: python -m lightning_gnnscale.partition <train.py overrides> out=<dir>\n"
    "  e.g. python -m lightning_gnnscale.partition strategy=distdgl dataset=sbm "
    "dataset.num_nodes=1000000 trainer.devices=4 out=parts/sbm-1m-4"
)


def compose_run(overrides: list[str], out: Path):
    """The validated run config of ``overrides`` (as train.py composes it)."""
    from hydra import compose, initialize_config_dir

    from .errors import ConfigError
    from .preflight import validate

    conf = Path(__file__).resolve().parents[1] / "conf"
    fixed = [f"paths.root={Path.cwd()}", f"paths.output_dir={out}"]
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = compose("config", overrides=[*fixed, *overrides])
    except Exception as err:  # Hydra's override and composition errors
        raise ConfigError(f"bad overrides {overrides}: {err}") from None
    return validate(cfg)


def partition(overrides: list[str], out: str | Path, log=print) -> dict:
    """Write the partition directory ``out`` for the run ``overrides`` describe; returns its
    metadata."""
    from .errors import ConfigError
    from .graph.partition_dir import check_writable, summary_line
    from .run import build_datamodule

    out = check_writable(out)  # before the dataset loads (minutes for a large graph)
    run = compose_run(overrides, out)
    if run.data.partition_dir is not None:
        raise ConfigError("data.partition_dir is what train.py reads; name the output with out=")
    if not run.strategy.supports_partition_dir:
        from .config_types import partition_dir_unsupported

        raise ConfigError(partition_dir_unsupported(run.strategy.name))
    start = time.perf_counter()
    log(f"[partition] loading dataset {run.dataset.name} ...")
    datamodule = build_datamodule(run, by_name=True)  # records the dataset's identity
    graph = datamodule.graph
    log(
        f"[partition] {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
        f"{graph.num_features} features ({time.perf_counter() - start:.1f} s); partitioning "
        f"for {run.world_size} ranks with strategy={run.strategy.name}"
    )
    meta = datamodule.write_partition_dir(out, run.world_size, log)
    seconds = time.perf_counter() - start
    log(f"[partition] wrote {out}\n{summary_line(meta, seconds)}")
    log(f"[partition] train with: python train.py {' '.join(overrides)} data.partition_dir={out}")
    return meta


def main(argv: list[str] | None = None) -> int:
    from .errors import ConfigError

    args = sys.argv[1:] if argv is None else argv
    outs = [a for a in args if a.startswith("out=")]
    overrides = [a for a in args if not a.startswith("out=")]
    if len(outs) != 1 or not outs[0][4:] or any(a in ("-h", "--help") for a in args):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        partition(overrides, outs[0][4:])
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
