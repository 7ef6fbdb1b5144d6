"""``GSplitDataModule``: one global mini-batch per step, split by the partition map.

Every rank draws the same global seeds as ``single`` (the shared epoch permutation), keeps
the targets it owns, samples split-parallel (collective, so in the main process), and loads
input features only for the vertices it owns, through a partition-aligned cache ranked by
pre-sampled input frequency (hit / miss counters; on CPU both are RAM, only the counts mean
anything). Evaluation is full-graph layer-wise inference (the topology is replicated).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
from torch.utils.data import DataLoader

from ...graph.batch import Batch
from ...graph.csc import Graph
from ...graph.order import EpochOrder
from ..base import (
    GNNDataModule,
    assert_same_on_all_ranks,
    collective_train_loader,
    replicated_eval_counts,
)
from .sampler import LayerPlan, SplitSampler


@dataclass(frozen=True)
class GSplitPrepared:
    """The prepared input of every rank: the graph, the split function and its statistics."""

    graph: Graph
    parts: torch.Tensor
    input_frequency: torch.Tensor  # k0_v: pre-sampled input-layer frequency (cache ranking)
    report: dict


@dataclass
class SplitBatch(Batch):
    """A :class:`Batch` plus the shuffle plan of every layer (``plans[i]`` before layer ``i``)."""

    plans: list[LayerPlan] = field(default_factory=list)

    def to(self, device) -> SplitBatch:
        return replace(super().to(device), plans=[p.to(device) for p in self.plans])


class PartitionedFeatureCache:
    """Rank ``r`` caches the ``capacity`` of its own vertices most often in pre-sampled input
    layers (``policy=presample_freq``) or the lowest ids (``id_order``); no row is cached twice.

    ``load(ids)`` returns ``x[ids]`` and counts hits, misses and host bytes.
    """

    def __init__(
        self,
        x: torch.Tensor,
        owned: torch.Tensor,
        frequency: torch.Tensor,
        fraction: float,
        policy: str,
    ):
        capacity = int(round(fraction * owned.numel()))
        if policy == "presample_freq":
            ranked = owned[torch.argsort(frequency[owned], descending=True, stable=True)]
        else:
            ranked = owned
        self.cached = torch.zeros(x.shape[0], dtype=torch.bool)
        self.cached[ranked[:capacity]] = True
        self.x, self.capacity = x, capacity
        self.hits = self.misses = 0

    def load(self, ids: torch.Tensor) -> torch.Tensor:
        hit = int(self.cached[ids].sum())
        self.hits += hit
        self.misses += ids.numel() - hit
        return self.x.index_select(0, ids)

    @property
    def row_bytes(self) -> int:
        return self.x.shape[1] * self.x.element_size()


class GSplitDataModule(GNNDataModule):
    """Args:
    data: the prepared graph and split function.
    fanouts: by hop from the targets.
    batch_size: global targets per step (``-1``: all training nodes).
    seed: base of the permutation and the sampling keys (the same as ``single``).
    cache_fraction: share of each rank's own vertices whose features are cached.
    cache_policy: ``presample_freq`` | ``id_order``.
    eval_chunk_size: destination nodes per chunk in layer-wise inference.
    """

    def __init__(
        self,
        data: GSplitPrepared,
        fanouts: list[int],
        batch_size: int,
        seed: int,
        cache_fraction: float = 0.25,
        cache_policy: str = "presample_freq",
        eval_chunk_size: int = 65536,
    ):
        super().__init__()
        self.data, self.fanouts, self.seed = data, list(fanouts), seed
        graph = data.graph
        self.train_ids = graph.split_ids("train")
        self.batch_size = self.train_ids.numel() if batch_size == -1 else batch_size
        self.cache_fraction, self.cache_policy = cache_fraction, cache_policy
        self.eval_chunk_size = eval_chunk_size
        self.order = EpochOrder(self.train_ids, seed)
        self.input_dim, self.num_classes = graph.num_features, graph.num_classes

    def setup(self, stage: str) -> None:
        if getattr(self, "sampler", None) is not None:
            return
        trainer, graph = self.trainer, self.data.graph
        self.rank, self.world_size = trainer.global_rank, trainer.world_size
        self.comm = trainer.strategy.comm
        parts = self.data.parts
        assert_same_on_all_ranks(self.comm, parts, "the GSplit split function")
        if int(parts.max()) >= self.world_size:
            raise ValueError(f"split function has parts >= world size {self.world_size}")
        self.sampler = SplitSampler(
            self.comm, parts, graph.indptr, graph.indices, self.fanouts, self.seed
        )
        owned = (parts == self.rank).nonzero().flatten()
        self.cache = PartitionedFeatureCache(
            graph.x, owned, self.data.input_frequency, self.cache_fraction, self.cache_policy
        )

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.train_ids.numel() // self.batch_size)

    def step_seeds(self, epoch: int, step: int) -> torch.Tensor:
        """The global mini-batch of a step: exactly ``single``'s."""
        return self.order.step(epoch, step, self.batch_size)

    def make_batch(self, epoch: int, step: int) -> SplitBatch:
        seeds = self.step_seeds(epoch, step)
        targets = seeds[self.data.parts[seeds] == self.rank]
        start = time.perf_counter()
        blocks, plans, inputs = self.sampler.sample(targets, epoch, step)
        sampled = time.perf_counter()
        hits, misses = self.cache.hits, self.cache.misses
        x = self.cache.load(inputs)
        y = self.data.graph.y.index_select(0, blocks[-1].dst_ids)
        parts = self.data.parts
        stats = {
            "sample_s": sampled - start,
            "load_s": time.perf_counter() - sampled,
            "input_nodes": inputs.numel(),
            "cache_hits": self.cache.hits - hits,
            "cache_misses": self.cache.misses - misses,
            "vertices": [b.num_dst for b in blocks],
            "edges": [b.num_edges for b in blocks],
            "cross_edges": [
                int((parts[b.src_ids[b.edge_index[0]]] != self.rank).sum()) for b in blocks
            ],
            "rows_received": [sum(p.recv_splits) - p.recv_splits[self.rank] for p in plans],
        }
        return SplitBatch(blocks, x, y, seeds.numel(), epoch, step, stats, plans=plans)

    def train_dataloader(self) -> DataLoader:
        return collective_train_loader(self)  # sampling runs collectives

    def eval_counts(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        return replicated_eval_counts(
            self.data.graph, net, splits, self.rank, self.world_size, self.eval_chunk_size
        )
