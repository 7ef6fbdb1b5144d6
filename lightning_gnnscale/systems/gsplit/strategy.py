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
        """``hook(i, h)``: shuffle before layer ``i``. Records the bytes this rank receives from
        other ranks per layer in ``self.bytes_received`` (on the strategy, because DDP's forward
        hands the model a rebuilt copy of the batch)."""
        self.bytes_received = [0] * len(batch.plans)

        def hook(i: int, h):
            row_bytes = h[0].numel() * h.element_size() if h.shape[0] else 0
            self.bytes_received[i] = batch.stats["rows_received"][i] * row_bytes
            return shuffle(h, batch.plans[i], self.comm)

        return hook
