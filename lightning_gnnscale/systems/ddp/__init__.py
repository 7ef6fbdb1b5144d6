"""``strategy=ddp``: every rank holds the whole graph and samples its share of each step.

This is what a PyG user does today; every system in the suite is compared with it. Lightning's
registry already has a ``ddp`` (its own, unmetered), so this one registers as ``data_parallel``.
"""

from __future__ import annotations

from .. import lazy_exports
from ..spec import SystemSpec
from .config import DataParallelConfig

SYSTEM = SystemSpec(
    name="ddp",
    description="replicated graph, plain data parallel (metered)",
    config_type=DataParallelConfig,
    package=__name__,
    strategy_class="DataParallelStrategy",
    datamodule_class="DataParallelDataModule",
    lightning_name="data_parallel",
    default_devices=2,
    exact=False,  # rank-salted sampling keys: each rank draws its own micro-batch
    exact_settings=(("salt_by_rank", False),),
)

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
_EXPORTS = {"DataParallelStrategy": ".strategy", "DataParallelDataModule": ".datamodule"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["DataParallelConfig", *_EXPORTS]
