"""``strategy=ddp``: every rank holds the whole graph and samples its share of each step.

This is what a PyG user does today; every system in the suite is compared with it. Lightning's
registry already has a ``ddp`` (its own, unmetered), so this one registers as ``metered_ddp``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...schema import SystemConfig
from ..base import MeteredDDPStrategy, SampledDataModule


@dataclass(frozen=True)
class DDPConfig(SystemConfig):
    """``strategy=ddp``.

    Args:
        salt_by_rank: ranks sample independent micro-batches (rank-salted keys), as real
            data-parallel training does; ``False``: exactly what one process would sample.
    """

    name: str = "ddp"
    salt_by_rank: bool = True

    NAMES = ("ddp",)
    accepts_custom_models = True
    batches_in_main_process = False  # sampled in DataLoader workers if asked


class DataParallelStrategy(MeteredDDPStrategy):
    """Plain data parallel: DDP's gradient all-reduce, metered; nothing else moves."""

    config_type = DDPConfig


class DataParallelDataModule(SampledDataModule):
    """Each rank samples its share of every step's seeds from the whole graph it holds.

    Args: as :class:`~..base.GNNDataModule`; ``config`` defaults to ``DDPConfig()``.
    """

    def __init__(self, dataset, config: DDPConfig | None = None, data=None, **kwargs):
        config = config or DDPConfig()
        super().__init__(dataset, config, data, salt_by_rank=config.salt_by_rank, **kwargs)
