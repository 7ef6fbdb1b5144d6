"""1-D row blocks of the GCN propagation matrix (docs/systems/sancus.md#what-is-implemented).

Nodes are relabelled so that rank ``i`` owns the contiguous rows ``R_i = [off_i, off_i+1)``.
Rank ``i`` keeps ``Â_ij = Â[R_i, R_j]`` for every ``j`` (sparse CSR), where
``Â = D̄^-1/2 (A + I) D̄^-1/2`` with full-graph in-degrees, exactly the suite's ``BlockGCN``.

A typed graph (docs/systems/sancus.md#typed-graphs) gives RGCN's propagation instead: one
mean-normalised ``Â_r`` per relation (``Â_r[v, u] = 1 / |N_r(v)|`` per in-edge ``u -> v`` of
relation ``r``, no self loop: RGCN's self term is its own weight), the ``R`` relations' rows
stacked into one CSR per column block (``[R * n_i, n_j]``, relation-major), and the transposed
blocks ``(Â_rᵀ)[R_i, R_j]`` the backward multiplies broadcast gradients with (``Â_r`` is not
symmetric).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from ...graph.csc import Graph


def normalized_adjacency(graph: Graph) -> tuple[Tensor, Tensor, Tensor]:
    """``Â`` as COO ``(rows, cols, values)``: row = destination, col = source, self loops added.

    Values are ``1/sqrt((d_u+1)(d_v+1))`` per in-edge ``u -> v`` and ``1/(d_v+1)`` on the
    diagonal (``d`` = in-degree), in the graph's feature dtype.
    """
    n = graph.num_nodes
    deg = graph.in_degree().to(graph.x.dtype)
    inv_sqrt = torch.rsqrt(deg + 1.0)
    dst, src = graph.dst_of_edges(), graph.indices
    loops = torch.arange(n)
    rows = torch.cat([dst, loops])
    cols = torch.cat([src, loops])
    values = torch.cat([inv_sqrt[src] * inv_sqrt[dst], inv_sqrt**2])
    return rows, cols, values


def relational_adjacency(graph: Graph) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A typed graph's ``Â_r`` as COO ``(relation, rows, cols, values)``: row = destination,
    col = source, value ``1 / |N_r(v)|`` (``|N_r(v)|``: ``v``'s in-edges of relation ``r``),
    in the graph's feature dtype; no self loops are added (RGCN's root weight is apart)."""
    n, num_rel = graph.num_nodes, graph.num_relations
    dst, src, kind = graph.dst_of_edges(), graph.indices, graph.edge_type
    slot = dst * num_rel + kind
    count = torch.bincount(slot, minlength=n * num_rel).to(graph.x.dtype)
    return kind, dst, src, 1.0 / count[slot]


def check_symmetric(graph: Graph) -> None:
    """SANCUS's δ broadcast relies on ``Â = Âᵀ``: every edge must be stored in both directions."""
    dst, src = graph.dst_of_edges(), graph.indices
    n = graph.num_nodes
    forward = torch.sort(dst * n + src).values  # multi-edges count: Â sums them
    backward = torch.sort(src * n + dst).values
    if not torch.equal(forward, backward):
        raise ValueError(
            f"SANCUS needs an undirected graph (Â symmetric); {graph.name!r} has edges stored in "
            "one direction only, or with different multiplicities in the two directions"
        )


@dataclass
class RowBlocks:
    """One rank's row block of ``Â`` split by column blocks.

    Attributes:
        rank: ``i``.
        offsets: int64 ``[P + 1]`` row-block boundaries (the same on every rank).
        blocks: ``P`` sparse CSR tensors, ``blocks[j] = Â_ij`` of shape ``[n_i, n_j]``;
            a typed graph's: ``[R * n_i, n_j]``, row ``r * n_i + a`` = ``Â_r[R_i, R_j]`` row ``a``.
        consumer: bool ``[P, P]``; ``consumer[k, j] = nnz(Â_kj) > 0`` for ``k != j`` (a typed
            graph: of any relation).
        seed_rows: int64 local positions of this rank's training seeds.
        num_relations: ``R`` of a typed graph's blocks; ``0``: GCN's ``Â`` (homogeneous).
        transposed: a typed graph's ``P`` CSR ``[R * n_i, n_j]`` of ``(Â_rᵀ)[R_i, R_j]`` (the
            backward's); ``None``: ``blocks`` (GCN's ``Â`` is symmetric).
    """

    rank: int
    offsets: Tensor
    blocks: list[Tensor]
    consumer: Tensor
    seed_rows: Tensor
    num_relations: int = 0
    transposed: list[Tensor] | None = None

    @property
    def backward_blocks(self) -> list[Tensor]:
        """The blocks the backward multiplies the broadcast output gradients with."""
        return self.blocks if self.transposed is None else self.transposed

    def backward_reads(self, j: int) -> bool:
        """Whether the backward reads root ``j``'s gradient rows (``Âᵀ_ij`` has entries)."""
        if self.transposed is None:
            return bool(self.consumer[self.rank, j])
        return bool(self.consumer[j, self.rank])

    @property
    def sizes(self) -> list[int]:
        return (self.offsets[1:] - self.offsets[:-1]).tolist()

    @property
    def world_size(self) -> int:
        return self.offsets.numel() - 1

    @property
    def num_rows(self) -> int:
        return self.sizes[self.rank]

    def to(self, device) -> RowBlocks:
        return RowBlocks(
            self.rank,
            self.offsets,
            [b.to(device) for b in self.blocks],
            self.consumer,
            self.seed_rows.to(device),
            self.num_relations,
            None if self.transposed is None else [b.to(device) for b in self.transposed],
        )


