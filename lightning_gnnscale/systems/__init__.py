"""The strategy registry: ``strategy.name`` -> how to validate and build that system."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import ddp, single


@dataclass(frozen=True)
class System:
    """What ``run.train`` needs from a system.

    ``validate(cfg)`` raises ``ConfigError`` before any process starts; ``build(cfg, graph)``
    runs on every rank and returns ``(strategy, datamodule, extra_callbacks)``;
    ``accepts_custom_models`` says whether a user ``model(x, edge_index)`` can run under it.
    """

    validate: Callable
    build: Callable
    accepts_custom_models: bool


STRATEGIES: dict[str, System] = {
    "single": System(single.validate, single.build, accepts_custom_models=True),
    "ddp": System(ddp.validate, ddp.build, accepts_custom_models=True),
}
