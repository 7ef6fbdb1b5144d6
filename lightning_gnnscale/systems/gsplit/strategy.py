"""``GSplitStrategy``: DDP for gradients plus the split-parallel row shuffle before each layer."""

from __future__ import annotations

import math

from ..base import MeteredDDPStrategy
from .sampler import shuffle


class GSplitStrategy(MeteredDDPStrategy):
    """Before every layer, rows move from their owners to the ranks that consume them (input
    features before layer 0, metered as ``feature``; hidden rows later, ``activation``), on the
    dedicated data-exchange group (never interleaved with DDP's gradient buckets); autograd
    returns the gradient rows. Gradients are summed by the metered DDP hook, the loss being the
    sum over each rank's targets divided by the global mini-batch size: exact."""

    def layer_hook(self, batch):
        """``hook(i, h)``: shuffle before layer ``i``. Records the bytes this rank receives from
        other ranks per layer in ``self.bytes_received`` (on the strategy, because DDP's forward
        hands the model a rebuilt copy of the batch)."""
        self.bytes_received = [0] * len(batch.plans)

        def hook(i: int, h):
            row_bytes = math.prod(h.shape[1:]) * h.element_size()  # also when h has no rows
            self.bytes_received[i] = batch.stats["rows_received"][i] * row_bytes
            return shuffle(h, batch.plans[i], self.comm, layer=i)

        return hook
