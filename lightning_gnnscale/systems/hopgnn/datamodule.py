"""``HopGNNDataModule``: partitioned features, replicated topology, the iteration planner and the
feature fetches (docs/systems/hopgnn.md).

Every rank holds the whole topology and every node's targets (the paper's placement).
Training reads only the feature rows of the nodes its partition owns (:class:`FeatureShard`)
plus the rows it fetches; the whole feature matrix stays resident in every process for
evaluation. A training batch is one iteration of this rank: the micrograph set of every kept
time step (blocks sampled with the global batch's keys, input rows gathered),
the migrations between steps, and the global seed count. Remote rows are fetched from their
owners through :class:`~lightning_gnnscale.comm.OwnerRoute` (``structure`` for the ids,
``feature`` for the rows): once per iteration, deduplicated over all kept steps, with
``pregather``; once per kept step without it (every rank takes part in each fetch). Both happen
while the batch is built, in the main process, in step order.

With ``data.partition_dir`` (``write_parts``) the nodes are relabelled so that each server owns
one contiguous id range (the partition becomes the ``[P + 1]`` offsets). What every server
replicates is one shared group a machine maps once: the topology (CSC in those ids, each
in-edge segment in its original order), the targets, the training ids and the original id of
every node (the sampling keys, so a run samples what ``single`` samples; the paper's servers
hold the ``[N]`` partition array in its place). A rank's part is its feature shard and its
nodes' split columns (the task's); it holds no other rank's feature row, and evaluates and
predicts its own nodes with its in-neighbours' rows fetched from their owners
(docs/systems/hopgnn.md#from-a-partition-directory).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from ...comm import Comm, OwnerRoute
from ...contract import RankContext
from ...graph.batch import Batch
from ...graph.block import Block
from ...graph.book import PartitionBook, RangeBook, relabel_csc, sort_sources
from ...graph.cache import cached_partition
from ...graph.node_targets import NodeTargets
from ...graph.partition import partition_report
from ...graph.partition_dir import PartitionDir, shared_folder
from ...graph.sampler import NeighborSampler, SampleKey, build_block_sorted, sample_neighbors
from ...kit.datamodule import GNNDataModule
from ...kit.partitions import assert_same_on_all_ranks, own_predictions
from ...kit.sampled import ReplicatedGraphEvaluation
from ...models.inference import owned_range_rows
from ...tasks.base import split_statistics
from .callbacks import HopGNNStats
from .config import HopGNNConfig
from .merging import MergeController, modeled_epoch_seconds
from .planner import (
    IterationPlan,
    micrograph_plan,
    model_centric_plan,
    owners_of,
    remote_inputs,
    sample_steps,
)

# A partition directory's files of the task's rows (NodeTargets.arrays' names): the target
# column, replicated in the shared group, and the split columns, each part its own nodes'.
TARGET_FILE, *SPLIT_FILES = NodeTargets.array_names()


@dataclass
class HopGNNBatch(Batch):
    """One rank's iteration: the micrograph sets of its kept time steps.

    The base fields summarise the iteration: ``blocks`` is empty, ``x`` is ``[n_roots, 0]``
    (no input rows of its own), ``y`` holds the targets of the ``n_roots`` roots this rank
    trains (over all steps) and ``global_seed_count`` the iteration's global mini-batch size.
    ``x`` has a row per root so that the first tensor Lightning's batch-size guess
    (``extract_batch_size``) meets gives ``n_roots``: a module's ``self.log(...,
    on_epoch=True)`` without ``batch_size`` weighs the iteration by its roots (a ``[0, F]``
    placeholder gave 0, a ``nan`` epoch mean). A model cannot run this batch directly;
    :class:`~.strategy.HopGNNStrategy` runs ``steps`` one by one.

    Attributes:
        steps: per kept step ``j`` (``T`` entries), a plain :class:`Batch` of the micrograph set
            this rank trains (``blocks``, input rows ``[n_src, F]``, the targets of its ``n_j``
            roots, the same ``global_seed_count``), or ``None`` when the set is empty.
        hops: per migration ``j = 1..T-1`` (``T - 1`` entries), ``(send_to, recv_from)``: where
            this rank sends the replica it hosted at step ``j - 1`` and whence it receives the
            one it hosts at step ``j``.
    """

    steps: list[Batch | None] = field(default_factory=list)
    hops: list[tuple[int, int]] = field(default_factory=list)

    @override
    def to(self, device: torch.device | str) -> HopGNNBatch:
        moved = super().to(device)
        return replace(moved, steps=[s.to(device) if s is not None else None for s in self.steps])


@dataclass(frozen=True)
class HopGNNPrepared:
    """What ``preprocess`` hands every rank: the feature partition and its report.

    Attributes:
        part: int64 ``[N]`` home server of every node.
        report: the partition's edge cut and balance (``partition_report``).
    """

    part: Tensor
    report: dict


@dataclass(frozen=True)
class OwnNodes:
    """The nodes a rank evaluates and predicts itself, its own (a part that holds no other
    rank's feature rows): their original ids ``[n]`` and the task's rows."""

    orig_ids: Tensor
    targets: NodeTargets


@dataclass(frozen=True)
class HopGNNPart:
    """What one rank holds: :meth:`HopGNNDataModule.part_of` builds it from the in-memory
    graph (original ids), :meth:`HopGNNDataModule.load_part` from a partition directory
    (relabelled ids, each server's nodes one contiguous range).

    Attributes:
        home: the home server of every node: int64 ``[N]``, or the :class:`RangeBook`
            offsets of a relabelled graph.
        rows, local_row: its feature shard (:class:`FeatureShard`'s ``rows`` and
            ``local_row``).
        target: every node's target rows (``NodeTargets.target``, replicated): what the
            training steps' ``y`` are gathered from.
        sampler: the hash-keyed sampler over the replicated topology (a relabelled one's,
            :class:`RelabelledSampler`, draws what the original graph's does).
        train_ids: the training seeds ``[n_train]`` in these ids, in original id order.
        num_nodes: ``N``.
        own: the nodes it evaluates and predicts itself; ``None``: it holds the whole graph
            and evaluates it by layer-wise inference (in memory).
    """

    home: Tensor | RangeBook
    rows: Tensor
    local_row: Tensor | None
    target: Tensor
    sampler: NeighborSampler | RelabelledSampler
    train_ids: Tensor
    num_nodes: int
    own: OwnNodes | None

    @property
    def split_table(self) -> Tensor:
        """What every rank must hold the same of the partition: its ``[N]`` table, or the
        ``[P + 1]`` offsets."""
        return self.home.node_offsets if isinstance(self.home, RangeBook) else self.home

    @property
    def num_parts(self) -> int:
        """The parts the partition names."""
        if isinstance(self.home, RangeBook):
            return self.home.num_parts
        return int(self.home.max()) + 1 if self.home.numel() else 0


class FeatureShard:
    """This rank's feature rows ``[n_local, F]`` and the fetch of other ranks' rows: the only
    feature rows the training path reads locally.

    Args:
        comm: the data-exchange ``Comm``.
        rows: this rank's nodes' feature rows, in id order (:meth:`own_rows`, or a partition
            directory's part).
        part: the home server of every node (int64 ``[N]``, or a contiguously relabelled
            graph's :class:`RangeBook`).
        local_row: int64 ``[N]``: the row in ``rows`` of every node, ``-1`` where another
            rank owns it; ``None``: this rank's range of a :class:`RangeBook` (no ``[N]``
            table).
    """

    def __init__(
        self, comm: Comm, rows: Tensor, part: Tensor | RangeBook, local_row: Tensor | None = None
    ):
        self.comm, self.part, self.rows, self.local_row = comm, part, rows, local_row
        self.fetches = 0  # exchanges this rank took part in (for reports)

    @staticmethod
    def own_rows(x: Tensor, part: Tensor, rank: int) -> tuple[Tensor, Tensor]:
        """``(rows, local_row)`` of rank ``rank`` out of the whole feature matrix ``x`` (its
        rows copied; the matrix itself stays resident in the graph for evaluation) and the
        ``[N]`` partition ``part``."""
        mine = (part == rank).nonzero().flatten()
        rows = x.index_select(0, mine).clone()
        local_row = torch.full((part.numel(),), -1, dtype=torch.int64)
        local_row[mine] = torch.arange(mine.numel())
        return rows, local_row

    def local(self, ids: Tensor) -> Tensor:
        """This shard's row of each of ``ids``, ``-1`` where another rank owns it."""
        if self.local_row is not None:
            return self.local_row.index_select(0, ids)
        first, stop = (int(v) for v in self.part.node_offsets[self.comm.rank : self.comm.rank + 2])
        return torch.where((ids >= first) & (ids < stop), ids - first, -1)

    def fetch(self, ids: Tensor) -> Tensor:
        """Rows ``[len(ids), F]`` of ``ids`` (none owned by this rank) from their owners.
        Collective: every rank calls it the same number of times (possibly with no ids)."""
        route = OwnerRoute.build(self.comm, ids, owners_of(self.part, ids))
        served = self.rows.index_select(0, self.local(route.served))
        self.fetches += 1
        return route.reply(self.comm, served, category="feature")

    def gather(self, ids: Tensor, table_ids: Tensor, table: Tensor) -> Tensor:
        """Rows of ``ids``: local ones from the shard, the others from ``table`` (rows of the
        sorted ``table_ids``)."""
        out = self.rows.new_empty((ids.numel(), self.rows.shape[1]))
        local = self.local(ids)
        mine = local >= 0
        out[mine] = self.rows.index_select(0, local[mine])
        if bool((~mine).any()):
            other = ids[~mine]
            out[~mine] = table.index_select(0, torch.searchsorted(table_ids, other))
        return out


class RelabelledSampler:
    """A :class:`NeighborSampler` twin over a relabelled graph that draws and orders exactly
    what the original graph's sampler does: the hash is keyed on the original ids
    ``orig_ids`` and every block's new sources are ordered by original id (blocks come out in
    relabelled ids). No ``[N]`` scratch table: sources are deduplicated by a sort.

    Args:
        indptr, indices: the relabelled CSC, each segment in its original order.
        orig_ids: int64 ``[N]`` original id of every node.
        fanouts, seed: as :class:`NeighborSampler`.
    """

    def __init__(self, indptr: Tensor, indices: Tensor, orig_ids: Tensor, fanouts, seed: int):
        self.indptr, self.indices, self.orig_ids = indptr, indices, orig_ids
        self.fanouts, self.seed = list(fanouts), seed

    def degree(self, ids: Tensor) -> Tensor:
        return self.indptr.index_select(0, ids + 1) - self.indptr.index_select(0, ids)

    def sample(self, seeds: Tensor, epoch: int = 0, step: int = 0, salt: int = 0) -> list[Block]:
        """The blocks of one mini-batch, input layer first (``blocks[-1].dst_ids == seeds``)."""
        key = SampleKey(self.seed, epoch, step, salt)
        frontier = seeds.to(torch.int64)
        blocks = []
        for hop, fanout in enumerate(self.fanouts):
            keys = self.orig_ids.index_select(0, frontier)
            src, dst_pos = sample_neighbors(
                self.indptr, self.indices, frontier, fanout, key.hop_key(hop), keys
            )
            block = build_block_sorted(frontier, src, dst_pos, self.degree)
            block = sort_sources(block, self.orig_ids.index_select(0, block.src_ids))
            blocks.append(block)
            frontier = block.src_ids
        return blocks[::-1]


class HopGNNDataModule(ReplicatedGraphEvaluation, GNNDataModule):
    """METIS-partitioned features, replicated topology and targets, HopGNN's planner.

    Every rank cuts the same global mini-batch of ``data.batch_size`` seeds per step as
    ``single`` / ``ddp`` (one seeded permutation per epoch) and splits it into the ``N``
    models' shares; the planner (pure) groups the roots by home server and schedules the time
    steps. Batches are :class:`HopGNNBatch`. Evaluation: full-graph layer-wise inference with
    the (identical) replica split across ranks
    (:func:`~...models.inference.replicated_eval_statistics`).

    Args: as :class:`~...kit.datamodule.GNNDataModule`; ``config`` defaults to ``HopGNNConfig()``.
    """

    def __init__(self, dataset, config: HopGNNConfig | None = None, data=None, **kwargs):
        super().__init__(dataset, config or HopGNNConfig(), data, **kwargs)
        self.rank, self.world_size = 0, 1
        self.controller: MergeController | None = None
        self.held: HopGNNPart | None = None  # this rank's part, once set up
        self._pending_state: dict | None = None  # controller state loaded before set-up
        self._epoch: int | None = None  # the epoch whose time is being measured
        self._window_open = False
        self._epoch_start: tuple[dict, float] = ({}, 0.0)
        self._untimed_bytes: dict[str, int] = {}  # evaluation's bytes in the open window
        self._iterations = 0
        self._fixed_trajectory: list[int] = []  # T of every epoch begun, without the controller
        self._trained: tuple[int, int] | None = None  # (epoch, step) of the last trained batch

    @override
    def preprocess(self, world_size: int) -> HopGNNPrepared:
        """Partition once (cached on disk by content hash) and report the cut."""
        graph, targets, partition = self.graph, self.targets, self.config.partition
        parts = cached_partition(
            graph,
            partition.method,
            world_size,
            self.seed,
            self.cache_dir,
            targets=targets,
            **partition.options(),
        )
        report = partition_report(graph, parts, world_size, splits=targets.split_matrix())
        print(
            f"[{self.config.name}] {partition.method} partition into {world_size}: edge cut "
            f"{report['edge_cut_fraction']:.1%}, node balance {report['node_balance']:.3f}",
            flush=True,
        )
        return HopGNNPrepared(parts.to(torch.int64), report)

    # ------------------------------------------------------------- partition directories
    @override
    def partition_settings(self) -> dict[str, Any]:
        """The feature partitioner and its options; the topology is replicated."""
        partition = self.config.partition
        options = json.loads(json.dumps(partition.options(), default=str))  # as stored
        return {
            "method": partition.method,
            "partition_options": {**options, "topology": "replicated"},
        }

    @override
    def write_parts(self, world_size: int, writer, log) -> dict:
        """Relabel so that each server owns one contiguous id range; write what every server
        replicates (CSC with segments in their original order, targets, training ids,
        original ids) as the shared group ``topology``, and per part its feature shard and its
        nodes' split columns."""
        prepared, graph, targets = self.prepare(world_size), self.graph, self.targets
        book = PartitionBook.from_parts(prepared.part, world_size)
        indptr, indices = relabel_csc(graph.indptr, graph.indices, book)
        replicated = {
            "indptr": indptr,
            "indices": indices,
            TARGET_FILE: targets.target[book.new2old],
            "train_ids": book.old2new[self.task.train_seeds(targets)],  # in original id order
            "orig_ids": book.new2old,
        }
        writer.write_shared("topology", replicated)
        del replicated, indices
        for k in range(world_size):
            lo, hi = int(book.node_offsets[k]), int(book.node_offsets[k + 1])
            own = book.new2old[lo:hi]
            columns = targets.rows(own).arrays()
            arrays = {"x": graph.x[own], **{name: columns[name] for name in SPLIT_FILES}}
            sizes = {"nodes": hi - lo, "edges": int(indptr[hi] - indptr[lo])}
            writer.write_part(k, arrays, sizes, shared=["topology"])
            log(f"[partition] part {k + 1}/{world_size} written ({sizes})")
        return {"node_offsets": book.node_offsets.tolist(), "report": prepared.report}

    @override
    def check_partition_part(self, opened: PartitionDir, k: int) -> None:
        """The replicated group's arrays have ``num_nodes`` rows (``indptr`` one more; the
        targets the task's target shape)."""
        nodes, folder, key = opened.meta["num_nodes"], shared_folder("topology"), "'num_nodes'"
        opened.expect_shape(folder, "indptr", (nodes + 1,), key)
        opened.expect_shape(folder, "orig_ids", (nodes,), key)
        opened.expect_shape(folder, TARGET_FILE, self.task.target_shape(nodes, opened.meta), key)

    # ------------------------------------------------------------------------ rank parts
    @override
    def part_of(self, prepared: HopGNNPrepared, rank: int) -> HopGNNPart:
        """Rank ``rank``'s share of the in-memory graph: a copy of its feature rows; the
        whole graph (topology, targets, features for evaluation) stays resident."""
        graph, home = self.graph, prepared.part
        rows, local_row = FeatureShard.own_rows(graph.x, home, rank)
        return HopGNNPart(
            home=home,
            rows=rows,
            local_row=local_row,
            target=self.targets.target,
            sampler=NeighborSampler(
                graph.indptr, graph.indices, list(self.data.fanouts), self.seed
            ),
            train_ids=self.train_ids,
            num_nodes=graph.num_nodes,
            own=None,
        )

    @override
    def load_part(self, opened: PartitionDir, rank: int) -> HopGNNPart:
        """The replicated group (memory-mapped, held once per machine) and rank ``rank``'s
        part: its feature shard and its nodes' split columns."""
        book = RangeBook(opened.node_offsets)
        replicated = opened.load_shared("topology", rank)
        arrays = opened.load_part(rank)
        if replicated["train_ids"].numel() == 0:  # as the base's train_ids
            raise ValueError(f"partition directory {opened.path}: no training nodes")
        x = arrays["x"] if arrays["x"].dtype == self.dtype else arrays["x"].to(self.dtype)
        orig_ids, target = replicated["orig_ids"], replicated[TARGET_FILE]
        first, stop = int(book.node_offsets[rank]), int(book.node_offsets[rank + 1])
        columns = {**arrays, TARGET_FILE: target[first:stop]}
        out_dim = self.task.out_dim_of(opened.meta)
        own = OwnNodes(orig_ids[first:stop], NodeTargets.from_arrays(columns, out_dim))
        sampler = RelabelledSampler(
            replicated["indptr"],
            replicated["indices"],
            orig_ids,
            list(self.data.fanouts),
            self.seed,
        )
        train_ids = replicated["train_ids"]
        return HopGNNPart(book, x, None, target, sampler, train_ids, orig_ids.numel(), own)

    # ------------------------------------------------------------------------ rank set-up
    @override
    def setup_rank(self, context: RankContext, part: HopGNNPart) -> None:
        self.rank, self.world_size = context.rank, context.world_size
        self.config.check_world(self.world_size)
        self.comm = context.comm
        if part.num_parts > self.world_size:
            raise ValueError(f"the partition has more parts than the {self.world_size} ranks")
        assert_same_on_all_ranks(context.comm, part.split_table, "the HopGNN partition")
        self.held, self.part = part, part.home
        self.train_ids, self.sampler = part.train_ids, part.sampler
        self.shard = FeatureShard(context.comm, part.rows, part.home, part.local_row)
        config = self.config
        if config.merge_adaptive:
            self.controller = MergeController(
                config.kept_steps(self.world_size),
                config.merge_monitor_epochs,
                config.merge_start_epoch,
                config.merge_min_steps,
            )
            if self._pending_state is not None:
                self.controller.load_state_dict(self._pending_state)

    # ------------------------------------------------------------------------ evaluation
    @override
    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """With the whole graph held (in memory): layer-wise inference over it. Otherwise (a
        partition directory): this rank's own nodes (:meth:`own_rows`), scored on them."""
        own = self.held.own
        if own is None:
            return super().eval_statistics(net, splits)
        out = self.own_rows(net, net.num_layers)
        return split_statistics(self.task, out, own.targets, splits)

    @override
    def predict_rows(
        self, net: torch.nn.Module, node_ids: Tensor | None, output: str
    ) -> tuple[Tensor, Tensor]:
        """The requested (original) ids this rank owns and their rows (a partition
        directory); with the whole graph held, the base's node-range split."""
        own = self.held.own
        if own is None:
            return super().predict_rows(net, node_ids, output)
        rows = self.own_rows(net, net.num_layers - (output == "embeddings"))
        return own_predictions(own.orig_ids.clone(), rows, node_ids, self.held.num_nodes)

    def own_rows(self, net: torch.nn.Module, layers: int) -> Tensor:
        """The first ``layers`` layers' full-neighbourhood rows of this rank's own nodes
        (:func:`~...models.inference.owned_range_rows`: in-neighbours' rows come from their owners). Its
        ``feature`` and ``structure`` bytes are kept out of the merging controller's modelled
        epoch time, which counts training bytes (in memory evaluation sends neither)."""
        before = self.comm.meter.snapshot()
        rows = owned_range_rows(
            net,
            self.comm,
            self.part,
            self.sampler.indptr,
            self.sampler.indices,
            self.shard.rows,
            layers,
            self.data.eval_chunk_size,
        )
        for category, sent in self.comm.meter.delta(before)["bytes"].items():
            self._untimed_bytes[category] = self._untimed_bytes.get(category, 0) + sent
        return rows

    # ------------------------------------------------------------------ merging controller
    def steps_for_epoch(self, epoch: int) -> int:
        """``T`` of ``epoch``: the config's, or the merging controller's decision, taken at
        the epoch's first batch (closing the previous epoch's measurement: one all-reduce of
        its time, ``control``). Collective when the controller is on. Records ``T`` in
        :attr:`trajectory` at the epoch's first batch."""
        if self.controller is None:
            steps = self.config.kept_steps(self.world_size)
            if epoch == len(self._fixed_trajectory):  # once per epoch, also after a resume
                self._fixed_trajectory.append(steps)
            return steps
        if epoch != self._epoch:
            if self._window_open:
                self._close_window()
            self.controller.begin_epoch()
            self._epoch, self._window_open, self._iterations = epoch, True, 0
            self._epoch_start = (self.comm.meter.snapshot(), time.perf_counter())
            self._untimed_bytes = {}
        return self.controller.steps

    def _close_window(self) -> None:
        """The finished epoch's time, averaged over ranks, into the controller."""
        config = self.config
        if config.merge_time_source == "wall":
            local = time.perf_counter() - self._epoch_start[1]
        else:
            delta = self.comm.meter.delta(self._epoch_start[0])["bytes"]
            delta = {c: n - self._untimed_bytes.get(c, 0) for c, n in delta.items()}
            local = modeled_epoch_seconds(
                delta,
                self._iterations,
                self.controller.steps,
                config.bandwidth,
                config.step_overhead_s,
            )
        total = self.comm.all_reduce(torch.tensor([local], dtype=torch.float64), category="control")
        self.controller.end_epoch(float(total[0]) / self.world_size)
        self._window_open = False

    def plan(self, epoch: int, step: int, steps: int | None = None) -> IterationPlan:
        """The global plan of one iteration (pure: the same on every rank); ``steps`` = ``T``
        (default: the config's)."""
        seeds = self.order.step(epoch, step, self.batch_size)
        config, n = self.config, self.world_size
        if config.mode == "model_centric":
            return model_centric_plan(seeds, n)
        return micrograph_plan(
            seeds,
            self.part,
            n,
            steps if steps is not None else config.kept_steps(n),
            score=config.merge_score,
            policy=config.merge_policy,
            direction=config.direction,
            recount=config.recount,
        )

    @override
    def make_batch(self, epoch: int, step: int) -> HopGNNBatch:
        """This rank's iteration: sample its micrograph sets, fetch their remote rows (one
        deduplicated fetch with ``pregather``, else one per kept step), gather inputs."""
        steps = self.steps_for_epoch(epoch)
        self._iterations += 1
        start = time.perf_counter()
        plan = self.plan(epoch, step, steps)
        rank, shard = self.rank, self.shard
        sampled = sample_steps(plan, rank, self.sampler, epoch, step)
        remote = [remote_inputs(blocks, self.part, rank) for blocks in sampled]
        sample_done = time.perf_counter()
        tables: list[tuple[Tensor, Tensor]]
        if self.config.pregather:
            ids = torch.unique(torch.cat(remote))
            tables = [(ids, shard.fetch(ids))] * len(sampled)
            fetched_rows = ids.numel()
        else:
            tables = [(ids, shard.fetch(ids)) for ids in remote]
            fetched_rows = sum(ids.numel() for ids in remote)
        y = self.held.target
        steps: list[Batch | None] = []
        for blocks, (ids, table) in zip(sampled, tables):
            if blocks is None:
                steps.append(None)
                continue
            roots = blocks[-1].dst_ids
            x = shard.gather(blocks[0].src_ids, ids, table)
            steps.append(Batch(blocks, x, y[roots], plan.global_seed_count, epoch, step))
        trained = [s.y for s in steps if s is not None]
        root_targets = torch.cat([y.new_empty((0, *y.shape[1:])), *trained])
        load = plan.load()
        stats = {
            "sample_s": sample_done - start,
            "load_s": time.perf_counter() - sample_done,
            "input_nodes": sum(b[0].num_src for b in sampled if b is not None),
            "remote_rows": fetched_rows,
            "local_rows": int(
                sum(
                    (owners_of(self.part, b[0].src_ids) == rank).sum()
                    for b in sampled
                    if b is not None
                )
            ),
            "time_steps": plan.num_steps,
            "migrations": len(plan.kept) - 1,
            "load": load[:, rank].tolist(),
        }
        hops = [plan.hop(j, rank) for j in range(1, plan.num_steps)]
        # a row per root: see the class
        no_inputs = shard.rows.new_empty((root_targets.shape[0], 0))
        return HopGNNBatch(
            [],
            no_inputs,
            root_targets,
            plan.global_seed_count,
            epoch,
            step,
            stats,
            steps=steps,
            hops=hops,
        )

    @property
    def trajectory(self) -> list[int]:
        """``T`` of every epoch begun (the controller's decisions, or the fixed ``T``); saved
        in checkpoints either way, so a resumed run reports the whole run."""
        return self.controller.trajectory if self.controller else self._fixed_trajectory

    @override
    def callbacks(self) -> list[L.Callback]:
        """:class:`~.callbacks.HopGNNStats` (reports only)."""
        return [HopGNNStats(lambda: list(self.trajectory))]

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Notes which training step the Trainer is about to run (Lightning's public data
        hook, called right before ``training_step``), for :meth:`state_dict`'s mid-epoch
        check."""
        if isinstance(batch, HopGNNBatch):
            self._trained = (batch.epoch, batch.step)
        return batch

    # ------------------------------------------------------------------------ checkpoints
    @override
    def state_dict(self) -> dict[str, Any]:
        """The merging controller's state, or without it the ``T`` trajectory. Called on every
        rank when a
        checkpoint is written at an epoch end: it first closes the epoch's measurement
        (collective), so a resumed run decides the next ``T`` as the uninterrupted one.

        A checkpoint written mid-epoch (``ModelCheckpoint(every_n_train_steps=...)``, a
        mid-epoch validation) is refused with a ``RuntimeError`` while the controller is on:
        the in-epoch measurement (iterations, meter snapshot, start time) is not saved, so a
        resume would not continue identically."""
        if self.controller is None:
            return {**super().state_dict(), "trajectory": list(self._fixed_trajectory)}
        if self._window_open and self._mid_epoch():
            raise RuntimeError(
                "HopGNN's merging controller (strategy.merge_adaptive=true) cannot be "
                "checkpointed mid-epoch: its epoch-time measurement is not part of the saved "
                "state, so a resume would not take the same T decisions; save checkpoints at "
                "epoch ends only (no every_n_train_steps / train_time_interval, "
                "val_check_interval=1.0) or turn the controller off"
            )
        if self._window_open:
            self._close_window()
        return {**super().state_dict(), "merge": self.controller.state_dict()}

    def _mid_epoch(self) -> bool:
        """Whether the attached Trainer is fitting and the last step it ran (noted by
        :meth:`on_after_batch_transfer`) is not the epoch's last (``Trainer.num_training_batches``
        counts ``limit_train_batches``; a mid-epoch validation included)."""
        trainer = getattr(self, "trainer", None)
        if trainer is None or trainer.state.fn != "fit" or self._trained is None:
            return False
        epoch, step = self._trained
        last = min(self.steps_per_epoch, trainer.num_training_batches) - 1  # limit_train_batches
        return epoch == self._epoch and step < last

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        merge = state_dict.get("merge")
        if merge is None:
            self._fixed_trajectory = list(state_dict.get("trajectory", []))
            return
        if self.controller is None:
            self._pending_state = merge
        else:
            self.controller.load_state_dict(merge)
        self._epoch, self._window_open = None, False
