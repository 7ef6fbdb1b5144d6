"""``strategy=grappa``: Grappa (Xu et al., 2025) on Lightning, gradient-only communication.

The graph is cut once into chunks (an on-disk chunk store); each super-epoch every rank trains
in isolation on a partition (a pinned base chunk + a swept variable chunk + 1-hop halo) read
from the store, and the only training traffic is the DDP gradient all-reduce, scaled per rank
by a coverage factor. Presets ``grappa_uw``, ``grappa_fp``, ``grappa_naive`` and ``grappa_50s``
are the paper's ablations. See docs/systems/grappa.md.
"""

from __future__ import annotations

from .. import lazy_exports
from .config import GRAPPA_PRESETS, EarlyTriggerConfig, GrappaConfig

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "GrappaBatch": ".datamodule",
        "GrappaDataModule": ".datamodule",
        "GrappaStrategy": ".strategy",
    },
)

__all__ = [
    "GRAPPA_PRESETS",
    "EarlyTriggerConfig",
    "GrappaBatch",
    "GrappaConfig",
    "GrappaDataModule",
    "GrappaStrategy",
]
