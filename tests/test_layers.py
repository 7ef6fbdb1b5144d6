"""The block layers' math against PyG's convolutions (independent oracles) and the sparse
neighbour sum against a per-edge reference, in float64, forward and backward."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch_geometric.nn import GCNConv

from lightning_gnnscale.graph.block import Block
from lightning_gnnscale.models.layers import BlockGCN, BlockSAGE, neighbour_sum

DIMS = [(7, 3), (3, 7), (5, 5)]  # in > out projects before the sum, the others after


def _block(num_src: int, num_dst: int, num_edges: int, grouped: bool = True) -> Block:
    """Random block; destination 0 has no in-edge (the mean must be 0 there)."""
    gen = torch.Generator().manual_seed(num_src * 31 + num_edges)
    dst = torch.randint(1, num_dst, (num_edges,), generator=gen)
    if grouped:
        dst = torch.sort(dst, stable=True).values
    src = torch.randint(0, num_src, (num_edges,), generator=gen)
    degree = torch.randint(0, 9, (num_src,), generator=gen)
    return Block(torch.arange(num_src), num_dst, torch.stack([src, dst]), degree)


def _whole_graph_block(num_nodes: int, num_edges: int) -> Block:
    """Every in-edge of a random graph (no self loops), ``src_deg`` its in-degrees."""
    gen = torch.Generator().manual_seed(num_nodes)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    order = torch.argsort(dst, stable=True)
    edge_index = torch.stack([src[order], dst[order]])
    degree = torch.bincount(dst, minlength=num_nodes)
    return Block(torch.arange(num_nodes), num_nodes, edge_index, degree)


def _grads(out: torch.Tensor, x: torch.Tensor, module: torch.nn.Module) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    upstream = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    return list(torch.autograd.grad(out, [x, *module.parameters()], upstream))


@pytest.mark.parametrize("in_dim, out_dim", DIMS)
@pytest.mark.parametrize("grouped", [True, False])
def test_block_sage_equals_pyg_sageconv(in_dim, out_dim, grouped):
    """The layer's own PyG ``SAGEConv`` (parameters and all) run through PyG's message
    passing is the oracle: outputs and every gradient, zero-in-degree destination included."""
    torch.manual_seed(0)
    layer = BlockSAGE(in_dim, out_dim).double()
    block = _block(40, 15, 120, grouped)
    x = torch.randn(40, in_dim, dtype=torch.float64, requires_grad=True)
    got = layer(block, x)
    want = layer.conv((x, x[:15]), block.edge_index, size=(40, 15))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
    for g, w in zip(_grads(got, x, layer), _grads(want, x, layer)):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-13)
    mean_zero = layer.conv.lin_r(x[:1])[0] + layer.conv.lin_l.bias  # no in-edge: mean 0
    torch.testing.assert_close(got[0], mean_zero, rtol=0, atol=1e-15)


@pytest.mark.parametrize("in_dim, out_dim", DIMS)
def test_block_gcn_equals_pyg_gcnconv_on_the_whole_graph(in_dim, out_dim):
    """With every in-edge and ``src_deg`` the in-degree, the layer is PyG's ``GCNConv``
    (symmetric normalisation with self loops) with the same weight and bias."""
    torch.manual_seed(0)
    layer = BlockGCN(in_dim, out_dim).double()
    with torch.no_grad():
        layer.bias.normal_()
    conv = GCNConv(in_dim, out_dim).double()
    conv.lin.weight.data.copy_(layer.lin.weight)
    conv.bias.data.copy_(layer.bias)
    block = _whole_graph_block(30, 150)
    x = torch.randn(30, in_dim, dtype=torch.float64, requires_grad=True)
    got = layer(block, x)
    torch.testing.assert_close(got, conv(x, block.edge_index), rtol=0, atol=1e-13)
    x_ref = x.detach().clone().requires_grad_()
    (grad_got,) = torch.autograd.grad(got.sum(), x)
    (grad_want,) = torch.autograd.grad(conv(x_ref, block.edge_index).sum(), x_ref)
    torch.testing.assert_close(grad_got, grad_want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("grouped", [True, False])
def test_neighbour_sum_equals_the_per_edge_sum(grouped):
    """Forward and gradient of ``x`` equal ``index_add`` over gathered rows, with per-edge
    weights (to rounding: the product may fuse multiply and add) and without (bitwise: the
    same terms summed in the same edge order; a gradient of grouped edges too); edges in any
    order."""
    block = _block(25, 10, 80, grouped)
    src, dst = block.edge_index
    x = torch.randn(25, 4, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(10, 4, dtype=torch.float64)
    for weight in [torch.rand(80, dtype=torch.float64), None]:
        factor = torch.ones(80, dtype=torch.float64) if weight is None else weight
        got = neighbour_sum(block, x, weight)
        want = torch.zeros(10, 4, dtype=torch.float64).index_add(0, dst, x[src] * factor[:, None])
        (grad_got,) = torch.autograd.grad(got, x, upstream)
        grad_want = torch.zeros(25, 4, dtype=torch.float64).index_add(
            0, src, upstream[dst] * factor[:, None]
        )
        if weight is None:
            assert torch.equal(got, want)
            assert torch.equal(grad_got, grad_want) or not grouped  # ungrouped: sorted first
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
        torch.testing.assert_close(grad_got, grad_want, rtol=0, atol=1e-14)


def test_neighbour_sum_of_an_edgeless_block_is_zero():
    block = Block(torch.arange(6), 4, torch.zeros(2, 0, dtype=torch.int64), torch.zeros(6).long())
    x = torch.randn(6, 3, requires_grad=True)
    out = neighbour_sum(block, x)
    assert torch.equal(out, torch.zeros(4, 3))
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.equal(grad, torch.zeros(6, 3))


class _Shapes(TorchDispatchMode):
    """Records the shape of every tensor each aten op returns."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append((str(func), tuple(t.shape)))
        return out


