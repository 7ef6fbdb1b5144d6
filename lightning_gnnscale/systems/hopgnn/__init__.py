"""``strategy=hopgnn``: HopGNN / LeapGNN (Chen et al.), feature-centric training that moves the
model replicas to the features; ``strategy=hopgnn_mc``: its model-centric baseline on the same
partition and strategy. See docs/systems/hopgnn.md."""

from __future__ import annotations

from .. import lazy_exports
from .config import HOPGNN_PRESETS, HopGNNConfig

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "FeatureShard": ".datamodule",
        "HopGNNBatch": ".datamodule",
        "HopGNNDataModule": ".datamodule",
        "HopGNNPrepared": ".datamodule",
        "IterationPlan": ".planner",
        "micrograph_plan": ".planner",
        "model_centric_plan": ".planner",
        "HopGNNStrategy": ".strategy",
    },
)

__all__ = [
    "HOPGNN_PRESETS",
    "FeatureShard",
    "HopGNNBatch",
    "HopGNNConfig",
    "HopGNNDataModule",
    "HopGNNPrepared",
    "HopGNNStrategy",
    "IterationPlan",
    "micrograph_plan",
    "model_centric_plan",
]
