"""``strategy=sancus`` / ``strategy=cagnet``: SANCUS (staleness-aware communication-avoiding
full-graph training) and its exact broadcast baseline CAGNET-1D, on Lightning.

Row blocks of ``Â`` per rank, one skip-broadcast autograd Function per GCN layer, historical
embedding caches, staleness policies (bound 0, epoch-fixed, adaptive, variation gap, SkipG),
gradients summed by the strategy itself (no DDP wrapper). See docs/systems/sancus.md.
"""

from __future__ import annotations

from .. import lazy_exports
from .config import SancusConfig

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "SancusDataModule": ".datamodule",
        "SancusStrategy": ".strategy",
    },
)

__all__ = ["SancusConfig", "SancusDataModule", "SancusStrategy"]
