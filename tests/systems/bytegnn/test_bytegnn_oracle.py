"""ByteGNN's blocks against an oracle written from the sampling rule's definition alone: plain
Python integers and per-vertex loops, importing none of ``sample_neighbors``,
``BlockBuilder``, ``SampleKey`` or ``NeighborSampler`` (issue 22 item 15: a comparison with
the reference sampler shares its kernel, so a broken kernel passes it).

The rule (graph/sampler.py's docstring): the hop key folds ``(seed, epoch, step, salt, hop)``
through splitmix64; a vertex of in-degree ``d`` keeps every in-edge when ``d <= k``, else the
``k`` positions of its CSC segment that Floyd's algorithm draws, draw ``i`` being
``(top 32 bits of splitmix64(splitmix64(v ^ key) + i)) * (j_i + 1) >> 32`` with
``j_i = d - k + i`` (a taken draw takes ``j_i``). A block's sources are its destinations
followed by the new source ids in increasing order."""

from __future__ import annotations

import torch

from lightning_gnnscale.graph.book import PartitionBook, build_local_partition, relabel_graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.seed_split import SeedSplit
from lightning_gnnscale.systems.bytegnn.config import DagConfig, SchedulerConfig
from lightning_gnnscale.systems.bytegnn.store import GraphStore
from lightning_gnnscale.systems.bytegnn.sworker import SWorker

M64 = (1 << 64) - 1


def mix(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def hop_key(seed: int, epoch: int, step: int, hop: int) -> int:
    h = 0
    for part in (seed, epoch, step, 0, hop):
        h = mix(h ^ (part & M64))
    return h


def kept_positions(v: int, degree: int, k: int, key: int) -> list[int]:
    if k == -1 or degree <= k:
        return list(range(degree))
    base = mix(v ^ key)
    chosen: list[int] = []
    for i in range(k):
        upper = degree - k + i
        draw = ((mix((base + i) & M64) >> 32) * (upper + 1)) >> 32
        chosen.append(upper if draw in chosen else draw)
    return sorted(chosen)


def oracle_blocks(indptr, indices, seeds, fanouts, seed, epoch, step):
    """``[(src_ids, {(src id, dst id)})]`` input layer first."""
    indptr, indices = indptr.tolist(), indices.tolist()
    frontier, out = list(seeds), []
    for hop, k in enumerate(fanouts):
        key = hop_key(seed, epoch, step, hop)
        edges = set()
        for v in frontier:
            start, degree = indptr[v], indptr[v + 1] - indptr[v]
            edges |= {(indices[start + p], v) for p in kept_positions(v, degree, k, key)}
        new = sorted({u for u, _ in edges} - set(frontier))
        frontier = frontier + new
        out.append((frontier, edges))
    return out[::-1]


def test_blocks_and_rows_equal_an_independent_oracle():
    dataset = sbm(num_nodes=400, num_classes=4, avg_degree=12.0, num_features=3, seed=11)
    book = PartitionBook.from_parts(torch.zeros(dataset.graph.num_nodes, dtype=torch.int64), 1)
    graph, targets = relabel_graph(dataset.graph, book), dataset.targets.rows(book.new2old)
    fanouts = [5, 3]
    assert int((graph.indptr.diff() > 5).sum()) > 100  # most vertices are really sampled
    local = build_local_partition(graph, targets, book, 0)
    store = GraphStore(local, book, graph.in_degree(), None)
    split = SeedSplit(targets.train.nonzero().flatten(), 1, 0, 40, 9)
    worker = SWorker(
        store,
        split,
        fanouts,
        9,
        DagConfig(nsc_tasks=3, ff_tasks=2),
        SchedulerConfig(),
        2,
        timeout_s=30.0,
        cpu_percent=lambda: 50.0,
    )
    worker.last_epoch = 1
    worker.start()
    try:
        for epoch, step in [(e, s) for e in range(2) for s in range(split.steps)]:
            batch = worker.take(epoch, step)
            seeds = split.seeds(epoch, step).tolist()
            want = oracle_blocks(graph.indptr, graph.indices, seeds, fanouts, 9, epoch, step)
            for block, (src_ids, edges) in zip(batch.blocks, want, strict=True):
                got_src = block.src_ids.tolist()
                assert got_src == src_ids
                dst_ids = got_src[: block.num_dst]
                got = {(got_src[s], dst_ids[d]) for s, d in block.edge_index.t().tolist()}
                assert got == edges
                assert block.edge_index.shape[1] == len(edges)  # no duplicate edge
            assert torch.equal(batch.x, graph.x[want[0][0]])
            assert torch.equal(batch.y, targets.target[seeds])
    finally:
        worker.stop()
