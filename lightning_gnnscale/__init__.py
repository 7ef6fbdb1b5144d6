"""lightning_gnnscale: distributed GNN training systems as PyTorch Lightning plugins.

Importing the package registers every system's strategy in Lightning's ``StrategyRegistry``
(``L.Trainer(strategy="gsplit")``; the plain data-parallel reference is ``data_parallel``, since
Lightning's own ``ddp`` is unmetered) and its run settings in Hydra's ConfigStore. Per system,
the public names of its package (its ``__all__``: Strategy, DataModule, typed config...) are
exported here; see docs/quickstart.md, "From your own Lightning script".

The import is light: the config schema and the registry, no system's implementation and no
Lightning, PyG, wandb, ogb or matplotlib. The names below load on first use (``gs.GNNModule``),
and a strategy name's system when a run or a Trainer uses it (docs/architecture.md, "Imports").

``system(name)`` gives ``(Strategy, DataModule, config)`` for any strategy name (presets and
Lightning names such as ``data_parallel`` included); each system's nested settings classes are
exported too (a system package exports a name prefixed with its system where two systems'
names would clash, and two packages exporting one name is refused).
"""

from importlib import import_module
from typing import Any

from .config_types import DataConfig, ModelConfig, RunConfig, RunFacts, SystemConfig, TrainerConfig
from .errors import ConfigError
from .systems.registry import SYSTEMS, register_systems, system
from .systems.spec import SystemSpec

register_systems()

# public name -> the module that defines it, imported on first use
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        ("CollectiveAudit", "CommStats", "EpochStats", "RunSummary", "StepSeed"), ".callbacks"
    ),
    "Batch": ".graph.batch",
    "Graph": ".graph.csc",
    **dict.fromkeys(("NodeDataset", "NodeTargets"), ".graph.node_targets"),
    "DATASETS": ".graph.dataset_config",
    "TaskConfig": ".tasks",
    "load_dataset": ".graph.datasets",
    **dict.fromkeys(("BlockGNN", "SubgraphModel", "build_model"), ".models.gnn"),
    "layerwise_inference": ".models.inference",
    "GNNModule": ".models.module",
    "GNNDataModule": ".kit.datamodule",
    "SystemStrategy": ".kit.strategies",
    **dict.fromkeys(
        ("Evaluation", "ModuleRuntime", "Prediction", "RankContext", "rank_context"),
        ".contract",
    ),
}


def _system_exports() -> dict[str, str]:
    """Every public name of this package's systems (each system package's ``__all__``) ->
    its package. A system outside the repository keeps its names in its own package."""
    exports: dict[str, str] = {}
    for spec in SYSTEMS.values():
        if not spec.package.startswith(f"{__name__}.systems."):
            continue
        for name in import_module(spec.package).__all__:  # imported by the registry already
            owner = exports.setdefault(name, spec.package)
            if owner != spec.package:
                raise ConfigError(f"{name!r} is exported by both {owner} and {spec.package}")
    return exports


_LAZY.update(_system_exports())


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # once: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "SYSTEMS",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "RunConfig",
    "RunFacts",
    "SystemConfig",
    "SystemSpec",
    "TrainerConfig",
    "register_systems",
    "system",
]
__all__ += sorted(_LAZY)
