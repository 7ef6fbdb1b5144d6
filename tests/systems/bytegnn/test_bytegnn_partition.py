"""ByteGNN's GNN-aware partitioner (graph/khop_blocks.py, method ``bytegnn``): spec §3.5
invariants 8 (block construction) and 9 (block assignment), the K-hop locality report."""

from __future__ import annotations

import json
import math
from collections import deque
from pathlib import Path

import pytest
import torch
from torch import Tensor

from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.datasets import load_dataset
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.khop_blocks import (
    assign_blocks,
    block_cross_edges,
    center_order,
    khop_locality,
    neighbourhood_blocks,
)
from lightning_gnnscale.graph.node_targets import NodeDataset
from lightning_gnnscale.graph.partition import partition, partition_report
from lightning_gnnscale.graph.partition_config import (
    METHOD_OPTIONS,
    PARTITION_METHODS,
    check_partition_options,
)


def _splits_of(dataset: NodeDataset) -> Tensor:
    """bool ``[N, 3]``: a dataset's own train / val / test membership."""
    return dataset.targets.split_matrix()


def _random_graph(
    num_nodes: int, num_edges: int, labelled: float, seed: int, undirected: bool = False
) -> tuple[Graph, Tensor]:
    """Random graph (directed by default, so the in-edge direction matters) and its splits
    (bool ``[N, 3]``): the labelled vertices split evenly at random into train / val / test."""
    gen = torch.Generator().manual_seed(seed)
    edges = torch.randint(num_nodes, (2, num_edges), generator=gen)
    split = torch.randint(3, (num_nodes,), generator=gen)
    is_labelled = torch.rand(num_nodes, generator=gen) < labelled
    splits = torch.stack([is_labelled & (split == k) for k in range(3)], dim=1)
    graph = Graph.from_edge_index(
        edges,
        num_nodes,
        undirected=undirected,
        x=torch.zeros(num_nodes, 3),
    )
    return graph, splits


def _in_lists(graph: Graph) -> list[list[int]]:
    indptr, indices = graph.indptr.tolist(), graph.indices.tolist()
    return [indices[indptr[v] : indptr[v + 1]] for v in range(graph.num_nodes)]


def _distances_into(in_lists: list[list[int]], center: int, limit: int) -> dict[int, int]:
    """Brute-force BFS: vertex -> length of its shortest in-path into ``center`` (<= limit)."""
    dist, queue = {center: 0}, deque([center])
    while queue:
        v = queue.popleft()
        if dist[v] == limit:
            continue
        for u in in_lists[v]:
            if u not in dist:
                dist[u] = dist[v] + 1
                queue.append(u)
    return dist


def _weak_components(graph: Graph, members: set[int]) -> dict[int, int]:
    """Union-find oracle: vertex of ``members`` -> representative of its weak component."""
    parent = {v: v for v in members}

    def find(v: int) -> int:
        while parent[v] != v:
            v = parent[v]
        return v

    for v, sources in enumerate(_in_lists(graph)):
        for u in sources:
            if u in members and v in members:
                parent[find(u)] = find(v)
    return {v: find(v) for v in members}


# --------------------------------------------------------------- invariant 8: the blocks
@pytest.mark.parametrize(("hops", "seed"), [(1, 0), (2, 1), (3, 2)])
def test_blocks_follow_nearest_center_with_pi_tie_break(hops, seed):
    graph, splits = _random_graph(300, 450, labelled=0.1, seed=seed)
    centers = center_order(splits, "random", seed)
    block_of, num_labelled = neighbourhood_blocks(graph, centers, hops)
    assert num_labelled == centers.numel() > 0
    in_lists = _in_lists(graph)
    distances = [_distances_into(in_lists, c, hops) for c in centers.tolist()]
    labelled = (splits[:, 0] | splits[:, 1] | splits[:, 2]).tolist()
    for v in range(graph.num_nodes):
        reach = [(d[v], rank) for rank, d in enumerate(distances) if v in d]
        if not reach:  # farther than K hops from every center: a label-free block
            assert int(block_of[v]) >= num_labelled
            continue
        nearest = min(reach)[0]
        assert int(block_of[v]) == min(rank for d, rank in reach if d == nearest)
        # every labelled vertex is the center of its own block, and the only labelled one
        assert labelled[v] == (nearest == 0)
    for rank, center in enumerate(centers.tolist()):
        members = (block_of == rank).nonzero().flatten().tolist()
        inside = set(members)
        # connected: every member reaches the center within K in-hops inside the block
        reached = _distances_into([[u for u in s if u in inside] for s in in_lists], center, hops)
        assert set(reached) == inside


