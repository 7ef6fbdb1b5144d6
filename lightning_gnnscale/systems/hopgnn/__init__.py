"""``strategy=hopgnn``: HopGNN / LeapGNN (Chen et al.), feature-centric training that moves the
model replicas to the features; ``strategy=hopgnn_mc``: its model-centric baseline on the same
partition and strategy. See docs/systems/hopgnn.md."""

from __future__ import annotations

from .. import lazy_exports
from ..spec import SystemSpec
from .config import HOPGNN_PRESETS, HopGNNConfig

SYSTEM = tuple(
    SystemSpec(
        name=name,
        description=description,
        config_type=HopGNNConfig,
        package=__name__,
        strategy_class="HopGNNStrategy",
        datamodule_class="HopGNNDataModule",
        default_devices=2,
        bench_baseline="hopgnn_mc" if name == "hopgnn" else None,
    )
    for name, description in HOPGNN_PRESETS.items()
)

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
_EXPORTS = {
    "FeatureShard": ".datamodule",
    "HopGNNBatch": ".datamodule",
    "HopGNNDataModule": ".datamodule",
    "HopGNNPrepared": ".datamodule",
    "IterationPlan": ".planner",
    "micrograph_plan": ".planner",
    "model_centric_plan": ".planner",
    "HopGNNStrategy": ".strategy",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["HOPGNN_PRESETS", "HopGNNConfig", *_EXPORTS]