def consumer_matrix(graph: Graph, offsets: Tensor) -> Tensor:
    """bool ``[P, P]``: ``[k, j]`` is true when some row of block ``k`` reads a row of block
    ``j != k`` (an edge ``u -> v`` with ``u`` in ``R_j`` and ``v`` in ``R_k``)."""
    p = offsets.numel() - 1
    part_of = torch.bucketize(torch.arange(graph.num_nodes), offsets[1:], right=True)
    pairs = part_of[graph.dst_of_edges()] * p + part_of[graph.indices]
    consumer = torch.zeros(p * p, dtype=torch.bool)
    consumer[pairs] = True
    consumer = consumer.view(p, p)
    consumer.fill_diagonal_(False)
    return consumer


def row_blocks(graph: Graph, offsets: Tensor, rank: int, is_seed: Tensor) -> RowBlocks:
    """Rank ``rank``'s :class:`RowBlocks` of a graph already relabelled into row-block order
    (``is_seed``: bool ``[N]``, the task's training seeds in that order); a typed graph's
    per relation (with the transposed blocks)."""
    adjacency, consumer = _adjacency(graph), consumer_matrix(graph, offsets)
    return _row_blocks(graph, offsets, rank, is_seed, adjacency, consumer)


def every_row_block(graph: Graph, offsets: Tensor, is_seed: Tensor) -> Iterator[RowBlocks]:
    """Every rank's :class:`RowBlocks` in rank order, ``Â`` and the consumer matrix computed
    once (the partition step writes them all)."""
    adjacency, consumer = _adjacency(graph), consumer_matrix(graph, offsets)
    for rank in range(offsets.numel() - 1):
        yield _row_blocks(graph, offsets, rank, is_seed, adjacency, consumer)


def _adjacency(graph: Graph) -> tuple[Tensor, ...]:
    """GCN's ``Â`` as ``(rows, cols, values)``, or a typed graph's ``(relation, rows, cols,
    values)``."""
    return relational_adjacency(graph) if graph.is_typed else normalized_adjacency(graph)


def _row_blocks(
    graph: Graph,
    offsets: Tensor,
    rank: int,
    is_seed: Tensor,
    adjacency: tuple[Tensor, ...],
    consumer: Tensor,
) -> RowBlocks:
    lo, hi = int(offsets[rank]), int(offsets[rank + 1])
    seed_rows = is_seed[lo:hi].nonzero().flatten()
    if not graph.is_typed:
        blocks = _column_blocks(*adjacency, lo, hi, offsets)
        return RowBlocks(rank, offsets.clone(), blocks, consumer, seed_rows)
    num_rel = graph.num_relations
    kind, rows, cols, values = adjacency
    # rows of relation r stacked at r * n_i: the forward's blocks (destinations of R_i) and the
    # transposed ones (sources of R_i, so the columns are the destinations)
    blocks = _column_blocks(rows, cols, values, lo, hi, offsets, kind, num_rel)
    transposed = _column_blocks(cols, rows, values, lo, hi, offsets, kind, num_rel)
    return RowBlocks(rank, offsets.clone(), blocks, consumer, seed_rows, num_rel, transposed)


def _column_blocks(
    rows: Tensor,
    cols: Tensor,
    values: Tensor,
    lo: int,
    hi: int,
    offsets: Tensor,
    kind: Tensor | None = None,
    num_relations: int = 1,
) -> list[Tensor]:
    """The CSR ``[R * (hi - lo), n_j]`` of every column block ``j`` of the COO entries whose
    row is in ``[lo, hi)``; row ``r * (hi - lo) + (row - lo)`` for an entry of relation
    ``kind = r`` (``None``: one relation)."""
    mine = (rows >= lo) & (rows < hi)
    rows, cols, values = rows[mine] - lo, cols[mine], values[mine]
    if kind is not None:
        rows = rows + kind[mine] * (hi - lo)
    blocks = []
    for j in range(offsets.numel() - 1):
        c_lo, c_hi = int(offsets[j]), int(offsets[j + 1])
        keep = (cols >= c_lo) & (cols < c_hi)
        coo = torch.sparse_coo_tensor(
            torch.stack([rows[keep], cols[keep] - c_lo]),
            values[keep],
            (num_relations * (hi - lo), c_hi - c_lo),
            check_invariants=True,
        ).coalesce()
        with warnings.catch_warnings():  # "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            blocks.append(coo.to_sparse_csr())
    return blocks
