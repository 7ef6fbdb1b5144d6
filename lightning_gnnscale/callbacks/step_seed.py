"""Per-step dropout seed: a resumed run continues exactly as the uninterrupted one."""

from __future__ import annotations

import lightning as L
import torch

from ..graph.sampler import splitmix64_int


class StepSeed(L.Callback):
    """Seeds torch's RNG (dropout) from ``(seed, epoch, step, rank)`` before every step, so a run
    resumed from a checkpoint continues exactly as the uninterrupted run."""

    def __init__(self, seed: int):
        self.seed = seed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        key = splitmix64_int(
            self.seed
            ^ splitmix64_int((trainer.current_epoch << 40) ^ (batch_idx << 8) ^ trainer.global_rank)
        )
        torch.manual_seed(key & ((1 << 63) - 1))
