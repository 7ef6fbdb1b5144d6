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
in-edge segment in its original order; a typed graph's relation per edge), the targets, the training ids and the original id of
every node (the sampling keys, so a run samples what ``single`` samples; the paper's servers
hold the ``[N]`` partition array in its place). A rank's part is its feature shard and its
nodes' split columns (the task's); it holds no other rank's feature row, and evaluates and
predicts its own nodes with its in-neighbours' rows fetched from their owners
(docs/systems/hopgnn.md#from-a-partition-directory).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
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
from ...graph.book import (
    PartitionBook,
    RangeBook,
    relabelled_edge_ids,
    sort_sources,
)
from ...graph.cache import cached_partition
from ...graph.csc_rows import CSCRows
from ...graph.node_targets import NodeTargets
from ...graph.partition import partition_report
from ...graph.partition_dir import PartitionDir, PartitionDirError, shared_folder
from ...graph.sampler import (
    NeighborSampler,
    SampleKey,
    build_block_sorted,
    drop_excluded,
    kept_edges,
    relation_plan,
    sample_neighbors,
    sample_typed_edge_ids,
)
from ...kit.datamodule import GNNDataModule, relation_fanouts
from ...kit.link_partitioned import owned_link_statistics
from ...kit.partitions import assert_same_on_all_ranks, own_predictions
from ...kit.sampled import ReplicatedGraphEvaluation
from ...models.inference import owned_range_rows, owned_rows
from ...tasks.base import split_statistics
from .callbacks import HopGNNStats
from .config import HopGNNConfig
from .links import link_plan
from .merging import (
    LINK_TRAINING_CATEGORIES,
    TRAINING_CATEGORIES,
    MergeController,
    modeled_epoch_seconds,
)
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
    trains (over all steps; link prediction: the pairs it scores, ``[n, 3]``) and
    ``global_seed_count`` the iteration's loss denominator (``task.loss_terms`` of the global
    mini-batch).
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


