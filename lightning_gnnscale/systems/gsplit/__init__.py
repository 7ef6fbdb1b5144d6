"""``strategy=gsplit``: GSplit (split-parallel mini-batch training) on Lightning.

Offline probabilistic partitioning (pre-sampled vertex and edge weights, weighted METIS),
split-parallel sampling with one id all-to-all per hop, a row shuffle before every layer (input
rows before layer 0, metered as ``feature``; hidden rows later, ``activation``), owner-only
feature loading through a partition-aligned cache. See docs/systems/gsplit.md.
"""

from __future__ import annotations

from .. import lazy_exports
from ..spec import SystemSpec
from .config import FeatureCacheConfig, GSplitConfig, GSplitPartitionConfig

SYSTEM = SystemSpec(
    name="gsplit",
    description="GSplit: split-parallel mini-batches, row shuffle before every layer",
    config_type=GSplitConfig,
    package=__name__,
    strategy_class="GSplitStrategy",
    datamodule_class="GSplitDataModule",
    default_devices=2,
    bench_baseline="ddp",
)

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
_EXPORTS = {
    "GSplitStats": ".callbacks",
    "RedundancyProbe": ".callbacks",
    "GSplitDataModule": ".datamodule",
    "LayerTraffic": ".datamodule",
    "SplitBatch": ".datamodule",
    "GSplitStrategy": ".strategy",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["FeatureCacheConfig", "GSplitConfig", "GSplitPartitionConfig", *_EXPORTS]
