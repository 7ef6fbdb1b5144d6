"""``bench partitions``: GSplit's split functions compared by measured cross-split edges.

Each method is fitted on ``presample_epochs`` pre-sampled epochs of the training schedule and
measured on ``eval_epochs`` later, fresh epochs: the share of sampled edges whose endpoints
lie in different splits (the communication GSplit's partitioner minimises), next to the share
the pre-sample predicted, and the per-step load imbalance of aggregated edges.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..files import write_json_atomic
from ..graph.generators import sbm
from ..graph.order import epoch_permutation
from ..graph.sampler import NeighborSampler
from ..systems.gsplit.partition import (
    PARTITION_METHODS,
    cross_split_fraction,
    expected_cross_fraction,
    presample,
    probabilistic_partition,
)
from ..tasks import build_task
from .report import command_line, environment, environment_lines, markdown_table


def measure(graph, train, parts, fanouts, batch_size, epochs, seed) -> dict:
    """Cross-split share and mean per-step edge imbalance on the given (fresh) epochs;
    ``train``: the training seeds ``[n_train]``, in id order."""
    sampler = NeighborSampler(graph.indptr, graph.indices, fanouts, seed)
    num_parts = int(parts.max()) + 1
    cross = total = 0
    imbalance = []
    for epoch in epochs:
        order = epoch_permutation(train, seed, epoch)
        for start in range(0, train.numel(), batch_size):
            blocks = sampler.sample(order[start : start + batch_size], epoch, start // batch_size)
            c, t = cross_split_fraction(blocks, parts)
            cross, total = cross + c, total + t
            per_part = sum(
                torch.bincount(parts[b.src_ids[b.edge_index[1]]], minlength=num_parts)
                for b in blocks
            ).double()
            imbalance.append(float(per_part.max() / per_part.mean().clamp(min=1e-12)))
    return {"cross_share": cross / max(total, 1), "imbalance": sum(imbalance) / len(imbalance)}


def run_partition_bench(
    *,
    nodes: int,
    train_frac: float,
    fanouts: list[int],
    batch_size: int,
    num_parts: list[int],
    presample_epochs: int,
    eval_epochs: int,
    seed: int,
    out: Path,
    argv: list[str],
) -> dict:
    dataset = sbm(num_nodes=nodes, train_frac=train_frac, seed=seed)
    graph, task = dataset.graph, build_task()
    start = time.perf_counter()
    train = task.train_seeds(dataset.targets)
    counts = presample(graph, train, fanouts, batch_size, presample_epochs, seed)
    print(
        f"[bench partitions] pre-sampled {counts.num_batches} mini-batches in "
        f"{time.perf_counter() - start:.1f} s",
        flush=True,
    )
    fresh = range(presample_epochs, presample_epochs + eval_epochs)
    rows = []
    for p in num_parts:
        for method in PARTITION_METHODS:
            parts = probabilistic_partition(
                graph,
                p,
                counts,
                method=method,
                is_train=task.is_train_seed(dataset.targets),
                seed=seed,
            )
            result = measure(graph, train, parts, fanouts, batch_size, fresh, seed)
            result.update(
                method=method,
                num_parts=p,
                predicted_share=expected_cross_fraction(graph, parts, counts.k_e),
            )
            rows.append(result)
            print(
                f"[bench partitions] P={p} {method}: measured {result['cross_share']:.1%}, "
                f"predicted {result['predicted_share']:.1%}",
                flush=True,
            )
    out.mkdir(parents=True, exist_ok=True)
    setup = {
        "nodes": nodes,
        "train_frac": train_frac,
        "fanouts": fanouts,
        "batch_size": batch_size,
        "presample_epochs": presample_epochs,
        "eval_epochs": eval_epochs,
        "seed": seed,
    }
    report = {
        "command": command_line(argv),
        "environment": environment(),
        "setup": setup,
        "results": rows,
    }
    write_json_atomic(str(out / "partitions.json"), report)
    table = markdown_table(
        [
            "P",
            "method",
            "cross-split edges (measured)",
            "predicted by pre-sampling",
            "edge imbalance per step (measured)",
        ],
        [
            [
                str(r["num_parts"]),
                r["method"],
                f"{r['cross_share']:.1%}",
                f"{r['predicted_share']:.1%}",
                f"{r['imbalance']:.3f}",
            ]
            for r in rows
        ],
    )
    lines = [
        "# bench partitions: GSplit split functions",
        "",
        "Command:",
        "",
        f"    {report['command']}",
        "",
        *environment_lines(report["environment"]),
        "",
        f"SBM with {nodes:,} nodes (train {train_frac:.0%}), fanouts {fanouts}, batch "
        f"{batch_size}; fitted on epochs 0-{presample_epochs - 1}, measured on epochs "
        f"{fresh.start}-{fresh.stop - 1}.",
        "",
        *table,
        "",
    ]
    (out / "partitions.md").write_text("\n".join(lines))
    print(f"[bench partitions] wrote {out / 'partitions.md'} and partitions.json", flush=True)
    return report
