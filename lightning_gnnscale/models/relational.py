"""Relational layers over one typed :class:`Block` (sources ``x_src``, destinations a prefix).

Like :mod:`.layers`, each maps ``(block, x_src [n_src, in]) -> [n_dst, out]`` from a
destination's own row and its sampled in-neighbours' rows only, so it is split-safe: a system
may compute different destinations on different processes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..graph.block import Block


class BlockRGCN(nn.Module):
    r"""Relational GCN layer (Schlichtkrull et al., 2018) with a mean per relation.

    .. math::
        h_v = W_0 x_v + \sum_{r} \frac{1}{|N_r(v)|} \sum_{u \in N_r(v)} W_r x_u + b

    ``N_r(v)`` are ``v``'s sampled in-neighbours under relation ``r`` (a relation with none
    adds nothing). With ``num_bases > 0`` the relation weights share a basis,
    ``W_r = \sum_b a_{rb} V_b`` (basis decomposition). PyG's ``RGCNConv(aggr="mean")`` and
    DGL's ``RelGraphConv`` compute the same rows; this one projects the sources once for every
    relation and gathers one projected row per edge.

    Args:
        in_dim, out_dim: input and output widths.
        num_relations: ``R``; a block without ``edge_type`` (a homogeneous graph) is relation 0
            (refused when ``R > 1``: a typed block must carry its relations).
        num_bases: ``0``: a full weight per relation; else the number of basis matrices
            (``<= R``).

    Shapes:
        block: ``edge_index [2, E_b]``, ``edge_type [E_b]`` in ``[0, R)``;
        x_src ``[n_src, in]`` -> ``[n_dst, out]``.
    """

    def __init__(self, in_dim: int, out_dim: int, num_relations: int, num_bases: int = 0):
        super().__init__()
        if num_relations < 1:
            raise ValueError(f"RGCN needs num_relations >= 1, got {num_relations}")
        if not 0 <= num_bases <= num_relations:
            raise ValueError(f"RGCN num_bases={num_bases} must be in [0, {num_relations}]")
        self.in_dim, self.out_dim = in_dim, out_dim
        self.num_relations, self.num_bases = num_relations, num_bases
        count = num_bases or num_relations
        self.weight = nn.Parameter(torch.empty(count, in_dim, out_dim))
        self.comp = nn.Parameter(torch.empty(num_relations, num_bases)) if num_bases else None
        self.root = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        bound = 1.0 / math.sqrt(in_dim)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.comp is not None:
            nn.init.uniform_(self.comp, -1.0 / math.sqrt(num_bases), 1.0 / math.sqrt(num_bases))

    def relation_weights(self) -> Tensor:
        """``[R, in, out]``: every relation's weight (combined from the basis if any)."""
        if self.comp is None:
            return self.weight
        return torch.einsum("rb,bio->rio", self.comp, self.weight)

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        n_dst, num_rel = block.num_dst, self.num_relations
        src, dst = block.edge_index
        kind = block_relations(block, num_rel)
        projected = _relation_projection(x_src, self.relation_weights())  # [n_src, R * out]
        messages = projected.view(-1, self.out_dim).index_select(0, src * num_rel + kind)
        slot = dst * num_rel + kind
        count = torch.bincount(slot, minlength=n_dst * num_rel).clamp_(min=1)
        messages = messages / count.index_select(0, slot).to(messages.dtype).unsqueeze(1)
        out = self.root(x_src[:n_dst]).index_add(0, dst, messages)
        return out + self.bias


def block_relations(block: Block, num_relations: int) -> Tensor:
    """The relation of each block edge: ``block.edge_type``; a block without relations (a
    homogeneous graph's) is relation 0, which only a one-relation layer accepts."""
    if block.edge_type is None:
        if num_relations > 1:
            raise ValueError(
                f"a {num_relations}-relation layer got a block without edge_type: the path "
                "that built it dropped the typed graph's relations"
            )
        return torch.zeros_like(block.edge_index[0])
    return block.edge_type


def _relation_projection(x: Tensor, weights: Tensor) -> Tensor:
    """``[n, R * out]``: ``x`` projected by every relation's weight ``[R, in, out]`` at once
    (row ``u``'s relation-``r`` projection is ``.view(n * R, out)[u * R + r]``)."""
    num_rel, in_dim, out_dim = weights.shape
    return x @ weights.permute(1, 0, 2).reshape(in_dim, num_rel * out_dim)