def test_sequential_blocks_go_to_the_first_center_within_k_hops():
    graph, splits = _random_graph(300, 450, labelled=0.1, seed=8)
    centers = center_order(splits, "random", 8)
    block_of, num_labelled = neighbourhood_blocks(graph, centers, 2, block_bfs="sequential")
    in_lists = _in_lists(graph)
    distances = [_distances_into(in_lists, c, 2) for c in centers.tolist()]
    center_rank = {c: rank for rank, c in enumerate(centers.tolist())}
    for v in range(graph.num_nodes):
        reach = [rank for rank, d in enumerate(distances) if v in d]
        if v in center_rank:
            assert int(block_of[v]) == center_rank[v]
        elif reach:
            assert int(block_of[v]) == min(reach)
        else:
            assert int(block_of[v]) >= num_labelled
    level_sync, _ = neighbourhood_blocks(graph, centers, 2)
    assert not torch.equal(block_of, level_sync)  # the readings differ on this graph
    assert torch.equal(block_of >= num_labelled, level_sync >= num_labelled)  # same free set
    with pytest.raises(ValueError, match="valid: \\['level_sync', 'sequential'\\]"):
        neighbourhood_blocks(graph, centers, 2, block_bfs="dfs")


def test_free_vertices_form_one_block_per_component():
    graph, splits = _random_graph(400, 420, labelled=0.03, seed=3)
    centers = center_order(splits, "gid", 0)
    block_of, num_labelled = neighbourhood_blocks(graph, centers, 1)
    in_lists = _in_lists(graph)
    reached = set()
    for c in centers.tolist():
        reached |= set(_distances_into(in_lists, c, 1))
    free = set(range(graph.num_nodes)) - reached
    assert {v for v in range(graph.num_nodes) if int(block_of[v]) >= num_labelled} == free
    component = _weak_components(graph, free)
    assert len(set(component.values())) > 10  # many components: the check has teeth
    for u in free:
        for v in free:
            assert (component[u] == component[v]) == (int(block_of[u]) == int(block_of[v]))
    # label-free blocks are numbered L, L+1, ... by smallest vertex
    first = [
        min(v for v in free if int(block_of[v]) == b)
        for b in sorted(set(block_of.tolist()))[num_labelled:]
    ]
    assert first == sorted(first)
    assert sorted(set(block_of.tolist())) == list(range(int(block_of.max()) + 1))


def test_large_free_components_are_cut_into_pieces_in_id_order():
    graph, splits = _random_graph(400, 420, labelled=0.03, seed=3)
    centers = center_order(splits, "gid", 0)
    whole, num_labelled = neighbourhood_blocks(graph, centers, 1)
    cut, _ = neighbourhood_blocks(graph, centers, 1, max_free_block=5)
    assert torch.equal(cut[:num_labelled].clamp(max=0), whole[:num_labelled].clamp(max=0))
    labelled = whole < num_labelled
    assert torch.equal(cut[labelled], whole[labelled])
    free = (~labelled).nonzero().flatten()
    sizes = torch.bincount(whole[free])
    assert int(sizes.max()) > 5  # some component must be cut: the check has teeth
    for block in torch.unique(whole[free]).tolist():
        members = free[whole[free] == block]  # ascending vertex ids
        expected = [members[i : i + 5].tolist() for i in range(0, members.numel(), 5)]
        got = [sorted(members[cut[members] == b].tolist()) for b in cut[members].unique()]
        assert sorted(got) == sorted(expected)
    with pytest.raises(ValueError, match="max_free_block"):
        neighbourhood_blocks(graph, centers, 1, max_free_block=0)


