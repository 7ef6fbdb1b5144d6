"""The strategy registry: ``strategy.name`` -> how to validate and build that system."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import ddp, distdgl, grappa, gsplit, sancus, single


@dataclass(frozen=True)
class System:
    """What ``run.train`` needs from a system.

    ``validate(cfg)`` raises ``ConfigError`` before any process starts; ``prepare(cfg, graph)``
    runs once in the launching process (e.g. partitioning, cached on disk) and its result is
    what every rank's ``build(cfg, prepared)`` receives (through shared memory); ``build``
    returns ``(strategy, datamodule, extra_callbacks)``; ``accepts_custom_models`` says whether
    a user ``model(x, edge_index)`` can run under it; ``build_net(cfg, datamodule)``, if set,
    builds the system's own net instead of ``models.build_model``.
    """

    validate: Callable
    build: Callable
    accepts_custom_models: bool
    prepare: Callable = staticmethod(lambda cfg, graph: graph)
    build_net: Callable | None = None


STRATEGIES: dict[str, System] = {
    "single": System(single.validate, single.build, accepts_custom_models=True),
    "ddp": System(ddp.validate, ddp.build, accepts_custom_models=True),
    "distdgl": System(
        distdgl.validate, distdgl.build, accepts_custom_models=False, prepare=distdgl.prepare
    ),
    "gsplit": System(
        gsplit.validate, gsplit.build, accepts_custom_models=False, prepare=gsplit.prepare
    ),
    **{
        name: System(
            sancus.validate,
            sancus.build,
            accepts_custom_models=False,
            prepare=sancus.prepare,
            build_net=sancus.build_net,
        )
        for name in ("sancus", "cagnet")
    },
    **{
        name: System(
            grappa.validate, grappa.build, accepts_custom_models=False, prepare=grappa.prepare
        )
        for name in grappa.PRESETS
    },
}
