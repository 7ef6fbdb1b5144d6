"""``strategy=distdgl``: DistDGL (Zheng et al., 2020) on Lightning.

Partitioned graph (METIS with balanced training nodes, 1-hop halo, relabelled ids), a KV store
holding each rank's core features, a distributed hash-keyed sampler, DistDGL's even trainer
split, DDP for dense gradients, optional learnable node embeddings with a sparse optimiser, and
layer-wise distributed evaluation. See docs/systems/distdgl.md.
"""

from __future__ import annotations

from .. import lazy_exports
from ..spec import SystemSpec
from .config import DistDGLConfig, PartitionConfig

SYSTEM = SystemSpec(
    name="distdgl",
    description="DistDGL: partitioned graph, KV store, distributed sampling",
    config_type=DistDGLConfig,
    package=__name__,
    strategy_class="DistDGLStrategy",
    datamodule_class="DistDGLDataModule",
    default_devices=2,
    exact_full_batch=True,  # each rank seeds its own partition's training nodes
    bench_baseline="distdgl_random",
    bench_variants=(("distdgl_random", ("strategy.partition.method=random",)),),
)

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
_EXPORTS = {
    "DistDGLDataModule": ".datamodule",
    "PartitionedGraph": ".datamodule",
    "DistDGLStrategy": ".strategy",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
# PartitionConfig is graph.partition_config's (HopGNN's too): public as DistDGLPartitionConfig
DistDGLPartitionConfig = PartitionConfig
__all__ = ["DistDGLConfig", "DistDGLPartitionConfig", *_EXPORTS]
