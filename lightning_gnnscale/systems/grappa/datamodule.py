"""``GrappaDataModule``: isolated mini-batches inside the rank's current partition.

An epoch is ``partitions_per_rank`` phases; in phase ``i`` rank ``r`` trains partition
``r + i * W`` of the current super-epoch ``t``. Within a phase every rank runs the same number of
steps (computed from the replicated per-chunk training counts, no communication). Each batch is
sampled inside the partition only, with its seeds' coverage statistics (``kappa``, ``s``)
attached for the strategy's coverage factor. ``t`` and ``e_in`` are advanced by
:class:`~.callbacks.SuperEpochController` and saved in checkpoints.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from ...graph.batch import Batch
from ...graph.csc import Graph
from ...graph.order import EpochOrder
from ...models.gnn import BlockGNN, layerwise_inference
from ..base import GNNDataModule, collective_train_loader, replicated_eval_counts
from .chunking import ChunkStore
from .estimators import gcn_kappa, kappa, seed_sample_counts
from .partition import LocalPartition, PartitionSampler, build_partition
from .remote import RemoteSampler
from .schedule import PartitionSpec, Schedule

EVAL_MODES = ("global_fullgraph", "isolated", "none")
MODES = ("minibatch", "fullgraph")
GCN_NEEDS_HALO = (
    "strategy.neighbor_weighting=gcn needs strategy.halo_hops=1: the GCN coverage is the local "
    "share of each seed's in-neighbour mass, and without the halo the partition has neither the "
    "seeds' remote in-edges nor their sources' degrees (kappa would be 1 everywhere)"
)


class GrappaDataModule(GNNDataModule):
    """Args:
    store: the chunk store written by ``prepare``.
    schedule: the chunk schedule.
    fanouts: by hop from the seeds (``fanouts[0]`` is the seed hop, ``f_seed``).
    batch_size: global seeds per step; each partition takes ``ceil(batch_size / W)`` before
        step equalisation (``-1``: all of a partition's seeds in one step).
    seed: base of the seed shuffles and sampling keys.
    mode: ``minibatch`` or ``fullgraph`` (one step per phase on the whole local neighbourhood).
    partitions_per_rank: phases per epoch ``k`` (``P = k W``).
    halo_hops, count_halo_as_local, degree_smoothing, neighbor_weighting: coverage settings.
    estimator: ``node`` attaches per-seed loss weights ``kappa``.
    eval_mode: ``global_fullgraph`` (needs ``graph``), ``isolated`` or ``none``.
    graph: the whole graph, only for ``global_fullgraph`` evaluation.
    remote_sample_frac: Grappa-50S: share of halo nodes expanded through their owner.
    cache_partitions: keep every built partition (small graphs) instead of only the current one.
    """

    def __init__(
        self,
        store: ChunkStore,
        schedule: Schedule,
        fanouts: list[int],
        batch_size: int,
        seed: int = 0,
        mode: str = "minibatch",
        partitions_per_rank: int = 1,
        halo_hops: int = 1,
        count_halo_as_local: bool = False,
        degree_smoothing: float = 1.0,
        neighbor_weighting: str = "uniform",
        estimator: str = "resampling",
        eval_mode: str = "global_fullgraph",
        graph: Graph | None = None,
        remote_sample_frac: float = 0.0,
        cache_partitions: bool = False,
        eval_chunk_size: int = 65536,
    ):
        super().__init__()
        if neighbor_weighting == "gcn" and halo_hops == 0:
            raise ValueError(GCN_NEEDS_HALO)
        self.store, self.schedule = store, schedule
        self.fanouts, self.batch_size, self.seed = list(fanouts), batch_size, seed
        self.mode, self.k = mode, partitions_per_rank
        self.halo_hops, self.count_halo_as_local = halo_hops, count_halo_as_local
        self.alpha, self.neighbor_weighting = degree_smoothing, neighbor_weighting
        self.estimator, self.eval_mode, self.graph = estimator, eval_mode, graph
        self.remote_sample_frac, self.cache_partitions = remote_sample_frac, cache_partitions
        self.eval_chunk_size = eval_chunk_size
        self.input_dim = int(store.meta["num_features"])
        self.num_classes = int(store.meta["num_classes"])
        self.rank, self.world_size = 0, 1
        self.t, self.e_in = 0, 0
        # repartition I/O: bytes read from the chunk store to build training partitions, and
        # their count (isolated evaluation's own reads are not counted)
        self.io_bytes = 0
        self.builds = 0
        self.largest_partition = {"nodes": 0, "edges": 0, "io_bytes": 0}
        # (partition id, chunks) -> the partition, its seed order and its sampler
        self._parts: dict[tuple, tuple[LocalPartition, EpochOrder, PartitionSampler]] = {}
        self.remote = None  # Grappa-50S sampler (set up in ``setup``)

    # ------------------------------------------------------------------------ set-up, state
    def setup(self, stage: str) -> None:
        trainer = self.trainer
        if trainer is not None:
            self.rank, self.world_size = trainer.global_rank, trainer.world_size
            self.comm = trainer.strategy.comm
        if self.schedule.num_partitions != self.k * self.world_size:
            raise ValueError(
                f"{self.schedule.num_partitions} partitions for {self.world_size} ranks x "
                f"{self.k} phases"
            )
        if self.remote_sample_frac > 0 and self.remote is None:
            self.remote = RemoteSampler(self, self.remote_sample_frac)
        self.n_steps = [self._phase_steps(i) for i in range(self.k)]

    def _layout(self) -> dict:
        """What ``t`` means: the chunking (content key), schedule, sweep order and phases."""
        return {
            "chunking": Path(self.store.path).name,
            "schedule": self.schedule.kind,
            "sweep_order": self.schedule.sweep_order,
            "sweep_seed": self.schedule.seed,
            "partitions_per_rank": self.k,
        }

    def state_dict(self) -> dict:
        return {"t": self.t, "e_in": self.e_in, **self._layout()}

    def load_state_dict(self, state: dict) -> None:
        """Restore the schedule position; the layout it indexes must be the same."""
        differ = {k: (state.get(k), v) for k, v in self._layout().items() if state.get(k) != v}
        if differ:
            raise ValueError(
                "the checkpoint's Grappa layout differs from this run's (checkpoint, run): "
                f"{differ}; same dataset, chunking, num_chunks, seed, schedule, sweep_order and "
                "partitions_per_rank needed"
            )
        self.t, self.e_in = int(state["t"]), int(state["e_in"])

    # --------------------------------------------------------------------------- partitions
    @property
    def local_batch(self) -> int:
        """Seeds per partition step before equalisation: ``ceil(batch_size / W)``."""
        return -1 if self.batch_size == -1 else -(-self.batch_size // self.world_size)

    def _seed_count(self, spec) -> int:
        return sum(int(self.store.meta["train_counts"][c]) for c in spec.seed_chunks)

    def _phase_steps(self, phase: int) -> int:
        """Steps of a phase: max over its partitions (and over a schedule cycle, so the epoch
        length never changes) of ``ceil(seeds / local_batch)``; 1 in full-graph mode."""
        if self.mode == "fullgraph" or self.local_batch == -1:
            return 1
        parts = range(phase * self.world_size, (phase + 1) * self.world_size)
        counts = [
            self._seed_count(self.schedule.partition(p, t))
            for t in range(self.schedule.cycle)
            for p in parts
        ]
        return max(1, max(math.ceil(n / self.local_batch) for n in counts))

    def step_slice(self, n_seeds: int, n_steps: int, step: int) -> slice:
        """Positions in the epoch's seed order of one step of a partition: ``local_batch``
        seeds when that fills exactly ``n_steps`` steps (the last one shorter, as ddp), else
        ``tensor_split(n_steps)``'s pieces (sizes differ by at most 1, none empty while
        ``n_seeds >= n_steps``)."""
        if self.local_batch != -1 and -(-n_seeds // self.local_batch) == n_steps:
            return slice(step * self.local_batch, (step + 1) * self.local_batch)
        size, longer = divmod(n_seeds, n_steps)
        start = step * size + min(step, longer)
        return slice(start, start + size + int(step < longer))

    def partition_id(self, phase: int) -> int:
        return self.rank + phase * self.world_size

    def partition(self, phase: int) -> LocalPartition:
        """This rank's partition of ``phase`` at the current super-epoch (built on demand)."""
        return self._partition_entry(phase)[0]

    def _spec(self, phase: int) -> tuple[tuple, PartitionSpec]:
        """The cache key ``(partition id, chunks)`` and spec of ``phase`` at super-epoch ``t``."""
        spec = self.schedule.partition(self.partition_id(phase), self.t)
        return (self.partition_id(phase), spec.seed_chunks, spec.owned_chunks), spec

    def _partition_entry(self, phase: int) -> tuple[LocalPartition, EpochOrder, PartitionSampler]:
        key, spec = self._spec(phase)
        if key not in self._parts:
            if not self.cache_partitions:
                self._parts.clear()  # drop the previous partition before reading the next
            part = build_partition(self.store, spec, self.halo_hops, self.count_halo_as_local)
            self.io_bytes += part.io_bytes
            self.builds += 1
            if part.num_nodes > self.largest_partition["nodes"]:
                self.largest_partition = {
                    "nodes": part.num_nodes,
                    "edges": part.indices.numel(),
                    "io_bytes": part.io_bytes,
                }
            fanouts = [-1] * len(self.fanouts) if self.mode == "fullgraph" else self.fanouts
            self._parts[key] = (
                part,
                EpochOrder(part.seeds, self.seed ^ (self.partition_id(phase) << 32)),
                PartitionSampler(part, fanouts, self.seed),
            )
        return self._parts[key]

    @property
    def steps_per_epoch(self) -> int:
        return sum(self.n_steps)

    def locate(self, step: int) -> tuple[int, int]:
        """``(phase, step within the phase)`` of an epoch step."""
        for phase, n in enumerate(self.n_steps):
            if step < n:
                return phase, step
            step -= n
        raise IndexError(f"step {step} beyond the epoch")

    # ------------------------------------------------------------------------------ batches
    def seed_kappa(self, part: LocalPartition, seeds) -> torch.Tensor:
        """Coverage of local seed ids (owned nodes)."""
        ell, deg = part.ell[seeds], part.deg[seeds]
        if self.neighbor_weighting == "uniform":
            return kappa(ell, deg, self.alpha)
        # gcn weights: local mass of each seed's neighbourhood (halo_hops=1 holds all of it)
        start, end = part.indptr[seeds], part.indptr[seeds + 1]
        n = end - start
        ptr = torch.zeros(seeds.numel() + 1, dtype=torch.int64)
        torch.cumsum(n, 0, out=ptr[1:])
        offs = torch.arange(int(ptr[-1])) - torch.repeat_interleave(ptr[:-1], n)
        src = part.indices[torch.repeat_interleave(start, n) + offs]
        local = src < part.num_own
        if self.count_halo_as_local:
            local = torch.ones_like(local)
        return gcn_kappa(ptr, src, local, part.deg[src], self.alpha)

    def make_batch(self, epoch: int, step: int) -> Batch:
        phase, local_step = self.locate(step)
        p = self.partition_id(phase)
        start = time.perf_counter()
        part, order, sampler = self._partition_entry(phase)
        seeds = order(epoch)[self.step_slice(part.seeds.numel(), self.n_steps[phase], local_step)]
        fanouts = sampler.fanouts
        if self.remote is not None:
            blocks, x = self.remote.sample(part, seeds, fanouts, epoch, step, salt=p)
        else:
            blocks = sampler.sample(seeds, epoch, step, p)
            x = None
        sampled = time.perf_counter()
        if x is None:
            x = part.x.index_select(0, blocks[0].src_ids)
        k = self.seed_kappa(part, seeds)
        s = seed_sample_counts(part.ell[seeds], fanouts[0])
        stats = {
            "sample_s": sampled - start,
            "load_s": time.perf_counter() - sampled,
            "input_nodes": blocks[0].num_src,
            "kappa": k,
            "s": s,
        }
        weight = k.to(x.dtype) if self.estimator == "node" else None
        return Batch(
            blocks,
            x,
            part.y.index_select(0, seeds),
            seeds.numel(),  # rank mean: the strategy's factor c / W makes the A14 aggregate
            epoch,
            step,
            stats,
            seed_weight=weight,
        )

    def _eval_partition(self, phase: int) -> LocalPartition:
        """The held partition of ``phase``, else one read for this evaluation only: not cached
        (the training partition stays) and not counted in ``builds`` / ``io_bytes``."""
        key, spec = self._spec(phase)
        if key in self._parts:
            return self._parts[key][0]
        return build_partition(self.store, spec, self.halo_hops, self.count_halo_as_local)

    def train_dataloader(self) -> DataLoader:
        return collective_train_loader(self)  # main process; 50S batches run collectives

    # ---------------------------------------------------------------------------- evaluation
    def isolated_logits(self, net: BlockGNN, part: LocalPartition) -> torch.Tensor:
        """Logits of every local node of ``part`` from its local graph alone (every local
        in-edge, no remote rows), normalised as in training: GCN divides by the *global*
        in-degrees ``part.deg`` (a halo node has no local in-edges but keeps its degree)."""
        device = next(net.parameters()).device
        return layerwise_inference(
            net,
            part.indptr,
            part.indices,
            part.x.to(device),
            self.eval_chunk_size,
            degree=part.deg,
        )

    @torch.no_grad()
    def eval_counts(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        counts = torch.zeros(len(splits), 2, dtype=torch.float64)
        if self.eval_mode == "none":
            return counts
        if self.eval_mode == "global_fullgraph":
            return replicated_eval_counts(
                self.graph, net, splits, self.rank, self.world_size, self.eval_chunk_size
            )
        assert isinstance(net, BlockGNN)
        for phase in range(self.k):  # isolated: each partition scores its seed chunks' nodes
            part = self._eval_partition(phase)
            pred = self.isolated_logits(net, part)[: part.num_own].argmax(1).cpu()
            for i, split in enumerate(splits):
                mask = getattr(part, f"{split}_mask")[: part.num_own] & part.seed_owned
                counts[i, 0] += (pred[mask] == part.y[: part.num_own][mask]).sum()
                counts[i, 1] += mask.sum()
        return counts
