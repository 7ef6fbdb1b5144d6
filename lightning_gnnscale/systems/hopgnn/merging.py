"""HopGNN's adaptive micrograph-merging controller (spec §3.5; docs/systems/hopgnn.md).

From epoch ``start_epoch`` on (the second epoch by default), every epoch runs with one kept time
step fewer while the epoch time keeps improving, down to ``min_steps``; the first epoch that is
not faster than the best so far reverts ``T`` to the last better value and freezes it. Epochs
before the ``monitor_epochs`` baseline epochs that precede ``start_epoch`` are warm-up: not
measured. The controller is DataModule state (in the checkpoint).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

TRAINING_CATEGORIES = ("feature", "structure", "parameter", "gradient")
# link prediction's training also exchanges the far endpoints' output rows and their gradients
LINK_TRAINING_CATEGORIES = (*TRAINING_CATEGORIES, "activation", "activation_grad")


@dataclass
class MergeController:
    """The number of kept time steps ``T`` per epoch, chosen from measured epoch times.

    Attributes:
        steps: ``T`` for the epoch about to run (starts at ``N`` or ``strategy.steps``).
        monitor_epochs: epochs measured per decision.
        start_epoch: the first epoch that may run with fewer steps.
        min_steps: the smallest ``T``; reaching it while improving freezes it.
        best: the best mean epoch time so far (``inf`` before the first decision).
        adjusting: ``False`` once ``T`` is frozen.
        window: the epoch times (mean over ranks) since the last decision.
        trajectory: ``T`` of every epoch started so far.
    """

    steps: int
    monitor_epochs: int = 1
    start_epoch: int = 1
    min_steps: int = 1
    best: float = math.inf
    adjusting: bool = True
    window: list[float] = field(default_factory=list)
    trajectory: list[int] = field(default_factory=list)

    def begin_epoch(self) -> int:
        """Decide ``T`` for the epoch about to start (from the closed window) and return it."""
        epoch = len(self.trajectory)
        if self.adjusting and epoch >= self.start_epoch and len(self.window) >= self.monitor_epochs:
            mean = sum(self.window) / len(self.window)
            if mean < self.best:
                self.best, self.window = mean, []
                if self.steps > self.min_steps:
                    self.steps -= 1
                else:
                    self.adjusting = False
            else:
                self.steps += 1
                self.adjusting = False
        self.trajectory.append(self.steps)
        return self.steps

    def end_epoch(self, seconds: float) -> None:
        """Record the time (already the mean over ranks) of the epoch last begun, unless it is
        a warm-up epoch."""
        epoch = len(self.trajectory) - 1
        if self.adjusting and epoch >= self.start_epoch - self.monitor_epochs:
            self.window.append(seconds)

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "monitor_epochs": self.monitor_epochs,
            "start_epoch": self.start_epoch,
            "min_steps": self.min_steps,
            "best": self.best,
            "adjusting": self.adjusting,
            "window": list(self.window),
            "trajectory": list(self.trajectory),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps, self.monitor_epochs = state["steps"], state["monitor_epochs"]
        # states written before the two settings existed had their defaults
        self.start_epoch, self.min_steps = state.get("start_epoch", 1), state.get("min_steps", 1)
        self.best, self.adjusting = state["best"], state["adjusting"]
        self.window, self.trajectory = list(state["window"]), list(state["trajectory"])


def modeled_epoch_seconds(
    delta_bytes: dict[str, int],
    iterations: int,
    steps: int,
    bandwidth: float,
    overhead: float,
    categories: tuple[str, ...] = TRAINING_CATEGORIES,
) -> float:
    """One rank's modeled epoch time: its training bytes (``categories``, default
    ``TRAINING_CATEGORIES``; link prediction's ``LINK_TRAINING_CATEGORIES``) over
    ``bandwidth`` plus ``overhead`` per time step of every iteration (kernel launches and the
    step barrier)."""
    sent = sum(delta_bytes.get(c, 0) for c in categories)
    return sent / bandwidth + iterations * steps * overhead
