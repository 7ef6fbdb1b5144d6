"""The DataModule of ``strategy=ddp``."""

from __future__ import annotations

from ...kit.sampled import SampledDataModule
from .config import DDPConfig


class DataParallelDataModule(SampledDataModule):
    """Each rank samples its share of every step's seeds from the whole graph it holds.

    Args: as :class:`~...kit.datamodule.GNNDataModule`; ``config`` defaults to ``DDPConfig()``.
    """

    def __init__(self, dataset, config: DDPConfig | None = None, data=None, **kwargs):
        config = config or DDPConfig()
        super().__init__(dataset, config, data, salt_by_rank=config.salt_by_rank, **kwargs)
