"""What names a task, torch-free (a leaf of the package: the schema reads it before torch is
imported, and the implementations refer to it)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class TaskSpec:
    """One task's name, metrics and where its implementation lives.

    Attributes:
        name: the ``task`` setting (``task=node_regression``).
        target: ``"<module>:<class>"`` of its :class:`~.base.NodeTask` in this package.
        metrics: what evaluation reports per split (``val/<metric>``, ``test/<metric>``, and
            ``summary.json``'s ``val_<metric>`` / ``test_<metric>``).
        monitor: the metric that picks the best epoch (best checkpoint, ``best_val_<monitor>``,
            early stopping), and ``mode``: ``max`` or ``min`` of it.
        seeds: what a step trains on: ``nodes`` (node tasks) or ``edges`` (link prediction:
            a system trains it only where its config lists it in ``TASKS``).
    """

    name: str
    target: str
    metrics: tuple[str, ...]
    monitor: str
    mode: str
    seeds: str = "nodes"

    def build(self, config: Any = None) -> Any:
        """A new instance of the task's :class:`~.base.NodeTask` with the run's ``task``
        settings ``config`` (a ``TaskConfig``), importing torch."""
        module, cls = self.target.split(":")
        task_class = getattr(import_module(f"{__package__}.{module}"), cls)
        return task_class(config)
