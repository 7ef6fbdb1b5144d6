"""``DistDGLConfig``: the settings of ``strategy=distdgl``."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...config_types import SystemConfig, require
from ...graph.partition_config import PartitionConfig
from ...tasks import NODE_TASKS


@dataclass(frozen=True)
class DistDGLConfig(SystemConfig):
    """``strategy=distdgl``.

    Args:
        partition: the partitioner and its options.
        embedding_dim: ``> 0``: learn node embeddings of this width as the input instead of the
            features (featureless graphs; their optimiser: ``data.embedding_optimizer`` and
            ``data.embedding_lr``); ``0``: use the features.
    """

    name: str = "distdgl"
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    embedding_dim: int = 0

    NAMES = ("distdgl",)
    # link prediction last: CI's conformance runs a preset's first two tasks
    TASKS = (*NODE_TASKS, "link_prediction")
    EXCLUDES_TARGET_EDGES = True  # the step's pairs, all-gathered, out of every rank's blocks
    TYPED_GRAPHS = True  # per-relation sampling through the owners (docs/systems/distdgl.md)
    LEARNED_INPUTS = True  # featureless node types and embedding_dim: KV-store tables
    TYPED_LINK_PREDICTION = True  # the split's typed message graph, partitioned (link.py)
    TRAINS_TASK_HEAD = True  # the head is a parameter of the DDP-wrapped module, as the net
    supports_partition_dir = True

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.embedding_dim >= 0,
            f"strategy.embedding_dim={self.embedding_dim} must be >= 0 (0 = use the features)",
        )
