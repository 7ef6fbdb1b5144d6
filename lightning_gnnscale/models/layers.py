"""GNN layers over one bipartite :class:`Block` (sources ``x_src``, destinations = a prefix).

Every layer maps ``(block, x_src [n_src, in]) -> [n_dst, out]`` and depends only on a
destination's own row, its sampled in-neighbours' rows and the parameters. That makes each layer
"split-safe": a system may compute different destinations on different processes.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
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


def _csr_product(crow: Tensor, col: Tensor, values: Tensor, x: Tensor) -> Tensor:
    """``A @ x``, ``A`` ``[crow.numel() - 1, x.shape[0]]`` in CSR: on CPU torch's sum-reduce
    kernel (a row's terms summed in their order; faster than MKL's product here), elsewhere
    the sparse library's product."""
    with warnings.catch_warnings():  # torch flags sparse CSR as beta, once per process
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
        a = torch.sparse_csr_tensor(
            crow, col, values, (crow.numel() - 1, x.shape[0]), check_invariants=False
        )
    return torch.sparse.mm(a, x, "sum") if x.device.type == "cpu" else a @ x


class _CSRProduct(torch.autograd.Function):
    """``A @ x`` for ``A`` ``[n_dst, n_src]`` in CSR; the backward ``A^T @ grad`` through the
    transposed CSR (built only when ``x`` needs a gradient), rows in increasing destination."""

    @staticmethod
    def forward(ctx, x: Tensor, crow: Tensor, col: Tensor, values: Tensor) -> Tensor:
        ctx.save_for_backward(crow, col, values)
        ctx.num_src = x.shape[0]
        return _csr_product(crow, col, values, x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        crow, col, values = ctx.saved_tensors
        n_dst, n_src = crow.numel() - 1, ctx.num_src
        row = torch.repeat_interleave(
            torch.arange(n_dst, device=crow.device), crow.diff(), output_size=col.numel()
        )
        order = torch.argsort(col, stable=True)
        t_crow = torch.zeros(n_src + 1, dtype=crow.dtype, device=crow.device)
        torch.cumsum(torch.bincount(col, minlength=n_src), 0, out=t_crow[1:])
        grad_x = _csr_product(t_crow, row[order], values[order], grad.contiguous())
        return grad_x, None, None, None


def neighbour_sum(
    block: Block, x: Tensor, weight: Tensor | None = None, mean: bool = False
) -> Tensor:
    """``out_v = sum_{(u, v) in block} weight_uv x_u`` for every destination ``v``, in edge order
    (``mean``: divided by ``v``'s number of in-edges; 0 without any).

    A CSR sparse-dense product (``Block.edge_index`` grouped by destination is already CSR;
    other orders are stably sorted first, the same sums): no ``[E, F]`` tensor of per-edge
    rows, in the forward or the backward. ``weight``: ``[E]`` per-edge factors (default 1),
    never differentiated. Shapes: ``x`` ``[n_src, F]`` -> ``[n_dst, F]``.
    """
    src, dst = block.edge_index
    n_dst = block.num_dst
    if src.numel() and int(src.max()) >= x.shape[0]:  # the CSR product reads unchecked
        raise IndexError(
            f"the block's edges read source row {int(src.max())} but x has {x.shape[0]} rows "
            f"(the block has {block.num_src} sources)"
        )
    if dst.numel() > 1 and not bool((dst[1:] >= dst[:-1]).all()):
        order = torch.argsort(dst, stable=True)
        src, dst = src[order], dst[order]
        weight = None if weight is None else weight[order]
    crow = torch.zeros(n_dst + 1, dtype=torch.int64, device=dst.device)
    torch.cumsum(torch.bincount(dst, minlength=n_dst), 0, out=crow[1:])
    values = torch.ones_like(src, dtype=x.dtype) if weight is None else weight.to(x.dtype)
    out = _CSRProduct.apply(x.contiguous(), crow, src, values.detach())
    if not mean:
        return out
    return out / crow.diff().clamp_(min=1).to(out.dtype).unsqueeze(1)


class BlockGCN(nn.Module):
    """GCN layer ``h_v = W (x_v/(d_v+1) + sum_u x_u / sqrt((d_u+1)(d_v+1))) + b``.

    ``d`` are full-graph in-degrees carried by the block, so the normalisation of an edge never
    depends on what else was sampled (exact across split and partitioned systems). With the
    full neighbourhood this is Kipf & Welling's symmetric normalisation with self-loops.
    The sum is :func:`neighbour_sum`'s sparse product, over ``W x`` when ``in_dim > out_dim``
    (fewer columns to sum), else over ``x`` before ``W`` (fewer rows to project).

    Args:
        in_dim, out_dim: input and output widths.

    Shapes: ``(block, x_src [n_src, in_dim]) -> [n_dst, out_dim]``.
    """

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        src, dst = block.edge_index
        inv_sqrt = torch.rsqrt(block.src_deg.to(x_src.dtype) + 1.0)
        n_dst = block.num_dst
        self_weight = (inv_sqrt[:n_dst] ** 2).unsqueeze(1)
        edge_weight = inv_sqrt[src] * inv_sqrt[dst]
        if self.lin.in_features > self.lin.out_features:
            z = self.lin(x_src)
            out = z[:n_dst] * self_weight + neighbour_sum(block, z, edge_weight)
        else:
            h = x_src[:n_dst] * self_weight + neighbour_sum(block, x_src, edge_weight)
            out = self.lin(h)
        return out + self.bias


class BlockSAGE(nn.Module):
    """GraphSAGE-mean, PyG ``SAGEConv``'s layer: ``W_l mean_u x_u + b + W_r x_v``; no neighbours
    -> mean 0.

    The parameters are a PyG ``SAGEConv``'s (``conv.lin_l``, ``conv.lin_r``: its names and
    initialisation); the mean is :func:`neighbour_sum`'s sparse product divided by the
    in-degree, over ``W_l x`` when ``in_dim > out_dim`` (the mean is linear, as DGL's
    ``SAGEConv`` does), else over ``x`` before ``W_l``.

    Args:
        in_dim, out_dim: input and output widths.

    Shapes: ``(block, x_src [n_src, in_dim]) -> [n_dst, out_dim]``.
    """

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.conv = SAGEConv(in_dim, out_dim, aggr="mean")

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        n_dst = block.num_dst
        lin_l, lin_r = self.conv.lin_l, self.conv.lin_r
        if lin_l.in_channels > lin_l.out_channels:
            out = neighbour_sum(block, F.linear(x_src, lin_l.weight), mean=True) + lin_l.bias
        else:
            out = lin_l(neighbour_sum(block, x_src, mean=True))
        return out + lin_r(x_src[:n_dst])


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
