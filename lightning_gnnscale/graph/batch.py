"""The mini-batch a DataModule hands to a strategy (DESIGN §3)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .block import Block


@dataclass
class Batch:
    """One rank's share of one training step.

    Attributes:
        blocks: the sampled layers, input layer first; ``blocks[-1].dst_ids`` are this rank's seeds.
        x: input rows ``[blocks[0].num_src, F]`` in ``blocks[0].src_ids`` order.
        y: labels of this rank's seeds ``[n_seeds]``.
        global_seed_count: seeds of this step summed over all ranks (the loss denominator).
        epoch, step: the sampling keys of this step.
        stats: timings and counts for callbacks (``sample_s``, ``load_s``, ``input_nodes``...).
    """

    blocks: list[Block]
    x: Tensor
    y: Tensor
    global_seed_count: int
    epoch: int = 0
    step: int = 0
    stats: dict = field(default_factory=dict)

    @property
    def num_seeds(self) -> int:
        return self.y.numel()

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            [b.to(device) for b in self.blocks],
            self.x.to(device),
            self.y.to(device),
            self.global_seed_count,
            self.epoch,
            self.step,
            self.stats,
        )
