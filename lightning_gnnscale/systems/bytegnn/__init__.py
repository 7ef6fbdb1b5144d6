"""``strategy=bytegnn``: ByteGNN (Zheng et al., PVLDB 2022) on Lightning.

Sampling as DAGs of small tasks (seed, one-hop neighbourhood per chunk, feature fetch) run by
a thread pool per rank, a coarse controller that decides when to launch the next mini-batch's
DAG from a launch score, a fine scheduler that orders ready tasks (older DAG, then cheaper task,
first), a socket transport to the other ranks' graph stores that never waits for lockstep
collectives, and synchronous data-parallel training on the sampled batches. See
docs/systems/bytegnn.md.
"""

from __future__ import annotations

from .. import lazy_exports
from ..spec import SystemSpec
from .config import ByteGNNConfig, ByteGNNPartitionConfig, DagConfig, SchedulerConfig

SYSTEM = SystemSpec(
    name="bytegnn",
    description=(
        "ByteGNN: sampling DAGs on a thread pool, launch-score scheduler, socket graph store"
    ),
    config_type=ByteGNNConfig,
    package=__name__,
    strategy_class="ByteGNNStrategy",
    datamodule_class="ByteGNNDataModule",
    default_devices=2,
    exact_full_batch=True,  # each rank seeds its own partition's training nodes
    bench_baseline="distdgl",
)

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
_EXPORTS = {
    "ByteGNNDataModule": ".datamodule",
    "ByteGNNStrategy": ".strategy",
    "ByteGNNBatch": ".sworker",
    "SamplingError": ".sworker",
    "SWorker": ".sworker",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["ByteGNNConfig", "ByteGNNPartitionConfig", "DagConfig", "SchedulerConfig", *_EXPORTS]
