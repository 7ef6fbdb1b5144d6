"""Tasks: what a run learns, apart from how a system distributes it (docs/architecture.md,
"Tasks").

A system decides who holds which rows, how a step's seed outputs are computed across ranks and
what crosses the network; the task decides which seeds a step trains on, the targets, the head's
width, the loss, the metrics and the evaluation splits. :data:`TASKS` names every task; its
entries are torch-free (the schema checks ``task.name`` against them before torch is imported)
and :meth:`TaskSpec.build` imports the implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import choice
from .spec import TaskSpec

if TYPE_CHECKING:
    from .base import NodeTask


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "node_classification", "node_classification:NodeClassification", ("acc",), "acc", "max"
        ),
        TaskSpec(
            "node_regression", "node_regression:NodeRegression", ("rmse", "mae"), "rmse", "min"
        ),
    )
}
DEFAULT_TASK = "node_classification"


def task_spec(name: str) -> TaskSpec:
    """The spec of task ``name``; a :class:`~..errors.ConfigError` lists the valid names."""
    choice("task.name", name, TASKS)
    return TASKS[name]


def build_task(task: str | NodeTask | None = None) -> NodeTask:
    """``task`` itself if it is a task, else the task of that name (default
    ``node_classification``)."""
    if task is None or isinstance(task, str):
        return task_spec(task or DEFAULT_TASK).build()
    return task
