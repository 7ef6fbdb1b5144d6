"""GNN layers over one bipartite :class:`Block` (sources ``x_src``, destinations = a prefix).

Every layer maps ``(block, x_src [n_src, in]) -> [n_dst, out]`` and depends only on a
destination's own row, its sampled in-neighbours' rows and the parameters. That makes each layer
"split-safe": a system may compute different destinations on different processes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATConv, SAGEConv

from ..graph.block import Block


def keep_threshold(p: float) -> tuple[int, int]:
    """``(threshold, levels)`` of :func:`row_dropout`: an element is kept when its uniform
    integer in ``[0, levels)`` is below ``threshold``.

    One random byte per element (``levels = 256``) when the keep probability ``1 - p`` is a
    multiple of 1/256 (0.5, 0.25, 0.75...: exact); otherwise two bytes (``levels = 65536``) and
    the keep probability is ``round((1 - p) * 65536) / 65536``, within 2**-17 of ``1 - p``.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    keep = 1.0 - p
    if float(keep * 256).is_integer():
        return int(keep * 256), 256
    return round(keep * 65536), 65536


def row_dropout(h: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of ``h`` (any shape) with masks from random bytes; returns ``h``'s shape.

    Same contract as ``F.dropout``: an element is kept with probability ``q`` (see
    :func:`keep_threshold`; ``q = 1 - p`` exactly for ``p`` a multiple of 1/256) and scaled
    by ``1 / q``, so the expectation is ``h`` exactly. On CPU the mask comes from 64-bit words
    of torch's default generator (so :class:`~lightning_gnnscale.callbacks.StepSeed` keys it per
    step, as it keys ``F.dropout``), compared byte- or 16-bit-wise with the threshold: about a
    twentieth of the cost of ``bernoulli_``, which draws one generator call per element.
    Other devices use ``F.dropout`` (its masks are already cheap there).
    """
    if not training or p == 0.0:
        return h
    if h.device.type != "cpu":
        return F.dropout(h, p, training=True)
    threshold, levels = keep_threshold(p)
    if threshold == 0:
        return h * 0.0
    n = h.numel()
    width = 1 if levels == 256 else 2
    words = torch.empty(-(-n * width // 8), dtype=torch.int64)
    words.random_(-(2**63), None)  # every bit uniform (random_() alone leaves the top bit 0)
    if levels == 256:
        keep = words.view(torch.uint8)[:n] < threshold
    else:
        keep = words.view(torch.int16)[:n] < threshold - 32768
    mask = keep.view(h.shape).to(h.dtype).mul_(levels / threshold)
    return h * mask


class BlockGCN(nn.Module):
    """GCN layer ``h_v = W (x_v/(d_v+1) + sum_u x_u / sqrt((d_u+1)(d_v+1))) + b``.

    ``d`` are full-graph in-degrees carried by the block, so the normalisation of an edge never
    depends on what else was sampled (exact across split and partitioned systems). With the
    full neighbourhood this is Kipf & Welling's symmetric normalisation with self-loops.
    """

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        z = self.lin(x_src)
        src, dst = block.edge_index
        inv_sqrt = torch.rsqrt(block.src_deg.to(z.dtype) + 1.0)
        weight = (inv_sqrt[src] * inv_sqrt[dst]).unsqueeze(1)
        n_dst = block.num_dst
        out = z[:n_dst] * (inv_sqrt[:n_dst] ** 2).unsqueeze(1)
        return out.index_add(0, dst, z[src] * weight) + self.bias


class BlockSAGE(nn.Module):
    """GraphSAGE-mean (PyG ``SAGEConv``): ``W_r x_v + W_l mean_u x_u``; no neighbours -> mean 0."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.conv = SAGEConv(in_dim, out_dim, aggr="mean")

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        n_dst = block.num_dst
        return self.conv((x_src, x_src[:n_dst]), block.edge_index, size=(block.num_src, n_dst))


class BlockGAT(nn.Module):
    """GAT (PyG ``GATConv``): attention over sampled in-neighbours plus the self loop.

    Hidden layers concatenate ``heads`` heads of ``out_dim // heads`` channels; the output layer
    uses ``concat=False`` (heads averaged). ``attention_dropout`` drops attention coefficients
    in training, as in the GAT paper.
    """

    def __init__(
        self, in_dim: int, out_dim: int, heads: int, concat: bool, attention_dropout: float = 0.0
    ):
        super().__init__()
        if concat and out_dim % heads:
            raise ValueError(f"GAT hidden size {out_dim} must be divisible by heads={heads}")
        per_head = out_dim // heads if concat else out_dim
        self.conv = GATConv(
            in_dim,
            per_head,
            heads=heads,
            concat=concat,
            add_self_loops=True,
            dropout=attention_dropout,
        )

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        n_dst = block.num_dst
        return self.conv((x_src, x_src[:n_dst]), block.edge_index, size=(block.num_src, n_dst))
