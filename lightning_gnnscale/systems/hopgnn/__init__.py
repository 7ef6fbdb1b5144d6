"""``strategy=hopgnn``: HopGNN / LeapGNN (Chen et al.), feature-centric training that moves the
model replicas to the features; ``strategy=hopgnn_mc``: its model-centric baseline on the same
partition and strategy. See docs/systems/hopgnn.md."""

from .config import HOPGNN_PRESETS, HopGNNConfig
from .datamodule import FeatureShard, HopGNNBatch, HopGNNDataModule, HopGNNPrepared
from .planner import IterationPlan, micrograph_plan, model_centric_plan
from .strategy import HopGNNStrategy

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
