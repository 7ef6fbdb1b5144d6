"""Differentiable row exchange: owners send rows to the ranks that consume them.

Forward: ``x[send_index]`` (rows grouped by destination rank) goes out in one all-to-all.
Backward: the consumers send the gradient rows back by the reverse all-to-all and the owner
adds them into ``grad_x`` at ``send_index`` (a row sent to several peers sums their gradients).

Collective ordering: the backward all-to-all runs iff autograd calls the backward, i.e. iff
``x`` requires grad and the output reaches the loss. Both must hold on *every* rank or on
none — decide them from globally consistent facts (e.g. "input features are learnable"),
never from local emptiness. A rank with zero rows still calls ``exchange_rows`` and still
connects its (empty) output to its loss, so autograd still runs its backward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lightning_gnnscale.comm.collectives import Comm


class _ExchangeRows(torch.autograd.Function):
    """Rows ``x[send_index]`` to their peers (all-to-all); backward returns the gradient rows
    the same way and adds them into ``grad_x`` ``[x.shape]`` at ``send_index``."""

    @staticmethod
    def forward(ctx, x, send_index, send_splits, recv_splits, comm, category, grad_category):
        ctx.save_for_backward(send_index)
        ctx.exchange = (x.shape, send_splits, recv_splits, comm, grad_category)
        rows = x.index_select(0, send_index)
        return comm.all_to_all_single(rows, send_splits, recv_splits, category=category)

    @staticmethod
    def backward(ctx, grad_out):
        (send_index,) = ctx.saved_tensors
        x_shape, send_splits, recv_splits, comm, grad_category = ctx.exchange
        grad_rows = comm.all_to_all_single(
            grad_out.contiguous(), recv_splits, send_splits, category=grad_category
        )
        grad_x = grad_out.new_zeros(x_shape).index_add_(0, send_index, grad_rows)
        return grad_x, None, None, None, None, None, None


def exchange_rows(
    x: Tensor,
    send_index: Tensor,
    send_splits: Sequence[int] | Tensor,
    recv_splits: Sequence[int] | Tensor | None,
    comm: Comm,
    category: str = "activation",
    grad_category: str = "activation_grad",
) -> Tensor:
    """Send rows of ``x`` to the ranks that need them; return the rows this rank receives.

    Args:
        x: ``[n_local, ...]`` rows this rank owns (any trailing shape, same on every rank).
        send_index: int64 ``[sum(send_splits)]`` rows of ``x`` to send, grouped by destination
            rank in rank order; a row may appear several times.
        send_splits: rows sent to each rank (``world_size`` counts, this rank's own included).
        recv_splits: rows received from each rank, or ``None`` to exchange counts first
            (counted as ``control``).
        comm: the metered communicator; forward bytes are counted under ``category``,
            backward bytes under ``grad_category``.

    Returns:
        ``[sum(recv_splits), ...]`` received rows, grouped by source rank in rank order.
    """
    if recv_splits is None:
        recv_splits = comm.exchange_splits(send_splits)
    return _ExchangeRows.apply(
        x, send_index, send_splits, recv_splits, comm, category, grad_category
    )
