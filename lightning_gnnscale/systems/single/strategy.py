"""The Strategy of ``strategy=single``."""

from __future__ import annotations

from ...kit.strategies import MeteredSingleDeviceStrategy
from .config import SingleConfig


class SingleStrategy(MeteredSingleDeviceStrategy):
    """One process, metered like the others (every collective a no-op that counts nothing)."""

    config_type = SingleConfig
