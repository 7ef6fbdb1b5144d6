"""``GSplitStrategy``: DDP for gradients plus the split-parallel activation shuffle."""

from __future__ import annotations

from ..base import MeteredDDPStrategy
from .sampler import shuffle


class GSplitStrategy(MeteredDDPStrategy):
    """Before every layer, rows move from their owners to the ranks that consume them, on the
    dedicated data-exchange group (never interleaved with DDP's gradient buckets); autograd
    returns the gradient rows. Gradients are summed by the metered DDP hook, the loss being the
    sum over each rank's targets divided by the global mini-batch size: exact."""

    def layer_hook(self, batch):
        return lambda i, h: shuffle(h, batch.plans[i], self.comm)
