"""``CSCRows``: the in-edge segments (CSC rows) a rank holds, of every vertex or of its own.

A rank that only ever expands the vertices it owns (GSplit's split-parallel sampler and its
layer-wise inference) needs only their rows: about ``|E| / P`` instead of ``|E|``
(docs/systems/gsplit.md#topology). Each row keeps its segment in the original order, so the
hash-keyed sampler (keyed on a vertex and a position within its segment) draws the same
neighbours from it as from the whole CSC.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .csc import relation_indptr
from .sampler import sample_edge_ids, sample_neighbors, sample_typed_edge_ids

COPY_EDGES = 1 << 20  # entries per gather when CSCRows.owned copies rows


class CSCRows:
    """The CSC rows of the vertices ``ids``: row ``i`` (``indptr[i]..indptr[i + 1]`` into
    ``indices``) is the in-edge segment of vertex ``ids[i]``.

    Args:
        indptr: int64 ``[n + 1]`` row pointers into ``indices`` (need not start at 0: a
            slice of a whole CSC's ``indptr`` over the whole ``indices``).
        indices: int64 in-neighbour ids (global).
        degree: ``ids -> in-degrees`` of any vertices (held ones or not: a block's sources
            carry their whole-graph in-degree).
        ids: int64 ``[n]`` the held vertices, sorted; ``None``: every vertex (row ``v`` is
            vertex ``v``).
        edge_type: a typed graph's relation of every entry of ``indices`` (rows sorted by
            relation, as :class:`~.csc.Graph` keeps them), with ``num_relations``; ``None``:
            homogeneous.
    """

    def __init__(
        self,
        indptr: Tensor,
        indices: Tensor,
        degree: Callable[[Tensor], Tensor],
        ids: Tensor | None = None,
        edge_type: Tensor | None = None,
        num_relations: int = 1,
    ):
        self.indptr, self.indices, self.degree, self.ids = indptr, indices, degree, ids
        self.edge_type, self.num_relations = edge_type, num_relations
        self._slots: Tensor | None = None

    @classmethod
    def whole(
        cls,
        indptr: Tensor,
        indices: Tensor,
        edge_type: Tensor | None = None,
        num_relations: int = 1,
    ) -> CSCRows:
        """Every vertex's row (a replicated topology)."""

        def degree(ids: Tensor) -> Tensor:
            return indptr.index_select(0, ids + 1) - indptr.index_select(0, ids)

        return cls(indptr, indices, degree, None, edge_type, num_relations)

    @classmethod
    def owned(
        cls,
        indptr: Tensor,
        indices: Tensor,
        ids: Tensor,
        edge_type: Tensor | None = None,
        num_relations: int = 1,
    ) -> CSCRows:
        """A copy of the rows of ``ids`` (sorted) out of the whole CSC, segments in their
        order, and the whole graph's in-degrees ``[N]``: what a rank keeps of an in-memory
        graph under ``topology: partitioned``. Copied about ``COPY_EDGES`` entries at a time,
        so the gather's temporaries stay small next to the copy."""
        deg = indptr[1:] - indptr[:-1]
        own_indptr = torch.zeros(ids.numel() + 1, dtype=torch.int64)
        torch.cumsum(deg.index_select(0, ids), 0, out=own_indptr[1:])
        own_indices = torch.empty(int(own_indptr[-1]), dtype=torch.int64)
        own_types = None if edge_type is None else torch.empty_like(own_indices)
        # chunk bounds (vertex positions): a chunk holds at most COPY_EDGES + one row's entries
        firsts = torch.arange(0, own_indices.numel(), COPY_EDGES)
        starts = torch.searchsorted(own_indptr, firsts, right=True) - 1
        bounds = torch.cat([torch.tensor([0]), starts, torch.tensor([ids.numel()])]).unique()
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            eids, _ = sample_edge_ids(indptr, ids[lo:hi], -1, 0)
            own_indices[own_indptr[lo] : own_indptr[hi]] = indices.index_select(0, eids)
            if own_types is not None:
                own_types[own_indptr[lo] : own_indptr[hi]] = edge_type.index_select(0, eids)
        degree = lambda v: deg.index_select(0, v)  # noqa: E731
        return cls(own_indptr, own_indices, degree, ids, own_types, num_relations)

    @property
    def num_rows(self) -> int:
        return self.indptr.numel() - 1

    @property
    def num_entries(self) -> int:
        """In-edges held (the ``indices`` the rows cover)."""
        return int(self.indptr[-1] - self.indptr[0])

    def rows(self, ids: Tensor) -> Tensor:
        """Row of each of ``ids``; a ``KeyError`` names the first id whose row is not held."""
        if self.ids is None:
            return ids
        pos = torch.searchsorted(self.ids, ids).clamp_(max=max(self.ids.numel() - 1, 0))
        held = self.ids[pos] == ids if self.ids.numel() else torch.zeros_like(ids, dtype=bool)
        if not bool(held.all()):
            missing = int(ids[~held][0])
            raise KeyError(f"vertex {missing}'s CSC row is not held by this rank")
        return pos

    def sample(
        self, dst: Tensor, fanout: int, key: int, node_keys: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """:func:`~.sampler.sample_neighbors` of the vertices ``dst`` (ids, unique), keyed on
        ``node_keys`` (default ``dst``): the whole CSC's samples."""
        keys = dst if node_keys is None else node_keys
        return sample_neighbors(self.indptr, self.indices, self.rows(dst), fanout, key, keys)

    def sample_typed(
        self, dst: Tensor, fanouts: tuple[int, ...], key: int, node_keys: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """:func:`~.sampler.sample_typed_edge_ids` of the vertices ``dst`` over these rows,
        ``fanouts[r]`` per relation (keyed on ``node_keys``, default ``dst``: the whole typed
        CSC's samples). Returns ``(src, dst_pos, edge_type)``."""
        if self.edge_type is None:
            raise ValueError("these CSC rows carry no relations (a homogeneous graph's)")
        if self._slots is None:  # each held row's relation runs, in positions of indices
            first = self.indptr[:1]
            local = relation_indptr(
                self.indptr - first,
                self.edge_type[int(first) : int(self.indptr[-1])],
                self.num_relations,
            )
            self._slots = local + first
        keys = dst if node_keys is None else node_keys
        eids, dst_pos = sample_typed_edge_ids(self._slots, self.rows(dst), fanouts, key, keys)
        return self.indices.index_select(0, eids), dst_pos, self.edge_type.index_select(0, eids)
