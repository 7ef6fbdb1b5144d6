"""``SancusStrategy``: the DDP process group without the DDP wrapper (spec §4.4).

Broadcasts rank 0's initial weights through ``comm`` (``parameter``), advances the SANCUS epoch
counter once per training step, and sums every parameter gradient over ranks itself after
backward (one flat ``all_reduce``, ``gradient``): the loss is already divided by the global
train count, so the sum is the single-process gradient of the computed forward.
"""

from __future__ import annotations

import torch

from ...comm import Comm
from ..base import MeteredDDPStrategy


class SancusStrategy(MeteredDDPStrategy):
    def configure_ddp(self) -> None:
        self.broadcast_initial_weights()  # and no DDP wrapper: gradients are summed below

    def training_step(self, *args, **kwargs):
        self.lightning_module.net.runtime.start_epoch()
        return super().training_step(*args, **kwargs)

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        sum_gradients(self.comm, list(self.lightning_module.parameters()))


def sum_gradients(comm: Comm, params: list[torch.Tensor]) -> None:
    """Replace every gradient by its sum over ranks: one flat ``all_reduce`` (``gradient``)."""
    params = [p for p in params if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = comm.all_reduce(torch.cat([g.flatten() for g in grads]), category="gradient")
    offset = 0
    for param, grad in zip(params, grads):
        param.grad = flat[offset : offset + grad.numel()].view_as(param).clone()
        offset += grad.numel()
