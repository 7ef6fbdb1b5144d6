"""The order in which an epoch visits the training nodes: the same on every rank.

Every system cuts an epoch's steps from one seeded permutation, so ranks agree on each step's
seeds without exchanging them and a resumed run visits them as the uninterrupted one.
"""

from __future__ import annotations

import torch

from .sampler import splitmix64_int


def epoch_permutation(ids: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
    """The same shuffled order of ``ids`` on every rank for ``(seed, epoch)``."""
    gen = torch.Generator().manual_seed(splitmix64_int((seed << 20) ^ epoch) & ((1 << 63) - 1))
    return ids[torch.randperm(ids.numel(), generator=gen)]


class EpochOrder:
    """``epoch_permutation(ids, seed, epoch)``, computed once per epoch rather than per step."""

    def __init__(self, ids: torch.Tensor, seed: int):
        self.ids, self.seed = ids, seed
        self._epoch, self._order = None, ids

    def __call__(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            self._epoch, self._order = epoch, epoch_permutation(self.ids, self.seed, epoch)
        return self._order

    def step(self, epoch: int, step: int, batch_size: int) -> torch.Tensor:
        """The ids of one step of ``batch_size``."""
        return self(epoch)[step * batch_size : (step + 1) * batch_size]