def test_one_giant_free_component_does_not_fill_a_part():
    # a long path with one labelled vertex at its end: at K=1 almost all of it is label-free
    num_nodes = 400
    src = torch.arange(num_nodes - 1)
    splits = torch.zeros(num_nodes, 3, dtype=torch.bool)
    splits[0, 0] = True  # vertex 0 is the one train vertex
    graph = Graph.from_edge_index(
        torch.stack([src, src + 1]),
        num_nodes,
        undirected=True,
        x=torch.zeros(num_nodes, 3),
    )
    parts = partition(graph, "bytegnn", 4, splits=splits, hops=1)
    counts = torch.bincount(parts, minlength=4).double()
    assert float(counts.max() / counts.mean()) <= 1.1


def test_center_order_is_seeded_or_by_id():
    _, splits = _random_graph(200, 300, labelled=0.3, seed=4)
    labelled = (splits[:, 0] | splits[:, 1] | splits[:, 2]).nonzero().flatten()
    assert torch.equal(center_order(splits, "gid", 7), labelled)
    shuffled = center_order(splits, "random", 7)
    assert torch.equal(shuffled, center_order(splits, "random", 7))
    assert not torch.equal(shuffled, center_order(splits, "random", 8))
    assert torch.equal(shuffled.sort().values, labelled)
    with pytest.raises(ValueError, match="valid: \\['random', 'gid'\\]"):
        center_order(splits, "degree", 0)


# ----------------------------------------------------------- invariant 9: the assignment
def _edges(*pairs: tuple[int, int, int]) -> Tensor:
    """Cross-edge columns from (block a, block b, multiplicity)."""
    columns = [(a, b) for a, b, count in pairs for _ in range(count)]
    return torch.tensor(columns, dtype=torch.int64).T


SIX_BLOCKS = {
    # block: size, (train, val, test); block 4 carries no label
    "sizes": torch.tensor([4, 3, 3, 2, 2, 1]),
    "split_counts": torch.tensor(
        [[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0], [1, 0, 0]]
    ),
    "cross_edges": _edges(
        (0, 1, 1), (0, 2, 3), (1, 3, 2), (2, 5, 1), (3, 5, 2), (4, 1, 2), (4, 0, 1)
    ),
}


def test_six_blocks_two_parts_by_hand():
    """Algorithm 2 worked by hand. weights (1/2, 1/4, 1/4); totals train 3, val 1, test 1,
    so C = (1.5, 0.5, 0.5) and BS_j = 1 - train_j / 3 - val_j / 2 - test_j / 2; lambda = 1,
    so CE_j = (cross_j + 1) / (|P_j| + 1). Order: labelled blocks by size desc, then id:
    0, 1, 2, 3, 5; then the label-free block 4.

    block 0: both parts empty, CE 1 and BS 1 each: tie, equal sizes -> part 0
             (P0: 4 vertices, train 1, BS 2/3).
    block 1: cross to P0 = 1: CE (2/5, 1), BS (2/3, 1), score (0.267, 1) -> part 1
             (P1: 3 vertices, train 1, BS 2/3).
    block 2: cross (3, 0): CE (4/5, 1/4), BS (2/3, 2/3), score (0.533, 0.167) -> part 0
             (P0: 7 vertices, train 1 val 1, BS 1/6).
    block 3: cross (0, 2): CE (1/8, 3/4), BS (1/6, 2/3), score (0.021, 0.5) -> part 1
             (P1: 5 vertices, train 1 test 1, BS 1/6).
    block 5: cross (1 to block 2, 2 to block 3): CE (2/8, 3/6), BS (1/6, 1/6),
             score (0.042, 0.083) -> part 1 (P1: 6 vertices, train 2 test 1, BS -1/6).
    block 4 carries no label, so its BS balances vertices (ours): BS_j = 1 - |P_j| / 7.5
             (15 vertices, 2 parts). Cross (1 to block 0, 2 to block 1): CE (2/8, 3/7),
             BS (1 - 7/7.5, 1 - 6/7.5) = (1/15, 1/5), score (0.017, 0.086) -> part 1.
    """
    parts = assign_blocks(
        **SIX_BLOCKS, num_parts=2, weights=(0.5, 0.25, 0.25), smoothing=1.0, imbalance=None
    )
    assert parts.tolist() == [0, 1, 0, 1, 1, 1]


