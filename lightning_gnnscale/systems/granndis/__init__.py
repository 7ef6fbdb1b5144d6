"""``strategy=granndis``: GraNNDIS (Song et al., PACT '24), server-aware full-graph and
co-batched training on one-hop graphs with per-layer masks, and its baselines FB_base and
MB_base. See docs/systems/granndis.md."""

from __future__ import annotations

from .. import lazy_exports
from .config import GRANNDIS_PRESETS, GraNNDISConfig

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "GraNNDISDataModule": ".datamodule",
        "OneHopBatch": ".datamodule",
        "OneHopPlan": ".plan",
        "build_layout": ".plan",
        "GraNNDISStrategy": ".strategy",
        "halo_hook": ".strategy",
    },
)

__all__ = [
    "GRANNDIS_PRESETS",
    "GraNNDISConfig",
    "GraNNDISDataModule",
    "GraNNDISStrategy",
    "OneHopBatch",
    "OneHopPlan",
    "build_layout",
    "halo_hook",
]
