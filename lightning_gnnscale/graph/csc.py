"""The suite's graph type: CSC over in-edges, with node features (a task's targets and splits
are apart from it: :mod:`.node_targets`).

The CSC position of an edge is its edge id. Within each destination's segment the sources are
sorted by id, so "the in-edges of v in order" is canonical and a hash-keyed sampler picks the
same neighbours wherever it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import Tensor


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class Graph:
    """A graph stored as CSC over in-edges; homogeneous, or typed (docs/architecture.md,
    "Typed graphs").

    A typed graph is the same CSC plus a relation per edge and a type per node: within each
    destination's segment the edges are sorted by ``(relation, source)``, so the in-edges of
    ``v`` under relation ``r`` are one contiguous run (:meth:`relation_indptr`). Two relations
    may join the same pair (a multigraph); one relation may not, twice.

    Attributes:
        indptr: int64 ``[N + 1]``; the in-edges of node ``v`` are ``indptr[v]:indptr[v+1]``.
        indices: int64 ``[E]``; source node of each in-edge, sorted within each segment
            (within each relation's run of it, for a typed graph).
        x: node features ``[N, F]`` (floating point; node types of narrower features are
            zero-padded to ``F``).
        name: a short name used in reports and cache keys.
        edge_type: int64 ``[E]`` relation of each edge in ``[0, R)``, or ``None``: homogeneous.
        relations: the ``R`` relation names (``()`` for a homogeneous graph).
        node_type: int64 ``[N]`` type of each node in ``[0, T)``, or ``None`` (one type).
        node_types: the ``T`` node type names (``()`` with ``node_type`` ``None``).
    """

    indptr: Tensor
    indices: Tensor
    x: Tensor
    name: str = "graph"
    meta: dict = field(default_factory=dict, compare=False)
    edge_type: Tensor | None = None
    relations: tuple[str, ...] = ()
    node_type: Tensor | None = None
    node_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = self.indptr.numel() - 1
        _check(
            self.indptr.dtype == torch.int64 and self.indices.dtype == torch.int64,
            "Graph.indptr and Graph.indices must be int64",
        )
        _check(n >= 0 and int(self.indptr[0]) == 0, "Graph.indptr must start at 0")
        _check(
            int(self.indptr[-1]) == self.indices.numel(),
            f"Graph.indptr[-1]={int(self.indptr[-1])} but there are {self.indices.numel()} edges",
        )
        _check(
            self.x.dim() == 2 and self.x.shape[0] == n,
            f"Graph.x must be [N={n}, F], got {tuple(self.x.shape)}",
        )
        _check(self.x.is_floating_point(), "Graph.x must be floating point")
        if self.indices.numel():
            _check(
                int(self.indices.min()) >= 0 and int(self.indices.max()) < n,
                "Graph.indices holds ids outside [0, N)",
            )
        self._check_types()

    def _check_types(self) -> None:
        _check(
            (self.edge_type is None) == (not self.relations),
            "Graph.edge_type and Graph.relations come together (both or neither)",
        )
        _check(
            (self.node_type is None) == (not self.node_types),
            "Graph.node_type and Graph.node_types come together (both or neither)",
        )
        for what, values, names, size in (
            ("edge_type", self.edge_type, self.relations, self.num_edges),
            ("node_type", self.node_type, self.node_types, self.num_nodes),
        ):
            if values is None:
                continue
            _check(len(set(names)) == len(names), f"Graph.{what} names repeat: {list(names)}")
            _check(
                values.dtype == torch.int64 and values.shape == (size,),
                f"Graph.{what} must be int64 [{size}], got {values.dtype} {tuple(values.shape)}",
            )
            _check(
                values.numel() == 0 or (int(values.min()) >= 0 and int(values.max()) < len(names)),
                f"Graph.{what} holds values outside [0, {len(names)})",
            )
        if self.edge_type is not None and self.num_edges:
            key = self.edge_type * self.num_nodes + self.indices
            starts = torch.zeros(self.num_edges, dtype=torch.bool)
            starts[self.indptr[:-1][self.in_degree() > 0]] = True
            _check(
                bool(((key[1:] > key[:-1]) | starts[1:]).all()),
                "a typed Graph's segments must be sorted by (relation, source), each pair "
                "once per relation (build it with Graph.from_edge_index(..., edge_type=))",
            )

    # ----------------------------------------------------------------------------- sizes
    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.indices.numel()

    @property
    def num_features(self) -> int:
        return self.x.shape[1]

    @property
    def is_typed(self) -> bool:
        """Its edges carry relations (:attr:`edge_type`)."""
        return self.edge_type is not None

    @property
    def num_relations(self) -> int:
        """``R``: relations of a typed graph; 1 for a homogeneous one."""
        return len(self.relations) or 1

    def relation_indptr(self) -> Tensor:
        """int64 ``[N * R + 1]``: the CSC over ``(node, relation)`` slots; the in-edges of
        ``v`` under relation ``r`` are ``p[v * R + r]:p[v * R + r + 1]`` (``indptr`` itself for
        a homogeneous graph)."""
        return relation_indptr(self.indptr, self.edge_type, self.num_relations)

    def in_degree(self) -> Tensor:
        """int64 ``[N]``: number of in-edges of every node."""
        return self.indptr[1:] - self.indptr[:-1]

    def dst_of_edges(self) -> Tensor:
        """int64 ``[E]``: destination node of every edge (expands ``indptr``)."""
        return torch.repeat_interleave(torch.arange(self.num_nodes), self.in_degree())

    def edge_index(self) -> Tensor:
        """int64 ``[2, E]`` with rows (source, destination), in CSC order."""
        return torch.stack([self.indices, self.dst_of_edges()])

    # ----------------------------------------------------------------------- construction
    @classmethod
    def from_edge_index(
        cls,
        edge_index: Tensor,
        num_nodes: int,
        *,
        undirected: bool = False,
        remove_self_loops: bool = True,
        edge_type: Tensor | None = None,
        **fields,
    ) -> Graph:
        """Build a CSC graph from a ``[2, E]`` (source, destination) edge list.

        Duplicate edges are merged (for a typed graph, ``edge_type`` ``[E]`` with
        ``fields["relations"]``: duplicates of one relation). With ``undirected=True`` both
        directions are stored, the reverse under the same relation. ``fields`` are the
        remaining dataclass fields (``x``, ``name``, ``meta``, ``relations``, ``node_type``...).
        """
        if edge_type is None:
            indptr, indices = csc_from_edges(
                edge_index[0],
                edge_index[1],
                num_nodes,
                undirected=undirected,
                remove_self_loops=remove_self_loops,
            )
            return cls(indptr=indptr, indices=indices, **fields)
        indptr, indices, types = typed_csc_from_edges(
            edge_index[0],
            edge_index[1],
            edge_type,
            num_nodes,
            len(fields.get("relations", ())),
            undirected=undirected,
            remove_self_loops=remove_self_loops,
        )
        return cls(indptr=indptr, indices=indices, edge_type=types, **fields)

    def with_structure(
        self, indptr: Tensor, indices: Tensor, edge_type: Tensor | None = None
    ) -> Graph:
        """The same node data over another edge set (a typed graph's with its relations)."""
        if self.is_typed and edge_type is None:
            raise ValueError("a typed Graph's new structure needs the edge_type of its edges")
        return replace(
            self, indptr=indptr, indices=indices, edge_type=edge_type, meta=dict(self.meta)
        )

    def without_types(self) -> Graph:
        """The homogeneous graph of the same nodes: relations and node types erased, the pairs
        several relations join merged into one edge."""
        if not self.is_typed and self.node_type is None:
            return self
        src, dst = self.edge_index()
        indptr, indices = csc_from_edges(src, dst, self.num_nodes, remove_self_loops=False)
        return replace(
            self,
            indptr=indptr,
            indices=indices,
            edge_type=None,
            relations=(),
            node_type=None,
            node_types=(),
            meta=dict(self.meta),
        )

    def reindexed(
        self, nodes: Tensor, indptr: Tensor, indices: Tensor, edge_type: Tensor | None = None
    ) -> Graph:
        """Node ``i`` of the result carries the features (and type) of node ``nodes[i]``;
        edges are given, a typed graph's with their relations ``edge_type``."""
        if self.is_typed and edge_type is None:
            raise ValueError("a typed Graph reindexed needs the edge_type of its new edges")
        return replace(
            self,
            indptr=indptr,
            indices=indices,
            x=self.x[nodes],
            edge_type=edge_type,
            node_type=None if self.node_type is None else self.node_type[nodes],
            meta=dict(self.meta),
        )

    def _refuse_typed(self, what: str) -> None:
        if self.is_typed or self.node_type is not None:
            raise ValueError(f"Graph.{what} keeps no types: erase them first (without_types)")

    def to_undirected(self) -> Graph:
        """Add the reverse of every edge (duplicates merged; homogeneous graphs only)."""
        self._refuse_typed("to_undirected")
        src, dst = self.edge_index()
        indptr, indices = csc_from_edges(
            src, dst, self.num_nodes, undirected=True, remove_self_loops=False
        )
        return self.with_structure(indptr, indices)

    def induced_subgraph(self, nodes: Tensor) -> Graph:
        """The subgraph on ``nodes`` (relabelled to ``0..len(nodes)-1`` in the given order;
        homogeneous graphs only)."""
        self._refuse_typed("induced_subgraph")
        nodes = nodes.to(torch.int64)
        new_id = torch.full((self.num_nodes,), -1, dtype=torch.int64)
        new_id[nodes] = torch.arange(nodes.numel())
        src, dst = self.edge_index()
        keep = (new_id[src] >= 0) & (new_id[dst] >= 0)
        indptr, indices = csc_from_edges(
            new_id[src[keep]], new_id[dst[keep]], nodes.numel(), remove_self_loops=False
        )
        return self.reindexed(nodes, indptr, indices)

    def to(self, dtype: torch.dtype) -> Graph:
        """The same graph with features cast to ``dtype``."""
        return replace(self, x=self.x.to(dtype), meta=dict(self.meta))


# Elements per chunk where a build streams over its edges: bounds the temporaries (8 MiB per
# int64 array) whatever the graph's size.
CHUNK = 1 << 20


def csc_from_edges(
    src: Tensor,
    dst: Tensor,
    num_nodes: int,
    *,
    undirected: bool = False,
    remove_self_loops: bool = True,
) -> tuple[Tensor, Tensor]:
    """CSC ``(indptr, indices)`` from edge endpoints; sorted by (dst, src), duplicates merged.

    Memory beyond the inputs: one int64 key per edge (two per pair when ``undirected``), a
    byte per key, and the merged result; the keys are sorted in place (numpy) and built in
    chunks, so no other temporary grows with the graph (docs/partitioning.md, "Large
    synthetic graphs").
    """
    if src.shape != dst.shape or src.dim() != 1:
        raise ValueError(f"src and dst must be 1-D of one length, got {src.shape} and {dst.shape}")
    n = src.numel()
    keys = torch.empty(2 * n if undirected else n, dtype=torch.int64)
    for i in range(0, n, CHUNK):
        j = min(n, i + CHUNK)
        s, d = src[i:j].to(torch.int64), dst[i:j].to(torch.int64)
        torch.add(s, d, alpha=num_nodes, out=keys[i:j])  # dst * N + src
        if undirected:
            torch.add(d, s, alpha=num_nodes, out=keys[n + i : n + j])
    sorted_keys = keys.numpy()
    sorted_keys.sort()  # in place
    keep = np.empty(sorted_keys.size, dtype=bool)
    if sorted_keys.size:
        keep[0] = True
        np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=keep[1:])  # duplicates merged
    if remove_self_loops:  # dst * N + src with src == dst is a multiple of N + 1
        for i in range(0, sorted_keys.size, CHUNK):
            keep[i : i + CHUNK] &= sorted_keys[i : i + CHUNK] % (num_nodes + 1) != 0
    merged = torch.from_numpy(sorted_keys[keep])
    del keys, sorted_keys, keep
    indptr = torch.searchsorted(merged, torch.arange(num_nodes + 1, dtype=torch.int64) * num_nodes)
    return indptr, merged.remainder_(num_nodes)


def typed_csc_from_edges(
    src: Tensor,
    dst: Tensor,
    edge_type: Tensor,
    num_nodes: int,
    num_relations: int,
    *,
    undirected: bool = False,
    remove_self_loops: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """A typed CSC ``(indptr, indices, edge_type)`` sorted by (dst, relation, src), the
    duplicates of one relation merged; ``undirected`` adds every reverse under its relation.

    :func:`csc_from_edges` over ``N * R`` (node, relation) destination slots, so it streams
    the same way."""
    if edge_type.shape != src.shape:
        raise ValueError(f"edge_type must be [E]={tuple(src.shape)}, got {tuple(edge_type.shape)}")
    if num_relations < 1:
        raise ValueError("a typed graph needs at least one relation")
    if (num_nodes * num_relations) ** 2 >= 1 << 63:  # the sort keys slot * N * R + src
        raise ValueError(
            f"{num_nodes:,} nodes x {num_relations} relations is past the typed CSC's int64 "
            "sort keys ((N * R)^2 < 2^63)"
        )
    kind = edge_type.to(torch.int64)
    if kind.numel() and (int(kind.min()) < 0 or int(kind.max()) >= num_relations):
        raise ValueError(f"edge_type holds values outside [0, {num_relations})")
    if remove_self_loops:
        keep = src != dst
        src, dst, kind = src[keep], dst[keep], kind[keep]
    slot = dst.to(torch.int64) * num_relations + kind
    reverse = src.to(torch.int64) * num_relations + kind
    if undirected:
        src, slot = torch.cat([src, dst]), torch.cat([slot, reverse])
    slot_indptr, indices = csc_from_edges(
        src, slot, num_nodes * num_relations, remove_self_loops=False
    )
    in_slot = slot_indptr[1:] - slot_indptr[:-1]
    types = torch.arange(num_relations).repeat(num_nodes).repeat_interleave(in_slot)
    return slot_indptr[::num_relations].contiguous(), indices, types


def relation_indptr(indptr: Tensor, edge_type: Tensor | None, num_relations: int) -> Tensor:
    """int64 ``[N * R + 1]``: the CSC over (node, relation) slots of a typed CSC whose
    segments are sorted by relation (``indptr`` itself when ``edge_type`` is ``None``)."""
    if edge_type is None:
        return indptr
    if edge_type.numel() and int(edge_type.max()) >= num_relations:
        raise ValueError(
            f"edge_type holds relation {int(edge_type.max())} but num_relations={num_relations}: "
            "pass the graph's number of relations"
        )
    num_nodes = indptr.numel() - 1
    dst = torch.repeat_interleave(torch.arange(num_nodes), indptr[1:] - indptr[:-1])
    counts = torch.bincount(dst * num_relations + edge_type, minlength=num_nodes * num_relations)
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
