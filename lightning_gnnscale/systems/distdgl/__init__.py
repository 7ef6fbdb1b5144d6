"""``strategy=distdgl``: DistDGL (Zheng et al., 2020) on Lightning.

Partitioned graph (METIS with balanced training nodes, 1-hop halo, relabelled ids), a KV store
holding each rank's core features, a distributed hash-keyed sampler, DistDGL's even trainer
split, DDP for dense gradients, optional learnable node embeddings with a sparse optimiser, and
layer-wise distributed evaluation. See docs/systems/distdgl.md.
"""

from __future__ import annotations

from .. import lazy_exports
from .config import DistDGLConfig, PartitionConfig

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DistDGLBatch": ".datamodule",
        "DistDGLDataModule": ".datamodule",
        "LearnableInputs": ".datamodule",
        "PartitionedGraph": ".datamodule",
        "DistDGLStrategy": ".strategy",
    },
)

__all__ = [
    "DistDGLBatch",
    "DistDGLConfig",
    "DistDGLDataModule",
    "DistDGLStrategy",
    "LearnableInputs",
    "PartitionConfig",
    "PartitionedGraph",
]
