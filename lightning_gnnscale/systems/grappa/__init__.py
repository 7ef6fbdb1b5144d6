"""``strategy=grappa``: Grappa (Xu et al., 2025) on Lightning, gradient-only communication.

The graph is cut once into chunks (an on-disk chunk store); each super-epoch every rank trains
in isolation on a partition (a pinned base chunk + a swept variable chunk + 1-hop halo) read
from the store, and the only training traffic is the DDP gradient all-reduce, scaled per rank
by a coverage factor. Presets ``grappa_uw``, ``grappa_fp``, ``grappa_naive`` and ``grappa_50s``
are the paper's ablations. See docs/systems/grappa.md.
"""

from .config import GRAPPA_PRESETS, EarlyTriggerConfig, GrappaConfig
from .datamodule import GrappaBatch, GrappaDataModule
from .strategy import GrappaStrategy

__all__ = [
    "GRAPPA_PRESETS",
    "EarlyTriggerConfig",
    "GrappaBatch",
    "GrappaConfig",
    "GrappaDataModule",
    "GrappaStrategy",
]
