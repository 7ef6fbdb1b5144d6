"""GNN layers over one bipartite :class:`Block` (sources ``x_src``, destinations = a prefix).

Every layer maps ``(block, x_src [n_src, in]) -> [n_dst, out]`` and depends only on a
destination's own row, its sampled in-neighbours' rows and the parameters. That makes each layer
"split-safe": a system may compute different destinations on different processes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import GATConv, SAGEConv

from ..graph.block import Block


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
