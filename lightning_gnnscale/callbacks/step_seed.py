"""Per-step dropout seed: a resumed run continues exactly as the uninterrupted one."""

from __future__ import annotations

import lightning as L
import torch

from ..graph.sampler import splitmix64_int


def step_key(seed: int, epoch: int, step: int, rank: int) -> int:
    """The 63-bit generator seed of one rank's step (splitmix64 of the run seed and the keys)."""
    key = splitmix64_int(seed ^ splitmix64_int((epoch << 40) ^ (step << 8) ^ rank))
    return key & ((1 << 63) - 1)


def seed_step_generators(key: int, device: torch.device) -> None:
    """Seed the CPU generator with ``key``, and ``device``'s generator when it is an accelerator.

    Equivalent, for these generators, to ``torch.manual_seed(key)``, without its lazy seeding of
    every accelerator (which formats a stack trace on each call while CUDA is not initialised).
    """
    torch.default_generator.manual_seed(key)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(key)
    elif device.type != "cpu":
        torch.manual_seed(key)  # other accelerators: torch's own path


class StepSeed(L.Callback):
    """Seeds torch's RNG (dropout) from ``(seed, epoch, step, rank)`` before every step, so a run
    resumed from a checkpoint continues exactly as the uninterrupted run.

    Only the CPU generator and the module's device generator are seeded (see
    :func:`seed_step_generators`).
    """

    def __init__(self, seed: int):
        self.seed = seed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        key = step_key(self.seed, trainer.current_epoch, batch_idx, trainer.global_rank)
        seed_step_generators(key, pl_module.device)