def segment_softmax(scores: Tensor, group: Tensor, num_groups: int) -> Tensor:
    """Softmax of ``scores`` ``[E, H]`` over the rows of each ``group`` (``[E]`` in
    ``[0, num_groups)``), per column; the group maximum is subtracted first."""
    index = group.unsqueeze(1).expand_as(scores)
    peak = scores.new_full((num_groups, scores.shape[1]), float("-inf"))
    peak = peak.scatter_reduce(0, index, scores, "amax", include_self=True)
    weights = (scores - peak.index_select(0, group)).exp()
    total = torch.zeros_like(peak).index_add_(0, group, weights)
    return weights / total.index_select(0, group)


class BlockRGAT(nn.Module):
    r"""Relational graph attention (Busbridge et al., 2019; PyG's ``RGATConv`` with
    additive self-attention across relations) plus a self-loop weight.

    .. math::
        z^r_u = W_r x_u, \quad
        e_{uv} = \mathrm{LeakyReLU}\big(q^\top z^r_v + k^\top z^r_u\big), \quad
        \alpha_{uv} = \mathrm{softmax}_{u \in N(v)}(e_{uv}), \quad
        h_v = W_0 x_v + \sum_{u \in N(v)} \alpha_{uv} z^r_u + b

    per head; ``r`` is the edge's relation and the softmax runs over all of ``v``'s sampled
    in-edges, whatever their relation. ``concat``: the ``heads`` heads of ``out / heads``
    channels are concatenated, else averaged (:class:`~.gnn.BlockGNN` gives hidden layers
    ``model.heads`` concatenated heads and the output layer one, as for GAT).

    Args:
        in_dim, out_dim: input and output widths.
        num_relations: ``R``; a block without ``edge_type`` is relation 0 (refused when
            ``R > 1``).
        heads: attention heads.
        concat: concatenate the heads (``out_dim`` divisible by ``heads``), else average.
        num_bases: ``0``: a full weight per relation; else the basis matrices (``<= R``).
        attention_dropout: dropout on the attention coefficients in training.

    Shapes:
        block: ``edge_index [2, E_b]``, ``edge_type [E_b]``; x_src ``[n_src, in]`` ->
        ``[n_dst, out]``.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        num_relations: int,
        heads: int = 1,
        concat: bool = True,
        num_bases: int = 0,
        attention_dropout: float = 0.0,
        negative_slope: float = 0.2,
    ):
        super().__init__()
        if concat and out_dim % heads:
            raise ValueError(f"RGAT width {out_dim} must be divisible by heads={heads}")
        if not 0 <= num_bases <= num_relations:
            raise ValueError(f"RGAT num_bases={num_bases} must be in [0, {num_relations}]")
        self.heads, self.concat = heads, concat
        self.channels = out_dim // heads if concat else out_dim
        self.num_relations, self.num_bases = num_relations, num_bases
        self.attention_dropout, self.negative_slope = attention_dropout, negative_slope
        width = heads * self.channels
        count = num_bases or num_relations
        self.weight = nn.Parameter(torch.empty(count, in_dim, width))
        self.comp = nn.Parameter(torch.empty(num_relations, num_bases)) if num_bases else None
        self.q = nn.Parameter(torch.empty(width, heads))
        self.k = nn.Parameter(torch.empty(width, heads))
        self.root = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        for weight in (self.weight, self.q, self.k):
            nn.init.xavier_uniform_(weight)
        if self.comp is not None:
            nn.init.xavier_uniform_(self.comp)

    def relation_weights(self) -> Tensor:
        """``[R, in, heads * channels]``: every relation's weight."""
        if self.comp is None:
            return self.weight
        return torch.einsum("rb,bio->rio", self.comp, self.weight)

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        n_dst, num_rel, heads = block.num_dst, self.num_relations, self.heads
        src, dst = block.edge_index
        kind = block_relations(block, num_rel)
        width = heads * self.channels
        projected = _relation_projection(x_src, self.relation_weights()).view(-1, width)
        z_src = projected.index_select(0, src * num_rel + kind)  # [E, H * C]
        z_dst = projected.index_select(0, dst * num_rel + kind)  # destinations: a src prefix
        scores = nn.functional.leaky_relu(z_dst @ self.q + z_src @ self.k, self.negative_slope)
        alpha = segment_softmax(scores, dst, n_dst)  # [E, H]
        if self.training and self.attention_dropout > 0:
            alpha = nn.functional.dropout(alpha, self.attention_dropout)
        messages = (z_src.view(-1, heads, self.channels) * alpha.unsqueeze(2)).flatten(1)
        pooled = torch.zeros(n_dst, width, dtype=messages.dtype, device=messages.device)
        pooled = pooled.index_add_(0, dst, messages)
        if not self.concat:
            pooled = pooled.view(n_dst, heads, self.channels).mean(1)
        return self.root(x_src[:n_dst]) + pooled + self.bias
