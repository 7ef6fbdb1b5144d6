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
        num_relations: ``R``; a block without ``edge_type`` (a homogeneous graph) is relation 0.
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
        kind = block.edge_type if block.edge_type is not None else torch.zeros_like(src)
        weights = self.relation_weights()  # [R, in, out]
        projected = x_src @ weights.permute(1, 0, 2).reshape(self.in_dim, num_rel * self.out_dim)
        messages = projected.view(-1, self.out_dim).index_select(0, src * num_rel + kind)
        slot = dst * num_rel + kind
        count = torch.bincount(slot, minlength=n_dst * num_rel).clamp_(min=1)
        messages = messages / count.index_select(0, slot).to(messages.dtype).unsqueeze(1)
        out = self.root(x_src[:n_dst]).index_add(0, dst, messages)
        return out + self.bias
