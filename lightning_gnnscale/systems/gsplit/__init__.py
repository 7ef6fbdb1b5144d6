"""``strategy=gsplit``: GSplit (split-parallel mini-batch training) on Lightning.

Offline probabilistic partitioning (pre-sampled vertex and edge weights, weighted METIS),
split-parallel sampling with one id all-to-all per hop, a row shuffle before every layer (input
rows before layer 0, metered as ``feature``; hidden rows later, ``activation``), owner-only
feature loading through a partition-aligned cache. See docs/systems/gsplit.md.
"""

from .callbacks import GSplitStats, RedundancyProbe
from .config import FeatureCacheConfig, GSplitConfig, GSplitPartitionConfig
from .datamodule import GSplitDataModule, LayerTraffic, SplitBatch
from .strategy import GSplitStrategy

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
