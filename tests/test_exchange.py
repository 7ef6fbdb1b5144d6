"""exchange_rows: forward equals direct indexing, gradients equal the unsharded computation."""

from __future__ import annotations

import pytest
import torch

from lightning_gnnscale.comm import Comm, CommMeter, exchange_rows
from tests.helpers.dist import run_distributed

# Rows of a 7-row global matrix: rank 0 owns rows 0-3, rank 1 rows 4-6, rank 2 none.
OWNED = [[0, 1, 2, 3], [4, 5, 6], []]
# Rows each rank consumes, repeats and own rows included; rank 1 consumes nothing.
NEEDED = [[5, 0, 6, 2, 5], [], [0, 3, 4, 0, 6]]
NUM_ROWS = 7


def _owner(row: int) -> int:
    return next(rank for rank, rows in enumerate(OWNED) if row in rows)


def _received_order(consumer: int) -> list[int]:
    """Global rows as ``consumer`` receives them: grouped by owner rank, request order within."""
    return sorted(NEEDED[consumer], key=_owner)


def _plan(rank: int, world_size: int) -> tuple[torch.Tensor, list[int], list[int]]:
    """``send_index`` (local rows, grouped by consumer), send and receive splits of ``rank``."""
    local = {row: i for i, row in enumerate(OWNED[rank])}
    per_consumer = [[local[r] for r in NEEDED[q] if _owner(r) == rank] for q in range(world_size)]
    send_index = torch.tensor([i for rows in per_consumer for i in rows], dtype=torch.int64)
    recv = [sum(_owner(r) == p for r in NEEDED[rank]) for p in range(world_size)]
    return send_index, [len(rows) for rows in per_consumer], recv


def _global_x(shape_tail: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn((NUM_ROWS, *shape_tail), generator=generator, dtype=torch.float64).to(dtype)


def _loss(received: torch.Tensor, consumer: int) -> torch.Tensor:
    """A per-consumer loss that is non-linear in the rows and weights each position."""
    generator = torch.Generator().manual_seed(100 + consumer)
    weights = torch.randn(received.shape, generator=generator, dtype=torch.float64).to(
        received.dtype
    )
    return (received * weights).sum() + 0.5 * (received**2).sum()


CASES = {  # name -> (trailing shape, dtype, x requires grad, pass recv_splits)
    "float64": ((4,), torch.float64, True, True),
    "counts_exchanged": ((4,), torch.float64, True, False),
    "heads_float32": ((2, 3), torch.float32, True, True),
    "zero_width": ((0,), torch.float64, True, True),
    "no_grad_input": ((4,), torch.float64, False, True),
}


def _exchange_case(rank: int, world_size: int) -> dict:
    comm = Comm.create(CommMeter(), timeout_s=30)
    send_index, send_splits, recv_splits = _plan(rank, world_size)
    results = {}
    for name, (tail, dtype, requires_grad, pass_recv) in CASES.items():
        x_local = _global_x(tail, dtype)[OWNED[rank]].clone().requires_grad_(requires_grad)
        before = comm.meter.snapshot()
        received = exchange_rows(
            x_local * 3, send_index, send_splits, recv_splits if pass_recv else None, comm
        )
        forward = comm.meter.delta(before)
        loss = _loss(received, rank)
        if requires_grad:
            loss.backward()
        results[name] = {
            "received": received.detach(),
            "grad": x_local.grad,
            "forward": forward,
            "total": comm.meter.delta(before),
        }
    return results


@pytest.mark.dist
def test_exchange_matches_unsharded_computation_on_three_ranks():
    world_size = 3
    results = run_distributed(_exchange_case, world_size, timeout_s=60)
    for name, (tail, dtype, requires_grad, pass_recv) in CASES.items():
        x = _global_x(tail, dtype).requires_grad_(requires_grad)
        total = sum(_loss(x[_received_order(q)] * 3, q) for q in range(world_size))
        if requires_grad:
            total.backward()
        row_bytes = torch.Size(tail).numel() * x.element_size()
        for rank, result in enumerate(results):
            case = result[name]
            assert torch.equal(case["received"], (x[_received_order(rank)] * 3).detach()), name
            _, send_splits, recv_splits = _plan(rank, world_size)
            sent = sum(n for q, n in enumerate(send_splits) if q != rank) * row_bytes
            returned = sum(n for p, n in enumerate(recv_splits) if p != rank) * row_bytes
            assert case["forward"]["bytes"]["activation"] == sent, (name, rank)
            assert case["forward"]["bytes"]["control"] == (0 if pass_recv else 8 * 2), (name, rank)
            if requires_grad:
                torch.testing.assert_close(case["grad"], x.grad[OWNED[rank]], rtol=1e-6, atol=1e-6)
                assert case["total"]["bytes"]["activation_grad"] == returned, (name, rank)
            else:
                assert case["grad"] is None
                assert case["total"]["bytes"]["activation_grad"] == 0
    # rank 1 receives nothing and rank 2 owns nothing, yet both took part in every collective.
    assert results[1]["float64"]["received"].shape == (0, 4)
    assert results[2]["float64"]["grad"].shape == (0, 4)
    messages = [result["float64"]["forward"]["messages"]["activation"] for result in results]
    assert messages == [1, 2, 0]  # one per non-empty send to another rank


def test_exchange_single_process_is_a_permutation_with_scatter_add_backward():
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    send_index = torch.tensor([4, 0, 0, 2])
    comm = Comm.local()
    received = exchange_rows(x, send_index, [4], [4], comm)
    assert torch.equal(received, x[send_index])
    received.pow(2).sum().backward()
    expected = torch.zeros_like(x).index_add_(0, send_index, 2 * x.detach()[send_index])
    torch.testing.assert_close(x.grad, expected)
    assert sum(comm.meter.snapshot()["bytes"].values()) == 0
