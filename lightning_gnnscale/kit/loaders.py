"""The suite loaders' samplers and batch makers: a rank's loader yields that rank's share of
each step (:class:`StepBatcher` over a replicated graph, :func:`collective_train_loader` for
batches built with collectives), evaluation and predict loaders one item."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ..graph.batch import Batch
from ..graph.csc import Graph
from ..graph.node_targets import NodeTargets
from ..graph.order import EpochOrder
from ..graph.sampler import NeighborSampler
from ..tasks.base import NodeTask


class StepSource(Protocol):
    """What the train loaders read of a DataModule: its global steps per epoch, the epoch a
    new iterator runs and its batch of one step."""

    @property
    def steps_per_epoch(self) -> int: ...

    def next_loader_epoch(self) -> int: ...

    def training_batch(self, epoch: int, step: int) -> Batch: ...


class RankShareSampler(DistributedSampler):
    """Base of the suite loaders' samplers: a rank's loader already yields that rank's share
    (a step's seeds are split across ranks by the batch maker, evaluation by node range).

    It is a ``DistributedSampler`` for that reason: Lightning leaves a loader whose sampler
    is one alone (``Trainer(use_distributed_sampler=True)``, the default, "will not replace
    the existing one"), so a script that omits ``use_distributed_sampler=False`` trains on the
    same steps (issue 23: re-wrapped, each rank ran every other step). The
    ``DistributedSampler`` base is one replica and holds no data.
    """

    def __init__(self) -> None:
        super().__init__(range(0), num_replicas=1, rank=0, shuffle=False)


class OneItem(RankShareSampler):
    """The evaluation and predict loaders' sampler: their one item, on every rank."""

    def __len__(self) -> int:
        return 1

    def __iter__(self):
        return iter([0])


class EpochSteps(RankShareSampler):
    """Yields ``(epoch, step)`` for the epoch about to run (iterated in the main process).

    The epoch is the DataModule's (:meth:`~.datamodule.GNNDataModule.next_loader_epoch`),
    asked once per iterator: a counter of ``iter`` calls would break when Lightning probes the
    loader (it does so with DataLoader workers). Covered by the resume, worker and prefetching
    tests.
    """

    def __init__(self, dm: StepSource):
        super().__init__()
        self.dm = dm

    def __len__(self) -> int:
        return self.dm.steps_per_epoch

    def __iter__(self):
        epoch = self.dm.next_loader_epoch()
        return iter([(epoch, step) for step in range(self.dm.steps_per_epoch)])


@dataclass
class StepBatcher(Dataset):
    """Builds one rank's batch of a step; self-contained so DataLoader workers (spawned inside
    spawned ranks) can pickle it without the Trainer. Indexed by ``(epoch, step)``.

    A step's seeds are the task's (``train_ids``: nodes, or link prediction's training
    pairs); the task turns a rank's share into the nodes to sample and the targets
    (:meth:`~..tasks.base.NodeTask.step_rows`)."""

    graph: Graph
    targets: NodeTargets
    task: NodeTask
    sampler: NeighborSampler
    train_ids: torch.Tensor
    batch_size: int
    seed: int
    rank: int
    world_size: int
    salt_by_rank: bool

    def __len__(self) -> int:
        return -(-self.train_ids.numel() // self.batch_size)

    def __post_init__(self) -> None:
        self.order = EpochOrder(self.train_ids, self.seed)

    @classmethod
    def on_graph(
        cls,
        graph: Graph,
        targets: NodeTargets,
        task: NodeTask,
        fanouts: list[int],
        train_ids: torch.Tensor,
        batch_size: int,
        seed: int,
        rank: int,
        world_size: int,
        salt_by_rank: bool,
        relation_fanouts: list[tuple[int, ...]] | None = None,
    ) -> StepBatcher:
        """A batcher sampling ``graph`` whole (over the task's training structure and its
        relations) with the suite's hash-keyed ``fanouts`` sampler (``targets``: the task's
        rows of its nodes; a typed graph's relations, the task's message relations, sampled
        with ``relation_fanouts``)."""
        indptr, indices = task.training_structure(graph, targets)
        sampler = NeighborSampler(
            indptr,
            indices,
            list(fanouts),
            seed,
            edge_type=task.training_edge_type(graph, targets),
            relation_fanouts=relation_fanouts,
            num_relations=len(task.message_relations(graph)) or 1,
        )
        return cls(
            graph,
            targets,
            task,
            sampler,
            train_ids,
            batch_size,
            seed,
            rank,
            world_size,
            salt_by_rank,
        )

    def step_seeds(self, epoch: int, step: int) -> torch.Tensor:
        """All ranks' seeds of one global step."""
        return self.order.step(epoch, step, self.batch_size)

    def __getitem__(self, key: tuple[int, int]) -> Batch:
        """This rank's share of step ``step``: sample, then gather input rows and targets."""
        epoch, step = key
        global_seeds = self.step_seeds(epoch, step)
        positions = torch.tensor_split(torch.arange(global_seeds.numel()), self.world_size)
        share = positions[self.rank]
        start = time.perf_counter()
        nodes, y = self.task.step_rows(
            self.targets, global_seeds[share], share, epoch=epoch, step=step
        )
        salt = self.rank if self.salt_by_rank else 0
        exclude = self.task.excluded_edges(self.targets, global_seeds)
        blocks = self.sampler.sample(nodes, epoch=epoch, step=step, salt=salt, exclude=exclude)
        sampled = time.perf_counter()
        x = self.graph.x.index_select(0, blocks[0].src_ids)
        stats = {
            "sample_s": sampled - start,
            "load_s": time.perf_counter() - sampled,
            "input_nodes": blocks[0].num_src,
        }
        global_terms = self.task.loss_terms(global_seeds.numel())
        return Batch(blocks, x, y, global_terms, epoch, step, stats)


def no_collate(batch):
    return batch


class _CollectiveSteps(Dataset):
    """Steps of a DataModule whose batches may run collectives: ``training_batch(epoch, step)``."""

    def __init__(self, dm: StepSource):
        self.dm = dm

    def __len__(self) -> int:
        return self.dm.steps_per_epoch

    def __getitem__(self, key: tuple[int, int]) -> Batch:
        return self.dm.training_batch(*key)


def collective_train_loader(dm: StepSource) -> DataLoader:
    """Train loader for batches built with collectives: main process, strict step order."""
    return DataLoader(
        _CollectiveSteps(dm),
        sampler=EpochSteps(dm),
        batch_size=None,
        collate_fn=no_collate,
        num_workers=0,
    )
