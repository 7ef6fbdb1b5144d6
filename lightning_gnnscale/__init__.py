"""lightning_gnnscale: distributed GNN training systems as PyTorch Lightning plugins.

Importing the package registers every system's strategy in Lightning's ``StrategyRegistry``
(``L.Trainer(strategy="gsplit")``; the plain data-parallel reference is ``metered_ddp``, since
Lightning's own ``ddp`` is unmetered) and its config schema in Hydra's ConfigStore. Per system,
its Strategy, DataModule and typed config are exported here; see docs/quickstart.md, "From your
own Lightning script".

The import is light: the config schema and the registry, no system's implementation and no
Lightning, PyG, wandb, ogb or matplotlib. The names below load on first use (``gs.GNNModule``),
and a strategy name's system when a run or a Trainer uses it (docs/architecture.md, "Imports").

``system(name)`` gives ``(Strategy, DataModule, config)`` for any strategy name (presets and
Lightning names such as ``metered_ddp`` included); each system's nested settings classes are
exported too (prefixed with the system where two systems' names would clash).
"""

from importlib import import_module
from typing import Any

from .errors import ConfigError
from .schema import DataConfig, ModelConfig, RunConfig, RunFacts, SystemConfig, TrainerConfig
from .systems.registry import SYSTEMS, SystemSpec, register_systems, system

register_systems()

# public name -> the module that defines it, imported on first use
_LAZY = {
    **dict.fromkeys(
        ("CollectiveAudit", "CommStats", "EpochStats", "RunSummary", "StepSeed"), ".callbacks"
    ),
    "Batch": ".graph.batch",
    "Graph": ".graph.csc",
    "DATASETS": ".graph.dataset_config",
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
    **dict.fromkeys(("ByteGNNConfig", "ByteGNNDataModule", "ByteGNNStrategy"), ".systems.bytegnn"),
    **dict.fromkeys(
        ("DataParallelDataModule", "DataParallelStrategy", "DDPConfig"), ".systems.ddp"
    ),
    **dict.fromkeys(("DistDGLConfig", "DistDGLDataModule", "DistDGLStrategy"), ".systems.distdgl"),
    **dict.fromkeys(
        ("GraNNDISConfig", "GraNNDISDataModule", "GraNNDISStrategy"), ".systems.granndis"
    ),
    **dict.fromkeys(("GrappaConfig", "GrappaDataModule", "GrappaStrategy"), ".systems.grappa"),
    **dict.fromkeys(("GSplitConfig", "GSplitDataModule", "GSplitStrategy"), ".systems.gsplit"),
    **dict.fromkeys(("HopGNNConfig", "HopGNNDataModule", "HopGNNStrategy"), ".systems.hopgnn"),
    **dict.fromkeys(("SancusConfig", "SancusDataModule", "SancusStrategy"), ".systems.sancus"),
    **dict.fromkeys(("SingleConfig", "SingleDataModule", "SingleStrategy"), ".systems.single"),
    # nested settings (prefixed with the system where two systems' names would clash)
    **dict.fromkeys(("DagConfig", "SchedulerConfig"), ".systems.bytegnn"),
    "ByteGNNPartitionConfig": (".systems.bytegnn", "PartitionConfig"),
    "DistDGLPartitionConfig": (".systems.distdgl", "PartitionConfig"),
    **dict.fromkeys(("CoBSettings", "EASSettings"), ".systems.granndis.config"),
    "GraNNDISPartitionSettings": (".systems.granndis.config", "PartitionSettings"),
    "EarlyTriggerConfig": ".systems.grappa",
    **dict.fromkeys(("FeatureCacheConfig", "GSplitPartitionConfig"), ".systems.gsplit"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _LAZY[name] if isinstance(_LAZY[name], tuple) else (_LAZY[name], name)
    value = getattr(import_module(module, __name__), attribute)
    globals()[name] = value  # once: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "DATASETS",
    "SYSTEMS",
    "Batch",
    "BlockGNN",
    "ByteGNNConfig",
    "ByteGNNDataModule",
    "ByteGNNPartitionConfig",
    "ByteGNNStrategy",
    "CoBSettings",
    "CollectiveAudit",
    "CommStats",
    "ConfigError",
    "DDPConfig",
    "DataConfig",
    "DataParallelDataModule",
    "DagConfig",
    "DataParallelStrategy",
    "DistDGLConfig",
    "DistDGLDataModule",
    "DistDGLPartitionConfig",
    "DistDGLStrategy",
    "EASSettings",
    "EarlyTriggerConfig",
    "EpochStats",
    "Evaluation",
    "GNNDataModule",
    "FeatureCacheConfig",
    "GNNModule",
    "GSplitConfig",
    "GSplitDataModule",
    "GSplitPartitionConfig",
    "GSplitStrategy",
    "GraNNDISConfig",
    "GraNNDISDataModule",
    "GraNNDISPartitionSettings",
    "GraNNDISStrategy",
    "Graph",
    "GrappaConfig",
    "GrappaDataModule",
    "GrappaStrategy",
    "HopGNNConfig",
    "HopGNNDataModule",
    "HopGNNStrategy",
    "ModelConfig",
    "ModuleRuntime",
    "Prediction",
    "RankContext",
    "RunConfig",
    "RunFacts",
    "RunSummary",
    "SancusConfig",
    "SancusDataModule",
    "SancusStrategy",
    "SchedulerConfig",
    "SingleConfig",
    "SingleDataModule",
    "SingleStrategy",
    "StepSeed",
    "SubgraphModel",
    "SystemConfig",
    "SystemSpec",
    "SystemStrategy",
    "TrainerConfig",
    "build_model",
    "layerwise_inference",
    "load_dataset",
    "rank_context",
    "register_systems",
    "system",
]
