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

import lightning as L
import torch
from typing_extensions import override

from ...graph.batch import Batch
from ...graph.sampler import NeighborSampler
from ..base import GNNDataModule, ReplicatedGraphEvaluation, assert_same_on_all_ranks
from ..contract import RankContext
from .callbacks import GSplitStats, RedundancyProbe
from .config import GSplitConfig
from .partition import cached_probabilistic_partition
from .sampler import LayerPlan, SplitSampler

PRESAMPLE_SEED_SALT = 0x5EED  # pre-sampling must not replay the training samples themselves


@dataclass(frozen=True)
class GSplitPrepared:
    """What every rank needs from preprocessing.

    Attributes:
        parts: int64 ``[N]``: the owner rank of every vertex (the split function).
        input_frequency: int64 ``[N]``: pre-sampled input-layer counts ``k0_v`` (ranks the
            feature cache).
        report: ``method``, ``expected_cross_fraction`` (predicted cross-split edge share),
            ``presampled_batches``.
    """

    parts: torch.Tensor
    input_frequency: torch.Tensor
    report: dict


class LayerTraffic:
    """What this rank receives from the other ranks in one step's forward shuffles.

    ``rows[i]`` and ``bytes[i]`` (ints, one per layer, input layer first) are written by the
    layer hook before layer ``i`` and read by :class:`~.callbacks.GSplitStats`. A plain object,
    not a dataclass: a wrapper that copies a dataclass batch field by field (Lightning's
    ``apply_to_collection`` does) keeps it, the one object the hook writes and callbacks read.
    """

    def __init__(self, num_layers: int):
        self.rows = [0] * num_layers
        self.bytes = [0] * num_layers

    def record(self, layer: int, rows: int, row_bytes: int) -> None:
        """``rows`` rows of ``row_bytes`` each were received before ``layer``."""
        self.rows[layer], self.bytes[layer] = rows, rows * row_bytes


@dataclass
class SplitBatch(Batch):
    """A :class:`Batch` plus what the shuffle needs.

    Attributes:
        plans: ``plans[i]``: how rows move before layer ``i`` (one per layer).
        traffic: this step's received rows and bytes per layer (written during forward).
    """

    plans: list[LayerPlan] = field(kw_only=True)
    traffic: LayerTraffic = field(kw_only=True)

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
        capacity = round(fraction * owned.numel())
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


class GSplitDataModule(ReplicatedGraphEvaluation, GNNDataModule):
    """Split-parallel mini-batches: rank ``r`` samples, loads and computes the vertices it
    owns of every step's global mini-batch (``single``'s).

    Batches are :class:`SplitBatch`: ``blocks`` input layer first, ``x`` ``[|inputs|, F]`` of
    the owned inputs, ``y`` of the owned targets, ``plans`` the shuffle before each layer.

    Args: as :class:`~..base.GNNDataModule`; ``config`` defaults to ``GSplitConfig()``.
    """

    def __init__(self, dataset, config: GSplitConfig | None = None, data=None, **kwargs):
        super().__init__(dataset, config or GSplitConfig(), data, **kwargs)
        self.rank, self.world_size = 0, 1
        self.report: dict = {}  # GSplitPrepared.report of the run's world size

    # ---------------------------------------------------------------------- preprocessing
    @override
    def preprocess(self, world_size: int) -> GSplitPrepared:
        """Pre-sample and partition (cached on disk by content hash under ``cache_dir``)."""
        p = self.config.partition
        artifact = cached_probabilistic_partition(
            self.graph,
            world_size,
            method=p.method,
            fanouts=list(self.data.fanouts),
            batch_size=self.data.batch_size,
            presample_epochs=p.presample_epochs,
            seed=self.seed ^ PRESAMPLE_SEED_SALT,
            cache_dir=self.cache_dir,
            metis_seed=self.seed,
            ufactor=p.ufactor,
            zero_edge_policy=p.zero_edge_policy,
        )
        print(
            f"[gsplit] {p.method} split into {world_size}: predicted cross-split edge share "
            f"{artifact['expected_cross_fraction']:.1%} ({artifact['num_batches']} pre-sampled "
            f"mini-batches)",
            flush=True,
        )
        report = {
            "method": p.method,
            "expected_cross_fraction": artifact["expected_cross_fraction"],
            "presampled_batches": artifact["num_batches"],
        }
        return GSplitPrepared(artifact["parts"], artifact["k0_v"], report)

    @override
    def setup_rank(self, context: RankContext, prepared: GSplitPrepared) -> None:
        graph, parts = self.graph, prepared.parts
        assert_same_on_all_ranks(context.comm, parts, "the GSplit split function")
        if int(parts.max()) >= context.world_size:
            raise ValueError(f"split function has parts >= world size {context.world_size}")
        self.rank, self.world_size = context.rank, context.world_size
        self.parts, self.report = parts, prepared.report
        self.sampler = SplitSampler(
            context.comm, parts, graph.indptr, graph.indices, list(self.data.fanouts), self.seed
        )
        cache = self.config.cache
        self.cache = PartitionedFeatureCache(
            graph.x,
            (parts == self.rank).nonzero().flatten(),
            prepared.input_frequency,
            cache.fraction,
            cache.policy,
        )

    # --------------------------------------------------------------------------- training
    def step_seeds(self, epoch: int, step: int) -> torch.Tensor:
        """The global mini-batch of a step: exactly ``single``'s."""
        return self.order.step(epoch, step, self.batch_size)

    def whole_batch_sampler(self) -> NeighborSampler:
        """The sampler ``single`` draws whole mini-batches with (same keys as the split one)."""
        graph = self.graph
        return NeighborSampler(graph.indptr, graph.indices, list(self.data.fanouts), self.seed)

    @override
    def make_batch(self, epoch: int, step: int) -> SplitBatch:
        seeds = self.step_seeds(epoch, step)
        targets = seeds[self.parts[seeds] == self.rank]
        start = time.perf_counter()
        blocks, plans, inputs = self.sampler.sample(targets, epoch, step)
        sampled = time.perf_counter()
        hits, misses = self.cache.hits, self.cache.misses
        x = self.cache.load(inputs)
        y = self.graph.y.index_select(0, blocks[-1].dst_ids)
        stats = {
            "sample_s": sampled - start,
            "load_s": time.perf_counter() - sampled,
            "input_nodes": inputs.numel(),
            "cache_hits": self.cache.hits - hits,
            "cache_misses": self.cache.misses - misses,
            "edges": [b.num_edges for b in blocks],
            "cross_edges": [
                int((self.parts[b.src_ids[b.edge_index[0]]] != self.rank).sum()) for b in blocks
            ],
        }
        return SplitBatch(
            blocks,
            x,
            y,
            seeds.numel(),
            epoch,
            step,
            stats,
            plans=plans,
            traffic=LayerTraffic(len(plans)),
        )

    @override
    def callbacks(self) -> list[L.Callback]:
        """:class:`GSplitStats`, and the :class:`RedundancyProbe` when
        ``redundancy_probe_steps > 0``."""
        stats = GSplitStats(partition_report=lambda: self.report)
        steps = self.config.redundancy_probe_steps
        if not steps:
            return [stats]
        return [stats, RedundancyProbe(steps, self.step_seeds, self.whole_batch_sampler)]
