"""PartitionBook relabelling and local partitions (core + 1-hop halo), against brute force."""

from __future__ import annotations

import pytest
import torch

from lightning_gnnscale.graph.book import (
    PartitionBook,
    build_local_partition,
    relabel_graph,
)
from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.node_targets import NodeTargets
from lightning_gnnscale.graph.partition import partition, partition_report


def _random_directed_graph(
    num_nodes: int = 60, num_edges: int = 300, seed: int = 0
) -> tuple[Graph, NodeTargets]:
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(num_nodes, (2, num_edges), generator=gen)
    graph = Graph.from_edge_index(edge_index, num_nodes, x=torch.randn(num_nodes, 3, generator=gen))
    targets = NodeTargets(
        torch.randint(4, (num_nodes,), generator=gen),
        torch.rand(num_nodes, generator=gen) < 0.5,
        torch.zeros(num_nodes, dtype=torch.bool),
        torch.ones(num_nodes, dtype=torch.bool),
        4,
    )
    return graph, targets


@pytest.fixture(params=[0, 1, 2])
def setup(request):
    """A random directed graph, a random 4-way partition with one empty part, and its book;
    the graph relabelled and its targets in gids (as ``partition_and_relabel`` gives them)."""
    graph, targets = _random_directed_graph(seed=request.param)
    gen = torch.Generator().manual_seed(request.param)
    parts = torch.randint(3, (graph.num_nodes,), generator=gen)
    parts[parts == 2] = 3  # part 2 stays empty
    book = PartitionBook.from_parts(parts, num_parts=4)
    relabelled = (relabel_graph(graph, book), targets.rows(book.new2old))
    return (graph, targets), parts, book, relabelled


def test_book_round_trips(setup):
    _, parts, book, _ = setup
    n = parts.numel()
    assert torch.equal(book.old2new[book.new2old], torch.arange(n))
    assert torch.equal(book.new2old[book.old2new], torch.arange(n))
    assert book.node_offsets.tolist() == [0, *torch.bincount(parts, minlength=4).cumsum(0).tolist()]
    assert book.part_sizes()[2] == 0 and book.part_nodes(2).numel() == 0


def test_relabelling_is_stable_and_lookups_agree(setup):
    _, parts, book, _ = setup
    gids = torch.arange(parts.numel())
    owner = book.nid2part(gids)
    assert torch.equal(owner, parts[book.new2old])
    assert bool((owner[1:] >= owner[:-1]).all()), "each part owns one contiguous gid range"
    for k in range(book.num_parts):
        olds = book.new2old[book.part_nodes(k)]
        assert torch.equal(olds, (parts == k).nonzero().flatten()), "ties keep original order"
    local = book.nid2local(gids)
    assert torch.equal(local + book.node_offsets[owner], gids)
    assert bool((local >= 0).all()) and bool((local < book.part_sizes()[owner]).all())
    assert torch.equal(book.nid2part(book.old2new), parts)


def test_relabelled_graph_is_the_same_graph(setup):
    (graph, targets), _, book, (relabelled, relabelled_targets) = setup
    src, dst = graph.edge_index()
    new_src, new_dst = relabelled.edge_index()
    expected = set(zip(book.old2new[src].tolist(), book.old2new[dst].tolist()))
    assert set(zip(new_src.tolist(), new_dst.tolist())) == expected
    assert relabelled.num_edges == graph.num_edges
    assert torch.equal(relabelled.x, graph.x[book.new2old])
    assert torch.equal(relabelled_targets.train[book.old2new], targets.train)
    offsets = book.edge_offsets(relabelled)
    assert torch.equal(
        book.nid2part(new_dst),
        torch.bucketize(torch.arange(relabelled.num_edges), offsets[1:], right=True),
    )


def test_local_partition_matches_brute_force(setup):
    _, _, book, (relabelled, targets) = setup
    src, dst = relabelled.edge_index()
    edges = list(zip(src.tolist(), dst.tolist()))
    seen_edge_ids = []
    for k in range(book.num_parts):
        local = build_local_partition(relabelled, targets, book, k)
        core = set(book.part_nodes(k).tolist())
        halo = sorted({s for s, d in edges if d in core and s not in core})
        assert local.halo_gids.tolist() == halo
        assert local.core_gids.tolist() == sorted(core) and local.num_core == len(core)
        local_src = local.local2global[local.indices]
        local_dst = local.core_gids[
            torch.repeat_interleave(
                torch.arange(local.num_core), local.indptr[1:] - local.indptr[:-1]
            )
        ]
        assert sorted(zip(local_src.tolist(), local_dst.tolist())) == sorted(
            (s, d) for s, d in edges if d in core
        )
        assert torch.equal(relabelled.indices[local.edge_ids], local_src)
        assert torch.equal(local.x, relabelled.x[local.core_gids])
        assert torch.equal(local.targets.train, targets.train[local.core_gids])
        assert torch.equal(local.targets.target, targets.target[local.core_gids])
        seen_edge_ids.append(local.edge_ids)
    all_ids = torch.cat(seen_edge_ids)
    assert torch.equal(all_ids.sort().values, torch.arange(relabelled.num_edges)), (
        "every edge is stored in exactly one partition"
    )


def test_local_partition_on_a_metis_partitioned_sbm():
    dataset = sbm(num_nodes=2000, seed=0)
    graph, splits = dataset.graph, dataset.targets.split_matrix()
    parts = partition(graph, "metis", 4)
    book = PartitionBook.from_parts(parts)
    relabelled = relabel_graph(graph, book)
    targets = dataset.targets.rows(book.new2old)
    locals_ = [build_local_partition(relabelled, targets, book, k) for k in range(4)]
    assert sum(local.num_edges for local in locals_) == graph.num_edges
    assert sum(local.num_core for local in locals_) == graph.num_nodes
    in_degree = relabelled.in_degree()
    halo_sizes = partition_report(graph, parts, splits=splits)["halo_nodes_per_part"]
    for k, local in enumerate(locals_):
        assert torch.equal(local.indptr[1:] - local.indptr[:-1], in_degree[local.core_gids])
        assert local.num_halo == halo_sizes[k]


def test_book_validation():
    with pytest.raises(ValueError, match="inverse permutation"):
        PartitionBook(
            node_offsets=torch.tensor([0, 2]),
            new2old=torch.tensor([0, 1]),
            old2new=torch.tensor([0, 0]),
        )
    with pytest.raises(ValueError, match="from 0 to N"):
        PartitionBook(
            node_offsets=torch.tensor([0, 1]),
            new2old=torch.tensor([1, 0]),
            old2new=torch.tensor([1, 0]),
        )
    with pytest.raises(ValueError, match="non-decreasing"):
        PartitionBook(
            node_offsets=torch.tensor([0, 3, 1, 3]),
            new2old=torch.arange(3),
            old2new=torch.arange(3),
        )
    with pytest.raises(ValueError, match="must lie in"):
        PartitionBook.from_parts(torch.tensor([0, 5]), num_parts=2)
    book = PartitionBook.from_parts(torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match="gids must lie"):
        book.nid2part(torch.tensor([3]))
    with pytest.raises(ValueError, match="out of range"):
        book.part_nodes(2)
