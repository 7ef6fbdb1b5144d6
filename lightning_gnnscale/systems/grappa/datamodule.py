"""``GrappaDataModule``: isolated mini-batches inside the rank's current partition.

An epoch is ``k`` phases (``GrappaConfig.phases``); in phase ``i`` rank ``r`` trains partition
``r + i * W`` of the current super-epoch ``t``. Within a phase every rank runs the same number of
steps (computed from the replicated per-chunk training counts, no communication). Each batch is
sampled inside the partition only and carries its coverage factor ``c`` and deficit
(:class:`GrappaBatch`). The DataModule owns the :class:`~.superepochs.SuperEpochClock` that
decides ``t``, advances it while it builds training batches and saves it in checkpoints.

A rank's part is its list of chunks (:class:`~.chunking.GrappaPart`): the chunk store's files
in memory, the directory's shared groups with ``data.partition_dir`` (``directory.py``); a
rank maps each chunk only while it builds a partition from it. The full-graph evaluation
and ``trainer.predict`` run on the ranks' home chunks, exchanging the halo's hidden rows, in
memory and from a directory alike (one kernel, so the two agree bit for bit).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from ...comm import Comm, OwnerRoute
from ...contract import RankContext
from ...errors import ConfigError
from ...graph.batch import Batch
from ...graph.order import EpochOrder
from ...graph.partition_dir import PartitionDir
from ...kit.datamodule import GNNDataModule
from ...kit.link_partitioned import owned_link_statistics
from ...kit.sampled import whole_graph_statistics
from ...models.gnn import BlockGNN
from ...models.inference import (
    inference_builder,
    layer_rows,
    layerwise_inference,
)
from ...tasks.base import split_statistics
from . import links
from .callbacks import GradientOnlyAudit, GrappaStats, ScheduleReport
from .chunking import GrappaPart, is_link, write_chunk_store
from .config import GrappaConfig
from .directory import (
    check_chunk_counts,
    directory_pair_relations,
    directory_relations,
    home_chunks,
    load_chunk_part,
    write_chunk_parts,
)
from .estimators import (
    batch_factor,
    c_uniform,
    gcn_kappa,
    kappa,
    relation_kappa,
    relation_sample_counts,
    seed_sample_counts,
)
from .partition import IsolatedPartition, PartitionSampler, build_partition
from .remote import RemoteSampler
from .schedule import PartitionSpec, Schedule, super_epoch_len
from .superepochs import SuperEpochClock


@dataclass
class GrappaBatch(Batch):
    """A Grappa training batch: a :class:`Batch` plus its seeds' coverage.

    ``global_seed_count`` is this rank's own seed count, so the loss is the rank's seed mean
    ``g_w``; the strategy scales it by ``coverage / W`` before the SUM all-reduce.

    Attributes:
        coverage: ``c``, the estimator's factor for this batch (1 for ``none`` and ``node``).
        deficit: ``1 - c_uniform``, the seeds' mean coverage deficit (the early trigger's
            input).
        kappa: float64 ``[n_seeds]``, each seed's coverage.
        seed_samples: int64 ``[n_seeds]``, each seed's seed-hop sample count ``s``.
    """

    coverage: float = field(kw_only=True)
    deficit: float = field(kw_only=True)
    kappa: Tensor = field(kw_only=True)
    seed_samples: Tensor = field(kw_only=True)


class GrappaDataModule(GNNDataModule):
    """Grappa's data: the chunk store, this rank's partitions, their batches and the schedule.

    ``preprocess`` writes the chunk store (content-keyed under ``cache_dir``) and gives each
    rank its part (its chunks); ``setup_rank`` derives the schedule and the step counts. The train loader yields
    :meth:`training_batch`, which advances the :class:`~.superepochs.SuperEpochClock`:
    each epoch end is counted when the epoch's last batch is built (the early trigger's vote
    is a ``control`` all-reduce there, between training steps), or, if that batch was never
    built (``limit_train_batches``), when the next epoch's first batch is.

    Args: as :class:`~...kit.datamodule.GNNDataModule`; ``config`` defaults to ``GrappaConfig()``.
    ``data.fanouts`` are by hop from the seeds (``fanouts[0]`` is the seed hop ``f_seed``);
    each partition takes ``ceil(data.batch_size / W)`` seeds per step before step
    equalisation (``-1``: all of a partition's seeds in one step).
    """

    def __init__(self, dataset, config: GrappaConfig | None = None, data=None, **kwargs):
        super().__init__(dataset, config or GrappaConfig(), data, **kwargs)
        self.rank, self.world_size = 0, 1
        self.comm: Comm | None = None
        self.chunks: GrappaPart | None = None  # this rank's part: the chunks it reads
        self.schedule: Schedule | None = None
        self.clock: SuperEpochClock | None = None
        self.phases = 1  # k, the config's partitions_per_rank resolved for the world size
        self.n_steps: list[int] = []
        # repartition I/O: bytes read from the chunk store to build training partitions, and
        # their count (isolated evaluation's own reads are not counted)
        self.io_bytes = 0
        self.builds = 0
        self.largest_partition = {"nodes": 0, "edges": 0, "io_bytes": 0}
        # (partition id, chunks) -> the partition, its seed order and its sampler
        self._parts: dict[tuple, tuple[IsolatedPartition, EpochOrder, PartitionSampler]] = {}
        self._batch_t: int | None = None  # super-epoch of the last batch built
        self.remote: RemoteSampler | None = None  # Grappa-50S only
        self.home: tuple[int, ...] = ()  # the chunks this rank evaluates and predicts
        # the home chunks' partition (with their 1-hop halo) and the route its halo's hidden
        # rows come by: built on first use, kept (evaluation, prediction, Grappa-50S)
        # (keyed by stage: link prediction's test stage passes messages over more edges)
        self._home_part: dict[str, IsolatedPartition] = {}
        self._home_route: dict[str, tuple[OwnerRoute, Tensor]] = {}
        # link prediction: the fraction of training pairs no partition of a super-epoch
        # trains (endpoints apart, source not in the halo), per super-epoch trained
        self.excluded_fraction: dict[int, float] = {}
        self._logged_excluded: set[int] = set()
        self._owner_chunk: Tensor | None = None  # every node's chunk (link evaluation)
        # a typed graph's fanout of every relation per hop (from the part's relation names)
        self.part_relation_fanouts: list[tuple[int, ...]] | None = None

    @property
    def link(self) -> bool:
        """The task's seeds are edges (link prediction)."""
        return is_link(self.task)

    def check_link_settings(self) -> None:
        """Refuse the task settings Grappa cannot honour under link prediction
        (``ConfigError``, before any rank starts: ``preprocess``, and a partition directory's
        ``check_partition_part``, run in the launcher; ``setup_rank`` checks again). The
        strategy settings are refused in ``GrappaConfig.check_run``."""
        if self.link:  # a plain script's strategy checks the run without its task
            self.config.check_link_prediction()
        if self.link and self.task.config.filter_negatives:
            raise ConfigError(
                "strategy=grappa with task.filter_negatives=true: a partition cannot tell "
                "whether a negative is a true training edge of a node it holds only as halo "
                "(no in-edges there), and negatives outside the partition are redrawn among "
                "its owned nodes; set task.filter_negatives=false (docs/systems/grappa.md, "
                '"Link prediction")'
            )

    # ------------------------------------------------------------------------ set-up, state
    @override
    def preprocess(self, world_size: int) -> tuple[GrappaPart, ...]:
        """Chunk the graph once and write the chunk store (or check and reuse it); every
        rank's part reads it (:meth:`~.chunking.ChunkStore.part`)."""
        cfg = self.config
        cfg.check_world(world_size)
        cfg.check_graph(self.graph.num_nodes, world_size)  # in the launcher, before any spawn
        self.check_link_settings()
        check_typed_settings(cfg, self.graph.is_typed)
        c = cfg.chunk_count(world_size)
        store = write_chunk_store(
            self.node_dataset,
            self.targets,
            self.task,
            c,
            cfg.chunking,
            self.seed,
            str(self.cache_dir),
        )
        if cfg.whole_graph(world_size):
            print(
                "[grappa] WARNING: 1 chunk: the only partition is the whole graph, so this is "
                "plain data parallelism (ddp), not isolated training",
                flush=True,
            )
        out_dim = self.targets.out_dim
        return tuple(store.part(home_chunks(k, world_size, c), out_dim) for k in range(world_size))

    @override
    def partition_settings(self) -> dict[str, Any]:
        """The chunking, and what decides which chunks each part lists (checked against a
        partition directory); :meth:`partition_expectation` adds the chunk and phase counts."""
        cfg = self.config
        return {
            "method": cfg.chunking,
            "partition_options": {
                "schedule": cfg.schedule,
                "halo_hops": cfg.halo_hops,
                "remote_sampling": cfg.remote_sample_frac > 0,
            },
        }

    @override
    def partition_expectation(self, world_size: int) -> dict[str, Any]:
        """The generic expectation, with ``num_chunks`` and ``partitions_per_rank`` as resolved
        for ``world_size`` (``chunk_count``, ``phases``) in ``partition_options``: a default
        and the explicit value it resolves to are the same directory."""
        cfg, expected = self.config, super().partition_expectation(world_size)
        expected["partition_options"] = {
            "num_chunks": cfg.chunk_count(world_size),
            "partitions_per_rank": cfg.phases(world_size),
            **expected["partition_options"],
        }
        return expected

    @override
    def write_parts(self, world_size: int, writer, log) -> dict:
        """Each chunk of the chunk store as a shared group, each part (:meth:`part_of`'s)
        listing its home chunks and the chunks its rank reads
        (:func:`~.directory.write_chunk_parts`)."""
        parts = self.prepare(world_size)
        meta = write_chunk_parts(self.config, parts, self.seed, writer, log)
        if self.graph.node_type is not None:  # the relations come with the chunks' meta
            meta["node_types"] = list(self.graph.node_types)
        return meta

    @override
    def check_partition_part(self, opened: PartitionDir, k: int) -> None:
        """The chunk sizes, training counts and sources against the chunks' files; a typed
        directory's relations against the settings (in the launcher, before any spawn)."""
        self.check_link_settings()
        check_chunk_counts(opened, k, link=self.link)
        relations = directory_relations(opened, self.link)
        if relations:
            check_typed_settings(self.config, True)
            relation_fanouts(self.data, relations)
        if self.link and relations:  # the pairs' relations, before a DistMult head is built
            self.task.relations = directory_pair_relations(opened, self.link)

    @override
    def part_of(self, prepared: tuple[GrappaPart, ...], rank: int) -> GrappaPart:
        return prepared[rank]

    @override
    def load_part(self, opened: PartitionDir, rank: int) -> GrappaPart:
        """The part's chunk groups, features cast to this run's dtype as partitions copy them
        (:func:`~.directory.load_chunk_part`), the head width the task's from the metadata."""
        return load_chunk_part(
            opened, rank, self.task.out_dim_of(opened.meta), self.dtype, link=self.link
        )

    @override
    def setup_rank(self, context: RankContext, part: GrappaPart) -> None:
        cfg = self.config
        self.check_link_settings()
        self.rank, self.world_size, self.comm = context.rank, context.world_size, context.comm
        self.chunks, self.home = part, part.home
        check_typed_settings(cfg, part.typed)
        self.part_relation_fanouts = (
            relation_fanouts(self.data, part.relations) if part.typed else None
        )
        if self.link and part.typed:  # the pairs' relations (a rank from a directory: its meta)
            self.task.relations = tuple(part.meta["pair_relations"])
        self._home_part, self._home_route = {}, {}
        self.schedule = Schedule(cfg.schedule, part.num_chunks, cfg.sweep_order, self.seed)
        max_epochs = self.trainer.max_epochs if self.trainer is not None else None
        length = super_epoch_len(cfg.super_epoch_len, max_epochs, self.schedule.cycle)
        self.clock = SuperEpochClock(length, cfg.early_trigger, cfg.auto_length)
        if cfg.remote_sample_frac > 0:
            self.remote = RemoteSampler(self, cfg.remote_sample_frac)
        self.phases = cfg.phases(self.world_size)
        self.n_steps = [self._phase_steps(i) for i in range(self.phases)]

    @property
    def t(self) -> int:
        """The super-epoch the next training batch is built in."""
        return self.clock.t

    @property
    def e_in(self) -> int:
        """Epochs already counted in super-epoch ``t``."""
        return self.clock.e_in

    def _layout(self) -> dict:
        """What ``t`` means: the chunking (content key, the same from a partition directory),
        schedule, sweep order and phases; and the features' dtype in this run."""
        return {
            "chunking": self.chunks.key,
            "dtype": str(self.chunks.dtype),
            "schedule": self.schedule.kind,
            "sweep_order": self.schedule.sweep_order,
            "sweep_seed": self.schedule.seed,
            "partitions_per_rank": self.phases,
        }

    @override
    def state_dict(self) -> dict:
        """The super-epoch clock and the layout its ``t`` indexes (and the base's
        ``train_epoch``)."""
        return {**super().state_dict(), **self.clock.state_dict(), **self._layout()}

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the clock; the layout it indexes must be the same."""
        super().load_state_dict(state_dict)
        differ = {
            k: (state_dict.get(k), v) for k, v in self._layout().items() if state_dict.get(k) != v
        }
        if differ:
            raise ValueError(
                "the checkpoint's Grappa layout differs from this run's (checkpoint, run): "
                f"{differ}; same dataset, chunking, num_chunks, seed, schedule, sweep_order, "
                "partitions_per_rank and dtype needed"
            )
        self.clock.load_state_dict(state_dict)

    def schedule_report(self) -> ScheduleReport:
        """This rank's schedule and partition figures so far, for :class:`~.callbacks.GrappaStats`."""
        return ScheduleReport(
            super_epoch_switches=len(self.clock.switches),
            early_switches=self.clock.early_switches,
            partition_builds=self.builds,
            repartition_io_bytes=self.io_bytes,
            largest_partition=self.largest_partition,
            excluded_pair_fraction=self.mean_excluded_fraction() if self.link else None,
        )

    def mean_excluded_fraction(self) -> float:
        """The mean over the super-epochs trained so far (``0 .. trained_t``: a resumed run
        counts those before its checkpoint too) of the fraction of training pairs that no
        partition of the super-epoch trains."""
        trained = range(self.trained_t + 1)
        return sum(self.excluded_at(t) for t in trained) / len(trained)

    def excluded_at(self, t: int) -> float:
        """The fraction of training pairs no partition of super-epoch ``t`` trains, over every
        partition of the schedule, from the replicated ``pair_counts`` (no communication)."""
        if t not in self.excluded_fraction:
            counts, halo_pairs = self.chunks.meta["pair_counts"], self.config.trains_halo_pairs
            total = sum(map(sum, counts))
            specs = self.schedule.partitions(t)
            excluded = sum(links.excluded_pairs(counts, spec, halo_pairs) for spec in specs)
            self.excluded_fraction[t] = excluded / max(total, 1)
        return self.excluded_fraction[t]

    def _count_excluded(self, t: int) -> None:
        """Log super-epoch ``t``'s excluded fraction at its first batch (rank 0)."""
        if not self.link or t in self._logged_excluded:
            return
        self._logged_excluded.add(t)
        total = sum(map(sum, self.chunks.meta["pair_counts"]))
        fraction = self.excluded_at(t)
        if self.rank == 0:
            print(
                f"[grappa] super-epoch {t}: {round(fraction * total)} of {total} training pairs "
                f"({100 * fraction:.2f} %) excluded (source not owned by the destination's "
                f"partition; strategy.pair_sources={self.config.pair_sources})",
                flush=True,
            )

    @override
    def callbacks(self) -> list[L.Callback]:
        """:class:`~.callbacks.GrappaStats`, and the gradient-only audit when
        ``audit_collectives``."""
        return [
            GrappaStats(self.schedule_report),
            *([GradientOnlyAudit()] if self.config.audit_collectives else []),
        ]

    # --------------------------------------------------------------------------- partitions
    @property
    def local_batch(self) -> int:
        """Seeds per partition step before equalisation: ``ceil(batch_size / W)``."""
        size = self.data.batch_size
        return -1 if size == -1 else -(-size // self.world_size)

    def _seed_count(self, spec: PartitionSpec) -> int:
        if self.link:  # the pairs it trains (its seed chunks' less those excluded)
            counts = self.chunks.meta["pair_counts"]
            return links.held_pairs(counts, spec, self.config.trains_halo_pairs)
        return sum(self.chunks.meta["train_counts"][c] for c in spec.seed_chunks)

    def _phase_steps(self, phase: int) -> int:
        """Steps of a phase: max over its partitions (and over a schedule cycle, so the epoch
        length never changes) of ``ceil(seeds / local_batch)``; 1 in full-graph mode."""
        if self.config.mode == "fullgraph" or self.local_batch == -1:
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

    @property
    def trained_t(self) -> int:
        """The super-epoch of the partitions in use: that of the last batch built (so an
        epoch's evaluation scores the partitions it trained, after the clock moved on), else
        ``t``."""
        return self._batch_t if self._batch_t is not None else self.t

    def partition(self, phase: int) -> IsolatedPartition:
        """This rank's partition of ``phase`` at :attr:`trained_t` (built on demand)."""
        return self._partition_entry(phase, self.trained_t)[0]

    def _spec(self, phase: int, t: int) -> tuple[tuple, PartitionSpec]:
        """The cache key ``(partition id, chunks)`` and spec of ``phase`` at super-epoch ``t``."""
        spec = self.schedule.partition(self.partition_id(phase), t)
        return (self.partition_id(phase), spec.seed_chunks, spec.owned_chunks), spec

    def _partition_entry(
        self, phase: int, t: int
    ) -> tuple[IsolatedPartition, EpochOrder, PartitionSampler]:
        key, spec = self._spec(phase, t)
        if key not in self._parts:
            cfg = self.config
            if not cfg.cache_partitions:
                self._parts.clear()  # drop the previous partition before reading the next
            part = build_partition(
                self.chunks,
                spec,
                self.task,
                cfg.halo_hops,
                cfg.count_halo_as_local,
                halo_pairs=cfg.trains_halo_pairs,
            )
            if part.seeds.numel() != self._seed_count(spec):  # the step counts' basis
                raise RuntimeError(
                    f"partition {key} trains {part.seeds.numel()} seeds, its chunks' metadata "
                    f"says {self._seed_count(spec)}"
                )
            self.io_bytes += part.io_bytes
            self.builds += 1
            if part.num_nodes > self.largest_partition["nodes"]:
                self.largest_partition = {
                    "nodes": part.num_nodes,
                    "edges": part.indices.numel(),
                    "io_bytes": part.io_bytes,
                }
            fanouts = list(self.data.fanouts)
            per_relation = self.part_relation_fanouts
            if cfg.mode == "fullgraph":
                fanouts = [-1] * len(fanouts)
                per_relation = per_relation and [(-1,) * len(f) for f in per_relation]
            self._parts[key] = (
                part,
                EpochOrder(part.seeds, self.seed ^ (self.partition_id(phase) << 32)),
                PartitionSampler(part, fanouts, self.seed, per_relation),
            )
        return self._parts[key]

    @property
    @override
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
    def seed_kappa(self, part: IsolatedPartition, seeds: Tensor) -> Tensor:
        """Coverage float64 ``[len(seeds)]`` of local seed ids (owned nodes)."""
        cfg = self.config
        if part.ell_rel is not None:  # typed: per relation (docs/systems/grappa.md)
            return relation_kappa(part.ell_rel[seeds], part.deg_rel[seeds], cfg.degree_smoothing)
        ell, deg = part.ell[seeds], part.deg[seeds]
        if cfg.neighbor_weighting == "uniform":
            return kappa(ell, deg, cfg.degree_smoothing)
        # gcn weights: local mass of each seed's neighbourhood (halo_hops=1 holds all of it)
        start, end = part.indptr[seeds], part.indptr[seeds + 1]
        n = end - start
        ptr = torch.zeros(seeds.numel() + 1, dtype=torch.int64)
        torch.cumsum(n, 0, out=ptr[1:])
        offs = torch.arange(int(ptr[-1])) - torch.repeat_interleave(ptr[:-1], n)
        src = part.indices[torch.repeat_interleave(start, n) + offs]
        local = src < part.num_core
        if cfg.count_halo_as_local:
            local = torch.ones_like(local)
        return gcn_kappa(ptr, src, local, part.deg[src], cfg.degree_smoothing)

    @override
    def make_batch(self, epoch: int, step: int) -> GrappaBatch:
        """This rank's batch of ``(epoch, step)`` at super-epoch ``t`` (the clock is left
        alone: see :meth:`training_batch`)."""
        cfg = self.config
        phase, local_step = self.locate(step)
        p = self.partition_id(phase)
        start = time.perf_counter()
        part, order, sampler = self._partition_entry(phase, self.t)
        self._batch_t = self.t
        self._count_excluded(self.t)
        seeds = order(epoch)[self.step_slice(part.seeds.numel(), self.n_steps[phase], local_step)]
        if self.link:  # seeds are pairs: the net's output rows are their endpoints'
            n_pairs = seeds.numel()
            seeds, y = links.step_rows(
                self.task,
                part,
                seeds,
                p,
                seed=self.seed,
                epoch=epoch,
                step=step,
                num_nodes=int(self.chunks.meta["num_nodes"]),
            )
            loss_terms = self.task.loss_terms(n_pairs)
            # the coverage of the loss nodes whose neighbourhood the partition samples (its
            # owned ones: every positive's destination and every negative); a halo endpoint
            # has no in-edges here, so it has nothing to correct
            covered = seeds[seeds < part.num_core]
        else:
            y = part.targets.target.index_select(0, seeds)
            loss_terms, covered = seeds.numel(), seeds
        fanouts = sampler.fanouts
        if self.remote is not None:
            blocks, x = self.remote.sample(part, seeds, fanouts, epoch, step, salt=p)
        else:
            blocks, x = sampler.sample(seeds, epoch, step, p), None
        sampled = time.perf_counter()
        if x is None:
            x = part.x.index_select(0, blocks[0].src_ids)
        k = self.seed_kappa(part, covered)
        if part.ell_rel is not None:
            s = relation_sample_counts(part.ell_rel[covered], sampler.relation_fanouts[0])
        else:
            s = seed_sample_counts(part.ell[covered], fanouts[0])
        stats = {
            "sample_s": sampled - start,
            "load_s": time.perf_counter() - sampled,
            "input_nodes": blocks[0].num_src,
        }
        return GrappaBatch(
            blocks,
            x,
            y,
            loss_terms,  # rank mean: the strategy's factor c / W makes the aggregate
            epoch,
            step,
            stats,
            seed_weight=k.to(x.dtype) if cfg.estimator == "node" else None,
            coverage=batch_factor(cfg.estimator, k, s, cfg.degree_smoothing),
            deficit=1.0 - c_uniform(k),
            kappa=k,
            seed_samples=s,
        )

    def training_batch(self, epoch: int, step: int) -> GrappaBatch:
        """:meth:`make_batch` in the fit loop: counts the previous epoch's end if its last
        batch was never built, records the batch's deficit, and counts this epoch's end at its
        last step (every rank builds the same steps, so the trigger's votes meet)."""
        clock = self.clock
        if clock.last_epoch < epoch - 1:
            clock.end_epoch(epoch - 1, self.comm)
        batch = self.make_batch(epoch, step)
        clock.record(batch.deficit)
        if step == self.steps_per_epoch - 1:
            clock.end_epoch(epoch, self.comm)
        return batch

    # ---------------------------------------------------------------------------- evaluation
    def _eval_partition(self, phase: int) -> IsolatedPartition:
        """The held partition of ``phase`` (at :attr:`trained_t`), else one read for this
        evaluation only: not cached (the training partition stays) and not counted in
        ``builds`` / ``io_bytes``."""
        key, spec = self._spec(phase, self.trained_t)
        if key in self._parts:
            return self._parts[key][0]
        cfg = self.config
        return build_partition(self.chunks, spec, self.task, cfg.halo_hops, cfg.count_halo_as_local)

    def isolated_logits(self, net: BlockGNN, part: IsolatedPartition) -> Tensor:
        """Logits ``[n, C]`` of every local node of ``part`` from its local graph alone (every
        local in-edge, no remote rows), normalised as in training: GCN divides by the *global*
        in-degrees ``part.deg`` (a halo node has no local in-edges but keeps its degree)."""
        device = next(net.parameters()).device
        return layerwise_inference(
            net,
            part.indptr,
            part.indices,
            part.x.to(device),
            self.data.eval_chunk_size,
            degree=part.deg,
            edge_type=part.edge_type,
        )

    @override
    @torch.no_grad()
    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> Tensor:
        stats = torch.zeros(len(splits), len(self.task.statistic_names), dtype=torch.float64)
        mode = self.config.eval_mode
        if mode == "none":
            return stats
        if self.link and mode == "global_fullgraph" and isinstance(net, BlockGNN):
            return self.link_statistics(net, splits)
        if mode == "global_fullgraph" and isinstance(net, BlockGNN):
            part, out = self.home_rows(net, net.num_layers)  # in memory too: one kernel
            owned = part.targets.rows(slice(0, part.num_core))
            return split_statistics(self.task, out, owned, splits)
        if mode == "global_fullgraph":  # another net runs on the whole graph
            return whole_graph_statistics(self, net, splits)
        assert isinstance(net, BlockGNN)
        for phase in range(self.phases):  # each scores its seed chunks
            part = self._eval_partition(phase)
            core = part.num_core
            out = self.isolated_logits(net, part)[:core]
            owned = part.targets.rows(slice(0, core))
            stats += split_statistics(self.task, out, owned, splits, within=part.seed_owned)
        return stats

    @torch.no_grad()
    def link_statistics(self, net: BlockGNN, splits: tuple[str, ...]) -> Tensor:
        """Link prediction's statistics of this rank: its home chunks' nodes embedded over
        each stage's structure (:meth:`home_rows`, halo rows from their home ranks), the
        evaluation pairs whose destination lies in a home chunk scored, the other rows each
        needs pulled from their owners (:func:`~...kit.link_partitioned.owned_link_statistics`):
        no rank holds every node's embedding. Collective."""
        if self._owner_chunk is None:
            self._owner_chunk = self.chunks.chunk_table()
        owner_chunk = self._owner_chunk
        pairs, relations = {}, {} if self.chunks.typed else None
        for split in splits:
            records = [self.chunks.load(c) for c in self.home]
            pos = torch.cat([r[f"{split}_pairs"] for r in records], 1)
            index = torch.cat([r[f"{split}_pair_ids"] for r in records])
            pairs[split] = (pos, index)
            if relations is not None:  # a typed graph's triples: each pair's relation
                relations[split] = torch.cat([r[f"{split}_pair_rel"] for r in records])
            del records

        def embed(stage: str) -> Tensor:
            part, rows = self.home_rows(net, net.num_layers, stage)
            return rows.cpu()

        home = self.home_partition("train")
        own_ids = home.local2global[: home.num_core]  # the same nodes in every stage
        try:
            return owned_link_statistics(
                self.task,
                embed,
                own_ids,
                lambda ids: owner_chunk[ids].long() % self.world_size,
                pairs,
                int(self.chunks.meta["num_nodes"]),
                self.seed,
                splits,
                self.comm,
                relations=relations,
            )
        finally:  # the test stage's partition is not kept: evaluation stays near training's peak
            self._home_part.pop("test", None)
            self._home_route.pop("test", None)

    # ------------------------------------------------------ full-graph inference by home chunk
    def home_partition(self, stage: str = "train") -> IsolatedPartition:
        """This rank's home chunks (:attr:`home`) with their 1-hop halo over ``stage``'s
        structure (link prediction; a node task has one), built on first use and kept: the
        full-graph evaluation and predictions run on it, and Grappa-50S serves its owners'
        in-edges and rows from it. Not counted in ``builds`` / ``io_bytes``."""
        if stage not in self._home_part:
            spec = PartitionSpec(self.home, self.home)
            self._home_part[stage] = build_partition(
                self.chunks, spec, self.task, halo_hops=1, stage=stage
            )
        return self._home_part[stage]

    @torch.no_grad()
    def home_rows(
        self, net: BlockGNN, layers: int, stage: str = "train"
    ) -> tuple[IsolatedPartition, Tensor]:
        """Full-neighbourhood rows ``[n_home, d]`` after ``layers`` layers of this rank's home
        chunks' nodes (:func:`~.directory.home_chunks`), with the partition they were computed
        on (:meth:`home_partition`: home nodes, sorted, then their halo). The halo's input rows
        are read from the chunks (storage, as a training partition's); its hidden rows come
        from their home ranks, one exchange per hidden layer (``activation``), by a route
        built on the first call (``structure``, the halo's ids) and kept. Link prediction:
        over ``stage``'s structure (``train``, ``test`` or ``full``). Collective."""
        part = self.home_partition(stage)
        core, device = part.num_core, next(net.parameters()).device
        if stage not in self._home_route and layers > 1 and self.world_size > 1:
            halo = part.local2global[core:]
            owners = part.halo_chunk % self.world_size
            route = OwnerRoute.build(self.comm, halo, owners, category="structure")
            self._home_route[stage] = (route, part.local_of(route.served))
        builder = inference_builder(part.indptr, part.deg)
        h = part.x.to(device)
        for i in range(layers):
            rows = layer_rows(
                net,
                i,
                builder,
                part.indptr,
                part.indices,
                h,
                0,
                core,
                self.data.eval_chunk_size,
                edge_type=part.edge_type,
            )
            if i == layers - 1:
                return part, rows
            h = torch.cat([rows, self._halo_rows(rows, stage).to(device)])
        return part, h[:core]

    def _halo_rows(self, rows: Tensor, stage: str = "train") -> Tensor:
        """The home partition's halo rows of a hidden layer, from their home ranks (one rank:
        its home chunks are every chunk, so there is no halo)."""
        if self.world_size == 1:
            return rows.new_empty((0, *rows.shape[1:]))
        route, served = self._home_route[stage]
        return route.reply(self.comm, rows.cpu()[served], category="activation")

    @override
    def predict_rows(
        self, net: torch.nn.Module, node_ids: Tensor | None, output: str
    ) -> tuple[Tensor, Tensor]:
        """The rows of this rank's home chunks' nodes (:meth:`home_rows`; from a partition
        directory and in memory alike), in the dataset's ids."""
        if not isinstance(net, BlockGNN):
            raise TypeError(f"predictions need a BlockGNN net, got {type(net).__name__}")
        # link prediction: over every edge, as single predicts (its chunks' ``full_*``)
        stage = "full" if self.link else "train"
        part, rows = self.home_rows(net, net.num_layers - (output == "embeddings"), stage)
        ids = part.local2global[: part.num_core]
        if node_ids is None:
            return ids, rows
        node_ids = node_ids.cpu()
        num_nodes = int(self.chunks.meta["num_nodes"])
        if node_ids.numel() and (int(node_ids.min()) < 0 or int(node_ids.max()) >= num_nodes):
            raise ValueError(f"node ids must be in [0, {num_nodes})")
        local = part.local_of(node_ids)
        keep = (local >= 0) & (local < part.num_core)
        return node_ids[keep], rows[local[keep].to(rows.device)]


def check_typed_settings(cfg: GrappaConfig, typed: bool) -> None:
    """The setting Grappa cannot honour on a typed graph (``ConfigError``, in the launcher
    before any spawn, and again in each rank): the GCN coverage weights one pooled
    neighbourhood, not RGCN's per-relation means (docs/systems/grappa.md, "Typed graphs")."""
    if typed and cfg.neighbor_weighting != "uniform":
        raise ConfigError(
            f"strategy.neighbor_weighting={cfg.neighbor_weighting} on a typed graph: the GCN "
            "coverage weights one pooled neighbourhood, but a typed graph's coverage is per "
            "relation (RGCN's mean per relation); use neighbor_weighting=uniform "
            '(docs/systems/grappa.md, "Typed graphs")'
        )


def relation_fanouts(data, relations: tuple[str, ...]) -> list[tuple[int, ...]]:
    """Per hop, the fanout of each of ``relations`` (``data.fanouts``, overridden by
    ``data.fanouts_per_relation``): ``GNNDataModule.relation_fanouts`` from the part's
    relation names, so a rank reading a partition directory (no graph) gets the same."""
    given = data.fanouts_per_relation
    unknown = sorted(set(given) - set(relations))
    if unknown:
        raise ConfigError(
            f"data.fanouts_per_relation names {unknown}, which are not relations of the "
            f"chunked graph; its relations: {list(relations)}"
        )
    return [
        tuple(given.get(r, data.fanouts)[hop] for r in relations)
        for hop in range(len(data.fanouts))
    ]
