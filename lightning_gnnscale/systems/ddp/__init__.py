"""``strategy=ddp``: every rank holds the whole graph and samples its share of each step.

This is what a PyG user does today; every system in the suite is compared with it. Lightning's
registry already has a ``ddp`` (its own, unmetered), so this one registers as ``metered_ddp``.
"""

from __future__ import annotations

from .. import lazy_exports
from .config import DDPConfig

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
__getattr__, __dir__ = lazy_exports(
    __name__, {"DataParallelStrategy": ".strategy", "DataParallelDataModule": ".datamodule"}
)

__all__ = ["DDPConfig", "DataParallelDataModule", "DataParallelStrategy"]
