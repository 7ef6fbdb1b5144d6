"""DistDGL's distributed sampler equals one process on the relabelled graph; trainer split."""

import pytest
import torch

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.graph.book import PartitionBook, build_local_partition, relabel_graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.partition import partition
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.systems.distdgl.sampler import DistNeighborSampler, TrainerSplit
from tests.helpers.dist import run_distributed

FANOUT_CASES = ([4, 3], [-1, -1], [2, 5, 1])


def relabelled_graph(world_size, empty_part=False):
    graph = sbm(num_nodes=240, num_classes=4, avg_degree=7.0, num_features=6, seed=2)
    parts = partition(graph, "random", world_size, seed=1)
    if empty_part:  # the last rank owns nothing: its collectives must still run
        parts = torch.where(parts == world_size - 1, 0, parts)
    book = PartitionBook.from_parts(parts, world_size)
    return relabel_graph(graph, book), book


def edge_set(blocks):
    return [
        {(int(s), int(d)) for s, d in zip(b.src_ids[b.edge_index[0]], b.src_ids[b.edge_index[1]])}
        for b in blocks
    ]


def _sample_rank(rank, world_size, empty_part):
    graph, book = relabelled_graph(world_size, empty_part)
    local = build_local_partition(graph, book, rank)
    comm = Comm.create()
    out = []
    for fanouts in FANOUT_CASES:
        sampler = DistNeighborSampler(comm, book, local, graph.in_degree(), fanouts, seed=9)
        for step in range(3):
            gen = torch.Generator().manual_seed(100 * step + rank)
            seeds = torch.randperm(graph.num_nodes, generator=gen)[: 5 + 7 * rank]
            if empty_part and rank == world_size - 1 and step == 0:
                seeds = seeds[:0]  # a rank with no seeds at all
            out.append((fanouts, step, seeds, sampler.sample(seeds, epoch=2, step=step)))
    return out, comm.meter.snapshot()


@pytest.mark.dist
@pytest.mark.parametrize(("world_size", "empty_part"), [(2, False), (3, True)])
def test_distributed_blocks_equal_single_process_blocks(world_size, empty_part):
    graph, _ = relabelled_graph(world_size, empty_part)
    results = run_distributed(_sample_rank, world_size, empty_part, timeout_s=120)
    for per_rank, meter in results:
        for fanouts, step, seeds, blocks in per_rank:
            ref = NeighborSampler(graph.indptr, graph.indices, fanouts, seed=9).sample(
                seeds, epoch=2, step=step
            )
            assert len(blocks) == len(ref)
            for got, want in zip(blocks, ref):
                assert torch.equal(got.src_ids, want.src_ids)  # same nodes, same order
                assert torch.equal(got.edge_index, want.edge_index)  # same edges, same order
                assert torch.equal(got.src_deg, want.src_deg)
        assert meter["bytes"]["structure"] > 0 and meter["bytes"]["feature"] == 0


def test_trainer_split_covers_every_seed_once_in_lockstep():
    train = torch.arange(0, 1000, 3)  # 334 sorted training gids
    world, batch = 3, 60
    splits = [TrainerSplit(train, world, r, batch, seed=4) for r in range(world)]
    assert len({s.steps for s in splits}) == 1  # every rank runs the same number of steps
    sizes = [s.mine.numel() for s in splits]
    assert max(sizes) - min(sizes) <= 1 and torch.equal(torch.cat([s.mine for s in splits]), train)
    for epoch in range(2):
        seen = torch.cat([s.seeds(epoch, t) for s in splits for t in range(splits[0].steps)])
        assert torch.equal(seen.sort().values, train)  # each training node exactly once
        for t in range(splits[0].steps):
            assert splits[0].global_seed_count(t) == sum(s.seeds(epoch, t).numel() for s in splits)
    assert not torch.equal(splits[0].seeds(0, 0), splits[0].seeds(1, 0))  # reshuffled per epoch
