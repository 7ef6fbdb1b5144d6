"""``strategy=grappa``: Grappa (Xu et al., 2025) on Lightning, gradient-only communication.

The graph is cut once into chunks (an on-disk chunk store); each super-epoch every rank trains
in isolation on a partition (a pinned base chunk + a swept variable chunk + 1-hop halo) read
from the store, and the only training traffic is the DDP gradient all-reduce, scaled per rank
by a coverage factor. Presets ``grappa_uw``, ``grappa_fp``, ``grappa_naive`` and ``grappa_50s``
are the paper's ablations. See docs/systems/grappa.md.
"""

from __future__ import annotations

from .. import lazy_exports
from ..spec import SystemSpec
from .config import GRAPPA_PRESETS, EarlyTriggerConfig, GrappaConfig

# isolated partitions train on a coverage-corrected estimate of the gradient: no strategy
# setting alone makes it single's (one chunk on one rank equals ddp, tests/test_grappa_dist.py)
SYSTEM = tuple(
    SystemSpec(
        name=name,
        description=description,
        config_type=GrappaConfig,
        package=__name__,
        strategy_class="GrappaStrategy",
        datamodule_class="GrappaDataModule",
        default_devices=2,
        bench_baseline="ddp" if name == "grappa" else None,
        exact=False,
    )
    for name, description in GRAPPA_PRESETS.items()
)

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
_EXPORTS = {
    "GrappaBatch": ".datamodule",
    "GrappaDataModule": ".datamodule",
    "GrappaStrategy": ".strategy",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["GRAPPA_PRESETS", "EarlyTriggerConfig", "GrappaConfig", *_EXPORTS]
