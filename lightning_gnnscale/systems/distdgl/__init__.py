"""``strategy=distdgl``: DistDGL (Zheng et al., 2020) on Lightning.

Partitioned graph (METIS with balanced training nodes, 1-hop halo, relabelled ids), a KV store
holding each rank's core features, a distributed hash-keyed sampler, DistDGL's even trainer
split, DDP for dense gradients, optional learnable node embeddings with a sparse optimiser, and
layer-wise distributed evaluation. See docs/systems/distdgl.md.
"""

from .config import DistDGLConfig, PartitionConfig
from .datamodule import DistDGLBatch, DistDGLDataModule, LearnableInputs, PartitionedGraph
from .strategy import DistDGLStrategy

__all__ = [
    "DistDGLBatch",
    "DistDGLConfig",
    "DistDGLDataModule",
    "DistDGLStrategy",
    "LearnableInputs",
    "PartitionConfig",
    "PartitionedGraph",
]