@dataclass
class LinkStepBatch(Batch):
    """One kept step's micrograph set under link prediction: ``blocks`` / ``x`` of the
    endpoints this rank computes, ``y`` ``[pairs, 3]`` the pairs it scores, whose rows index
    its output rows followed by the rows it receives: the strategy appends them to the
    module's output (:func:`~.strategy.exchanged_outputs`) through
    :func:`~...comm.exchange_rows` with these counts (``send_index`` into its output rows)."""

    send_index: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    send_splits: list[int] = field(default_factory=list)
    recv_splits: list[int] = field(default_factory=list)

    @override
    def to(self, device: torch.device | str) -> LinkStepBatch:
        return replace(super().to(device), send_index=self.send_index.to(device))


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
class LinkPart:
    """What a rank holds for link prediction beside its feature shard (docs/systems/hopgnn.md,
    "Link prediction").

    Attributes:
        targets: the task's targets ``task.step_rows`` reads: the training pairs in original
            ids, the node count and the seed (in memory the whole split; from a partition
            directory a split holding the training pairs only).
        home: original ids -> the rank whose features they are.
        to_local: original ids -> this rank's ids (``None``: the same, in memory).
        structures: ``{stage: (indptr, indices)}`` in this rank's ids: ``"train"`` (the
            training edges, what blocks are sampled on and validation passes messages over)
            and ``"test"`` (training + validation edges).
        own_ids: original ids of the nodes this rank evaluates (its own), in its rows' order.
        pairs: ``{split: (pos [2, m], index [m])}``: the evaluation pairs it scores (those
            whose source it owns, original ids) and their positions in the split.
        edge_types: a typed graph's ``{stage: int64 [E_stage]}``, the relation of every edge
            of ``structures[stage]`` (inverse edges ``r + R``); ``{}`` when homogeneous.
        relations: a typed graph's ``{split: int64 [m]}``, the relation of each of ``pairs``'
            triples; ``None`` when homogeneous.
    """

    targets: Any
    home: Callable[[Tensor], Tensor]
    to_local: Callable[[Tensor], Tensor] | None
    structures: dict[str, tuple[Tensor, Tensor]]
    own_ids: Tensor
    pairs: dict[str, tuple[Tensor, Tensor]]
    edge_types: dict[str, Tensor] = field(default_factory=dict)
    relations: dict[str, Tensor] | None = None


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
        link: link prediction's pairs and structures (:class:`LinkPart`); ``None`` for a
            node task (``target`` is then unused under link prediction).
        topology: the whole graph's CSC in these ids (what prediction passes messages
            over); ``None``: the sampler's.
        topology_edge_type: a typed graph's relation of every edge of ``topology``.
    """

    home: Tensor | RangeBook
    rows: Tensor
    local_row: Tensor | None
    target: Tensor
    sampler: NeighborSampler | RelabelledSampler
    train_ids: Tensor
    num_nodes: int
    own: OwnNodes | None
    link: LinkPart | None = None
    topology: tuple[Tensor, Tensor] | None = None
    topology_edge_type: Tensor | None = None

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


def typed_meta(graph) -> dict[str, Any]:
    """A typed graph's partition-directory metadata: its relation names (what
    ``GNNDataModule.num_relations`` reads) and node-type names; ``{}`` when homogeneous."""
    out: dict[str, Any] = {}
    if graph.is_typed:
        out["relations"] = list(graph.relations)
    if graph.node_type is not None:
        out["node_types"] = list(graph.node_types)
    return out


def node_type_counts(
    node_type: Tensor, num_types: int, part: Tensor, world_size: int
) -> list[list[int]]:
    """``[P][T]``: the nodes of each of the ``num_types`` types every part owns (the
    partition report's per-type balance)."""
    counts = torch.bincount(part * num_types + node_type, minlength=world_size * num_types)
    return counts.view(world_size, num_types).tolist()


def owned_eval_pairs(
    split, owner: Callable[[Tensor], Tensor], rank: int
) -> dict[str, tuple[Tensor, Tensor]]:
    """``{split: (pos [2, m], index [m])}``: the validation and test pairs whose source
    ``rank`` owns (original ids) and their positions in the split, in position order: what
    :func:`~...kit.link_partitioned.owned_link_statistics` scores on that rank (every pair
    on exactly one rank)."""
    out = {}
    for name in ("val", "test"):
        pos = split.positives(name)
        index = (owner(pos[0]) == rank).nonzero().flatten()
        out[name] = (pos[:, index].contiguous(), index)
    return out


def owned_eval_relations(split, pairs: dict[str, tuple[Tensor, Tensor]]):
    """A typed split's ``{split: int64 [m]}``: the relation of each of ``pairs``' triples
    (:func:`owned_eval_pairs`); ``None`` when homogeneous."""
    if not split.is_typed:
        return None
    return {name: split.positive_relations(name)[index] for name, (_, index) in pairs.items()}


def directory_link_targets(
    train_pos: Tensor,
    train: tuple[Tensor, Tensor],
    orig_ids,
    task,
    seed,
    typed: dict | None = None,
):
    """The :class:`~...tasks.link_prediction.LinkTargets` a rank loading a partition directory
    hands ``task.step_rows``: the training pairs (original ids), the node count and the seed.
    Its split holds no evaluation pairs; its training CSC (original ids, what
    ``task.filter_negatives`` redraws against) is rebuilt from the relabelled one ``train``
    only under that setting, else left empty (nothing else reads it). ``typed`` (a typed
    split): ``train_rel`` (the training pairs' relations), ``train_edge_type`` (of
    ``train``'s edges), ``relations`` (the message relations) and ``num_relations`` (the
    pairs' ``R``)."""
    from ...tasks.link.split import LinkSplit, triple_keys
    from ...tasks.link_prediction import LinkTargets

    n = orig_ids.numel()
    empty = torch.empty(0, dtype=torch.int64)
    indptr, indices = torch.zeros(n + 1, dtype=torch.int64), empty
    edge_type = None if typed is None else empty
    if task.config.filter_negatives:
        new_indptr, new_indices = train
        dst = orig_ids[torch.repeat_interleave(torch.arange(n), new_indptr[1:] - new_indptr[:-1])]
        src = orig_ids[new_indices]
        if typed is None:
            order = torch.argsort(dst * n + src)
        else:  # each segment sorted by (relation, source), as graph.csc.Graph keeps them
            rel = typed["train_edge_type"]
            order = torch.argsort(triple_keys(src, dst, rel, n, max(1, len(typed["relations"]))))
            edge_type = rel[order]
        torch.cumsum(torch.bincount(dst, minlength=n), 0, out=indptr[1:])
        indices = src[order]
    pairs = torch.empty((2, 0), dtype=torch.int64)
    relations = {}
    if typed is not None:
        relations = {
            "train_rel": typed["train_rel"],
            "val_rel": empty,
            "test_rel": empty,
            "train_edge_type": edge_type,
            "test_edge_type": edge_type,
            "relations": tuple(typed["relations"]),
            "num_relations": typed["num_relations"],
        }
    split = LinkSplit(
        train_pos,
        pairs,
        pairs,
        empty.to(torch.int8),
        indptr,
        indices,
        indptr,
        indices,
        bool(task.config.undirected),
        **relations,
    )
    return LinkTargets(split, n, task.config.embedding_dim, seed)


def check_edge_type(where: str, prefix: str, replicated: dict, num_relations: int) -> None:
    """A directory's relation per edge ``{prefix}edge_type`` of the CSC ``{prefix}indptr`` /
    ``{prefix}indices`` (outside input): int64, one per edge, in ``[0, num_relations)``, each
    in-edge segment sorted by relation (what the per-relation slots assume); else
    :class:`PartitionDirError`."""
    name = f"{prefix}edge_type"
    edge_type, indptr = replicated[name], replicated[f"{prefix}indptr"]
    ok = edge_type.dtype == torch.int64 and edge_type.shape == replicated[f"{prefix}indices"].shape
    if ok and edge_type.numel():
        ok = int(edge_type.min()) >= 0 and int(edge_type.max()) < num_relations
        starts = torch.zeros(edge_type.numel(), dtype=torch.bool)
        starts[indptr[:-1][indptr[1:] > indptr[:-1]]] = True
        ok = ok and bool(((edge_type[1:] >= edge_type[:-1]) | starts[1:]).all())
    if not ok:
        raise PartitionDirError(
            f"{where}: shared-topology/{name}.npy must be int64, one relation in "
            f"[0, {num_relations}) per edge, each in-edge segment sorted by relation; "
            "partition again"
        )


def check_relations(where: str, name: str, rel: Tensor, count: int, num_relations: int) -> None:
    """A directory's pair relations ``name`` (outside input): int64 ``[count]`` in
    ``[0, num_relations)``; else :class:`PartitionDirError`."""
    ok = rel.dtype == torch.int64 and rel.shape == (count,)
    if ok and rel.numel():
        ok = int(rel.min()) >= 0 and int(rel.max()) < num_relations
    if not ok:
        raise PartitionDirError(
            f"{where}: {name} must be int64 [{count}] (one relation per pair) in "
            f"[0, {num_relations}), got {rel.dtype} {tuple(rel.shape)}; partition again"
        )


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
        edge_type: a typed graph's relation per edge of ``indices`` (each segment sorted by
            relation, as the original's); ``None``: homogeneous.
        relation_fanouts, num_relations: with ``edge_type``, as :class:`NeighborSampler`
            (the slot ``(v, r)`` keyed on ``orig_ids[v] * R + r``, as the original graph's).
    """

    def __init__(
        self,
        indptr: Tensor,
        indices: Tensor,
        orig_ids: Tensor,
        fanouts,
        seed: int,
        edge_type: Tensor | None = None,
        relation_fanouts: list[tuple[int, ...]] | None = None,
        num_relations: int = 1,
    ):
        self.indptr, self.indices, self.orig_ids = indptr, indices, orig_ids
        self.fanouts, self.seed = list(fanouts), seed
        self.edge_type = edge_type
        self.relation_fanouts, self.slot_indptr = relation_plan(
            indptr, edge_type, self.fanouts, relation_fanouts, num_relations
        )

    def degree(self, ids: Tensor) -> Tensor:
        return self.indptr.index_select(0, ids + 1) - self.indptr.index_select(0, ids)

    def sample(
        self,
        seeds: Tensor,
        epoch: int = 0,
        step: int = 0,
        salt: int = 0,
        exclude: Tensor | None = None,
    ) -> list[Block]:
        """The blocks of one mini-batch, input layer first (``blocks[-1].dst_ids == seeds``).
        ``exclude``: sorted keys ``dst * N + src`` in *original* ids of edges left out after
        sampling (``NeighborSampler.sample``'s, so both drop the same edges)."""
        key = SampleKey(self.seed, epoch, step, salt)
        frontier = seeds.to(torch.int64)
        blocks = []
        n = self.orig_ids.numel()
        for hop, fanout in enumerate(self.fanouts):
            keys = self.orig_ids.index_select(0, frontier)
            types = None
            if self.edge_type is None:
                src, dst_pos = sample_neighbors(
                    self.indptr, self.indices, frontier, fanout, key.hop_key(hop), keys
                )
                if exclude is not None:
                    orig_src = self.orig_ids.index_select(0, src)
                    src, dst_pos = drop_excluded(src, dst_pos, keys, orig_src, n, exclude)
            else:  # per relation, keyed as the original graph's slots
                eids, dst_pos = sample_typed_edge_ids(
                    self.slot_indptr, frontier, self.relation_fanouts[hop], key.hop_key(hop), keys
                )
                if exclude is not None and exclude.numel():
                    orig_src = self.orig_ids.index_select(0, self.indices.index_select(0, eids))
                    kept = kept_edges(keys[dst_pos], orig_src, n, exclude)
                    eids, dst_pos = eids[kept], dst_pos[kept]
                src, types = (
                    self.indices.index_select(0, eids),
                    self.edge_type.index_select(0, eids),
                )
            block = build_block_sorted(frontier, src, dst_pos, self.degree, types)
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
        """Partition once (cached on disk by content hash) and report the cut. Link
        prediction partitions the same graph by the dataset's node rows (its targets are an
        edge split: placement only, nothing trains on them)."""
        graph, partition = self.graph, self.config.partition
        targets = self.node_dataset.targets if self.is_link else self.targets
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
        if graph.node_type is not None:  # balance per type: reported (docs: why not enforced)
            report["node_type_counts"] = node_type_counts(
                graph.node_type, len(graph.node_types), parts.to(torch.int64), world_size
            )
        print(
            f"[{self.config.name}] {partition.method} partition into {world_size}: edge cut "
            f"{report['edge_cut_fraction']:.1%}, node balance {report['node_balance']:.3f}",
            flush=True,
        )
        return HopGNNPrepared(parts.to(torch.int64), report)

    @property
    def is_link(self) -> bool:
        """Whether the task's seeds are pairs (link prediction)."""
        return self.task.spec.seeds == "edges"

    # ------------------------------------------------------------- partition directories
    @override
    def partition_settings(self) -> dict[str, Any]:
        """The feature partitioner and its options; the topology is replicated. Under link
        prediction also the edge split's settings (a directory holds one split)."""
        partition = self.config.partition
        options = json.loads(json.dumps(partition.options(), default=str))  # as stored
        out = {
            "method": partition.method,
            "partition_options": {**options, "topology": "replicated"},
        }
        if self.is_link:
            c = self.task.config
            out["link_split"] = {
                "val_fraction": c.val_fraction,
                "test_fraction": c.test_fraction,
                "undirected": c.undirected,
            }
        return out

    @override
    def write_parts(self, world_size: int, writer, log) -> dict:
        """Relabel so that each server owns one contiguous id range; write what every server
        replicates (CSC with segments in their original order, a typed graph's relation per
        edge, targets, training ids, original ids) as the shared group ``topology``, and per
        part its feature shard and its nodes' split columns. A typed graph's metadata names
        its relations and node types, and each part's count of every node type."""
        prepared, graph, targets = self.prepare(world_size), self.graph, self.targets
        book = PartitionBook.from_parts(prepared.part, world_size)
        if self.is_link:
            return self._write_link_parts(prepared, book, world_size, writer, log)
        indptr, old_edge = relabelled_edge_ids(graph.indptr, book)  # relabel_csc's edge order
        replicated = {
            "indptr": indptr,
            "indices": book.old2new[graph.indices[old_edge]],
            TARGET_FILE: targets.target[book.new2old],
            "train_ids": book.old2new[self.task.train_seeds(targets)],  # in original id order
            "orig_ids": book.new2old,
        }
        if graph.is_typed:
            replicated["edge_type"] = graph.edge_type[old_edge]
        writer.write_shared("topology", replicated)
        del replicated, old_edge
        for k in range(world_size):
            lo, hi = int(book.node_offsets[k]), int(book.node_offsets[k + 1])
            own = book.new2old[lo:hi]
            columns = targets.rows(own).arrays()
            arrays = {"x": graph.x[own], **{name: columns[name] for name in SPLIT_FILES}}
            sizes = {"nodes": hi - lo, "edges": int(indptr[hi] - indptr[lo])}
            writer.write_part(k, arrays, sizes, shared=["topology"])
            log(f"[partition] part {k + 1}/{world_size} written ({sizes})")
        return {
            "node_offsets": book.node_offsets.tolist(),
            "report": prepared.report,
            **typed_meta(graph),
        }

    def _write_link_parts(self, prepared, book: PartitionBook, world_size: int, writer, log):
        """Link prediction's directory: the replicated group ``topology`` holds the whole
        graph's CSC (prediction), the training and test stages' CSCs (each in the new ids,
        segments in their original order), the training pairs (original ids: what the
        negatives are keyed on) and every node's original id; part ``k`` its feature shard
        and the validation and test pairs whose source it owns, with their positions in the
        split (what their fixed negatives are keyed on). A typed split adds each CSC's
        relation per edge (``edge_type``, ``train_edge_type``, ``test_edge_type``, in the
        relabelled edge order), the training pairs' relations ``train_rel`` and a part's
        pairs' ``val_rel`` / ``test_rel``; the metadata names the message relations
        (``relations``: what the RGCN and the per-relation fanouts are sized from) and the
        pairs' (``pair_relations``: DistMult's)."""
        graph, split = self.graph, self.targets.split
        replicated = {"orig_ids": book.new2old, "train_pos": split.train_pos}
        stages = {"": (graph.indptr, graph.indices, graph.edge_type)}
        stages |= {
            f"{stage}_": (*split.structure(stage), split.structure_edge_type(stage))
            for stage in ("train", "test")
        }
        for prefix, (indptr, indices, edge_type) in stages.items():
            new_indptr, old_edge = relabelled_edge_ids(indptr, book)  # relabel_csc's order
            replicated[f"{prefix}indptr"] = new_indptr
            replicated[f"{prefix}indices"] = book.old2new[indices[old_edge]]
            if split.is_typed:
                replicated[f"{prefix}edge_type"] = edge_type[old_edge]
        if split.is_typed:
            replicated["train_rel"] = split.train_rel
        writer.write_shared("topology", replicated)
        indptr = replicated["indptr"]
        del replicated
        home = prepared.part
        for k in range(world_size):
            lo, hi = int(book.node_offsets[k]), int(book.node_offsets[k + 1])
            arrays = {"x": graph.x[book.new2old[lo:hi]]}
            pairs = owned_eval_pairs(split, lambda i: home[i], k)
            for name, (pos, index) in pairs.items():
                arrays[f"{name}_pos"], arrays[f"{name}_index"] = pos, index
            for name, rel in (owned_eval_relations(split, pairs) or {}).items():
                arrays[f"{name}_rel"] = rel
            sizes = {"nodes": hi - lo, "edges": int(indptr[hi] - indptr[lo])}
            writer.write_part(k, arrays, sizes, shared=["topology"])
            log(f"[partition] part {k + 1}/{world_size} written ({sizes})")
        typed = {}
        if split.is_typed:
            typed = {
                **typed_meta(graph),
                "relations": list(split.relations),
                "pair_relations": list(graph.relations),
            }
        return {"node_offsets": book.node_offsets.tolist(), "report": prepared.report, **typed}

    @override
    def check_partition_part(self, opened: PartitionDir, k: int) -> None:
        """The replicated group's arrays have ``num_nodes`` rows (``indptr`` one more; the
        targets the task's target shape; link prediction: each stage's ``indptr``)."""
        nodes, folder, key = opened.meta["num_nodes"], shared_folder("topology"), "'num_nodes'"
        opened.expect_shape(folder, "indptr", (nodes + 1,), key)
        opened.expect_shape(folder, "orig_ids", (nodes,), key)
        if self.is_link:
            for stage in ("train", "test"):
                opened.expect_shape(folder, f"{stage}_indptr", (nodes + 1,), key)
            return
        opened.expect_shape(folder, TARGET_FILE, self.task.target_shape(nodes, opened.meta), key)
        if "relations" in opened.meta:  # a typed graph: a relation per edge of indices
            opened.expect_shape(folder, "edge_type", (opened.meta["num_edges"],), "'num_edges'")

    # ------------------------------------------------------------------------ rank parts
    @override
    def part_of(self, prepared: HopGNNPrepared, rank: int) -> HopGNNPart:
        """Rank ``rank``'s share of the in-memory graph: a copy of its feature rows; the
        whole graph (topology, targets, features for evaluation) stays resident."""
        graph, home = self.graph, prepared.part
        rows, local_row = FeatureShard.own_rows(graph.x, home, rank)
        link = None
        if self.is_link:
            split = self.targets.split
            structures = {stage: split.structure(stage) for stage in ("train", "test")}

            def owner(ids: Tensor) -> Tensor:
                return home.index_select(0, ids)

            pairs = owned_eval_pairs(split, owner, rank)
            edge_types = {}
            if split.is_typed:
                edge_types = {s: split.structure_edge_type(s) for s in ("train", "test")}
            link = LinkPart(
                targets=self.targets,
                home=owner,
                to_local=None,
                structures=structures,
                own_ids=(home == rank).nonzero().flatten(),
                pairs=pairs,
                edge_types=edge_types,
                relations=owned_eval_relations(split, pairs),
            )
        indptr, indices = link.structures["train"] if link else (graph.indptr, graph.indices)
        typed = {}
        if graph.is_typed:  # link prediction: the training edges' message relations
            typed = {
                "edge_type": link.edge_types["train"] if link else graph.edge_type,
                "relation_fanouts": self.relation_fanouts,
                "num_relations": self.num_relations,
            }
        return HopGNNPart(
            home=home,
            rows=rows,
            local_row=local_row,
            target=self.targets.target if link is None else torch.empty(0),
            sampler=NeighborSampler(indptr, indices, list(self.data.fanouts), self.seed, **typed),
            train_ids=self.train_ids,
            num_nodes=graph.num_nodes,
            own=None,
            link=link,
        )

    @override
    def load_part(self, opened: PartitionDir, rank: int) -> HopGNNPart:
        """The replicated group (memory-mapped, held once per machine) and rank ``rank``'s
        part: its feature shard and its nodes' split columns."""
        book = RangeBook(opened.node_offsets)
        replicated = opened.load_shared("topology", rank)
        arrays = opened.load_part(rank)
        if self.is_link:
            return self._load_link_part(opened, book, replicated, arrays, rank)
        if replicated["train_ids"].numel() == 0:  # as the base's train_ids
            raise ValueError(f"partition directory {opened.path}: no training nodes")
        x = arrays["x"] if arrays["x"].dtype == self.dtype else arrays["x"].to(self.dtype)
        orig_ids, target = replicated["orig_ids"], replicated[TARGET_FILE]
        first, stop = int(book.node_offsets[rank]), int(book.node_offsets[rank + 1])
        columns = {**arrays, TARGET_FILE: target[first:stop]}
        out_dim = self.task.out_dim_of(opened.meta)
        own = OwnNodes(orig_ids[first:stop], NodeTargets.from_arrays(columns, out_dim))
        typed = self._directory_relations(opened, replicated)
        sampler = RelabelledSampler(
            replicated["indptr"],
            replicated["indices"],
            orig_ids,
            list(self.data.fanouts),
            self.seed,
            **typed,
        )
        train_ids = replicated["train_ids"]
        return HopGNNPart(book, x, None, target, sampler, train_ids, orig_ids.numel(), own)

    def _directory_relations(self, opened: PartitionDir, replicated: dict) -> dict[str, Any]:
        """A typed directory's sampler settings (``edge_type``, ``relation_fanouts``,
        ``num_relations``; ``{}`` for a homogeneous one), its relations checked as outside
        input: int64 in ``[0, R)``, one per edge, each segment sorted by relation (what the
        per-relation slots assume), and ``data.fanouts_per_relation`` naming only them."""
        relations = opened.meta.get("relations")
        if relations is None:
            return {}
        where = f"partition directory {opened.path}"
        if "edge_type" not in replicated:
            raise PartitionDirError(
                f"{where}: its metadata names relations {relations} but the shared group "
                "'topology' holds no edge_type; partition again"
            )
        num_relations = len(relations)
        check_edge_type(where, "", replicated, num_relations)
        return {
            "edge_type": replicated["edge_type"],
            "relation_fanouts": relation_fanouts(self.data, relations, where),
            "num_relations": num_relations,
        }

    def _load_link_part(self, opened, book: RangeBook, replicated, arrays, rank: int):
        """Link prediction's part from a directory (:meth:`_write_link_parts`): the
        sampler over the training stage's CSC, keyed on original ids."""
        x = arrays["x"] if arrays["x"].dtype == self.dtype else arrays["x"].to(self.dtype)
        orig_ids = replicated["orig_ids"]
        old2new = torch.empty_like(orig_ids)
        old2new[orig_ids] = torch.arange(orig_ids.numel())
        train_pos = replicated["train_pos"]
        if train_pos.shape[1] == 0:
            raise ValueError(f"partition directory {opened.path}: no training pairs")
        structures = {
            stage: (replicated[f"{stage}_indptr"], replicated[f"{stage}_indices"])
            for stage in ("train", "test")
        }
        num_nodes = orig_ids.numel()
        typed = self._directory_link_relations(opened, replicated, arrays)
        targets = directory_link_targets(
            train_pos, structures["train"], orig_ids, self.task, self.seed, typed.get("split")
        )

        def to_local(ids: Tensor) -> Tensor:
            return old2new.index_select(0, ids)

        def owner(ids: Tensor) -> Tensor:
            return book.nid2part(to_local(ids))

        first, stop = int(book.node_offsets[rank]), int(book.node_offsets[rank + 1])
        link = LinkPart(
            targets=targets,
            home=owner,
            to_local=to_local,
            structures=structures,
            own_ids=orig_ids[first:stop],
            pairs={s: (arrays[f"{s}_pos"], arrays[f"{s}_index"]) for s in ("val", "test")},
            edge_types=typed.get("edge_types", {}),
            relations=typed.get("relations"),
        )
        sampler = RelabelledSampler(
            *structures["train"],
            orig_ids,
            list(self.data.fanouts),
            self.seed,
            **typed.get("sampler", {}),
        )
        train_ids = torch.arange(train_pos.shape[1])  # the task's seeds: pair positions
        return HopGNNPart(
            book,
            x,
            None,
            torch.empty(0),
            sampler,
            train_ids,
            num_nodes,
            None,
            link=link,
            topology=(replicated["indptr"], replicated["indices"]),
            topology_edge_type=typed.get("topology_edge_type"),
        )

    def _directory_link_relations(self, opened, replicated: dict, arrays: dict) -> dict:
        """A typed link directory's relations (``{}`` for a homogeneous one), checked as
        outside input: every CSC's ``edge_type`` (:func:`check_edge_type`, the message
        relations), the training pairs' and this part's evaluation pairs' relations (the
        pairs' relations), and ``data.fanouts_per_relation`` naming only message relations.
        Returns the sampler's settings, the stages' edge types, the whole graph's, and the
        pairs' relations."""
        relations = opened.meta.get("relations")
        if relations is None:
            return {}
        where = f"partition directory {opened.path}"
        pair_relations = opened.meta.get("pair_relations")
        names = ["edge_type", "train_edge_type", "test_edge_type", "train_rel"]
        missing = [n for n in names if n not in replicated]
        missing += [f"{s}_rel" for s in ("val", "test") if f"{s}_rel" not in arrays]
        if pair_relations is None or missing:
            raise PartitionDirError(
                f"{where}: its metadata names relations {relations} but it holds no "
                f"{missing or 'pair_relations'} (a typed link split's relations); partition again"
            )
        for prefix in ("", "train_", "test_"):
            check_edge_type(where, prefix, replicated, len(relations))
        check_relations(
            where, "train_rel", replicated["train_rel"], replicated["train_pos"].shape[1],
            len(pair_relations),
        )  # fmt: skip
        for s in ("val", "test"):
            count = arrays[f"{s}_index"].numel()
            check_relations(where, f"{s}_rel", arrays[f"{s}_rel"], count, len(pair_relations))
        return {
            "sampler": {
                "edge_type": replicated["train_edge_type"],
                "relation_fanouts": relation_fanouts(self.data, relations, where),
                "num_relations": len(relations),
            },
            "edge_types": {s: replicated[f"{s}_edge_type"] for s in ("train", "test")},
            "topology_edge_type": replicated["edge_type"],
            "split": {
                "train_rel": replicated["train_rel"],
                "train_edge_type": replicated["train_edge_type"],
                "relations": relations,
                "num_relations": len(pair_relations),
            },
            "relations": {s: arrays[f"{s}_rel"] for s in ("val", "test")},
        }

    @override
    def check_partition_task(self, opened) -> None:
        """The base's check; then a typed link directory tells the task its pairs' relations
        (``pair_relations``: what DistMult's diagonals are sized from, before the module's
        head is built, as ``task.prepare`` does in memory)."""
        super().check_partition_task(opened)
        if self.is_link and "pair_relations" in opened.meta:
            self.task.relations = tuple(opened.meta["pair_relations"])

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
        if self.is_link:
            return self.link_statistics(net, splits)
        own = self.held.own
        if own is None:
            return super().eval_statistics(net, splits)
        out = self.own_rows(net, net.num_layers)
        return split_statistics(self.task, out, own.targets, splits)

    def link_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """Link prediction's evaluation, partition-local in memory as from a directory: each
        rank embeds its own nodes over a stage's structure (full neighbourhoods, the
        in-neighbours' rows from their owners), scores the evaluation pairs whose source it
        owns and pulls the other rows they need from their owners per round
        (:func:`~...kit.link_partitioned.owned_link_statistics`): no rank holds every node's
        embedding. Its bytes are kept out of the merging controller's modelled time."""
        link = self.held.link
        if link is None:
            raise RuntimeError("the DataModule is not set up for link prediction")
        before = self.comm.meter.snapshot()

        def embed(stage: str) -> Tensor:
            return self._owned_embeddings(
                net, link.structures[stage], net.num_layers, link.edge_types.get(stage)
            )

        stats = owned_link_statistics(
            self.task,
            embed,
            link.own_ids,
            link.home,
            link.pairs,
            self.held.num_nodes,
            self.seed,
            splits,
            self.comm,
            relations=link.relations,
        )
        self._untime(before)
        return stats

    def _owned_embeddings(
        self,
        net: torch.nn.Module,
        structure: tuple[Tensor, Tensor],
        layers: int,
        edge_type: Tensor | None = None,
    ) -> Tensor:
        """The first ``layers`` layers' full-neighbourhood rows of this rank's own nodes over
        ``structure`` (a CSC in this rank's ids; a typed graph's with ``edge_type``, its
        message relations), in its own rows' order."""
        indptr, indices = structure
        chunk = self.data.eval_chunk_size
        typed = {}
        if edge_type is not None:
            typed = {"edge_type": edge_type, "num_relations": self.num_relations}
        if isinstance(self.part, RangeBook):
            return owned_range_rows(
                net, self.comm, self.part, indptr, indices, self.shard.rows, layers, chunk, **typed
            )
        own = CSCRows.owned(indptr, indices, self.held.link.own_ids, **typed)
        home = self.part

        def owner(ids: Tensor) -> Tensor:
            return home.index_select(0, ids)

        return owned_rows(net, self.comm, owner, own, self.shard.rows, layers, chunk)

    def _untime(self, before: dict) -> None:
        """Keep the bytes sent since ``before`` out of the controller's modelled time."""
        for category, sent in self.comm.meter.delta(before)["bytes"].items():
            self._untimed_bytes[category] = self._untimed_bytes.get(category, 0) + sent

    @override
    def predict_rows(
        self, net: torch.nn.Module, node_ids: Tensor | None, output: str
    ) -> tuple[Tensor, Tensor]:
        """The requested (original) ids this rank owns and their rows (a partition
        directory); with the whole graph held, the base's node-range split."""
        own, held = self.held.own, self.held
        if own is None and held.topology is None:
            return super().predict_rows(net, node_ids, output)
        ids = own.orig_ids if own is not None else held.link.own_ids
        rows = self.own_rows(net, net.num_layers - (output == "embeddings"))
        return own_predictions(ids.clone(), rows, node_ids, held.num_nodes)

    def own_rows(self, net: torch.nn.Module, layers: int) -> Tensor:
        """The first ``layers`` layers' full-neighbourhood rows of this rank's own nodes
        (:func:`~...models.inference.owned_range_rows`: in-neighbours' rows come from their owners). Its
        ``feature`` and ``structure`` bytes are kept out of the merging controller's modelled
        epoch time, which counts training bytes (in memory evaluation sends neither)."""
        before = self.comm.meter.snapshot()
        topology = self.held.topology or (self.sampler.indptr, self.sampler.indices)
        edge_type = self.held.topology_edge_type
        if self.held.topology is None:
            edge_type = self.sampler.edge_type
        typed = {}
        if edge_type is not None:
            typed = {"edge_type": edge_type, "num_relations": self.num_relations}
        rows = owned_range_rows(
            net,
            self.comm,
            self.part,
            *topology,
            self.shard.rows,
            layers,
            self.data.eval_chunk_size,
            **typed,
        )
        self._untime(before)
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
                LINK_TRAINING_CATEGORIES if self.is_link else TRAINING_CATEGORIES,
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
        if self.is_link:
            return self._make_link_batch(epoch, step, steps)
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

    def link_plan(self, epoch: int, step: int, steps: int | None = None):
        """Link prediction's ``(plan, this rank's LinkShare per kept step)`` of one iteration
        (:func:`~.links.link_plan`; pure: every rank derives the same plan)."""
        config, n, link = self.config, self.world_size, self.held.link
        seeds = self.order.step(epoch, step, self.batch_size)
        planner = {}
        if config.mode != "model_centric":
            planner = {
                "steps": steps if steps is not None else config.kept_steps(n),
                "score": config.merge_score,
                "policy": config.merge_policy,
                "direction": config.direction,
                "recount": config.recount,
            }
        return link_plan(
            self.task,
            link.targets,
            seeds,
            link.home,
            self.held.num_nodes,
            n,
            self.rank,
            epoch,
            step,
            model_centric=config.mode == "model_centric",
            **planner,
        )

    def _make_link_batch(self, epoch: int, step: int, steps: int) -> HopGNNBatch:
        """Link prediction's iteration on this rank: per kept step, the micrograph set of the
        endpoints it computes (:class:`~.links.LinkShare`), sampled over the training
        structure with ``single``'s keys, its remote input rows fetched (pre-gathered over the
        steps with ``pregather``), and the pairs it scores with the row exchange's counts."""
        start = time.perf_counter()
        plan, shares = self.link_plan(epoch, step, steps)
        rank, shard, link = self.rank, self.shard, self.held.link
        # task.exclude_target_edges: the whole step's positives, keyed in original ids
        seeds = self.order.step(epoch, step, self.batch_size)
        exclude = self.task.excluded_edges(link.targets, seeds)
        sampled = [
            self.sampler.sample(
                share.nodes if link.to_local is None else link.to_local(share.nodes),
                epoch=epoch,
                step=step,
                exclude=exclude,
            )
            for share in shares
        ]
        remote = [remote_inputs(blocks, self.part, rank) for blocks in sampled]
        sample_done = time.perf_counter()
        if self.config.pregather:
            ids = torch.unique(torch.cat(remote))
            tables = [(ids, shard.fetch(ids))] * len(sampled)
            fetched_rows = ids.numel()
        else:
            tables = [(ids, shard.fetch(ids)) for ids in remote]
            fetched_rows = sum(ids.numel() for ids in remote)
        terms = self.task.loss_terms(plan.global_seed_count)
        subs: list[Batch | None] = []
        for blocks, (ids, table), share in zip(sampled, tables, shares):
            x = shard.gather(blocks[0].src_ids, ids, table)
            subs.append(
                LinkStepBatch(
                    blocks,
                    x,
                    share.y,
                    terms,
                    epoch,
                    step,
                    send_index=share.send_index,
                    send_splits=share.send_splits,
                    recv_splits=share.recv_splits,
                )
            )
        width = 4 if link.targets.split.is_typed else 3  # typed: the relation last
        pairs = torch.cat([torch.empty((0, width), dtype=torch.int64), *[s.y for s in shares]])
        stats = {
            "sample_s": sample_done - start,
            "load_s": time.perf_counter() - sample_done,
            "input_nodes": sum(b[0].num_src for b in sampled),
            "remote_rows": fetched_rows,
            "local_rows": int(
                sum((owners_of(self.part, b[0].src_ids) == rank).sum() for b in sampled)
            ),
            "exchanged_rows": sum(sum(s.recv_splits) for s in shares),
            "time_steps": plan.num_steps,
            "migrations": len(plan.kept) - 1,
            "load": plan.load()[:, rank].tolist(),
        }
        hops = [plan.hop(j, rank) for j in range(1, plan.num_steps)]
        return HopGNNBatch(
            [],
            shard.rows.new_empty((pairs.shape[0], 0)),  # a row per scored pair: see the class
            pairs,
            terms,
            epoch,
            step,
            stats,
            steps=subs,
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
