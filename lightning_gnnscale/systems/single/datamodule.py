"""The DataModule of ``strategy=single``."""

from __future__ import annotations

from ...kit.sampled import SampledDataModule
from .config import SingleConfig


class SingleDataModule(SampledDataModule):
    """Every training node's sampled blocks in one process: exactly the global mini-batch.

    Args: as :class:`~...kit.datamodule.GNNDataModule`; ``config`` defaults to ``SingleConfig()``.
    """

    def __init__(self, dataset, config: SingleConfig | None = None, data=None, **kwargs):
        super().__init__(dataset, config or SingleConfig(), data, salt_by_rank=False, **kwargs)
