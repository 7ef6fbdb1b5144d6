"""The mini-batch a DataModule hands to a strategy (docs/architecture.md, "Contract types")."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from .block import Block


@dataclass
class Batch:
    """One rank's share of one training step.

    Attributes:
        blocks: the sampled layers, input layer first; ``blocks[-1].dst_ids`` are this rank's seeds.
        x: input rows ``[blocks[0].num_src, F]`` in ``blocks[0].src_ids`` order.
        y: the task's targets of this rank's seeds (``[n_seeds]`` labels or ``[n_seeds, d]``).
        global_seed_count: seeds of this step summed over all ranks (the loss denominator).
        epoch, step: the sampling keys of this step.
        stats: timings and counts for callbacks (``sample_s``, ``load_s``, ``input_nodes``...).
        seed_weight: optional per-seed loss weights ``[n_seeds]`` (Grappa's ``estimator=node``);
            ``None`` weighs every seed 1.
        learned_inputs: the DataModule's learnable input rows (``kit.embeddings.LearnableInputs``)
            when the step must look its learned rows up (the strategy does, in the training
            step); ``None``: ``x`` is the whole input.
    """

    blocks: list[Block]
    x: Tensor
    y: Tensor
    global_seed_count: int
    epoch: int = 0
    step: int = 0
    stats: dict = field(default_factory=dict)
    seed_weight: Tensor | None = field(default=None, kw_only=True)  # keeps subclasses positional
    learned_inputs: Any = field(default=None, kw_only=True)

    @property
    def num_seeds(self) -> int:
        return self.y.shape[0]

    def to(self, device: torch.device | str) -> Batch:
        """A copy on ``device`` (of the same class, so subclasses keep their extra fields)."""
        return replace(
            self,
            blocks=[b.to(device) for b in self.blocks],
            x=self.x.to(device),
            y=self.y.to(device),
            seed_weight=None if self.seed_weight is None else self.seed_weight.to(device),
        )
