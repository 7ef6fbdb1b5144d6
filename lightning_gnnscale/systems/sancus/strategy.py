"""``SancusStrategy``: the DDP process group without the DDP wrapper
(docs/systems/sancus.md#what-is-implemented, "Gradients").

Broadcasts rank 0's initial weights through ``comm`` (``parameter``) and sums every parameter
gradient over ranks itself after backward (one flat ``all_reduce``, ``gradient``): the loss is
already divided by the global train count, so the sum is the single-process gradient of the
computed forward. The net's layers broadcast the embeddings themselves (``SancusGCN``).
"""

from __future__ import annotations

import torch
from typing_extensions import override

from ...comm import Comm
from ...kit.strategies import MeteredDDPStrategy
from .config import SancusConfig


class SancusStrategy(MeteredDDPStrategy):
    """DDP's process group and metered ``comm``, no DDP wrapper; gradients summed by hand.

    Args: as :class:`~...kit.strategies.MeteredDDPStrategy` (``config``: a :class:`SancusConfig`;
    ``None``, as with ``L.Trainer(strategy="sancus")``, adopts the DataModule's).
    """

    config_type = SancusConfig

    @override
    def configure_ddp(self) -> None:
        self.broadcast_initial_weights()  # and no DDP wrapper: gradients are summed below

    @override
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