def test_six_blocks_with_the_papers_unsmoothed_ratio():
    """lambda = 0 is the paper's CE = cross / |P_j| with 0/0 = 0 (same BS as above).

    block 0: every score 0 -> highest BS: tie -> part 0 (BS 2/3).
    block 1: CE (1/4, 0/0 = 0), score (1/6, 0) -> part 0 (P0: 7 vertices, train 2, BS 1/3).
    block 2: CE (3/7, 0), score (1/7, 0) -> part 0 (P0: 10, train 2 val 1, BS -1/6).
    block 3: CE (2/10, 0), BS (-1/6 -> 0, 1): every score 0 -> highest BS -> part 1
             (P1: 2 vertices, test 1, BS 1/2).
    block 5: CE (1/10, 2/2), score (0, 1/2) -> part 1 (P1: 3, train 1 test 1, BS 1/6).
    block 4 (label-free, BS_j = 1 - |P_j| / 7.5): cross (3, 0): CE (3/10, 0/3), BS
             (-1/3 -> 0, 3/5): score (0, 0) -> highest BS -> part 1.
    """
    parts = assign_blocks(
        **SIX_BLOCKS, num_parts=2, weights=(0.5, 0.25, 0.25), smoothing=0.0, imbalance=None
    )
    assert parts.tolist() == [0, 0, 0, 1, 1, 1]


def test_ties_go_to_the_smaller_part_then_the_lower_id():
    """Three unconnected train blocks of sizes 5, 1, 1 into 3 parts, weights (1, 0, 0):
    C = 1 per part, so BS_j = 1 - train_j. Block 0 -> part 0 (all tie); block 1: CE
    (1/6, 1, 1), BS (0, 1, 1) -> part 1 (tie with part 2, lower id); block 2: CE (1/6, 1/2, 1),
    BS (0, 0, 1) -> part 2. Then a free block of size 1 with one edge to each part: its BS
    balances vertices, 1 - |P_j| / (8/3) = (-7/8 -> 0, 5/8, 5/8); CE (2/6, 2/2, 2/2) -> scores
    (0, 5/8, 5/8) tie -> fewest vertices: parts 1 and 2 (1 each) -> the lower id, part 1."""
    parts = assign_blocks(
        torch.tensor([5, 1, 1, 1]),
        torch.tensor([[1, 0, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0]]),
        _edges((3, 0, 1), (3, 1, 1), (3, 2, 1)),
        3,
        weights=(1.0, 0.0, 0.0),
        imbalance=None,
    )
    assert parts.tolist() == [0, 1, 2, 1]


def test_lambda_enters_numerator_and_denominator():
    """lambda = 3, weights (1, 0, 0), train blocks of sizes 4, 2, 1, one edge between blocks
    2 and 0. C = 1.5, so BS_j = 1 - 2/3 train_j.
    block 0: all tie -> part 0 (4 vertices, BS 1/3).
    block 1: CE (3/7, 3/3), BS (1/3, 1) -> part 1 (2 vertices, BS 1/3).
    block 2: CE ((1+3)/(4+3) = 0.571, 3/(2+3) = 0.6), equal BS -> part 1.
    (With lambda only in the denominator, CE would be (2/7, 1/5) and block 2 would go to 0.)
    """
    parts = assign_blocks(
        torch.tensor([4, 2, 1]),
        torch.tensor([[1, 0, 0]] * 3),
        _edges((2, 0, 1)),
        2,
        weights=(1.0, 0.0, 0.0),
        smoothing=3.0,
        imbalance=None,
    )
    assert parts.tolist() == [0, 1, 1]


def test_all_zero_scores_fall_back_to_the_highest_balance_score():
    """lambda = 0 and no cross edge: every CE is 0, so each block goes by BS alone.
    Blocks: val of size 5, train, train, val (size 1 each); weights (1/2, 1/2, 0), C = (1, 1),
    BS_j = 1 - train_j / 2 - val_j / 2.
    block 0: BS (1, 1) tie -> part 0 (5 vertices, BS 1/2). block 1: BS (1/2, 1) -> part 1.
    block 2: BS (1/2, 1/2) tie -> fewer vertices -> part 1 (BS 0).
    block 3: BS (1/2, 0) -> part 0, although part 1 has fewer vertices.
    """
    parts = assign_blocks(
        torch.tensor([5, 1, 1, 1]),
        torch.tensor([[0, 1, 0], [1, 0, 0], [1, 0, 0], [0, 1, 0]]),
        torch.zeros(2, 0, dtype=torch.int64),
        2,
        weights=(0.5, 0.5, 0.0),
        smoothing=0.0,
        imbalance=None,
    )
    assert parts.tolist() == [0, 1, 1, 0]


