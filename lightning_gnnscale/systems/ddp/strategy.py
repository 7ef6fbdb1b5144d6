"""The Strategy of ``strategy=ddp``."""

from __future__ import annotations

from ...kit.strategies import MeteredDDPStrategy
from .config import DataParallelConfig


class DataParallelStrategy(MeteredDDPStrategy):
    """Plain data parallel: DDP's gradient all-reduce, metered; nothing else moves."""

    config_type = DataParallelConfig
