"""The DataModule of ``strategy=ddp``."""

from __future__ import annotations

from ...kit.sampled import SampledDataModule
from .config import DataParallelConfig


class DataParallelDataModule(SampledDataModule):
    """Each rank samples its share of every step's seeds from the whole graph it holds.

    Args: as :class:`~...kit.datamodule.GNNDataModule`; ``config`` defaults to ``DataParallelConfig()``.
    """

    def __init__(self, dataset, config: DataParallelConfig | None = None, data=None, **kwargs):
        config = config or DataParallelConfig()
        super().__init__(dataset, config, data, salt_by_rank=config.salt_by_rank, **kwargs)