def test_the_cap_keeps_every_split_balanced_where_the_score_alone_does_not():
    """A star of train blocks around a val block. With the weight on val, block 0 fills its
    part's BS (0.01 left) and BS hardly notices train, so every train block piles into the
    other part. The cap (imbalance 0) holds train to ceil(4 / 2) = 2 per part."""
    sizes = torch.ones(6, dtype=torch.int64)
    split_counts = torch.tensor([[0, 1, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [0, 1, 0]])
    star = _edges(*((0, b, 5) for b in range(1, 5)))
    weights = (0.01, 0.99, 0.0)
    free = assign_blocks(sizes, split_counts, star, 2, weights=weights, imbalance=None)
    capped = assign_blocks(sizes, split_counts, star, 2, weights=weights, imbalance=0.0)
    train = split_counts[:, 0].bool()
    assert torch.bincount(free[train], minlength=2).max() > 2  # the score alone piles up
    assert torch.bincount(capped[train], minlength=2).tolist() == [2, 2]


def test_the_cap_is_the_exact_ceiling_despite_float_rounding():
    """100 train blocks, every pair joined by 5 edges, into 3 parts, all the weight on the
    (empty) val split so BS stays 1: CE pulls each block to the fullest part, so part 0 fills
    up to the cap. ceil(1.05 * 100 / 3) = ceil(35) = 35, but in floats
    1.05 * (100 / 3) = 35.00000000000001, whose ceil is 36."""
    count = 100
    low, high = torch.triu_indices(count, count, offset=1)
    clique = torch.stack([low, high]).repeat_interleave(5, dim=1)
    parts = assign_blocks(
        torch.ones(count, dtype=torch.int64),
        torch.tensor([[1, 0, 0]] * count),
        clique,
        3,
        weights=(0.0, 1.0, 0.0),
        imbalance=0.05,
    )
    assert torch.bincount(parts, minlength=3).max() == 35


def test_a_negative_balance_score_scores_zero_and_the_fallback_picks_the_highest_bs():
    """lambda = 0, weights (1, 0, 0), 3 parts, train total 5 so C = 5/3 and
    BS_j = 1 - 0.6 train_j; the val block carries no weight. Order by size: 0, 1, 2, 3.
    block 0 (size 10, train 3): every CE is 0/0 = 0 -> highest BS: all 1, fewest vertices
             tie -> part 0 (BS -0.8).
    block 1 (size 5, val): CE all 0 -> BS (-0.8, 1, 1) -> tie, fewest vertices -> part 1.
    block 2 (size 2, train): CE all 0 -> BS (-0.8, 1, 1) -> part 2 (fewer vertices than 1).
    block 3 (size 1, train, an edge to block 0): CE (1/10, 0, 0), BS (-0.8, 1, 0.4). With BS
             clamped at 0 every score is 0 -> highest BS -> part 1. (Scoring part 0 with the
             negative BS, -0.08, and then taking the best score with the tie rule would send
             it to part 2, which has fewer vertices than part 1.)
    """
    parts = assign_blocks(
        torch.tensor([10, 5, 2, 1]),
        torch.tensor([[3, 0, 0], [0, 1, 0], [1, 0, 0], [1, 0, 0]]),
        _edges((3, 0, 1)),
        3,
        weights=(1.0, 0.0, 0.0),
        smoothing=0.0,
        imbalance=None,
    )
    assert parts.tolist() == [0, 1, 2, 1]


def test_block_cross_edges_count_each_adjacent_pair_once():
    """Blocks {0, 1}, {2}, {3, 4}. Edges: 0->2 and 2->0 (one pair), 1->2 twice (one pair),
    3->4 (inside a block), 4->4 (self-loop), 1->3 and 4->0 (two pairs between the same
    blocks). Expected block pairs, one per vertex pair: (0, 1), (0, 1), (0, 2), (0, 2)."""
    graph = Graph(  # CSC by hand: in-neighbours of 0: 2, 4; of 2: 0, 1, 1; of 3: 1; of 4: 3, 4
        indptr=torch.tensor([0, 2, 2, 5, 6, 8]),
        indices=torch.tensor([2, 4, 0, 1, 1, 1, 3, 4]),
        x=torch.zeros(5, 1),
    )
    pairs = block_cross_edges(graph, torch.tensor([0, 0, 1, 2, 2]))
    assert sorted(map(tuple, pairs.sort(0).values.T.tolist())) == [(0, 1), (0, 1), (0, 2), (0, 2)]


def test_a_block_that_fits_nowhere_ignores_the_cap():
    """Train totals 4 over 2 parts, cap 2 (imbalance 0). Blocks 0 and 1 (one train vertex
    each) go to parts 0 and 1; block 2 holds two train vertices and would make 3 in either
    part, so it is placed by score alone: one edge to block 1 gives CE (1/2, 2/2), BS
    (1/2, 1/2) -> part 1."""
    parts = assign_blocks(
        torch.ones(3, dtype=torch.int64),
        torch.tensor([[1, 0, 0], [1, 0, 0], [2, 0, 0]]),
        _edges((2, 1, 1)),
        2,
        imbalance=0.0,
    )
    assert parts.tolist() == [0, 1, 1]


@pytest.fixture(scope="module")
def sbm_dataset() -> NodeDataset:
    return sbm(num_nodes=2000, avg_degree=6.0, seed=0)


@pytest.fixture(scope="module")
def sbm_sparse(sbm_dataset) -> tuple[Graph, Tensor]:
    """SBM and splits whose labelled vertices are a third of the nodes (the generator's own
    splits label all, so the dataset's own splits differ from these)."""
    graph = sbm_dataset.graph
    keep = torch.rand(graph.num_nodes, generator=torch.Generator().manual_seed(0)) < 1 / 3
    splits = _splits_of(sbm_dataset)
    splits[:, 1:] &= keep.unsqueeze(1)
    return graph, splits


@pytest.mark.parametrize("num_parts", [2, 4])
@pytest.mark.parametrize("graph_name", ["sbm", "sbm_sparse"])
def test_every_split_balanced_and_more_khop_local_than_random(graph_name, num_parts, request):
    if graph_name == "sbm":
        dataset = request.getfixturevalue("sbm_dataset")
        graph, splits = dataset.graph, _splits_of(dataset)
    else:
        graph, splits = request.getfixturevalue("sbm_sparse")
    parts = partition(graph, "bytegnn", num_parts, seed=0, splits=splits)
    report = partition_report(graph, parts, num_parts, splits=splits, hops=2)
    for split in ("train", "val", "test"):
        assert report[f"{split}_balance"] <= 1.1, split
    random_parts = partition(graph, "random", num_parts)
    random = partition_report(graph, random_parts, num_parts, splits=splits, hops=2)
    assert report["local_khop_ratio"] >= random["local_khop_ratio"]
    assert report["remote_bytes_per_epoch"] <= random["remote_bytes_per_epoch"]


PLANETOID_ROOT = Path(__file__).parents[4] / "shared/datasets/planetoid"


@pytest.mark.cora
@pytest.mark.skipif(
    not (PLANETOID_ROOT / "Cora" / "raw").is_dir(),
    reason="needs the raw Cora files under ../shared/datasets/planetoid",
)
def test_cora_every_split_balanced_only_with_the_cap(tmp_path):
    """Cora's 140 train vertices are 9% of the labelled ones, so Algorithm 2's weighted BS
    alone lets train pile up; the default cap holds every split within 1.1 at P = 2 and 4."""
    dataset = load_dataset("cora", root=PLANETOID_ROOT, cache_dir=tmp_path)
    cora, splits = dataset.graph, _splits_of(dataset)
    for num_parts in (2, 4):
        parts = partition(cora, "bytegnn", num_parts, seed=0, splits=splits)
        report = partition_report(cora, parts, num_parts, splits=splits, hops=2)
        assert max(report[f"{s}_balance"] for s in ("train", "val", "test")) <= 1.1
        random_parts = partition(cora, "random", num_parts)
        random = partition_report(cora, random_parts, num_parts, splits=splits, hops=2)
        assert report["local_khop_ratio"] >= random["local_khop_ratio"]
    uncapped = partition(cora, "bytegnn", 4, seed=0, splits=splits, imbalance=None)
    assert partition_report(cora, uncapped, 4, splits=splits)["train_balance"] > 1.1


def test_each_block_lies_in_exactly_one_part(sbm_sparse):
    graph, splits = sbm_sparse
    centers = center_order(splits, "random", 0)
    block_of, _ = neighbourhood_blocks(graph, centers, 2)
    parts = partition(graph, "bytegnn", 4, seed=0, splits=splits)
    parts_per_block = torch.zeros(int(block_of.max()) + 1, 4, dtype=torch.int64)
    parts_per_block.index_put_((block_of, parts), torch.ones_like(parts), accumulate=True)
    assert ((parts_per_block > 0).sum(1) == 1).all()


# ------------------------------------------------------------------ the method and report
def test_khop_locality_matches_brute_force():
    graph, splits = _random_graph(120, 260, labelled=0.25, seed=5)
    parts = torch.randint(3, (graph.num_nodes,), generator=torch.Generator().manual_seed(5))
    in_lists = _in_lists(graph)
    labelled = (splits[:, 0] | splits[:, 1] | splits[:, 2]).nonzero().flatten().tolist()
    for hops in (1, 2):
        local = total = remote = 0
        for c in labelled:
            dist = _distances_into(in_lists, c, hops)
            home = int(parts[c])
            for v, d in dist.items():
                if d < hops:
                    for u in in_lists[v]:
                        total += 1
                        local += int(parts[u]) == home and int(parts[v]) == home
                if bool(splits[c, 0]):  # a train center
                    remote += int(parts[v]) != home
        got = khop_locality(graph, splits, parts, hops, chunk=7)  # chunks split the centers
        assert got["local_khop_ratio"] == pytest.approx(local / total)
        assert got["remote_vertices_per_epoch"] == remote
        assert got["remote_bytes_per_epoch"] == remote * (8 + 3 * 4)  # id + 3 float32
    assert 0 < local < total and remote > 0


def test_report_adds_khop_keys_only_when_asked(sbm_sparse):
    graph, splits = sbm_sparse
    parts = partition(graph, "random", 2)
    plain = partition_report(graph, parts, 2, splits=splits)
    assert "local_khop_ratio" not in plain
    with_khop = partition_report(graph, parts, 2, splits=splits, hops=2)
    assert with_khop == {**plain, **khop_locality(graph, splits, parts, 2)}
    whole = partition_report(graph, torch.zeros_like(parts), 1, splits=splits, hops=2)
    assert whole["local_khop_ratio"] == 1.0


def test_bytegnn_is_a_seeded_partition_method(sbm_sparse, sbm_dataset):
    graph, splits = sbm_sparse
    assert "bytegnn" in PARTITION_METHODS

    def cut(seed, **options):
        return partition(graph, "bytegnn", 3, seed=seed, splits=splits, **options)

    parts = cut(1)
    assert torch.equal(parts, cut(1))
    assert not torch.equal(parts, cut(2))
    assert torch.equal(cut(1, order="gid"), cut(2, order="gid"))
    # the splits given are the ones balanced: the dataset's own (all labelled) cut differently
    own = _splits_of(sbm_dataset)
    assert not torch.equal(parts, partition(graph, "bytegnn", 3, seed=1, splits=own))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"hops": 0}, "hops must be an integer >= 1"),
        ({"hops": 2.0}, "hops must be an integer >= 1"),
        ({"weights": (0.5, 0.5)}, "three numbers"),
        ({"weights": (0.5, 0.6, -0.1)}, "three numbers"),
        ({"weights": (0.2, 0.2, 0.2)}, "summing to 1"),
        ({"smoothing": -1}, "smoothing must be a number >= 0"),
        ({"order": "degree"}, "valid: \\['random', 'gid'\\]"),
        ({"imbalance": -0.1}, "imbalance must be None or a number >= 0"),
        ({"hop": 2}, "unknown options \\['hop'\\]"),
        ({"block_bfs": "dfs"}, "valid: \\['level_sync', 'sequential'\\]"),
    ],
)
def test_bad_options_fail_before_any_work(options, message):
    with pytest.raises(ValueError, match=message):
        check_partition_options("bytegnn", options)
    graph, splits = _random_graph(20, 30, labelled=0.5, seed=0)
    with pytest.raises(ValueError, match=message):
        partition(graph, "bytegnn", 1, splits=splits, **options)  # even with nothing to cut


