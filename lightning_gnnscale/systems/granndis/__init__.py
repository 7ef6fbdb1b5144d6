"""``strategy=granndis``: GraNNDIS (Song et al., PACT '24), server-aware full-graph and
co-batched training on one-hop graphs with per-layer masks, and its baselines FB_base and
MB_base. See docs/systems/granndis.md."""

from .config import GRANNDIS_PRESETS, GraNNDISConfig
from .datamodule import GraNNDISDataModule, OneHopBatch
from .plan import OneHopPlan, build_layout
from .strategy import GraNNDISStrategy, halo_hook

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
