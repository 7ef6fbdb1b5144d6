"""``strategy=gsplit``: GSplit (split-parallel mini-batch training) on Lightning.

Offline probabilistic partitioning (pre-sampled vertex and edge weights, weighted METIS),
split-parallel sampling with one id all-to-all per hop, a row shuffle before every layer (input
rows before layer 0, metered as ``feature``; hidden rows later, ``activation``), owner-only
feature loading through a partition-aligned cache. See docs/systems/gsplit.md.
"""

from __future__ import annotations

from .. import lazy_exports
from .config import FeatureCacheConfig, GSplitConfig, GSplitPartitionConfig

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "GSplitStats": ".callbacks",
        "RedundancyProbe": ".callbacks",
        "GSplitDataModule": ".datamodule",
        "LayerTraffic": ".datamodule",
        "SplitBatch": ".datamodule",
        "GSplitStrategy": ".strategy",
    },
)

__all__ = [
    "FeatureCacheConfig",
    "GSplitConfig",
    "GSplitDataModule",
    "GSplitPartitionConfig",
    "GSplitStats",
    "GSplitStrategy",
    "LayerTraffic",
    "RedundancyProbe",
    "SplitBatch",
]
