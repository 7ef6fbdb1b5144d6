"""The DataModule of systems whose ranks all hold the whole graph (``single``, ``ddp``)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader
from typing_extensions import override

from ..contract import RankContext
from ..graph.batch import Batch
from ..graph.book import RangeBook
from ..models.inference import full_logits, replicated_eval_statistics
from .datamodule import GNNDataModule
from .embeddings import KVStore, LearnableInputs
from .loaders import EpochSteps, StepBatcher, no_collate


def whole_graph_statistics(
    dm: GNNDataModule, net: torch.nn.Module, splits: tuple[str, ...]
) -> torch.Tensor:
    """``[len(splits), k]`` task statistics of rank ``dm.rank``'s node range of the whole
    graph (``dm.graph``, which this rank holds): layer-wise inference split across
    ``dm.world_size`` ranks (:func:`replicated_eval_statistics`). Also Grappa's, for a net
    that runs on the whole graph."""
    comm = dm.context.comm if dm.context is not None else None
    if dm.task.spec.seeds == "edges":
        return whole_graph_link_statistics(dm, net, splits, comm)
    return replicated_eval_statistics(
        dm.task,
        dm.input_graph(),
        dm.targets,
        net,
        splits,
        dm.rank,
        dm.world_size,
        dm.data.eval_chunk_size,
        comm,
    )


def whole_graph_link_statistics(
    dm: GNNDataModule, net: torch.nn.Module, splits: tuple[str, ...], comm
) -> torch.Tensor:
    """Link prediction's statistics on a rank that holds the whole graph: every node embedded
    once per stage (layer-wise, split across ranks and all-gathered as ``activation`` with a
    distributed ``comm``), then this rank's share of the evaluation edges scored
    (:meth:`~..tasks.link_prediction.LinkPrediction.link_statistics`)."""
    distributed = comm if comm is not None and comm.world_size > 1 else None
    inputs = dm.input_graph()

    def embed(stage: str) -> torch.Tensor:
        graph = dm.task.stage_graph(inputs, dm.targets, stage)
        return full_logits(graph, net, dm.data.eval_chunk_size, distributed)

    return dm.task.link_statistics(embed, dm.targets, splits, dm.rank, dm.world_size)


class ReplicatedGraphEvaluation:
    """``eval_statistics`` for a DataModule whose ranks all hold the whole graph
    (``self.graph``): :func:`whole_graph_statistics`."""

    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        return whole_graph_statistics(self, net, splits)


class SampledDataModule(ReplicatedGraphEvaluation, GNNDataModule):
    """Per-rank sampled mini-batches over a graph that every rank holds whole.

    Every rank draws the same seeded permutation of the training nodes per epoch; a step's
    ``data.batch_size`` seeds are split across ranks and sampled with the hash-keyed sampler
    (rank-salted keys when ``salt_by_rank``: independent micro-batches, as data-parallel systems
    sample; otherwise ranks sample exactly what one process would). Evaluation: full-graph
    layer-wise inference split across ranks, each rank inferring and scoring its node range
    (:func:`replicated_eval_statistics`).

    Args: as :class:`GNNDataModule`, plus ``salt_by_rank`` (rank-salted sampling keys).
    """

    def __init__(self, dataset, config, data=None, *, salt_by_rank: bool, **kwargs):
        super().__init__(dataset, config, data, **kwargs)
        self.salt_by_rank = salt_by_rank
        self.rank, self.world_size = 0, 1

    @override
    def setup_rank(self, context: RankContext, prepared: Any) -> None:
        """The rank's place, and the learned input rows of featureless node types
        (:meth:`~.datamodule.GNNDataModule.featureless_nodes`): a table sharded over the ranks
        by even node ranges (each rank updates its own; a step looks up the rows of its
        input nodes from their owners)."""
        self.rank, self.world_size = context.rank, context.world_size
        learned = self.featureless_nodes()
        if learned is None:
            return
        n, graph = self.graph.num_nodes, self.graph
        offsets = torch.tensor([n * r // self.world_size for r in range(self.world_size + 1)])
        kv = KVStore(context.comm, RangeBook(offsets))
        self.learned_inputs = LearnableInputs(
            kv,
            graph.num_features,
            self.seed,
            graph.x.dtype,
            self.data.embedding_optimizer,
            self.data.embedding_lr,
            torch.arange(int(offsets[self.rank]), int(offsets[self.rank + 1])),
            learned,
        )

    def batcher(self) -> StepBatcher:
        """The batch maker for this rank (rank and world size as set up)."""
        return StepBatcher.on_graph(
            self.graph,
            self.targets,
            self.task,
            self.data.fanouts,
            self.train_ids,
            self.batch_size,
            self.seed,
            self.rank,
            self.world_size,
            self.salt_by_rank,
            self.relation_fanouts,
        )

    def make_batch(self, epoch: int, step: int) -> Batch:
        """This rank's share of step ``step``."""
        return self.batcher()[epoch, step]

    @override
    def train_dataloader(self) -> DataLoader:
        workers = self.data.num_workers
        return DataLoader(
            self.batcher(),
            sampler=EpochSteps(self),
            batch_size=None,
            collate_fn=no_collate,
            num_workers=workers,
            persistent_workers=workers > 0,
        )