def test_check_partition_options_covers_every_method():
    with pytest.raises(ValueError, match="valid: \\['random', 'contiguous', 'metis'"):
        check_partition_options("kmeans", {})
    with pytest.raises(ValueError, match="overpartition"):
        check_partition_options("metis_balanced", {"overpartition": 0})
    with pytest.raises(ValueError, match="unknown options \\['hops'\\]"):
        check_partition_options("metis", {"hops": 2})
    check_partition_options("bytegnn", {"weights": [0.5, 0.25, 0.25], "imbalance": None})


def test_edge_cases_no_labels_empty_split_and_more_parts_than_blocks():
    # no labelled vertex: every block is a component, balanced by size
    unlabelled, no_splits = _random_graph(200, 150, labelled=0.0, seed=6)
    parts = partition(unlabelled, "bytegnn", 2, splits=no_splits)
    assert torch.bincount(parts, minlength=2).min() > 0
    # no val vertex: the empty split drops out of BS, the others still balance
    graph, splits = _random_graph(600, 1200, labelled=0.5, seed=7, undirected=True)
    splits[:, 1] = False
    parts = partition(graph, "bytegnn", 2, splits=splits)
    report = partition_report(graph, parts, 2, splits=splits)
    assert report["train_balance"] <= 1.1 and report["test_balance"] <= 1.1
    # two blocks (a labelled pair and an isolated vertex) into four parts: empty parts allowed
    tiny = Graph.from_edge_index(
        torch.tensor([[0], [1]]),
        3,
        undirected=True,
        x=torch.zeros(3, 1),
    )
    tiny_splits = torch.zeros(3, 3, dtype=torch.bool)
    tiny_splits[0, 0] = True  # vertex 0 trains
    parts = partition(tiny, "bytegnn", 4, splits=tiny_splits)
    assert int(parts[0]) == int(parts[1]) and int(parts[2]) != int(parts[0])
    assert torch.bincount(parts, minlength=4).tolist().count(0) == 2


