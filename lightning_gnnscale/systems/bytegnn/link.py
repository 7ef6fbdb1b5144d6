"""ByteGNN's link prediction: its partition carries each rank's part of the edge split, and
its sampling DAG seeds positive training pairs (docs/systems/bytegnn.md, "Link prediction").

- **The partition.** The whole graph is partitioned and relabelled as for the node tasks (the
  partitioner balances the task's node rows, ``LinkTargets.node_rows``); every local edge carries its split (``edge_split``, int8: 0 train, 1 validation,
  2 test), so a rank cuts its training structure (train edges), its test-stage structure
  (train + validation edges) and its predict structure (all) from its own partition, with the
  in-degrees of its core and halo in the first two (``stage_degree``).
- **The id map.** Pairs and negatives are in original ids (the task's keys), the store in
  gids: original id ``v`` is mapped by rank ``v``'s shard of the map (``even_offsets(N, P)``
  ranges), which holds each id's gid and training in-degree (``id_gid``, ``id_degree``).
- **Training pairs.** Sorted by their source's gid and cut into the even chunks node seeds
  use (:class:`~...graph.seed_split.SeedSplit`): a pair goes to the rank owning its source
  but for the chunk boundaries, and a step's global batch is ``data.batch_size`` pairs, as
  ``single``'s. A rank holds its chunk's pairs (original ids) and their indices in the split's
  training pairs.
- **Evaluation pairs.** Each validation and test pair goes to the owner of its source, with its
  index in the split (which keys its fixed negatives).
- **A typed graph** (docs/systems/bytegnn.md, "Typed graphs"): the partitioned graph is the
  *message graph* (:func:`~...tasks.link.split.message_graph`: every triple, and, for a directed split, its
  inverse ``(t, r + R, h)``), each edge with its split, so a stage's structure is the split's
  typed one; every pair keeps its relation (``train_rel``, ``eval_rel``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ...graph.book import LocalPartition, PartitionedGraph, partition_and_relabel
from ...graph.halo_part import write_halo_parts
from ...graph.order import epoch_permutation
from ...graph.partition_dir import part_folder
from ...graph.seed_split import SeedSplit, even_offsets
from ...tasks.link.split import EdgeLookup, LinkSplit, message_graph
from ...tasks.link_prediction import LinkTargets
from .typed import TypedHaloPart, check_typed_files, check_values

EVAL_SPLITS = ("val", "test")
STAGE_EDGES = {"train": 0, "test": 1}  # the largest edge split a stage passes messages over
PAIR_SPLITS = ("train", *EVAL_SPLITS)


@dataclass(frozen=True)
class LinkPrepared:
    """The in-memory partition of a link-prediction run (what every rank's part is cut from).

    Attributes:
        partitioned: the whole graph relabelled (a typed graph's :func:`message_graph`), with
            the task's node rows (``LinkTargets.node_rows``).
        link: the task's targets (the whole split, original ids).
        edge_split: int8 ``[E]``: the split of every edge of the relabelled graph.
        stage_degree: int64 ``[2, N]``: in-degrees by gid over the training edges and over
            the training and validation edges.
        pair_order: int64 ``[n_train]``: the training pairs' indices sorted by source gid.
    """

    partitioned: PartitionedGraph
    link: LinkTargets
    edge_split: Tensor
    stage_degree: Tensor
    pair_order: Tensor

    @property
    def book(self):
        return self.partitioned.book

    @property
    def graph(self):
        """The relabelled graph (a typed graph's message graph)."""
        return self.partitioned.graph

    @property
    def report(self) -> dict:
        return self.partitioned.report


def prepare_link(
    graph, link: LinkTargets, method: str, world_size: int, seed: int, cache_dir, **options
) -> LinkPrepared:
    """Partition and relabel ``graph`` (a typed graph's :func:`message_graph`; cached), and
    mark every relabelled edge's split (an inverse edge's is its triple's)."""
    partitioned = partition_and_relabel(
        message_graph(graph, link.split)[0],
        link.node_rows(),
        method,
        world_size,
        seed,
        cache_dir,
        system="bytegnn",
        **options,
    )
    book, relabelled = partitioned.book, partitioned.graph
    src, dst = book.new2old[relabelled.edge_index()]
    if graph.is_typed:  # by (src, dst, relation); an inverse edge (t, r + R, h) is (h, r, t)'s
        r = link.split.num_relations
        rel = relabelled.edge_type
        inverse = rel >= r
        lookup = EdgeLookup(graph.indptr, graph.indices, graph.edge_type, r)
        edge = lookup.find(torch.where(inverse, dst, src), torch.where(inverse, src, dst), rel % r)
    else:
        edge = EdgeLookup(graph.indptr, graph.indices).find(src, dst)
    edge_split = link.split.edge_split[edge]
    dst = relabelled.dst_of_edges()
    n = graph.num_nodes
    stage_degree = torch.stack(
        [torch.bincount(dst[edge_split <= s], minlength=n) for s in STAGE_EDGES.values()]
    )
    pair_src = book.old2new[link.split.train_pos[0]]
    pair_order = torch.argsort(pair_src, stable=True)
    return LinkPrepared(partitioned, link, edge_split, stage_degree, pair_order)


@dataclass(frozen=True)
class LinkPart:
    """Rank ``halo.local.part_id``'s part of a link-prediction partition (see the module
    docstring); the same object in memory (:meth:`of`) and from a directory (:meth:`load`).

    Attributes:
        halo: the node part (core, halo, every in-edge of the core whatever its split; a
            typed graph's with each in-edge's relation, inverses ``r + R`` included).
        edge_split: int8 ``[E_k]``: each local edge's split.
        stage_degree: int64 ``[2, n_local]``: in-degrees of the core and halo over the
            training edges and over the training and validation edges.
        pair_ids: int64 ``[m]``: this rank's training pairs (indices in the split's).
        train_pos: int64 ``[2, m]``: those pairs in original ids.
        eval_pos, eval_index: per evaluation split, the pairs whose source this rank owns
            ``[2, m_s]`` and their indices in the split ``[m_s]``.
        id_gid, id_degree: this rank's shard of the id map (original ids
            ``[id_lo, id_lo + len)``): each id's gid and training in-degree.
        pair_sizes: int64 ``[P]``: every rank's training pair count (the directory's
            ``pair_sizes``; its ``trainer_sizes`` are the node part's, none).
        pair_rel: a typed graph's ``{split: int64 [m_s]}``, the relation of each of this
            rank's pairs of ``train`` (``train_pos``), ``val`` and ``test`` (``eval_pos``);
            ``None`` when homogeneous.
    """

    halo: TypedHaloPart
    edge_split: Tensor
    stage_degree: Tensor
    pair_ids: Tensor
    train_pos: Tensor
    eval_pos: dict[str, Tensor]
    eval_index: dict[str, Tensor]
    id_gid: Tensor
    id_degree: Tensor
    pair_sizes: Tensor
    pair_rel: dict[str, Tensor] | None = None

    # the node part's fields, as a HaloPart's
    local = property(lambda self: self.halo.local)
    book = property(lambda self: self.halo.book)
    degree = property(lambda self: self.halo.degree)
    local_degree = property(lambda self: self.halo.local_degree)
    orig_ids = property(lambda self: self.halo.orig_ids)
    agreed = property(lambda self: self.halo.agreed)
    trainer_sizes = property(lambda self: self.halo.trainer_sizes)  # no node seeds
    edge_type = property(lambda self: self.halo.edge_type)  # a typed graph's, local CSC order

    @property
    def num_nodes(self) -> int:
        return self.halo.book.num_nodes

    @property
    def id_offsets(self) -> Tensor:
        """``[P + 1]``: the original-id ranges of the id map's shards."""
        return even_offsets(self.num_nodes, self.halo.book.num_parts)

    @classmethod
    def of(cls, prepared: LinkPrepared, k: int) -> LinkPart:
        """Part ``k`` of the in-memory partition (pure)."""
        book, split = prepared.book, prepared.link.split
        halo = TypedHaloPart.of(prepared.partitioned, k, torch.zeros(0, dtype=torch.int64))
        local = halo.local
        chunks = SeedSplit.chunks(prepared.pair_order, book.num_parts)
        eval_pos, eval_index = {}, {}
        for name in EVAL_SPLITS:
            pos = split.positives(name)
            index = (book.nid2part(book.old2new[pos[0]]) == k).nonzero().flatten()
            eval_pos[name], eval_index[name] = pos[:, index].clone(), index
        lo, hi = (int(v) for v in even_offsets(book.num_nodes, book.num_parts)[k : k + 2])
        id_gid = book.old2new[lo:hi].clone()
        pair_rel = None
        if split.is_typed:
            rows = {"train": chunks[k], **eval_index}
            pair_rel = {s: split.positive_relations(s)[rows[s]].clone() for s in PAIR_SPLITS}
        return cls(
            halo=halo,
            edge_split=prepared.edge_split[local.edge_ids],
            stage_degree=prepared.stage_degree[:, local.local2global].clone(),
            pair_ids=chunks[k].clone(),
            train_pos=split.train_pos[:, chunks[k]].clone(),
            eval_pos=eval_pos,
            eval_index=eval_index,
            id_gid=id_gid,
            id_degree=prepared.stage_degree[0, id_gid].clone(),
            pair_sizes=torch.tensor([c.numel() for c in chunks], dtype=torch.int64),
            pair_rel=pair_rel,
        )

    @classmethod
    def load(cls, opened, k: int, out_dim: int, dtype: torch.dtype) -> LinkPart:
        """Part ``k`` from its files (memory-mapped), as :meth:`arrays` wrote them; a typed
        part's relations (its edges' and its pairs') checked in range (outside input)."""
        halo = TypedHaloPart.load(opened, k, out_dim, dtype)
        arrays = opened.load_part(k)
        pair_rel = None
        if opened.meta.get("pair_relations"):
            count, where = len(opened.meta["pair_relations"]), opened.path / part_folder(k)
            pair_rel = {s: arrays[f"link_{s}_rel"] for s in PAIR_SPLITS}
            for s, rel in pair_rel.items():
                check_values(rel, count, where / f"link_{s}_rel.npy")
        return cls(
            halo=halo,
            edge_split=arrays["edge_split"],
            stage_degree=arrays["stage_degree"],
            pair_ids=arrays["link_pair_ids"],
            train_pos=arrays["link_train_pos"],
            eval_pos={s: arrays[f"link_{s}_pos"] for s in EVAL_SPLITS},
            eval_index={s: arrays[f"link_{s}_index"] for s in EVAL_SPLITS},
            id_gid=arrays["id_gid"],
            id_degree=arrays["id_degree"],
            pair_sizes=torch.tensor(opened.meta["pair_sizes"], dtype=torch.int64),
            pair_rel=pair_rel,
        )

    def arrays(self) -> dict[str, Tensor]:
        """The part's files (what :meth:`load` reads)."""
        arrays = {
            **self.halo.arrays(),
            "link_pair_ids": self.pair_ids,
            "edge_split": self.edge_split,
            "stage_degree": self.stage_degree,
            "link_train_pos": self.train_pos,
            "id_gid": self.id_gid,
            "id_degree": self.id_degree,
        }
        for s in EVAL_SPLITS:
            arrays[f"link_{s}_pos"] = self.eval_pos[s]
            arrays[f"link_{s}_index"] = self.eval_index[s]
        for s, rel in (self.pair_rel or {}).items():
            arrays[f"link_{s}_rel"] = rel
        return arrays

    def sizes(self) -> dict[str, int]:
        """The part's record in the directory's metadata (``pairs``: its training pairs)."""
        return {**self.halo.sizes(), "pairs": self.pair_ids.numel()}

    def stage_partition(self, stage: str) -> LocalPartition:
        """The local partition over ``stage``'s edges (``train``: training edges; ``test``:
        training and validation edges); its in-degrees are :meth:`stage_local_degree`."""
        return keep_edges(self.local, self.edge_split <= STAGE_EDGES[stage])

    def stage_edge_type(self, stage: str) -> Tensor | None:
        """The relation of each edge of :meth:`stage_partition` (``None``: homogeneous)."""
        if self.edge_type is None:
            return None
        return self.edge_type[self.edge_split <= STAGE_EDGES[stage]]

    def stage_local_degree(self, stage: str) -> Tensor:
        return self.stage_degree[STAGE_EDGES[stage]]

    def local_targets(self, seed: int, out_dim: int, num_relations: int = 1) -> LinkTargets:
        """The task's targets as this rank holds them: its training pairs (indexed by local
        pair ids, what its sampling DAG seeds) and its evaluation pairs, a typed graph's with
        their relations (of ``num_relations``, the graph's ``R``)."""
        ids = torch.zeros(0, dtype=torch.int64)
        rel = self.pair_rel or {}
        split = LinkSplit(
            train_pos=self.train_pos,
            val_pos=self.eval_pos["val"],
            test_pos=self.eval_pos["test"],
            edge_split=torch.zeros(0, dtype=torch.int8),
            train_indptr=ids,
            train_indices=ids,
            test_indptr=ids,
            test_indices=ids,
            undirected=False,
            train_rel=rel.get("train"),
            val_rel=rel.get("val"),
            test_rel=rel.get("test"),
            num_relations=num_relations if self.pair_rel is not None else 1,
        )
        return LinkTargets(split, self.num_nodes, out_dim, seed)


def write_link_parts(prepared: LinkPrepared, part_of, writer, log) -> dict:
    """:func:`~...graph.halo_part.write_halo_parts` of every :class:`LinkPart`, plus the
    metadata's ``pair_sizes`` (every rank's training pair count)."""
    meta = write_halo_parts(prepared, part_of, writer, log)
    chunks = SeedSplit.chunks(prepared.pair_order, prepared.book.num_parts)
    meta = {**meta, "pair_sizes": [c.numel() for c in chunks]}
    split = prepared.link.split
    if split.is_typed:  # the pairs' relations (the graph's R; the edges' are ``relations``)
        meta["pair_relations"] = list(split.relations[: split.num_relations])
    return meta


def check_link_part(opened, k: int) -> None:
    """Part ``k``'s link-prediction files against the metadata: ``pair_sizes`` has one count
    per part, part ``k``'s is its ``pairs``, and its pair, edge and id-map files have the
    shapes its counts give; a typed directory (``pair_relations``) holds each pair's relation
    (int64, one per pair of each split), and its edges' relations (``check_typed_files``)."""
    from ...graph.partition_dir import PartitionDirError, is_count, part_folder

    meta, record = opened.meta, opened.meta["parts"][k]
    sizes = meta.get("pair_sizes")
    if (
        not isinstance(sizes, list)
        or len(sizes) != opened.num_parts
        or not all(is_count(size) for size in sizes)
        or sizes[k] != record.get("pairs")
    ):
        raise PartitionDirError(
            f"{opened.path}: 'pair_sizes' {sizes!r} is not one training pair count per part "
            f"(part {k}'s 'pairs' is {record.get('pairs')!r}); partition again"
        )
    folder, pairs = part_folder(k), record["pairs"]
    local = record["nodes"] + record["halo"]
    lo, hi = (int(v) for v in even_offsets(meta["num_nodes"], opened.num_parts)[k : k + 2])
    for name, shape, key in (
        ("link_pair_ids", (pairs,), "'pairs'"),
        ("link_train_pos", (2, pairs), "'pairs'"),
        ("edge_split", (record["edges"],), "'edges'"),
        ("stage_degree", (2, local), "'nodes' + 'halo'"),
        ("id_gid", (hi - lo,), "'num_nodes'"),
        ("id_degree", (hi - lo,), "'num_nodes'"),
    ):
        opened.expect_shape(folder, name, shape, f"part {k}'s {key}")
    check_typed_files(opened, k)
    names = meta.get("pair_relations")
    if names is not None and not (
        isinstance(names, list) and names and all(isinstance(n, str) for n in names)
    ):
        raise PartitionDirError(
            f"{opened.path}: the metadata's 'pair_relations' {names!r} is not a list of names"
        )
    if bool(names) != bool(meta.get("relations")):
        raise PartitionDirError(
            f"{opened.path}: the metadata lists {'pair_relations' if names else 'relations'} "
            f"without {'relations' if names else 'pair_relations'} (a typed link-prediction "
            "directory lists both); partition again"
        )
    files = opened.verified_files.get(folder)
    for s in PAIR_SPLITS if names and files is not None else ():
        name = f"link_{s}_rel"
        found = files.get(name)
        if found is None or str(found.dtype) != "int64":
            held = f"no {name}.npy" if found is None else f"{name}.npy of {found.dtype}"
            raise PartitionDirError(
                f"{opened.path / folder} holds {held}, but the metadata lists "
                "'pair_relations' (int64, one relation per pair); partition again"
            )
        shape = (pairs,) if s == "train" else opened.shape(folder, f"link_{s}_index")
        opened.expect_shape(folder, name, shape, f"part {k}'s {s} pairs")


def keep_edges(local: LocalPartition, keep: Tensor) -> LocalPartition:
    """``local`` with only the edges ``keep`` selects (bool ``[E_k]``; CSC order kept, and a
    typed partition's relations with them)."""
    dst = torch.repeat_interleave(torch.arange(local.num_core), local.indptr.diff())
    indptr = torch.zeros(local.num_core + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst[keep], minlength=local.num_core), 0, out=indptr[1:])
    edge_ids = None if local.edge_ids is None else local.edge_ids[keep]
    edge_type = None if local.edge_type is None else local.edge_type[keep]
    return replace(
        local, indptr=indptr, indices=local.indices[keep], edge_ids=edge_ids, edge_type=edge_type
    )


class LinkSteps:
    """The positions of a rank's training pairs in each step's global batch (the keys of
    their negatives, :meth:`~...tasks.link_prediction.LinkPrediction.step_rows`).

    In a one-step epoch (``data.batch_size=-1``, or larger than the pairs) the step is
    ``single``'s, and so are the positions: the pairs' places in ``single``'s epoch
    permutation of every training pair (``[n_train]`` int64 computed once per epoch). Else a
    step's global batch is the ranks' shares in rank order, and a pair's position is its
    rank's offset plus its place in the share.

    Args:
        split: the rank's seed split over its local pair ids ``0..m-1``.
        pair_ids: int64 ``[m]``: the split's index of each local pair.
        num_pairs: the training pairs of the whole split.
        seed: the run's seed (``single``'s permutation).
    """

    def __init__(self, split: SeedSplit, pair_ids: Tensor, num_pairs: int, seed: int):
        self.split, self.num_pairs, self.seed = split, num_pairs, seed
        self.sorted_ids, self.order = torch.sort(pair_ids)
        self._lock = threading.Lock()
        self._epoch: int | None = None
        self._positions: Tensor | None = None

    def _single_positions(self, epoch: int) -> Tensor:
        """``[m]``: each local pair's position in ``single``'s epoch permutation."""
        with self._lock:
            if self._epoch != epoch:
                ids = self.sorted_ids
                perm = epoch_permutation(torch.arange(self.num_pairs), self.seed, epoch)
                at = torch.searchsorted(ids, perm).clamp_(max=max(ids.numel() - 1, 0))
                hit = (ids[at] == perm) if ids.numel() else torch.zeros_like(perm, dtype=bool)
                where = hit.nonzero().flatten()
                positions = torch.empty(ids.numel(), dtype=torch.int64)
                positions[self.order[at[where]]] = where
                self._epoch, self._positions = epoch, positions
            return self._positions

    def positions(self, epoch: int, step: int, seeds: Tensor) -> Tensor:
        """int64 positions of the local pairs ``seeds`` (this rank's share of ``step``)."""
        split = self.split
        if split.steps == 1:
            return self._single_positions(epoch)[seeds]
        sizes = split.sizes
        shares = sizes // split.steps + (step < sizes % split.steps).long()
        offset = int(shares[: split.rank].sum())
        return offset + torch.arange(seeds.numel())


@dataclass
class LinkSeeds:
    """A link-prediction DAG's seed nodes: gids ``ids`` of the step's endpoint nodes (the
    task's order), their training in-degrees ``deg`` and the step's ``y``."""

    ids: Tensor
    deg: Tensor
    y: Tensor


@dataclass(frozen=True)
class LinkDag:
    """What an S-Worker needs to build link prediction's DAG: the task, this rank's
    targets (:meth:`LinkPart.local_targets`) and the pairs' positions."""

    task: object
    targets: LinkTargets
    steps: LinkSteps

    @property
    def nodes_per_pair(self) -> int:
        """The most seed nodes one positive brings (its two ends and its negatives)."""
        return 2 + self.task.config.num_negatives
