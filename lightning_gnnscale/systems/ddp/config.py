"""The settings of ``strategy=ddp``."""

from __future__ import annotations

from dataclasses import dataclass

from ...config_types import SystemConfig


@dataclass(frozen=True)
class DataParallelConfig(SystemConfig):
    """``strategy=ddp``.

    Args:
        salt_by_rank: ranks sample independent micro-batches (rank-salted keys), as real
            data-parallel training does; ``False``: exactly what one process would sample.
    """

    name: str = "ddp"
    salt_by_rank: bool = True

    NAMES = ("ddp",)
    # node tasks and link prediction; the conformance suite runs the first two in CI
    TASKS = ("node_classification", "link_prediction", "node_regression")
    EXCLUDES_TARGET_EDGES = True
    TRAINS_TASK_HEAD = True
    TYPED_GRAPHS = True
    LEARNED_INPUTS = True  # featureless node types: a sharded table (kit.embeddings)
    TYPED_LINK_PREDICTION = True
    FILTERED_RANKING = True
    accepts_custom_models = True
    batches_in_main_process = False  # sampled in DataLoader workers if asked