# ------------------------------------------------------------------------- configuration
def test_distdgl_partition_config_reaches_bytegnn(sbm_sparse):
    from lightning_gnnscale.systems.distdgl.config import DistDGLConfig, PartitionConfig

    config = DistDGLConfig(partition=PartitionConfig(method="bytegnn"))
    options = config.partition.options()
    assert set(options) == set(METHOD_OPTIONS["bytegnn"])
    graph, splits = sbm_sparse
    parts = partition(graph, config.partition.method, 2, seed=0, splits=splits, **options)
    assert torch.equal(parts, partition(graph, "bytegnn", 2, seed=0, splits=splits))


def test_metis_cuts_are_reported_next_to_bytegnn_with_the_same_keys(sbm_sparse):
    graph, splits = sbm_sparse
    reports = {
        method: partition_report(
            graph, partition(graph, method, 2, splits=splits), 2, splits=splits, hops=2
        )
        for method in ("bytegnn", "metis", "metis_balanced", "random")
    }
    assert len({tuple(sorted(r)) for r in reports.values()}) == 1
    assert math.isfinite(reports["metis"]["local_khop_ratio"])


# ----------------------------------------------------------------------------------- bench
def test_bench_writes_its_table_and_skips_a_missing_cora(tmp_path, capsys):
    from lightning_gnnscale.bench.bytegnn_partition import METHODS, run_bytegnn_partition_bench

    out = tmp_path / "bench"
    result = run_bytegnn_partition_bench(
        nodes=300, num_parts=[2], hops=2, seed=0, cora_root=tmp_path / "none", out=out, argv=[]
    )
    assert "Cora skipped" in capsys.readouterr().out
    rows = json.loads((out / "bytegnn_partition.json").read_text())["results"]
    assert rows == json.loads(json.dumps(result["results"]))
    assert {(r["graph"], r["method"]) for r in rows} == {
        (g, m) for g in ("sbm", "sbm-sparse") for m in METHODS
    }
    table = (out / "bytegnn_partition.md").read_text()
    assert "| sbm-sparse | 2 | bytegnn |" in table and "Cora skipped" in table
