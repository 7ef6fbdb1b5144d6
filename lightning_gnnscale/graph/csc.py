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
    """A homogeneous graph stored as CSC over in-edges.

    Attributes:
        indptr: int64 ``[N + 1]``; the in-edges of node ``v`` are ``indptr[v]:indptr[v+1]``.
        indices: int64 ``[E]``; source node of each in-edge, sorted within each segment.
        x: node features ``[N, F]`` (floating point).
        name: a short name used in reports and cache keys.
    """

    indptr: Tensor
    indices: Tensor
    x: Tensor
    name: str = "graph"
    meta: dict = field(default_factory=dict, compare=False)

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
        **fields,
    ) -> Graph:
        """Build a CSC graph from a ``[2, E]`` (source, destination) edge list.

        Duplicate edges are merged. With ``undirected=True`` both directions are stored.
        ``fields`` are the remaining dataclass fields (``x``, ``name``, ``meta``).
        """
        indptr, indices = csc_from_edges(
            edge_index[0],
            edge_index[1],
            num_nodes,
            undirected=undirected,
            remove_self_loops=remove_self_loops,
        )
        return cls(indptr=indptr, indices=indices, **fields)

    def with_structure(self, indptr: Tensor, indices: Tensor) -> Graph:
        """The same node data over another edge set."""
        return replace(self, indptr=indptr, indices=indices, meta=dict(self.meta))

    def reindexed(self, nodes: Tensor, indptr: Tensor, indices: Tensor) -> Graph:
        """Node ``i`` of the result carries the features of node ``nodes[i]``; edges are
        given."""
        return replace(self, indptr=indptr, indices=indices, x=self.x[nodes], meta=dict(self.meta))

    def to_undirected(self) -> Graph:
        """Add the reverse of every edge (duplicates merged)."""
        src, dst = self.edge_index()
        indptr, indices = csc_from_edges(
            src, dst, self.num_nodes, undirected=True, remove_self_loops=False
        )
        return self.with_structure(indptr, indices)

    def induced_subgraph(self, nodes: Tensor) -> Graph:
        """The subgraph on ``nodes`` (relabelled to ``0..len(nodes)-1`` in the given order)."""
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
