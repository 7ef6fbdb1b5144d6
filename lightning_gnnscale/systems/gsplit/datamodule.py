"""``GSplitDataModule``: one global mini-batch per step, split by the partition map.

Every rank draws the same global seeds as ``single`` (the shared epoch permutation), keeps
the targets it owns, samples split-parallel (collective, so in the main process), and loads
input features only for the vertices it owns, through a partition-aligned cache ranked by
pre-sampled input frequency (hit / miss counters; on CPU both are RAM, only the counts mean
anything). With ``topology: replicated`` every rank holds the whole CSC and evaluation is
full-graph layer-wise inference; with ``partitioned`` a rank holds only its own vertices' CSC
rows and evaluates them layer by layer, the rows of in-neighbours owned elsewhere pulled from
their owners (docs/systems/gsplit.md#topology).

With ``data.partition_dir`` (``write_parts``) the vertices are relabelled so that each rank
owns one contiguous id range (the split function becomes the ``[P + 1]`` offsets). The
topology, in those ids with every in-edge segment in its original order, is one shared group
every rank of a machine maps once (``replicated``, with the training ids and every vertex's
original id, the redundancy probe's sampling keys) or split into the parts, each holding its
own vertices' rows (``partitioned``; the shared group then holds the training ids and the
in-degrees). A rank's part holds its own vertices' features, the task's rows (targets and
splits), original ids (the sampling keys) and pre-sampled input counts. Evaluation and
prediction then compute each rank's own rows layer by layer, the rows of in-neighbours it does
not own pulled from their owners (docs/systems/gsplit.md#from-a-partition-directory).

Link prediction (:mod:`.link`): a pair belongs to its source's owner; a step's endpoints are
computed by their owners, split-parallel over the training structure, and their output rows
move to the pairs' ranks after the last layer; evaluation stays partition-local
(docs/systems/gsplit.md#link-prediction).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import lightning as L
import torch
from typing_extensions import override

from ...comm import Comm
from ...contract import RankContext
from ...graph.batch import Batch
from ...graph.book import PartitionBook, RangeBook, relabel_csc, relabelled_edge_ids
from ...graph.csc import Graph
from ...graph.csc_rows import CSCRows
from ...graph.node_targets import NodeTargets
from ...graph.partition_dir import PartitionDir, PartitionDirError, part_folder, shared_folder
from ...graph.sampler import (
    NeighborSampler,
    SampleKey,
    sample_neighbors,
    sample_typed_edge_ids,
)
from ...kit.datamodule import GNNDataModule
from ...kit.link_partitioned import owned_link_statistics
from ...kit.partitions import assert_same_on_all_ranks, own_predictions
from ...kit.sampled import ReplicatedGraphEvaluation
from ...models.gnn import BlockGNN
from ...models.inference import owned_rows
from ...tasks.base import split_statistics
from ...tasks.link.split import message_relations
from .callbacks import GSplitStats, RedundancyProbe
from .config import GSplitConfig
from .link import STAGES, LinkPart, link_part, split_arrays
from .partition import LinkSchedule, cached_probabilistic_partition
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


@dataclass(frozen=True)
class GSplitPart:
    """What one rank holds: :meth:`GSplitDataModule.part_of` builds it from the in-memory
    graph (original ids), :meth:`GSplitDataModule.load_part` from a partition directory
    (relabelled ids, each rank's vertices one contiguous range).

    Attributes:
        owner: the split function: int64 ``[N]`` owner of every vertex, or the
            :class:`RangeBook` offsets of a relabelled graph.
        topology: the CSC rows the split sampler expands (every vertex's, or its own only).
        own_topology: its own vertices' CSC rows, which evaluation and predict expand;
            ``None``: it holds the whole graph and evaluates it whole (``replicated`` in memory).
        node_keys: ``ids -> ids`` the sampling hash is keyed on for its vertices (their
            original ids); ``None``: the ids themselves.
        orig_ids: int64 ``[N]`` original id of every vertex of a relabelled whole topology
            (the redundancy probe's sampling keys); ``None``: the ids are the original ones,
            or only its own rows are held.
        own_ids: int64 ``[n_own]`` its vertices, sorted; ``own_orig_ids`` their original ids.
        x, targets: feature rows and the task's rows, vertex ``v``'s at row ``v - first_id``
            (the whole graph's, ``first_id`` 0, or the part's own); link prediction's
            ``targets`` are the whole split in memory, ``None`` from a directory (the rank's
            share is ``link``).
        input_frequency: pre-sampled input counts, indexed like ``x``.
        own_rows: the rows of ``x`` and ``targets`` that hold its vertices, in id order;
            ``None``: all of them.
        train_ids: the training seeds ``[n_train]`` in these ids, in original id order.
        num_nodes: ``N``; report: :attr:`GSplitPrepared.report`.
        link: link prediction's share of the edge split (:class:`~.link.LinkPart`); ``None``
            for node tasks. ``topology`` is then the training structure's rows.
    """

    owner: torch.Tensor | RangeBook
    topology: CSCRows
    own_topology: CSCRows | None
    node_keys: Callable[[torch.Tensor], torch.Tensor] | None
    orig_ids: torch.Tensor | None
    own_ids: torch.Tensor
    own_orig_ids: torch.Tensor
    x: torch.Tensor
    targets: NodeTargets
    input_frequency: torch.Tensor
    first_id: int
    own_rows: torch.Tensor | None
    train_ids: torch.Tensor
    num_nodes: int
    report: dict
    link: LinkPart | None = None

    def own(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (indexed like ``x``) of its own vertices, in id order."""
        return rows if self.own_rows is None else rows.index_select(0, self.own_rows)

    def own_targets(self) -> NodeTargets:
        """The task's rows of its own vertices, in id order."""
        return self.targets if self.own_rows is None else self.targets.rows(self.own_rows)

    @property
    def split_table(self) -> torch.Tensor:
        """What every rank must hold the same of the split function: its ``[N]`` table, or
        the ``[P + 1]`` offsets."""
        return self.owner.node_offsets if isinstance(self.owner, RangeBook) else self.owner

    @property
    def num_parts(self) -> int:
        """The parts the split function names."""
        if isinstance(self.owner, RangeBook):
            return self.owner.num_parts
        return int(self.owner.max()) + 1 if self.owner.numel() else 0


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
        self.recorded = [False] * num_layers

    def record(self, layer: int, rows: int, row_bytes: int) -> None:
        """``rows`` rows of ``row_bytes`` each were received before ``layer``."""
        self.rows[layer], self.bytes[layer] = rows, rows * row_bytes
        self.recorded[layer] = True


class EndpointShuffleGNN(BlockGNN):
    """A :class:`BlockGNN` that also calls the layer hook after its last layer
    (``layer_hook(num_layers, out)``): GSplit's link prediction moves each output row from
    its owner to the ranks whose pairs score it there. The same layers and parameter names as
    the :class:`BlockGNN` it is made from (:meth:`GSplitDataModule.build_model`), so its
    weights and checkpoints are ``single``'s; without a hook it is that net."""

    def forward(self, blocks, x, layer_hook=None):
        h = super().forward(blocks, x, layer_hook)
        return h if layer_hook is None else layer_hook(self.num_layers, h)


@dataclass
class SplitBatch(Batch):
    """A :class:`Batch` plus what the shuffle needs.

    Attributes:
        plans: ``plans[i]``: how rows move before layer ``i`` (one per layer); link
            prediction adds ``plans[num_layers]``, the output rows' move to the ranks whose
            pairs need them (``y`` indexes the rows it returns).
        traffic: this step's received rows and bytes per layer (written during forward).
    """

    plans: list[LayerPlan] = field(kw_only=True)
    traffic: LayerTraffic = field(kw_only=True)

    def to(self, device) -> SplitBatch:
        return replace(super().to(device), plans=[p.to(device) for p in self.plans])


class PartitionedFeatureCache:
    """Rank ``r`` caches the ``capacity`` of its own vertices most often in pre-sampled input
    layers (``policy=presample_freq``) or the lowest ids (``id_order``); no row is cached twice.

    ``load(ids)`` returns the rows of ``ids`` and counts hits, misses and host bytes.

    Args:
        x: feature rows; vertex ``v``'s is row ``v - first_id`` (the whole graph's, or a
            partition directory's part).
        owned: this rank's vertex ids, sorted.
        frequency: pre-sampled input counts, indexed like ``x``'s rows.
        fraction, policy: as :class:`~.config.FeatureCacheConfig`.
        first_id: the id of row 0.
    """

    def __init__(
        self,
        x: torch.Tensor,
        owned: torch.Tensor,
        frequency: torch.Tensor,
        fraction: float,
        policy: str,
        first_id: int = 0,
    ):
        capacity = round(fraction * owned.numel())
        rows = owned - first_id
        if policy == "presample_freq":
            rows = rows[torch.argsort(frequency[rows], descending=True, stable=True)]
        self.cached = torch.zeros(x.shape[0], dtype=torch.bool)
        self.cached[rows[:capacity]] = True
        self.x, self.capacity, self.first_id = x, capacity, first_id
        self.hits = self.misses = 0

    def load(self, ids: torch.Tensor) -> torch.Tensor:
        rows = ids - self.first_id
        hit = int(self.cached[rows].sum())
        self.hits += hit
        self.misses += ids.numel() - hit
        return self.x.index_select(0, rows)

    @property
    def row_bytes(self) -> int:
        return self.x.shape[1] * self.x.element_size()


class OrigKeyedSampler(NeighborSampler):
    """:class:`NeighborSampler` whose hash is keyed on the original ids ``orig_ids`` (``[N]``:
    id -> original id, of a relabelled CSC; ``None``: the ids are the original ones, as
    :class:`NeighborSampler` keys them): the in-memory graph's samples, in this CSC's ids
    (GSplit's redundancy probe)."""

    def __init__(
        self,
        indptr,
        indices,
        fanouts: list[int],
        seed: int,
        orig_ids: torch.Tensor | None,
        edge_type: torch.Tensor | None = None,
        relation_fanouts: list[tuple[int, ...]] | None = None,
        num_relations: int = 1,
    ):
        super().__init__(indptr, indices, fanouts, seed, edge_type, relation_fanouts, num_relations)
        self.orig_ids = orig_ids

    @override
    def sample(self, seeds, epoch: int = 0, step: int = 0, salt: int = 0):
        key = SampleKey(self.seed, epoch, step, salt)
        frontier = seeds.to(torch.int64)
        blocks = []
        for hop, fanout in enumerate(self.fanouts):
            keys = None if self.orig_ids is None else self.orig_ids.index_select(0, frontier)
            if self.edge_type is None:
                src, dst_pos = sample_neighbors(
                    self.indptr, self.indices, frontier, fanout, key.hop_key(hop), keys
                )
                block = self.build_block(frontier, src, dst_pos)
            else:
                eids, dst_pos = sample_typed_edge_ids(
                    self.slot_indptr, frontier, self.relation_fanouts[hop], key.hop_key(hop), keys
                )
                src = self.indices.index_select(0, eids)
                block = self.build_block(frontier, src, dst_pos, self.edge_type[eids])
            blocks.append(block)
            frontier = block.src_ids
        return blocks[::-1]


def typed_rows(
    opened: PartitionDir,
    arrays: dict[str, torch.Tensor],
    indptr: torch.Tensor,
    relations,
    folder: str,
    name: str = "edge_type",
) -> dict:
    """The :class:`CSCRows` keywords of a partition directory's relations: ``edge_type``
    (``arrays``' entry ``name``, one per entry of the rows ``indptr`` cover, in ``folder``) and
    ``num_relations``; ``{}`` for a homogeneous graph's. Outside input: the file must come
    exactly when the metadata names ``relations``, hold int64 values in ``[0, R)``, and keep
    every segment sorted by relation (a typed graph's CSC order, which per-relation sampling
    reads as runs); else ``PartitionDirError`` naming it."""
    where = f"{opened.path / folder / f'{name}.npy'}"
    edge_type = arrays.get(name)
    if (edge_type is None) != (not relations):
        have = "no" if edge_type is None else "an"
        raise PartitionDirError(
            f"{opened.path}: the metadata names relations {list(relations)} but there is "
            f"{have} {where}; partition again"
        )
    if edge_type is None:
        return {}
    num_relations = len(relations)
    if edge_type.dtype != torch.int64 or edge_type.shape != indices_shape(indptr):
        raise PartitionDirError(
            f"{where} must be int64 {list(indices_shape(indptr))}, holds {edge_type.dtype} "
            f"{list(edge_type.shape)}; partition again"
        )
    if edge_type.numel():
        if int(edge_type.min()) < 0 or int(edge_type.max()) >= num_relations:
            raise PartitionDirError(
                f"{where} holds relations outside [0, {num_relations}) (the metadata's "
                f"'relations' {list(relations)}); partition again"
            )
        starts = torch.zeros(edge_type.numel(), dtype=torch.bool)
        degree = indptr[1:] - indptr[:-1]
        starts[(indptr[:-1] - indptr[0])[degree > 0]] = True
        if not bool(((edge_type[1:] >= edge_type[:-1]) | starts[1:]).all()):
            raise PartitionDirError(
                f"{where}: a segment's relations are not sorted (a typed CSC keeps each "
                "vertex's in-edges sorted by relation); partition again"
            )
    return {"edge_type": edge_type, "num_relations": num_relations}


def pair_relations(meta: dict, path) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """A typed link-prediction directory's ``(pair relations, message relations)``: its
    metadata ``meta``'s ``pair_relations`` (the graph's, which each pair of the split keeps) and
    ``relations`` (what messages pass over: the same, or with each one's ``<r>_inverse``
    after them); ``None`` when it names no relations. Outside input: else
    ``PartitionDirError``."""
    message = tuple(meta.get("relations") or ())
    pairs = meta.get("pair_relations")
    if not message and pairs is None:
        return None
    fine = isinstance(pairs, list) and pairs and all(isinstance(r, str) for r in pairs)
    if fine:
        try:
            directed = message_relations(tuple(pairs), undirected=False)
        except ValueError:
            fine = False
        else:
            fine = message in (tuple(pairs), directed)
    if not fine:
        raise PartitionDirError(
            f"{path}'s metadata 'pair_relations' {pairs!r} does not name the relations "
            f"of its 'relations' {list(message)} (the same, or each followed by its inverse); "
            "partition again"
        )
    return tuple(pairs), message


def indices_shape(indptr: torch.Tensor) -> tuple[int]:
    """The shape of the entries the rows ``indptr`` cover."""
    return (int(indptr[-1] - indptr[0]),)


def check_node_types(opened: PartitionDir, arrays: dict[str, torch.Tensor], folder: str) -> None:
    """A part's ``node_type`` (outside input) comes exactly when the metadata names
    ``node_types``, and holds int64 values in ``[0, T)``; else ``PartitionDirError``."""
    names = opened.meta.get("node_types") or ()
    node_type = arrays.get("node_type")
    where = f"{opened.path / folder / 'node_type.npy'}"
    if (node_type is None) != (not names):
        have = "no" if node_type is None else "an"
        raise PartitionDirError(
            f"{opened.path}: the metadata names node types {list(names)} but there is "
            f"{have} {where}; partition again"
        )
    if node_type is not None and (
        node_type.dtype != torch.int64
        or (node_type.numel() and (int(node_type.min()) < 0 or int(node_type.max()) >= len(names)))
    ):
        raise PartitionDirError(
            f"{where} must hold int64 node types in [0, {len(names)}) (the metadata's "
            f"'node_types' {list(names)}); partition again"
        )


class GSplitDataModule(ReplicatedGraphEvaluation, GNNDataModule):
    """Split-parallel mini-batches: rank ``r`` samples, loads and computes the vertices it
    owns of every step's global mini-batch (``single``'s).

    Batches are :class:`SplitBatch`: ``blocks`` input layer first, ``x`` ``[|inputs|, F]`` of
    the owned inputs, ``y`` of the owned targets, ``plans`` the shuffle before each layer.

    Args: as :class:`~...kit.datamodule.GNNDataModule`; ``config`` defaults to ``GSplitConfig()``.
    """

    def __init__(self, dataset, config: GSplitConfig | None = None, data=None, **kwargs):
        super().__init__(dataset, config or GSplitConfig(), data, **kwargs)
        self.rank, self.world_size = 0, 1
        self.report: dict = {}  # GSplitPrepared.report of the run's world size
        self.held: GSplitPart | None = None  # this rank's part, once set up

    # ---------------------------------------------------------------------- preprocessing
    @override
    def preprocess(self, world_size: int) -> GSplitPrepared:
        """Pre-sample the task's training seeds and partition (cached on disk by content hash
        under ``cache_dir``)."""
        p = self.config.partition
        graph, is_train, link = self.graph, None, None
        if self.is_link:
            graph, is_train, link = self.link_schedule()
        else:
            is_train = self.task.is_train_seed(self.targets)
        artifact = cached_probabilistic_partition(
            graph,
            world_size,
            targets=None if link is not None else self.targets,
            is_train=is_train,
            link=link,
            method=p.method,
            fanouts=list(self.data.fanouts),
            batch_size=self.data.batch_size,
            presample_epochs=p.presample_epochs,
            seed=self.seed ^ PRESAMPLE_SEED_SALT,
            cache_dir=self.cache_dir,
            metis_seed=self.seed,
            ufactor=p.ufactor,
            zero_edge_policy=p.zero_edge_policy,
            relation_fanouts=self.relation_fanouts,
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

    @property
    def is_link(self) -> bool:
        """Whether the task's seeds are edges (link prediction)."""
        return self.task.spec.seeds == "edges"

    def link_schedule(self) -> tuple[Graph, torch.Tensor, LinkSchedule]:
        """``(graph, is_train, schedule)`` pre-sampling runs for link prediction: the training
        structure, the training pairs' endpoints (the ``edge`` baseline's train mass), and the
        steps' endpoint nodes (their negatives keyed on the pre-sampling seed, so the partition
        is not fitted to training's own draws)."""
        task, targets = self.task, self.targets
        graph = task.stage_graph(self.graph, targets, "train")  # typed: its message relations
        salted = replace(targets, seed=targets.seed ^ PRESAMPLE_SEED_SALT)

        def step_nodes(seeds: torch.Tensor, epoch: int, step: int) -> torch.Tensor:
            positions = torch.arange(seeds.numel())
            return task.step_rows(salted, seeds, positions, epoch=epoch, step=step)[0]

        pos = targets.split.train_pos
        is_train = torch.zeros(graph.num_nodes, dtype=torch.bool)
        is_train[pos.flatten()] = True
        c = task.config
        key = {
            "task": [c.name, c.negatives, c.num_negatives, c.filter_negatives],
            "task_seed": targets.seed,
        }
        schedule = LinkSchedule(task.train_seeds(targets), step_nodes, key, (pos,))
        return graph, is_train, schedule

    # ------------------------------------------------------------- partition directories
    @override
    def partition_settings(self) -> dict[str, Any]:
        """The partitioner, what pre-sampling runs (the training schedule's fanouts and batch
        size, and a typed graph's ``data.fanouts_per_relation`` when given) and the topology
        (``replicated``: one shared copy per machine; ``partitioned``: each part holds its own
        vertices' rows)."""
        p = self.config.partition
        options = {
            "presample_epochs": p.presample_epochs,
            "ufactor": p.ufactor,
            "zero_edge_policy": p.zero_edge_policy,
            "fanouts": list(self.data.fanouts),
            "batch_size": self.data.batch_size,
            "topology": self.config.topology,
        }
        if self.data.fanouts_per_relation:  # a typed graph's pre-sampling used them too
            options["fanouts_per_relation"] = {
                r: list(f) for r, f in sorted(self.data.fanouts_per_relation.items())
            }
        return {"method": p.method, "partition_options": options}

    @override
    def write_parts(self, world_size: int, writer, log) -> dict:
        """Relabel so that each rank owns one contiguous id range; per part write its
        vertices' ``x``, the task's rows (:meth:`NodeTargets.arrays`; link prediction: the
        part's share of the edge split, :func:`~.link.split_arrays`), ``orig_ids`` and
        pre-sampled ``input_frequency``. The topology (CSC, segments in their original order)
        is, with ``replicated``, the shared group ``topology`` (with the training ids and every
        vertex's original id, ``orig_ids`` ``[N]``: the redundancy probe's sampling keys);
        with ``partitioned``, each part's own rows (``indptr`` ``[n_k + 1]`` from 0,
        ``indices``), next to a shared group ``vertices`` of the training ids and the
        in-degrees ``degree`` ``[N]``. Link prediction writes each structure so: the graph's
        (predict), ``train_`` (training and validation's) and ``test_`` (test's), and shares
        ``new_ids`` ``[N]`` (original id -> id: negatives are drawn in original ids). A typed
        graph's relation of every CSC entry, ``edge_type``, goes with its ``indices`` (shared
        or per part), each part's ``node_type`` with its rows, and the metadata names them
        (``relations``, ``node_types``); typed link prediction adds the stage structures'
        ``train_edge_type`` and ``test_edge_type``, each part's pair relations, and names the
        message relations (``relations``: inverses included) and the graph's
        (``pair_relations``)."""
        prepared, graph, targets = self.prepare(world_size), self.graph, self.targets
        book = PartitionBook.from_parts(prepared.parts, world_size)
        structures = {"": (graph.indptr, graph.indices)}
        edge_types = {"": graph.edge_type}
        if self.is_link:
            split = targets.split
            structures |= {f"{s}_": split.structure(s) for s in STAGES}
            edge_types |= {f"{s}_": split.structure_edge_type(s) for s in STAGES}
            train_ids = self.task.train_seeds(targets)  # pair positions: no relabelling
        else:
            train_ids = book.old2new[self.task.train_seeds(targets)]  # in original id order
        relabelled = {p: relabel_csc(*csc, book) for p, csc in structures.items()}
        indptr = relabelled[""][0]
        partitioned = self.config.topology == "partitioned"
        relabelled_types = {}  # each relabelled entry's relation (segments keep their order)
        if graph.is_typed:
            for p, (ip, _) in structures.items():
                old = relabelled_edge_ids(ip, book)[1]
                relabelled_types[p] = edge_types[p].index_select(0, old)
        if partitioned:
            group = "vertices"
            shared = {"train_ids": train_ids}
            shared |= {f"{p}degree": ip[1:] - ip[:-1] for p, (ip, _) in relabelled.items()}
        else:
            group = "topology"
            shared = {"train_ids": train_ids, "orig_ids": book.new2old}
            for p, (ip, ix) in relabelled.items():
                shared |= {f"{p}indptr": ip, f"{p}indices": ix}
            shared |= {f"{p}edge_type": t for p, t in relabelled_types.items()}
        if self.is_link:
            shared["new_ids"] = book.old2new
        writer.write_shared(group, shared)
        for k in range(world_size):
            lo, hi = int(book.node_offsets[k]), int(book.node_offsets[k + 1])
            own = book.new2old[lo:hi]
            arrays = {
                "x": graph.x[own],
                "orig_ids": own,
                "input_frequency": prepared.input_frequency[own],
            }
            if self.is_link:
                arrays |= split_arrays(targets.split, prepared.parts == k)
            else:
                arrays |= targets.rows(own).arrays()
            if graph.node_type is not None:
                arrays["node_type"] = graph.node_type[own]
            if partitioned:
                for p, (ip, ix) in relabelled.items():
                    arrays[f"{p}indptr"] = ip[lo : hi + 1] - ip[lo]
                    arrays[f"{p}indices"] = ix[ip[lo] : ip[hi]]
                    if p in relabelled_types:
                        arrays[f"{p}edge_type"] = relabelled_types[p][ip[lo] : ip[hi]]
            sizes = {"nodes": hi - lo, "edges": int(indptr[hi] - indptr[lo])}
            writer.write_part(k, arrays, sizes, shared=[group])
            log(f"[partition] part {k + 1}/{world_size} written ({sizes})")
        meta = {"node_offsets": book.node_offsets.tolist(), "report": prepared.report}
        if graph.is_typed and self.is_link:  # messages pass over the split's relations
            meta["relations"] = list(targets.split.relations)
            meta["pair_relations"] = list(graph.relations)
        elif graph.is_typed:
            meta["relations"] = list(graph.relations)
        if graph.node_type is not None:
            meta["node_types"] = list(graph.node_types)
        return meta

    @override
    def check_partition_part(self, opened: PartitionDir, k: int) -> None:
        """The shared group's ``[N]`` arrays have ``num_nodes`` rows (``indptr`` one more)."""
        nodes, key = opened.meta["num_nodes"], "'num_nodes'"
        topology, vertices = shared_folder("topology"), shared_folder("vertices")
        for p in ("", *(f"{s}_" for s in STAGES)):
            opened.expect_shape(topology, f"{p}indptr", (nodes + 1,), key)
            opened.expect_shape(vertices, f"{p}degree", (nodes,), key)
        opened.expect_shape(topology, "orig_ids", (nodes,), key)
        for folder in (topology, vertices):
            opened.expect_shape(folder, "new_ids", (nodes,), key)
        record, part = opened.meta["parts"][k], part_folder(k)
        opened.expect_shape(topology, "edge_type", (opened.meta["num_edges"],), "'num_edges'")
        if "edges" in record:
            opened.expect_shape(part, "edge_type", (record["edges"],), f"part {k}'s 'edges'")
        if "nodes" in record:
            opened.expect_shape(part, "node_type", (record["nodes"],), f"part {k}'s 'nodes'")
        for name in ("relations", "node_types"):
            names = opened.meta.get(name)
            if names is not None and not (
                isinstance(names, list)
                and names
                and all(isinstance(n, str) for n in names)
                and len(set(names)) == len(names)
            ):
                raise PartitionDirError(
                    f"{opened.path}'s metadata {name!r} {names!r} is not a list of distinct "
                    "names; partition again"
                )

    # ------------------------------------------------------------------------ rank parts
    @override
    def part_of(self, prepared: GSplitPrepared, rank: int) -> GSplitPart:
        """Rank ``rank``'s share of the in-memory graph, in its original ids: the whole
        graph's rows, the whole CSC (``replicated``, evaluated over the whole graph) or a
        copy of its own vertices' rows (``partitioned``). Link prediction samples the
        training structure the same way, and holds its own vertices' rows of each evaluation
        stage's structure and its share of the edge split (:class:`~.link.LinkPart`)."""
        graph, parts = self.graph, prepared.parts
        own = (parts == rank).nonzero().flatten()
        own_topology, link = None, None
        structure = (graph.indptr, graph.indices)
        task, targets = self.task, self.targets

        def typed(edge_type: torch.Tensor | None) -> dict:
            """A typed graph's rows carry their relations, of the task's message relations
            (link prediction's stage structures: inverses too)."""
            if not graph.is_typed:
                return {}
            return {"edge_type": edge_type, "num_relations": self.num_relations}

        sampled = typed(graph.edge_type)
        if self.is_link:
            structure = task.training_structure(graph, targets)
            sampled = typed(task.training_edge_type(graph, targets))
        if self.config.topology == "partitioned":
            topology = CSCRows.owned(*structure, own, **sampled)
            own_topology = CSCRows.owned(graph.indptr, graph.indices, own, **typed(graph.edge_type))
        else:
            topology = CSCRows.whole(*structure, **sampled)
        if self.is_link:
            split = targets.split
            stages = {
                s: CSCRows.owned(*split.structure(s), own, **typed(split.structure_edge_type(s)))
                for s in STAGES
            }
            arrays = split_arrays(split, parts == rank)
            relations = (tuple(graph.relations), split.relations) if split.is_typed else None
            link = link_part(
                arrays, graph.num_nodes, self.out_dim, targets.seed, stages, None, relations
            )
        return GSplitPart(
            owner=parts,
            topology=topology,
            own_topology=own_topology,
            node_keys=None,
            orig_ids=None,
            own_ids=own,
            own_orig_ids=own,
            x=graph.x,
            targets=self.targets,
            input_frequency=prepared.input_frequency,
            first_id=0,
            own_rows=own,
            train_ids=self.train_ids,
            num_nodes=graph.num_nodes,
            report=prepared.report,
            link=link,
        )

    @override
    def load_part(self, opened: PartitionDir, rank: int) -> GSplitPart:
        """Rank ``rank``'s part and the shared group, memory-mapped, in relabelled ids: with
        ``replicated`` the whole topology (no ``[N]`` array but its ``indptr`` and the
        probe's ``orig_ids``), with ``partitioned`` the part's own rows and the in-degrees
        ``[N]``. Link prediction: the training structure is the one sampled, each stage's
        own rows are evaluated over, and the part's share of the edge split."""
        book = RangeBook(opened.node_offsets)
        arrays = opened.load_part(rank)
        own = book.part_nodes(rank)
        first, stop = int(book.node_offsets[rank]), int(book.node_offsets[rank + 1])
        orig_ids, link = None, None
        relations = opened.meta.get("relations") or ()
        if self.config.topology == "partitioned":
            shared = opened.load_shared("vertices", rank)

            def typed(p: str) -> dict:
                ip, folder = arrays[f"{p}indptr"], part_folder(rank)
                return typed_rows(opened, arrays, ip, relations, folder, f"{p}edge_type")

            def rows(p: str) -> CSCRows:
                degree = shared[f"{p}degree"]
                return CSCRows(
                    arrays[f"{p}indptr"],
                    arrays[f"{p}indices"],
                    lambda ids: degree.index_select(0, ids),
                    own,
                    **typed(p),
                )

        else:
            shared = opened.load_shared("topology", rank)
            orig_ids = shared["orig_ids"]

            def typed(p: str) -> dict:
                ip, folder = shared[f"{p}indptr"], shared_folder("topology")
                return typed_rows(opened, shared, ip, relations, folder, f"{p}edge_type")

            def rows(p: str) -> CSCRows:
                whole = CSCRows.whole(shared[f"{p}indptr"], shared[f"{p}indices"])
                return CSCRows(
                    whole.indptr[first : stop + 1],
                    whole.indices,
                    whole.degree,
                    own,
                    **typed(p),
                )

        own_topology = rows("")
        if self.config.topology == "partitioned":
            topology = rows("train_") if self.is_link else own_topology
        else:
            p = "train_" if self.is_link else ""
            topology = CSCRows.whole(shared[f"{p}indptr"], shared[f"{p}indices"], **typed(p))
        check_node_types(opened, arrays, part_folder(rank))
        if shared["train_ids"].numel() == 0:  # as the base's train_ids
            raise ValueError(f"partition directory {opened.path}: no training nodes")
        own_orig_ids = arrays["orig_ids"]
        x = arrays["x"] if arrays["x"].dtype == self.dtype else arrays["x"].to(self.dtype)
        targets = None
        if self.is_link:
            new_ids = shared["new_ids"]
            stages = {s: rows(f"{s}_") for s in STAGES}
            num_nodes = int(opened.meta["num_nodes"])
            typed_pairs = self.know_pair_relations()
            try:
                link = link_part(
                    arrays,
                    num_nodes,
                    self.task.out_dim_of(opened.meta),
                    self.seed,
                    stages,
                    lambda ids: new_ids.index_select(0, ids),
                    typed_pairs,
                )
            except ValueError as err:
                raise PartitionDirError(
                    f"{opened.path / part_folder(rank)}: {err}; partition again"
                ) from None
        else:
            targets = NodeTargets.from_arrays(arrays, self.task.out_dim_of(opened.meta))
        return GSplitPart(
            owner=book,
            topology=topology,
            own_topology=own_topology,
            node_keys=lambda ids: own_orig_ids.index_select(0, ids - first),
            orig_ids=orig_ids,
            own_ids=own,
            own_orig_ids=own_orig_ids,
            x=x,
            targets=targets,
            input_frequency=arrays["input_frequency"],
            first_id=first,
            own_rows=None,
            train_ids=shared["train_ids"],
            num_nodes=int(opened.meta["num_nodes"]),
            report=opened.meta["report"],
            link=link,
        )

    # ------------------------------------------------------------------------ rank set-up
    @override
    def setup_rank(self, context: RankContext, part: GSplitPart) -> None:
        self.rank, self.world_size = context.rank, context.world_size
        # the agreement collective first: a rank that raised before it would leave the rest waiting
        assert_same_on_all_ranks(context.comm, part.split_table, "the GSplit split function")
        if part.num_parts > context.world_size:
            raise ValueError(f"split function has parts >= world size {context.world_size}")
        self.held, self.parts, self.report = part, part.owner, part.report
        self.train_ids = part.train_ids
        self.sampler = SplitSampler(
            context.comm,
            part.owner,
            part.topology,
            list(self.data.fanouts),
            self.seed,
            node_keys=part.node_keys,
            relation_fanouts=None if part.topology.edge_type is None else self.relation_fanouts,
        )
        cache = self.config.cache
        self.cache = PartitionedFeatureCache(
            part.x,
            part.own_ids,
            part.input_frequency,
            cache.fraction,
            cache.policy,
            first_id=part.first_id,
        )

    # --------------------------------------------------------------------------- training
    def step_seeds(self, epoch: int, step: int) -> torch.Tensor:
        """The global mini-batch of a step: exactly ``single``'s."""
        return self.order.step(epoch, step, self.batch_size)

    def whole_batch_sampler(self) -> NeighborSampler:
        """The sampler ``single`` draws whole mini-batches with (same keys as the split one;
        from a partition directory keyed on the original ids, so it draws the same samples,
        in relabelled ids)."""
        topology, fanouts = self.sampler.topology, list(self.data.fanouts)
        if topology.ids is not None:
            raise RuntimeError("whole mini-batches need the whole topology (topology: replicated)")
        indptr, indices = topology.indptr, topology.indices
        return OrigKeyedSampler(
            indptr,
            indices,
            fanouts,
            self.seed,
            self.held.orig_ids,
            topology.edge_type,
            self.sampler.relation_fanouts,
            topology.num_relations,
        )

    @override
    def make_batch(self, epoch: int, step: int) -> SplitBatch:
        """This rank's share of step ``step``. Outside a trainer (no rank set up) the
        DataModule first sets itself up as the one rank of a world of 1 (``single``'s
        batches), as ``single``'s makes a batch without one."""
        if self.held is None:
            if self.context is not None:
                raise RuntimeError("the GSplit DataModule's rank is not set up")
            local = RankContext(Comm.local(), torch.device("cpu"))
            self.setup_rank(local, self.part_of(self.prepare(1), 0))
        seeds = self.step_seeds(epoch, step)
        owner = self.sampler.owner
        start = time.perf_counter()
        if self.is_link:
            blocks, plans, inputs, y = self.link_step(seeds, epoch, step)
            global_count = self.task.loss_terms(seeds.numel())
        else:
            targets = seeds[owner(seeds) == self.rank]
            blocks, plans, inputs = self.sampler.sample(targets, epoch, step)
            first = self.cache.first_id
            y = self.held.targets.target.index_select(0, blocks[-1].dst_ids - first)
            global_count = seeds.numel()
        sampled = time.perf_counter()
        hits, misses = self.cache.hits, self.cache.misses
        x = self.cache.load(inputs)
        stats = {
            "sample_s": sampled - start,
            "load_s": time.perf_counter() - sampled,
            "input_nodes": inputs.numel(),
            "cache_hits": self.cache.hits - hits,
            "cache_misses": self.cache.misses - misses,
            "edges": [b.num_edges for b in blocks],
            "cross_edges": [
                int((owner(b.src_ids[b.edge_index[0]]) != self.rank).sum()) for b in blocks
            ],
        }
        return SplitBatch(
            blocks,
            x,
            y,
            global_count,
            epoch,
            step,
            stats,
            plans=plans,
            traffic=LayerTraffic(len(plans)),
        )

    def link_step(
        self, seeds: torch.Tensor, epoch: int, step: int
    ) -> tuple[list, list[LayerPlan], torch.Tensor, torch.Tensor]:
        """``(blocks, plans, inputs, y)`` of this rank's share of link-prediction step
        ``seeds`` (training-pair positions): its pairs (those whose source it owns) and their
        negatives (``task.step_rows``, keyed by position in the step: ``single``'s); their
        endpoints go to their owners (one id all-to-all, ``structure``), whose received ids
        are the local frontier ``D^L`` sampled split-parallel; ``plans[-1]`` brings the
        endpoints' output rows back (``y`` indexes them). Collective."""
        link = self.held.link
        local, positions = link.step_pairs(seeds)
        nodes, y = self.task.step_rows(link.targets, local, positions, epoch=epoch, step=step)
        frontier, endpoints = self.sampler.split(link.ids(nodes))
        blocks, plans, inputs = self.sampler.sample(frontier, epoch, step)
        return blocks, [*plans, endpoints], inputs, y

    @override
    def build_model(self, model) -> torch.nn.Module:
        """The base's net; a :class:`BlockGNN` becomes an :class:`EndpointShuffleGNN` (the same
        parameters), which link prediction's endpoint exchange needs."""
        net = super().build_model(model)  # the task learns a typed head's relations there
        if type(net) is BlockGNN:
            net.__class__ = EndpointShuffleGNN  # adds no state: the same module, one more hook call
        return net

    def know_pair_relations(self) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """The link-prediction partition directory's ``(pair relations, message relations)``
        (:func:`pair_relations`), which the task then knows (``task.relations``: a DistMult
        head's relations, the range each scored pair's relation is checked in); ``None``:
        homogeneous."""
        typed = pair_relations(self.partition_meta(), self.partition_dir)
        self.task.relations = () if typed is None else typed[0]
        return typed

    @override
    def callbacks(self) -> list[L.Callback]:
        """:class:`GSplitStats`, and the :class:`RedundancyProbe` when
        ``redundancy_probe_steps > 0``."""
        stats = GSplitStats(partition_report=lambda: self.report)
        steps = self.config.redundancy_probe_steps
        if not steps:
            return [stats]
        return [stats, RedundancyProbe(steps, self.step_seeds, self.whole_batch_sampler)]

    # ------------------------------------------------------------------------ evaluation
    @override
    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """With the whole graph held (``replicated`` in memory): layer-wise inference over it.
        Otherwise (a partition directory, or ``topology: partitioned``): this rank's own rows
        (:meth:`own_rows`), scored on its own vertices."""
        held = self.held
        if held.link is not None:
            return self.link_statistics(net, splits)
        if held.own_topology is None:
            return super().eval_statistics(net, splits)
        out = self.own_rows(net, net.num_layers)
        return split_statistics(self.task, out, held.own_targets(), splits)

    @override
    def predict_rows(
        self, net: torch.nn.Module, node_ids: torch.Tensor | None, output: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The requested (original) ids this rank owns, and their rows (:meth:`own_rows`);
        with the whole graph held, the base's node-range split."""
        held = self.held
        if held.own_topology is None:
            return super().predict_rows(net, node_ids, output)
        rows = self.own_rows(net, net.num_layers - (output == "embeddings"))
        return own_predictions(held.own_orig_ids.clone(), rows, node_ids, held.num_nodes)

    def link_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """Link prediction's statistics, partition-local: each stage embeds this rank's own
        vertices over the stage's structure (:func:`~...models.inference.owned_rows`, the
        in-neighbours' rows from their owners), then it scores the evaluation edges whose
        source it owns, the far rows pulled from their owners per round
        (:func:`~...kit.link_partitioned.owned_link_statistics`): no rank holds every node's
        embedding."""
        held, link, comm = self.held, self.held.link, self.context.comm
        x = held.own(held.x)

        def embed(stage: str) -> torch.Tensor:
            topology = link.stages[stage]
            chunk = self.data.eval_chunk_size
            return owned_rows(net, comm, self.sampler.owner, topology, x, net.num_layers, chunk)

        return owned_link_statistics(
            self.task,
            embed,
            held.own_orig_ids,
            lambda ids: self.sampler.owner(link.ids(ids)),
            link.eval_pairs,
            held.num_nodes,
            link.targets.seed,
            splits,
            comm,
            relations=link.eval_relations,
        )

    def own_rows(self, net: torch.nn.Module, layers: int) -> torch.Tensor:
        """The first ``layers`` layers' full-neighbourhood rows ``[n_own, d]`` of this rank's
        own vertices, from their CSC rows (:func:`~...models.inference.owned_rows`: the in-neighbours'
        rows come from their owners)."""
        return owned_rows(
            net,
            self.context.comm,
            self.sampler.owner,
            self.held.own_topology,
            self.held.own(self.held.x),
            layers,
            self.data.eval_chunk_size,
        )