@pytest.mark.parametrize("kind", [BlockGCN, BlockSAGE])
@pytest.mark.parametrize("in_dim, out_dim", DIMS)
def test_layers_build_no_per_edge_rows(kind, in_dim, out_dim):
    """Forward and backward never build a ``[E, F]`` tensor (one row per edge): the sum is a
    sparse product, not a gather of source rows; the products (forward and backward) run at
    the narrower width (projection first when the layer narrows, as DGL's ``SAGEConv``)."""
    num_edges = 97  # no other size in the layer is 97
    layer = kind(in_dim, out_dim)
    block = _block(41, 13, num_edges)
    x = torch.randn(41, in_dim, requires_grad=True)
    with _Shapes() as seen:
        layer(block, x).sum().backward()
    per_edge = [(op, s) for op, s in seen.shapes if len(s) == 2 and s[0] == num_edges]
    assert not per_edge, per_edge
    assert any(s == (num_edges,) for _, s in seen.shapes)  # the mode saw the edge-level ops
    products = [s for op, s in seen.shapes if "sparse_mm_reduce" in op and len(s) == 2]
    assert sorted(products) == [(13, min(in_dim, out_dim)), (41, min(in_dim, out_dim))]


def test_the_sparse_product_refuses_rows_the_block_does_not_have():
    """The CSR product reads its columns unchecked: a block whose sources lie past ``x``'s
    rows (a net given the wrong rows) fails loudly, as a gather would."""
    from lightning_gnnscale.graph.block import Block
    from lightning_gnnscale.models.layers import neighbour_sum

    block = Block(
        torch.arange(5), 2, torch.tensor([[4, 3], [0, 1]]), torch.zeros(5, dtype=torch.long)
    )
    with pytest.raises(IndexError, match="source row 4 but x has 3 rows"):
        neighbour_sum(block, torch.randn(3, 2))
    assert neighbour_sum(block, torch.randn(5, 2)).shape == (2, 2)
