"""``strategy=single``: one process, sampled or full-neighbourhood mini-batches; the oracle."""

from __future__ import annotations

from .. import lazy_exports
from ..spec import SystemSpec
from .config import SingleConfig

SYSTEM = SystemSpec(
    name="single",
    description="one process, the oracle",
    config_type=SingleConfig,
    package=__name__,
    strategy_class="SingleStrategy",
    datamodule_class="SingleDataModule",
    run_settings=(("trainer.num_nodes", 1),),
)

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
_EXPORTS = {"SingleStrategy": ".strategy", "SingleDataModule": ".datamodule"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["SingleConfig", *_EXPORTS]
