"""``bench bytegnn-partitions``: ByteGNN's K-hop block partitioner against random and METIS.

For every graph and part count: the time to partition, train / val / test balance (max over
mean), the edge cut, the local K-hop ratio and the modelled remote bytes per epoch
(:func:`~lightning_gnnscale.graph.khop_blocks.khop_locality`), per method; also the node
balance, which Algorithm 2 does not target (its balance score counts labelled vertices only).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch

from ..files import write_json_atomic
from ..graph.datasets import DatasetNotFoundError, load_dataset
from ..graph.generators import sbm
from ..graph.node_targets import NodeDataset
from ..graph.partition import partition, partition_report
from .report import command_line, environment, environment_lines, markdown_table

METHODS = ("bytegnn", "random", "metis", "metis_balanced")
SPARSE_LABELS = (0.05, 0.025, 0.025)  # train / val / test shares of the sparsely labelled SBM


def sparsely_labelled_sbm(nodes: int, seed: int) -> NodeDataset:
    """SBM with 5% train, 2.5% val, 2.5% test; the rest unlabelled (the generator gives test
    every remaining node, so test is thinned to its first 2.5% in a seeded order)."""
    train, val, test = SPARSE_LABELS
    dataset = sbm(num_nodes=nodes, train_frac=train, val_frac=val, seed=seed)
    test_ids = dataset.targets.test.nonzero().flatten()
    order = torch.randperm(test_ids.numel(), generator=torch.Generator().manual_seed(seed))
    thinned = torch.zeros_like(dataset.targets.test)
    thinned[test_ids[order[: round(test * nodes)]]] = True
    return NodeDataset(dataset.graph, replace(dataset.targets, test=thinned))


def _graphs(
    nodes: int, seed: int, cora_root: Path | None
) -> tuple[dict[str, NodeDataset], list[str]]:
    """The graphs to compare, and notes on the ones skipped."""
    graphs = {
        "sbm": sbm(num_nodes=nodes, seed=seed),
        "sbm-sparse": sparsely_labelled_sbm(nodes, seed),
    }
    notes = []
    if cora_root is None:
        notes.append("Cora skipped: no --cora-root given.")
    else:
        try:
            graphs["cora"] = load_dataset("cora", root=cora_root)
        except DatasetNotFoundError as err:
            notes.append(f"Cora skipped: {err}")
    for note in notes:
        print(f"[bench bytegnn-partitions] {note}", flush=True)
    return graphs, notes


def run_bytegnn_partition_bench(
    *,
    nodes: int,
    num_parts: list[int],
    hops: int,
    seed: int,
    cora_root: Path | None,
    out: Path,
    argv: list[str],
) -> dict:
    """Partition every graph with every method of :data:`METHODS`; write
    ``bytegnn_partition.json`` and ``bytegnn_partition.md`` into ``out``."""
    graphs, notes = _graphs(nodes, seed, cora_root)
    rows = []
    for name, dataset in graphs.items():
        graph, splits = dataset.graph, dataset.targets.split_matrix()
        labelled = int(splits.any(1).sum())
        print(
            f"[bench bytegnn-partitions] {name}: {graph.num_nodes:,} nodes, "
            f"{graph.num_edges:,} edges, {labelled:,} labelled",
            flush=True,
        )
        for p in num_parts:
            for method in METHODS:
                options = {"hops": hops} if method == "bytegnn" else {}
                start = time.perf_counter()
                parts = partition(graph, method, p, seed=seed, splits=splits, **options)
                seconds = time.perf_counter() - start
                report = partition_report(graph, parts, p, splits=splits, hops=hops)
                rows.append({"graph": name, "method": method, "seconds": seconds, **report})
                print(
                    f"[bench bytegnn-partitions] {name} P={p} {method}: {seconds:.2f} s, "
                    f"local {report['local_khop_ratio']:.3f}, train balance "
                    f"{report['train_balance']:.3f}",
                    flush=True,
                )
    setup = {
        "nodes": nodes,
        "num_parts": num_parts,
        "hops": hops,
        "seed": seed,
        "cora_root": None if cora_root is None else str(cora_root),
        "sparse_labels": SPARSE_LABELS,
        "graphs": {
            name: {
                "nodes": d.graph.num_nodes,
                "edges": d.graph.num_edges,
                "features": d.graph.num_features,
                **{f"{s}_nodes": int(d.targets.split(s).sum()) for s in ("train", "val", "test")},
            }
            for name, d in graphs.items()
        },
    }
    result = {
        "command": command_line(argv),
        "environment": environment(),
        "setup": setup,
        "notes": notes,
        "results": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(str(out / "bytegnn_partition.json"), result)
    table = markdown_table(
        [
            "graph",
            "P",
            "method",
            "train / val / test balance",
            "node balance",
            f"local {hops}-hop ratio",
            "edge cut",
            "remote MB / epoch (model)",
            "time (s)",
        ],
        [
            [
                r["graph"],
                str(r["num_parts"]),
                r["method"],
                " / ".join(f"{r[f'{s}_balance']:.3f}" for s in ("train", "val", "test")),
                f"{r['node_balance']:.3f}",
                f"{r['local_khop_ratio']:.3f}",
                f"{r['edge_cut_fraction']:.1%}",
                f"{r['remote_bytes_per_epoch'] / 1e6:.1f}",
                f"{r['seconds']:.2f}",
            ]
            for r in rows
        ],
    )
    graph_lines = [
        f"- {name}: {g['nodes']:,} nodes, {g['edges']:,} stored edges, {g['features']} "
        f"features; train / val / test {g['train_nodes']:,} / {g['val_nodes']:,} / "
        f"{g['test_nodes']:,}"
        for name, g in setup["graphs"].items()
    ]
    lines = [
        "# bench bytegnn-partitions: ByteGNN's K-hop blocks against random and METIS",
        "",
        "Command:",
        "",
        f"    {result['command']}",
        "",
        *environment_lines(result["environment"]),
        "",
        *graph_lines,
        *(f"- {note}" for note in notes),
        "",
        f"K = {hops}. Balance: max over mean of each split's (node balance: all) vertices per "
        "part. Local ratio: "
        f"share of the edges in the labelled vertices' {hops}-hop in-neighbourhoods whose "
        "endpoints both lie in the center's part. Remote bytes: every training vertex a seed "
        f"once with its full {hops}-hop in-neighbourhood, 8 B id + one feature row per vertex "
        "owned elsewhere (an upper bound: no sampling, no sharing within a mini-batch).",
        "",
        *table,
        "",
    ]
    (out / "bytegnn_partition.md").write_text("\n".join(lines))
    print(
        f"[bench bytegnn-partitions] wrote {out / 'bytegnn_partition.md'} and "
        "bytegnn_partition.json",
        flush=True,
    )
    return result
