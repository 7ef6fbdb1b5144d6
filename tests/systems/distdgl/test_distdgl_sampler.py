"""DistDGL's distributed sampler equals one process on the relabelled graph; trainer split."""

import pytest
import torch

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.graph.book import PartitionBook, build_local_partition, relabel_graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.partition import partition
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.graph.seed_split import SeedSplit
from lightning_gnnscale.kit.loaders import collective_train_loader
from lightning_gnnscale.systems.distdgl.datamodule import DistDGLDataModule
from lightning_gnnscale.systems.distdgl.sampler import DistNeighborSampler
from tests.helpers.dist import run_distributed

FANOUT_CASES = ([4, 3], [-1, -1], [2, 5, 1])


def relabelled_graph(world_size, empty_part=False):
    """The relabelled graph, its targets in gids and the book."""
    dataset = sbm(num_nodes=240, num_classes=4, avg_degree=7.0, num_features=6, seed=2)
    parts = partition(dataset.graph, "random", world_size, seed=1)
    if empty_part:  # the last rank owns nothing: its collectives must still run
        parts = torch.where(parts == world_size - 1, 0, parts)
    book = PartitionBook.from_parts(parts, world_size)
    return relabel_graph(dataset.graph, book), dataset.targets.rows(book.new2old), book


def edge_set(blocks):
    return [
        {(int(s), int(d)) for s, d in zip(b.src_ids[b.edge_index[0]], b.src_ids[b.edge_index[1]])}
        for b in blocks
    ]


def _sample_rank(rank, world_size, empty_part):
    graph, targets, book = relabelled_graph(world_size, empty_part)
    local = build_local_partition(graph, targets, book, rank)
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
    graph, _, _ = relabelled_graph(world_size, empty_part)
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


class _SplitLoaderSource:
    """What ``collective_train_loader`` reads from a ``DistDGLDataModule`` (epoch 0), with
    the data module's own ``steps_per_epoch``; a batch is the rank's seeds."""

    steps_per_epoch = DistDGLDataModule.steps_per_epoch
    link = None  # a node task's: the steps are the SeedSplit's

    def next_loader_epoch(self) -> int:
        return 0

    def __init__(self, split: SeedSplit):
        self.split = split

    def training_batch(self, epoch: int, step: int) -> torch.Tensor:
        return self.split.seeds(epoch, step)


def _expected_steps(num_train: int, world: int, batch: int) -> int:
    """The trainer split (docs/systems/distdgl.md), computed here from scratch: rank chunks are an even split of the training
    ids (the first ``num_train % world`` get one more), the local batch is ``batch // world``
    (at least 1), and every rank runs ``ceil(smallest chunk / local batch)`` steps."""
    if batch == -1:
        return 1
    smallest = num_train // world  # the last chunk never gets the extra id
    local_batch = max(1, batch // world)
    return max(1, (smallest + local_batch - 1) // local_batch)


@pytest.mark.parametrize(
    ("num_train", "world", "batch"),
    # (301, 3, 60): chunks 101/100/100, local batch 20 -> 5 steps (the largest chunk or the
    # global count would give 6); (334, 3, 64): local batch 21 -> 6; (10, 4, 8): chunks
    # 3/3/2/2, local batch 2 -> 1; (50, 2, -1): one step.
    [(301, 3, 60), (334, 3, 64), (10, 4, 8), (50, 2, -1)],
)
def test_trainer_split_steps_per_epoch_follow_the_even_split_rule(num_train, world, batch):
    """Every rank's real train loader yields the number of steps the even-split rule gives,
    computed independently of ``SeedSplit``, and its steps cover its chunk evenly."""
    train = torch.arange(0, 3 * num_train, 3)
    expected = _expected_steps(num_train, world, batch)
    for rank in range(world):
        split = SeedSplit(train, world, rank, batch, seed=4)
        batches = list(collective_train_loader(_SplitLoaderSource(split)))
        assert len(batches) == expected, rank
        chunk = num_train // world + (rank < num_train % world)
        sizes = [b.numel() for b in batches]
        assert sum(sizes) == chunk and max(sizes) - min(sizes) <= 1  # whole chunk, even steps


def test_trainer_split_covers_every_seed_once_in_lockstep():
    train = torch.arange(0, 1000, 3)  # 334 sorted training gids
    world, batch = 3, 60
    splits = [SeedSplit(train, world, r, batch, seed=4) for r in range(world)]
    assert len({s.steps for s in splits}) == 1  # every rank runs the same number of steps
    assert splits[0].steps == _expected_steps(train.numel(), world, batch)
    sizes = [s.mine.numel() for s in splits]
    assert max(sizes) - min(sizes) <= 1 and torch.equal(torch.cat([s.mine for s in splits]), train)
    for epoch in range(2):
        seen = torch.cat([s.seeds(epoch, t) for s in splits for t in range(splits[0].steps)])
        assert torch.equal(seen.sort().values, train)  # each training node exactly once
        for t in range(splits[0].steps):
            assert splits[0].global_seed_count(t) == sum(s.seeds(epoch, t).numel() for s in splits)
    assert not torch.equal(splits[0].seeds(0, 0), splits[0].seeds(1, 0))  # reshuffled per epoch
