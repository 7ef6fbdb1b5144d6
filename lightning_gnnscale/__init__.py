"""lightning_gnnscale: distributed GNN training systems as PyTorch Lightning plugins.

Importing the package registers every system's strategy in Lightning's ``StrategyRegistry``
(``L.Trainer(strategy="gsplit")``; the plain data-parallel reference is ``metered_ddp``, since
Lightning's own ``ddp`` is unmetered) and its config schema in Hydra's ConfigStore. Per system,
its Strategy, DataModule and typed config are exported here; see docs/quickstart.md, "From your
own Lightning script".

``system(name)`` gives ``(Strategy, DataModule, config)`` for any strategy name (presets and
Lightning names such as ``metered_ddp`` included); each system's nested settings classes are
exported too (prefixed with the system where two systems' names would clash).
"""

from .callbacks import CollectiveAudit, CommStats, EpochStats, RunSummary, StepSeed
from .errors import ConfigError
from .graph.batch import Batch
from .graph.csc import Graph
from .graph.datasets import DATASETS, load_dataset
from .models.gnn import BlockGNN, SubgraphModel, build_model, layerwise_inference
from .models.module import GNNModule
from .schema import DataConfig, ModelConfig, RunConfig, RunFacts, SystemConfig, TrainerConfig
from .systems.base import GNNDataModule, SystemStrategy
from .systems.bytegnn import (
    ByteGNNConfig,
    ByteGNNDataModule,
    ByteGNNStrategy,
    DagConfig,
    SchedulerConfig,
)
from .systems.bytegnn import PartitionConfig as ByteGNNPartitionConfig
from .systems.contract import Evaluation, ModuleRuntime, Prediction, RankContext, rank_context
from .systems.ddp import DataParallelDataModule, DataParallelStrategy, DDPConfig
from .systems.distdgl import DistDGLConfig, DistDGLDataModule, DistDGLStrategy
from .systems.distdgl import PartitionConfig as DistDGLPartitionConfig
from .systems.granndis import GraNNDISConfig, GraNNDISDataModule, GraNNDISStrategy
from .systems.granndis.config import CoBSettings, EASSettings
from .systems.granndis.config import PartitionSettings as GraNNDISPartitionSettings
from .systems.grappa import EarlyTriggerConfig, GrappaConfig, GrappaDataModule, GrappaStrategy
from .systems.gsplit import (
    FeatureCacheConfig,
    GSplitConfig,
    GSplitDataModule,
    GSplitPartitionConfig,
    GSplitStrategy,
)
from .systems.hopgnn import HopGNNConfig, HopGNNDataModule, HopGNNStrategy
from .systems.registry import SYSTEMS, SystemSpec, register_systems, system
from .systems.sancus import SancusConfig, SancusDataModule, SancusStrategy
from .systems.single import SingleConfig, SingleDataModule, SingleStrategy

register_systems()

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
