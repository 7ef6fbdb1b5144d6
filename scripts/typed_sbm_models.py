"""Typed graphs' acceptance on ``dataset=typed_sbm`` (docs/benchmarks.md, "Typed graphs"): each
model's test accuracy per seed with the dataset's defaults, RGCN and RGAT on the typed graph,
GCN on the typed graph and with the types erased (``dataset.typed=false``), and what the node
types alone predict (each type's majority training class).

    python scripts/typed_sbm_models.py --seeds 0 1 2
    python scripts/typed_sbm_models.py --seeds 0 1 2 --featureless 1   # learned vs zero rows

``--featureless K`` takes the features of the last ``K`` node types away and compares RGCN with
their input rows learned (``data.featureless=learned``) against RGCN on their zero rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RUNS = {
    "rgcn": ("model=rgcn",),
    "rgat": ("model=rgat",),
    "gcn (typed graph)": ("model=gcn",),
    "gcn (types erased)": ("model=gcn", "dataset.typed=false"),
}


def featureless_runs(k: int) -> dict[str, tuple[str, ...]]:
    """RGCN with the last ``k`` node types featureless: their rows learned, or zero."""
    lost = f"dataset.featureless_node_types={k}"
    return {
        "rgcn, featureless rows learned": ("model=rgcn", lost, "data.featureless=learned"),
        "rgcn, featureless rows zero": ("model=rgcn", lost, "data.featureless=zeros"),
    }


def types_alone(seed: int) -> float:
    """Test accuracy of each node type's majority training class (the types' information)."""
    from lightning_gnnscale.graph.generators import typed_sbm

    data = typed_sbm(seed=0)  # the run's graph: dataset.seed stays 0; the run seed varies
    g, t = data.graph, data.targets
    guess = torch.zeros(len(g.node_types), dtype=torch.long)
    for kind in range(len(g.node_types)):
        labels = t.target[t.train & (g.node_type == kind)]
        guess[kind] = torch.bincount(labels, minlength=t.out_dim).argmax()
    return float((guess[g.node_type[t.test]] == t.target[t.test]).float().mean())


def main() -> None:
    from hydra import compose, initialize_config_dir

    from lightning_gnnscale.run import train

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--featureless", type=int, default=0, help="node types without features")
    args = parser.parse_args()
    runs = featureless_runs(args.featureless) if args.featureless else RUNS
    table: dict[str, list[float]] = {name: [] for name in runs}
    with (
        tempfile.TemporaryDirectory() as tmp,
        initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"),
    ):
        for seed in args.seeds:
            for name, settings in runs.items():
                cfg = compose(
                    "config",
                    overrides=[
                        "strategy=single",
                        "dataset=typed_sbm",
                        "logger=none",
                        f"seed={seed}",
                        f"paths.root={tmp}",
                        f"paths.output_dir={tmp}/run_{len(table[name])}_{list(runs).index(name)}_{seed}",
                        *settings,
                    ],
                )
                metrics, _ = train(cfg)
                table[name].append(metrics["test_acc"])
                print(f"seed {seed} {name}: test acc {metrics['test_acc']:.4f}", flush=True)
    print("\n| model | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean |")
    print("|---|" + "---|" * (len(args.seeds) + 1))
    for name, accs in table.items():
        cells = " | ".join(f"{a:.4f}" for a in accs)
        print(f"| {name} | {cells} | **{statistics.mean(accs):.4f}** |")
    if args.featureless:
        return
    alone = types_alone(0)
    print(f"| node types alone (majority class per type) | {alone:.4f} (any seed) |")


if __name__ == "__main__":
    main()
