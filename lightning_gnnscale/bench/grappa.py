"""``bench grappa``: the paper's Table 1 analogue, counted on real sampled batches.

Per partition and epoch: Grappa's gradient all-reduce bytes (ring model, ``steps x 2(P-1)/P x
4|theta|``, with Grappa's equalised step count: every rank runs the largest partition's steps)
against the neighbour traffic a conventional partitioned mini-batch system
(DistDGL style) moves for the *same* sampled batches: remote input rows (``F x 4`` bytes each),
plus sampling structure (8 bytes per remote frontier id sent, 16 per remote edge returned).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..comm import ring_allreduce_bytes
from ..files import write_json_atomic
from ..graph.generators import rmat, sbm
from ..graph.order import epoch_permutation
from ..graph.partition import partition
from ..graph.sampler import NeighborSampler
from ..models.gnn import BlockGNN
from .report import command_line, environment, environment_lines, fmt, markdown_table

# The paper's fanouts (DGL order {25,10}, {15,10,5}, {20,15,10,5}) in PyG order (seed hop first).
PAPER_FANOUTS = {2: [10, 25], 3: [5, 10, 15], 4: [5, 10, 15, 20]}


def make_graph(dataset: str, nodes: int, features: int, seed: int):
    if dataset == "sbm":
        return sbm(
            num_nodes=nodes, num_classes=8, avg_degree=16.0, num_features=features, seed=seed
        )
    if dataset == "rmat":
        return rmat(num_nodes=nodes, num_edges=16 * nodes, num_features=features, seed=seed)
    raise ValueError(f"unknown dataset {dataset!r}; valid: ['sbm', 'rmat']")


def neighbour_traffic(graph, train, parts, num_parts, fanouts, batch_size, seed) -> dict:
    """Per-partition mean of one epoch's conventional traffic (bytes) and step count, and the
    largest partition's step count (``max_steps``: what Grappa's step equalisation runs).

    Each partition samples its own training nodes (of ``train``; batches of ``ceil(batch_size / P)``) on the
    whole graph; a node owned by another partition costs its feature row if it is an input,
    its id if it is expanded (a sampling request), and 16 bytes per edge sampled for it.
    """
    sampler = NeighborSampler(graph.indptr, graph.indices, fanouts, seed)
    row_bytes = graph.num_features * 4
    local_batch = -(-batch_size // num_parts)
    totals = {"feature": 0, "structure": 0, "steps": 0}
    max_steps = 0
    for p in range(num_parts):
        mine = train[parts[train] == p]
        order = epoch_permutation(mine, seed + p, 0)
        for step, start in enumerate(range(0, order.numel(), local_batch)):
            blocks = sampler.sample(order[start : start + local_batch], 0, step, p)
            inputs = blocks[0].src_ids
            totals["feature"] += int((parts[inputs] != p).sum()) * row_bytes
            for block in blocks:  # hop expansions: remote destinations ask their owners
                dst = block.dst_ids
                remote = parts[dst] != p
                edges_per_dst = torch.bincount(block.edge_index[1], minlength=block.num_dst)
                totals["structure"] += 8 * int(remote.sum()) + 16 * int(edges_per_dst[remote].sum())
            totals["steps"] += 1
        max_steps = max(max_steps, -(-mine.numel() // local_batch))
    return {**{k: v / num_parts for k, v in totals.items()}, "max_steps": max_steps}


def run_grappa_bench(
    dataset: str,
    nodes: int,
    features: int,
    num_parts: list[int],
    depths: list[int],
    batch_size: int,
    hidden: int,
    methods: list[str],
    seed: int,
    out: Path,
    argv: list[str],
) -> list[dict]:
    data = make_graph(dataset, nodes, features, seed)
    graph, train = data.graph, data.targets.train.nonzero().flatten()
    rows = []
    for method in methods:
        for p in num_parts:
            start = time.perf_counter()
            parts = partition(graph, method, p, seed=seed)
            for depth in depths:
                net = BlockGNN("sage", graph.num_features, hidden, data.num_classes, depth)
                n_params = sum(t.numel() for t in net.parameters())
                conv = neighbour_traffic(
                    graph, train, parts, p, PAPER_FANOUTS[depth], batch_size, seed
                )
                grappa = conv["max_steps"] * ring_allreduce_bytes(4 * n_params, p)
                rows.append(
                    {
                        "partitioning": method,
                        "parts": p,
                        "depth": depth,
                        "params": n_params,
                        "steps_per_partition": conv["steps"],
                        "grappa_steps": conv["max_steps"],
                        "conventional_feature_mb": conv["feature"] / 1e6,
                        "conventional_structure_mb": conv["structure"] / 1e6,
                        "grappa_gradient_mb": grappa / 1e6,
                        "ratio": (conv["feature"] + conv["structure"]) / max(grappa, 1),
                    }
                )
            print(f"[bench grappa] {method} P={p} done in {time.perf_counter() - start:.1f}s")
    write_report(rows, dataset, graph, batch_size, hidden, out, argv)
    return rows


def write_report(rows, dataset, graph, batch_size, hidden, out: Path, argv) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    write_json_atomic(str(out / "grappa_traffic.json"), {"rows": rows, "environment": env})
    headers = [
        "partitioning",
        "parts",
        "depth",
        "steps / part",
        "Grappa steps",
        "conventional feature MB",
        "conventional structure MB",
        "Grappa gradient MB",
        "conventional / Grappa",
    ]
    table = [
        [
            r["partitioning"],
            str(r["parts"]),
            str(r["depth"]),
            fmt(r["steps_per_partition"], 3),
            str(r["grappa_steps"]),
            fmt(r["conventional_feature_mb"]),
            fmt(r["conventional_structure_mb"]),
            fmt(r["grappa_gradient_mb"]),
            fmt(r["ratio"], 3),
        ]
        for r in rows
    ]
    lines = [
        "# Grappa traffic per partition per epoch (counted)",
        "",
        f"`{command_line(argv)}`",
        "",
        f"{dataset}: {graph.num_nodes} nodes, {graph.num_edges} edges, {graph.num_features} "
        f"features; SAGE hidden {hidden}; global batch {batch_size}; fanouts (seed hop first) "
        + ", ".join(f"depth {d}: {f}" for d, f in PAPER_FANOUTS.items()),
        "",
        *markdown_table(headers, table),
        "",
        *environment_lines(env),
    ]
    (out / "grappa_traffic.md").write_text("\n".join(lines) + "\n")
