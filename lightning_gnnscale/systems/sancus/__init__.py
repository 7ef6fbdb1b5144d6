"""``strategy=sancus`` / ``strategy=cagnet``: SANCUS (staleness-aware communication-avoiding
full-graph training) and its exact broadcast baseline CAGNET-1D, on Lightning.

Row blocks of ``Â`` per rank, one skip-broadcast autograd Function per GCN layer, historical
embedding caches, staleness policies (bound 0, epoch-fixed, adaptive, variation gap, SkipG),
gradients summed by the strategy itself (no DDP wrapper). See docs/systems/sancus.md.
"""

from __future__ import annotations

from .. import lazy_exports
from ..spec import SystemSpec
from .config import SancusConfig

_SHARED = dict(
    config_type=SancusConfig,
    package=__name__,
    strategy_class="SancusStrategy",
    datamodule_class="SancusDataModule",
    default_devices=2,
    exact_full_batch=True,  # full-graph steps
    bench_model="gcn",  # SANCUS/CAGNET train GCN only
)
SYSTEM = (
    SystemSpec(
        name="sancus",
        description="SANCUS: full-graph, staleness-aware skipped broadcasts",
        bench_baseline="cagnet",
        exact=False,  # stale blocks are reused
        exact_settings=(("policy", "none"),),
        **_SHARED,
    ),
    SystemSpec(
        name="cagnet",
        description="CAGNET-1D: full-graph exact broadcasts (SANCUS with bound 0)",
        **_SHARED,
    ),
)

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
_EXPORTS = {"SancusDataModule": ".datamodule", "SancusStrategy": ".strategy"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["SancusConfig", *_EXPORTS]
