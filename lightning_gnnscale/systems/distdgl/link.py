"""DistDGL's link prediction (docs/systems/distdgl.md, "Link prediction").

The graph is partitioned and relabelled as for node tasks (the whole graph, METIS on the edge
split's node rows, ``LinkTargets.node_rows``); on top of its :class:`~...graph.halo_part.HaloPart` a rank holds its
part of the edge split (:class:`LinkPart`): the training pairs whose source it owns (the ones
it seeds, DistDGL's "edges of its own partition"), the validation and test pairs whose source
it owns (the ones it scores), the stage of each of its local edges (train, val or test: the
training CSC is the train edges, the test stage's the train and validation edges) and the
in-degrees of its core and halo over those two structures. Nothing of it is an ``[N]`` or
``[E]`` array: the original-id -> gid map is spread over the ranks too (:class:`IdDirectory`).

On a typed graph the partitioned graph is the split's message graph (:func:`~...tasks.link.split.message_graph`):
every edge under its relation plus, for a directed split, its inverse under ``r + R``, each
with its edge's stage, so a stage's local CSC is that stage's typed structure; the pairs keep
their relations (docs/systems/distdgl.md, "Typed graphs").

A step is ``single``'s step (:class:`PairOrder`): every rank draws the same epoch order of the
training pair ids and seeds the pairs of the step it owns, at their positions in the step, so
the positives and their negatives (keyed by position) are ``single``'s, split by owner.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ...comm import Comm, OwnerRoute
from ...graph.book import LocalPartition, PartitionedGraph, RangeBook
from ...graph.halo_part import HaloPart
from ...graph.order import epoch_permutation
from ...graph.seed_split import even_offsets
from ...tasks.link.split import STAGES, EdgeLookup, LinkSplit
from ...tasks.link_prediction import LinkTargets

TRAIN, VAL, TEST = range(3)  # LinkSplit.edge_split's stage codes
EVAL_SPLITS = ("val", "test")
PREFIX = "link_"  # the partition directory's names of a LinkPart's arrays


@dataclass(frozen=True)
class LinkPartitioned(PartitionedGraph):
    """A :class:`PartitionedGraph` of the whole graph (targets: ``LinkTargets.node_rows``)
    with the edge split in original ids and every relabelled edge's stage.

    Attributes:
        link: the task's targets (original ids).
        edge_stage: int8 ``[E]``: the stage (0 train, 1 val, 2 test) of each edge of ``graph``.
    """

    link: LinkTargets
    edge_stage: Tensor


def link_partitioned(
    prepared: PartitionedGraph, original, link: LinkTargets, stage: Tensor | None = None
) -> LinkPartitioned:
    """``prepared`` (the relabelled ``original`` graph) with the stage of each relabelled edge
    (looked up in ``original``'s CSC, by relation when typed; ``stage``: the stage of each of
    ``original``'s edges, default ``link.split.edge_split``, which indexes its edge ids)."""
    relabelled, new2old = prepared.graph, prepared.book.new2old
    dst = relabelled.dst_of_edges()
    if original.is_typed:
        lookup = EdgeLookup(
            original.indptr, original.indices, original.edge_type, original.num_relations
        )
        eid = lookup.find(new2old[relabelled.indices], new2old[dst], relabelled.edge_type)
    else:
        eid = EdgeLookup(original.indptr, original.indices).find(
            new2old[relabelled.indices], new2old[dst]
        )
    if bool((eid < 0).any()):
        raise RuntimeError("a relabelled edge is not an edge of the original graph")
    stage = (link.split.edge_split if stage is None else stage)[eid]
    return LinkPartitioned(
        prepared.graph, prepared.targets, prepared.book, prepared.report, link, stage
    )


def _pairs_of(pos: Tensor, owner_of_src: Tensor, k: int) -> tuple[Tensor, Tensor]:
    index = (owner_of_src == k).nonzero().flatten()
    return pos[:, index], index


@dataclass(frozen=True)
class LinkPart:
    """Rank ``k``'s part of the edge split.

    Attributes:
        train_pairs: int64 ``[n_t]`` sorted ids (positions in the split's training pairs) of
            the training pairs whose source this rank owns: the ones it seeds.
        train_pos: int64 ``[2, n_t]`` those pairs (original ids).
        val_pos, test_pos: int64 ``[2, m]`` the evaluation pairs whose source it owns (the
            ones it scores), original ids; ``val_index``, ``test_index``: int64 ``[m]`` their
            positions in the split's positives (which key their fixed negatives).
        edge_stage: int8 ``[E_k]`` the stage of each local edge (0 train, 1 val, 2 test).
        stage_degree: int64 ``[2, n_local]`` in-degrees of the core and halo over the training
            edges (row 0) and over the training and validation edges (row 1).
        train_degree: int64 ``[N]`` in-degrees over the training edges, in memory only
            (``None`` from a directory: the owners serve their core's).
        ids: int64 ``[hi - lo]`` gids of the original ids ``[lo, hi)`` of this rank's even
            range (:class:`IdDirectory`).
        num_train: training pairs of the whole split.
        undirected: the split's pairs are both directions of an edge.
        train_rel, val_rel, test_rel: a typed graph's: int64 relation of each of
            ``train_pos``, ``val_pos``, ``test_pos`` (``None``: homogeneous).
        num_relations: a typed graph's ``R``, the relations of the positives (0: homogeneous).
    """

    train_pairs: Tensor
    train_pos: Tensor
    val_pos: Tensor
    val_index: Tensor
    test_pos: Tensor
    test_index: Tensor
    edge_stage: Tensor
    stage_degree: Tensor
    train_degree: Tensor | None
    ids: Tensor
    num_train: int
    undirected: bool
    train_rel: Tensor | None = None
    val_rel: Tensor | None = None
    test_rel: Tensor | None = None
    num_relations: int = 0

    @classmethod
    def of(cls, prepared: LinkPartitioned, part: HaloPart) -> LinkPart:
        """The part of ``part.local.part_id`` (pure: no collective)."""
        book, split, local = prepared.book, prepared.link.split, part.local
        k, n = local.part_id, book.num_nodes
        owner = {name: book.nid2part(book.old2new[split.positives(name)[0]]) for name in STAGES}
        train_pos, train_pairs = _pairs_of(split.train_pos, owner["train"], k)
        val_pos, val_index = _pairs_of(split.val_pos, owner["val"], k)
        test_pos, test_index = _pairs_of(split.test_pos, owner["test"], k)
        stage, graph = prepared.edge_stage, prepared.graph
        lo, hi = int(book.node_offsets[k]), int(book.node_offsets[k + 1])
        edge_stage = stage[int(graph.indptr[lo]) : int(graph.indptr[hi])].clone()
        dst = graph.dst_of_edges()
        degrees = [torch.bincount(dst[stage <= s], minlength=n) for s in (TRAIN, VAL)]
        directory = even_offsets(n, book.num_parts)
        typed = {}
        if split.is_typed:
            index = {"train": train_pairs, "val": val_index, "test": test_index}
            typed = {f"{name}_rel": split.positive_relations(name)[index[name]] for name in STAGES}
            typed["num_relations"] = split.num_relations
        return cls(
            train_pairs=train_pairs,
            train_pos=train_pos,
            val_pos=val_pos,
            val_index=val_index,
            test_pos=test_pos,
            test_index=test_index,
            edge_stage=edge_stage,
            stage_degree=torch.stack([d[local.local2global] for d in degrees]),
            train_degree=degrees[0],
            ids=book.old2new[int(directory[k]) : int(directory[k + 1])].clone(),
            num_train=split.train_pos.shape[1],
            undirected=split.undirected,
            **typed,
        )

    _ARRAYS = (
        "train_pairs",
        "train_pos",
        "val_pos",
        "val_index",
        "test_pos",
        "test_index",
        "edge_stage",
        "stage_degree",
        "ids",
    )
    _RELATIONS = ("train_rel", "val_rel", "test_rel")  # a typed graph's

    def arrays(self) -> dict[str, Tensor]:
        """The part's files (names after :data:`PREFIX`; ``train_degree`` is an ``[N]`` array
        and stays out; a typed graph's pair relations too)."""
        names = self._ARRAYS + (self._RELATIONS if self.num_relations else ())
        return {PREFIX + name: getattr(self, name) for name in names}

    @classmethod
    def from_arrays(
        cls,
        arrays: dict[str, Tensor],
        num_train: int,
        undirected: bool,
        num_relations: int = 0,
        where: str = "the partition directory",
    ) -> LinkPart:
        """The part of :meth:`arrays`' files (``num_train``, ``undirected``, ``num_relations``:
        the directory's metadata). The pair relations are outside input: present exactly when
        ``num_relations``, int64, one per pair, in ``[0, num_relations)``; else
        ``PartitionDirError`` naming ``where``."""
        from ...graph.partition_dir import PartitionDirError

        fields = {name: arrays[PREFIX + name] for name in cls._ARRAYS}
        typed = {}
        for name in cls._RELATIONS:
            rel, pairs = arrays.get(PREFIX + name), name.replace("rel", "pos")
            if (rel is None) != (not num_relations):
                state = "missing" if rel is None else "there, but the metadata lists no relations"
                raise PartitionDirError(f"{where}: {PREFIX}{name} is {state}")
            if rel is None:
                continue
            m = fields[pairs].shape[-1]
            if rel.dtype != torch.int64 or rel.shape != (m,):
                raise PartitionDirError(
                    f"{where}: {PREFIX}{name} must be int64 [{m}], got {rel.dtype} "
                    f"{list(rel.shape)}"
                )
            if rel.numel() and (int(rel.min()) < 0 or int(rel.max()) >= num_relations):
                raise PartitionDirError(
                    f"{where}: {PREFIX}{name} holds values outside [0, {num_relations})"
                )
            typed[name] = rel
        return cls(
            **fields,
            train_degree=None,
            num_train=num_train,
            undirected=undirected,
            **typed,
            num_relations=num_relations,
        )

    def pairs(self, split: str) -> tuple[Tensor, Tensor]:
        """``(pos [2, m], index [m])``: the pairs of evaluation split ``split`` this rank scores."""
        if split not in EVAL_SPLITS:
            raise ValueError(f"unknown evaluation split {split!r}; valid: {list(EVAL_SPLITS)}")
        return getattr(self, f"{split}_pos"), getattr(self, f"{split}_index")

    def relations(self, split: str) -> Tensor | None:
        """The relations ``[m]`` of :meth:`pairs` ``(split)`` (``None``: homogeneous)."""
        if split not in EVAL_SPLITS:
            raise ValueError(f"unknown evaluation split {split!r}; valid: {list(EVAL_SPLITS)}")
        return getattr(self, f"{split}_rel")

    def targets(self, num_nodes: int, out_dim: int, seed: int) -> LinkTargets:
        """A :class:`LinkTargets` whose training pairs are this rank's (what
        ``task.step_rows`` reads, with seeds its positions in :attr:`train_pairs`); the other
        splits and structures are empty: this rank holds none of the whole split's (a typed
        graph's pairs keep their relations, which the step's rows carry)."""
        empty = torch.empty(0, dtype=torch.int64)
        none = torch.empty(2, 0, dtype=torch.int64)
        typed = {}
        if self.num_relations:
            typed = {
                "train_rel": self.train_rel,
                "val_rel": empty,
                "test_rel": empty,
                "num_relations": self.num_relations,
            }
        split = LinkSplit(
            train_pos=self.train_pos,
            val_pos=none,
            test_pos=none,
            edge_split=torch.empty(0, dtype=torch.int8),
            train_indptr=empty,
            train_indices=empty,
            test_indptr=empty,
            test_indices=empty,
            undirected=self.undirected,
            **typed,
        )
        return LinkTargets(split, num_nodes, out_dim, seed)

    def sizes(self) -> dict[str, int]:
        return {
            "train_pairs": self.train_pairs.numel(),
            "val_pairs": self.val_index.numel(),
            "test_pairs": self.test_index.numel(),
        }


def stage_partition(local: LocalPartition, edge_stage: Tensor, stage: int) -> LocalPartition:
    """``local`` with only the in-edges of stage ``<= stage`` (the same local ids, core and
    halo: halo nodes that lose their edges stay, unreferenced)."""
    keep = edge_stage <= stage
    counts = torch.zeros(local.num_core, dtype=torch.int64)
    if local.num_core:
        segment = torch.repeat_interleave(
            torch.arange(local.num_core), local.indptr[1:] - local.indptr[:-1]
        )
        counts = torch.bincount(segment[keep], minlength=local.num_core)
    indptr = torch.zeros(local.num_core + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr[1:])
    edge_ids = None if local.edge_ids is None else local.edge_ids[keep]
    edge_type = None if local.edge_type is None else local.edge_type[keep]
    return replace(
        local, indptr=indptr, indices=local.indices[keep], edge_ids=edge_ids, edge_type=edge_type
    )


@dataclass(frozen=True)
class LinkHaloPart:
    """A rank's part under link prediction: the :class:`HaloPart` and the :class:`LinkPart`
    (what ``write_halo_parts`` writes: both parts' files and sizes)."""

    halo: HaloPart
    link: LinkPart

    @property
    def trainer_sizes(self) -> Tensor:
        return self.halo.trainer_sizes

    def arrays(self) -> dict[str, Tensor]:
        return {**self.halo.arrays(), **self.link.arrays()}

    def sizes(self) -> dict[str, int]:
        return {**self.halo.sizes(), **self.link.sizes()}


class IdDirectory:
    """Original id -> gid, spread over the ranks: rank ``k`` holds the gids of the original
    ids of its even range (``even_offsets(N, P)``), and a lookup asks their holders (one
    :class:`~...comm.OwnerRoute` round, ``structure`` bytes; the own range moves nothing).
    No rank holds an ``[N]`` map (DistDGL's ranks keep their core's original ids only).

    Collective: every rank calls :meth:`gids` (and :meth:`owner`) the same number of times,
    also with no ids."""

    def __init__(self, comm: Comm, book: RangeBook, ids: Tensor):
        self.comm, self.book, self.ids = comm, book, ids
        self.offsets = even_offsets(book.num_nodes, comm.world_size)
        self.first = int(self.offsets[comm.rank])
        if ids.numel() != int(self.offsets[comm.rank + 1]) - self.first:
            raise ValueError("the id directory's slice does not match this rank's range")

    def gids(self, orig: Tensor) -> Tensor:
        """int64 gids of the original ids ``orig`` ``[n]`` (duplicates allowed)."""
        orig = orig.reshape(-1).to(torch.int64)
        unique, inverse = torch.unique(orig, return_inverse=True)
        holder = torch.searchsorted(self.offsets[1:], unique, right=True)
        route = OwnerRoute.build(self.comm, unique, holder, category="structure")
        found = route.reply(self.comm, self.ids[route.served - self.first], category="structure")
        return found[inverse]

    def owner(self, orig: Tensor) -> Tensor:
        """The rank owning each original id (:meth:`gids`, then the partition book)."""
        return self.book.nid2part(self.gids(orig))


class PairOrder:
    """The training pairs this rank seeds at each step: ``single``'s steps, split by owner.

    Every rank draws ``single``'s epoch order of the ``num_train`` pair ids
    (:func:`~...graph.order.epoch_permutation`, the same seeded permutation; transient, one
    int64 per training pair, once per epoch) and keeps the places of its own pairs
    ``own [n_own]`` (sorted pair ids); step ``s`` is the places ``[s B, (s + 1) B)``, so a
    rank seeds the pairs of ``single``'s step it owns, at their positions in it.

    Args:
        own: int64 sorted ids of this rank's training pairs.
        num_train: training pairs of the whole split.
        batch_size: global pairs per step (``-1``: all of them).
        seed: the run's seed.
    """

    def __init__(self, own: Tensor, num_train: int, batch_size: int, seed: int):
        self.own, self.num_train, self.seed = own, num_train, seed
        self.batch_size = num_train if batch_size == -1 else batch_size
        self.steps = max(1, -(-num_train // self.batch_size))
        self._epoch: int | None = None
        self._place = self._local = torch.empty(0, dtype=torch.int64)

    def _order(self, epoch: int) -> tuple[Tensor, Tensor]:
        if epoch != self._epoch:
            order = epoch_permutation(torch.arange(self.num_train), self.seed, epoch)
            place = torch.empty_like(order)
            place[order] = torch.arange(order.numel())
            self._place, self._local = torch.sort(place[self.own])
            self._epoch = epoch
        return self._place, self._local

    def seeds(self, epoch: int, step: int) -> tuple[Tensor, Tensor]:
        """``(local, positions)``: this rank's pairs of the step (positions in :attr:`own`,
        ordered by their position in the step) and their positions in the step's global
        batch."""
        place, local = self._order(epoch)
        lo = step * self.batch_size
        bounds = torch.tensor([lo, lo + self.batch_size])
        a, b = torch.searchsorted(place, bounds).tolist()
        return local[a:b], place[a:b] - lo

    def global_count(self, step: int) -> int:
        """Pairs of the step over all ranks."""
        return max(0, min(self.batch_size, self.num_train - step * self.batch_size))
