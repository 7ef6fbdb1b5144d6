"""The settings of ``strategy=single``."""

from __future__ import annotations

from dataclasses import dataclass

from ...config_types import RunFacts, SystemConfig, require


@dataclass(frozen=True)
class SingleConfig(SystemConfig):
    """``strategy=single``: no settings of its own; one process."""

    name: str = "single"

    NAMES = ("single",)
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

    def check_run(self, run: RunFacts) -> None:
        require(
            run.devices == 1 and run.num_nodes == 1,
            f"strategy=single runs one process, but trainer.devices={run.devices} and "
            f"trainer.num_nodes={run.num_nodes}; set both to 1 or use strategy=ddp",
        )
