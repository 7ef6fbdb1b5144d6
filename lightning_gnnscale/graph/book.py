"""DistDGL-style relabelling and the partition book (docs/systems/distdgl.md#partitioning).

Nodes are renumbered so that each part owns one contiguous range of new ids ("gids"):
``new2old = stable_argsort(parts)``. Then "which part owns gid g" and "g's local id" are a
binary search in the ``[P + 1]`` offsets array and one subtraction. Edges are owned by their
destination's part; in the relabelled CSC the in-edges of part k are one contiguous range.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_gnnscale.graph.block import Block
from lightning_gnnscale.graph.cache import cached_partition
from lightning_gnnscale.graph.csc import Graph, csc_from_edges, typed_csc_from_edges
from lightning_gnnscale.graph.node_targets import NodeTargets
from lightning_gnnscale.graph.partition import partition_report


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class RangeBook:
    """Node -> part map over relabelled ids, from the ``[P + 1]`` offsets alone (``O(P)``):
    what a rank that loaded its part from a partition directory holds.

    Attributes:
        node_offsets: int64 ``[P + 1]``; part ``k`` owns gids ``[node_offsets[k], node_offsets[k+1])``.
    """

    node_offsets: Tensor

    def __post_init__(self) -> None:
        offsets = self.node_offsets
        _check(
            offsets.dim() == 1 and offsets.dtype == torch.int64,
            f"{type(self).__name__}.node_offsets must be 1-D int64",
        )
        _check(offsets.numel() >= 2, f"{type(self).__name__} needs at least one part")
        _check(int(offsets[0]) == 0, f"{type(self).__name__}.node_offsets must start at 0")
        _check(
            bool((offsets[1:] >= offsets[:-1]).all()),
            f"{type(self).__name__}.node_offsets must be non-decreasing",
        )

    @property
    def num_parts(self) -> int:
        return self.node_offsets.numel() - 1

    @property
    def num_nodes(self) -> int:
        return int(self.node_offsets[-1])

    def part_sizes(self) -> Tensor:
        """int64 ``[P]``: number of nodes owned by each part."""
        return self.node_offsets[1:] - self.node_offsets[:-1]

    def nid2part(self, gids: Tensor) -> Tensor:
        """Owning part of each gid (binary search over the offsets); same shape as ``gids``."""
        if gids.numel():
            _check(
                int(gids.min()) >= 0 and int(gids.max()) < self.num_nodes,
                f"gids must lie in [0, {self.num_nodes})",
            )
        return torch.searchsorted(self.node_offsets[1:], gids, right=True)

    def nid2local(self, gids: Tensor) -> Tensor:
        """Local id of each gid inside its owning part."""
        return gids - self.node_offsets[self.nid2part(gids)]

    def part_nodes(self, k: int) -> Tensor:
        """int64 gids owned by part ``k`` (a contiguous range)."""
        _check(0 <= k < self.num_parts, f"part {k} out of range [0, {self.num_parts})")
        return torch.arange(int(self.node_offsets[k]), int(self.node_offsets[k + 1]))


@dataclass(frozen=True)
class PartitionBook(RangeBook):
    """A :class:`RangeBook` plus the relabelling itself (``[N]`` arrays: the process that
    partitions holds it; the in-memory path hands it to every rank).

    Attributes:
        node_offsets: as :class:`RangeBook`.
        new2old: int64 ``[N]``; original id of every gid.
        old2new: int64 ``[N]``; gid of every original id (inverse of ``new2old``).
    """

    new2old: Tensor
    old2new: Tensor

    def __post_init__(self) -> None:
        super().__post_init__()
        offsets, n = self.node_offsets, self.new2old.numel()
        for name in ("new2old", "old2new"):
            tensor = getattr(self, name)
            _check(
                tensor.dim() == 1 and tensor.dtype == torch.int64,
                f"PartitionBook.{name} must be 1-D int64",
            )
        _check(
            int(offsets[-1]) == n,
            f"PartitionBook.node_offsets must run from 0 to N={n}",
        )
        _check(
            self.old2new.numel() == n and torch.equal(self.old2new[self.new2old], torch.arange(n)),
            "PartitionBook.old2new must be the inverse permutation of new2old",
        )

    @classmethod
    def from_parts(cls, parts: Tensor, num_parts: int | None = None) -> PartitionBook:
        """Book for ``parts`` (int64 ``[N]`` part per original id); ties keep original order."""
        parts = parts.to(torch.int64)
        if num_parts is None:
            num_parts = int(parts.max()) + 1 if parts.numel() else 1
        _check(
            parts.numel() == 0 or (int(parts.min()) >= 0 and int(parts.max()) < num_parts),
            f"parts must lie in [0, {num_parts})",
        )
        new2old = torch.argsort(parts, stable=True)
        old2new = torch.empty_like(new2old)
        old2new[new2old] = torch.arange(new2old.numel())
        node_offsets = torch.zeros(num_parts + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(parts, minlength=num_parts), 0, out=node_offsets[1:])
        return cls(node_offsets=node_offsets, new2old=new2old, old2new=old2new)

    def edge_offsets(self, relabelled: Graph) -> Tensor:
        """int64 ``[P + 1]``: part ``k`` owns the edge ids ``[edge_offsets[k], edge_offsets[k+1])``
        of ``relabelled`` (the graph from :func:`relabel_graph`)."""
        _check(relabelled.num_nodes == self.num_nodes, "graph and book disagree on N")
        return relabelled.indptr[self.node_offsets]


def relabel_graph(graph: Graph, book: PartitionBook) -> Graph:
    """``graph`` in gids: node data permuted by ``new2old``, CSC rebuilt in (dst, src) gid order
    (a typed graph's in (dst, relation, src))."""
    _check(graph.num_nodes == book.num_nodes, "graph and book disagree on N")
    src, dst = graph.edge_index()
    if graph.is_typed:
        indptr, indices, kinds = typed_csc_from_edges(
            book.old2new[src],
            book.old2new[dst],
            graph.edge_type,
            graph.num_nodes,
            graph.num_relations,
            remove_self_loops=False,
        )
        return graph.reindexed(book.new2old, indptr, indices, kinds)
    indptr, indices = csc_from_edges(
        book.old2new[src], book.old2new[dst], graph.num_nodes, remove_self_loops=False
    )
    del src, dst
    return graph.reindexed(book.new2old, indptr, indices)


@dataclass(frozen=True)
class LocalPartition:
    """Part ``k``'s local graph: core nodes, their 1-hop halo, and every in-edge of the core.

    Local ids: core nodes ``0..n_core-1`` (gid - ``node_offsets[k]``), then halo nodes
    ``n_core..n_local-1`` in increasing gid order.

    Attributes:
        part_id: ``k``.
        num_core: number of owned nodes ``n_core``.
        local2global: int64 ``[n_local]``; core gids then sorted halo gids.
        indptr: int64 ``[n_core + 1]``; CSC over core destinations.
        indices: int64 ``[E_k]``; local source id of each edge. Within a segment the edges keep
            the full graph's order (by source gid), so samplers see the same neighbour order.
        edge_ids: int64 ``[E_k]``; the edge's id in the relabelled global graph (contiguous);
            ``None`` when loaded from a partition directory (nothing reads it there).
        x: features of the core nodes only (halo data lives with its owner).
        targets: the task's rows of the core nodes (:class:`~.node_targets.NodeTargets`).
        edge_type: int64 ``[E_k]`` a typed graph's relation of each edge (segments sorted by
            relation, as the whole graph's); ``None``: homogeneous.
    """

    part_id: int
    num_core: int
    local2global: Tensor
    indptr: Tensor
    indices: Tensor
    edge_ids: Tensor | None
    x: Tensor
    targets: NodeTargets
    edge_type: Tensor | None = None

    def __post_init__(self) -> None:
        n_core, n_local = self.num_core, self.local2global.numel()
        _check(0 <= n_core <= n_local, "LocalPartition.num_core must be <= len(local2global)")
        _check(self.indptr.shape == (n_core + 1,), "LocalPartition.indptr must be [num_core + 1]")
        edges = self.indices.numel() if self.edge_ids is None else self.edge_ids.numel()
        _check(
            int(self.indptr[-1]) == self.indices.numel() == edges,
            "LocalPartition.indptr[-1], indices and edge_ids disagree on the edge count",
        )
        _check(
            self.indices.numel() == 0
            or (int(self.indices.min()) >= 0 and int(self.indices.max()) < n_local),
            "LocalPartition.indices holds ids outside [0, n_local)",
        )
        _check(self.x.shape[0] == n_core, "LocalPartition.x must have one row per core node")
        _check(
            self.targets.num_rows == n_core,
            "LocalPartition.targets must have one row per core node",
        )
        _check(
            self.edge_type is None or self.edge_type.shape == self.indices.shape,
            "LocalPartition.edge_type must have one relation per edge",
        )

    @property
    def num_local(self) -> int:
        return self.local2global.numel()

    @property
    def num_halo(self) -> int:
        return self.num_local - self.num_core

    @property
    def num_edges(self) -> int:
        return self.indices.numel()

    @property
    def core_gids(self) -> Tensor:
        return self.local2global[: self.num_core]

    @property
    def halo_gids(self) -> Tensor:
        return self.local2global[self.num_core :]

    def find(self, gids: Tensor) -> tuple[Tensor, Tensor]:
        """``(local ids, held)``: the local id of each gid this partition holds (core: a range
        check; halo: a binary search in the sorted halo) and a bool mask of which it holds;
        the local id of a gid not held is 0 (mask it out)."""
        lid = torch.zeros_like(gids)
        held = torch.zeros(gids.shape, dtype=torch.bool)
        if self.num_core:
            first = int(self.local2global[0])
            held = (gids >= first) & (gids < first + self.num_core)
            lid[held] = gids[held] - first
        halo = self.halo_gids
        if halo.numel():
            pos = torch.searchsorted(halo, gids).clamp_(max=halo.numel() - 1)
            in_halo = (halo[pos] == gids) & ~held
            lid[in_halo] = self.num_core + pos[in_halo]
            held = held | in_halo
        return lid, held

    def arrays(self) -> dict[str, Tensor]:
        """The partition as named arrays: the files of a partition directory's part
        (``edge_ids`` is left out: it is a position in the whole graph; ``edge_type`` is there
        for a typed graph)."""
        structure = {name: getattr(self, name) for name in ("indptr", "indices", "local2global")}
        if self.edge_type is not None:
            structure["edge_type"] = self.edge_type
        return {**structure, "x": self.x, **self.targets.arrays()}

    @classmethod
    def from_arrays(
        cls, part: dict[str, Tensor], part_id: int, out_dim: int, dtype: torch.dtype | None = None
    ) -> LocalPartition:
        """The partition of a loaded part (:meth:`arrays`' names; memory-mapped arrays are
        used as they are), its features cast to ``dtype`` if given and different; ``out_dim``:
        the targets' head width (the task's, from the directory's metadata). A part with an
        ``edge_type`` file is typed (its values are the loader's to check)."""
        x = part["x"] if dtype is None or part["x"].dtype == dtype else part["x"].to(dtype)
        return cls(
            part_id=part_id,
            num_core=x.shape[0],
            local2global=part["local2global"],
            indptr=part["indptr"],
            indices=part["indices"],
            edge_ids=None,
            x=x,
            targets=NodeTargets.from_arrays(part, out_dim),
            edge_type=part.get("edge_type"),
        )


# the arrays of a LocalPartition that a partition directory stores (LocalPartition.arrays)
PART_ARRAYS = ("indptr", "indices", "local2global", "x", *NodeTargets.array_names())


def build_local_partition(
    relabelled: Graph, targets: NodeTargets, book: PartitionBook, k: int
) -> LocalPartition:
    """Cut part ``k``'s local graph out of ``relabelled`` (the output of :func:`relabel_graph`)
    and its ``targets`` (the task's rows, in gids).

    Node data is copied, so the partition can be saved or sent without the full graph.
    """
    _check(relabelled.num_nodes == book.num_nodes, "graph and book disagree on N")
    _check(0 <= k < book.num_parts, f"part {k} out of range [0, {book.num_parts})")
    lo, hi = int(book.node_offsets[k]), int(book.node_offsets[k + 1])
    edge_lo, edge_hi = int(relabelled.indptr[lo]), int(relabelled.indptr[hi])
    src = relabelled.indices[edge_lo:edge_hi]
    is_core = (src >= lo) & (src < hi)
    halo = torch.unique(src[~is_core])  # sorted
    local_src = torch.where(is_core, src - lo, hi - lo + torch.searchsorted(halo, src))
    core = slice(lo, hi)
    return LocalPartition(
        part_id=k,
        num_core=hi - lo,
        local2global=torch.cat([torch.arange(lo, hi), halo]),
        indptr=relabelled.indptr[lo : hi + 1] - edge_lo,
        indices=local_src,
        edge_ids=torch.arange(edge_lo, edge_hi),
        x=relabelled.x[core].clone(),
        targets=targets.rows(core).clone(),
        edge_type=None
        if relabelled.edge_type is None
        else relabelled.edge_type[edge_lo:edge_hi].clone(),
    )


@dataclass(frozen=True)
class PartitionedGraph:
    """A graph partitioned over ranks: what a partitioned system's ``preprocess`` hands every
    rank (DistDGL, ByteGNN).

    The whole relabelled graph reaches the ranks with the DataModule (shared memory under the
    suite's launcher), but a rank reads only its own partition (:func:`build_local_partition`)
    plus replicated metadata, as those systems' machines do.

    Attributes:
        graph: the relabelled graph (part ``k`` owns gids ``[node_offsets[k], node_offsets[k+1])``).
        targets: the task's rows, in gids.
        book: node ownership over those gids.
        report: the partition's edge cut and balance (``partition_report``).
    """

    graph: Graph
    targets: NodeTargets
    book: PartitionBook
    report: dict


def partition_and_relabel(
    graph: Graph,
    targets: NodeTargets,
    method: str,
    num_parts: int,
    seed: int,
    cache_dir,
    *,
    system: str,
    **options,
) -> PartitionedGraph:
    """Partition ``graph`` (cached on disk by content hash), print the cut and balance under
    ``[system]``, and relabel it and the task's ``targets`` so that every part owns a
    contiguous gid range."""
    parts = cached_partition(graph, method, num_parts, seed, cache_dir, targets=targets, **options)
    report = partition_report(graph, parts, num_parts, splits=targets.split_matrix())
    print(
        f"[{system}] {method} partition into {num_parts}: edge cut "
        f"{report['edge_cut_fraction']:.1%}, train balance {report['train_balance']:.3f}, "
        f"node balance {report['node_balance']:.3f}",
        flush=True,
    )
    book = PartitionBook.from_parts(parts, num_parts)
    relabelled = relabel_graph(graph, book)
    return PartitionedGraph(relabelled, targets.rows(book.new2old), book, report)


def relabel_csc(indptr: Tensor, indices: Tensor, book: PartitionBook) -> tuple[Tensor, Tensor]:
    """A CSC in gids that keeps every segment's edge order (unlike :func:`relabel_graph`,
    which re-sorts by source gid): position ``i`` of node ``v``'s segment is the same
    neighbour in both, so a hash-keyed sampler that picks positions draws the same edges.
    Returns ``(indptr [N + 1], indices [E])``; vectorised, ``O(N + E)``. A typed graph's
    relations follow as ``edge_type[relabelled_edge_ids(indptr, book)[1]]``."""
    new_indptr, old_edge = relabelled_edge_ids(indptr, book)
    return new_indptr, book.old2new[indices[old_edge]]


def relabelled_edge_ids(indptr: Tensor, book: PartitionBook) -> tuple[Tensor, Tensor]:
    """:func:`relabel_csc`'s ``indptr`` and, per edge of it, the old edge id ``[E]`` (what
    carries any per-edge data along: a typed graph's relations)."""
    degree = (indptr[1:] - indptr[:-1])[book.new2old]
    new_indptr = torch.zeros_like(indptr)
    torch.cumsum(degree, 0, out=new_indptr[1:])
    shift = torch.repeat_interleave(indptr[:-1][book.new2old] - new_indptr[:-1], degree)
    shift += torch.arange(shift.numel())  # the old edge id of every new edge id
    return new_indptr, shift


def sort_sources(block: Block, key: Tensor) -> Block:
    """``block`` with its non-destination sources reordered by ``key`` (one value per source,
    stable: ties keep their order), rows and degrees alike; the edges keep their order, their
    source positions remapped. A rank whose graph is relabelled builds its blocks in its own
    ids' order; sorting by the original ids (HopGNN from a partition directory) makes its
    blocks equal to the in-memory path's row for row. ``O(n log n)`` per block: where the
    relabelled order can be the in-memory order too, build in it instead (GSplit's
    ``OwnerOrderBuilder``)."""
    n_dst = block.num_dst
    order = torch.cat([torch.arange(n_dst), torch.argsort(key[n_dst:], stable=True) + n_dst])
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel())
    edge_index = torch.stack([position[block.edge_index[0]], block.edge_index[1]])
    return Block(block.src_ids[order], n_dst, edge_index, block.src_deg[order], block.edge_type)
