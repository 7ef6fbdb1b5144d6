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
    """

    name: str
    target: str
    metrics: tuple[str, ...]
    monitor: str
    mode: str

    def build(self) -> Any:
        """A new instance of the task's :class:`~.base.NodeTask` (imports torch)."""
        module, cls = self.target.split(":")
        return getattr(import_module(f"{__package__}.{module}"), cls)()
