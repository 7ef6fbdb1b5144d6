"""lightning_gnnscale: distributed GNN training systems as PyTorch Lightning plugins.

Importing the package registers every system's strategy in Lightning's ``StrategyRegistry``
(``L.Trainer(strategy="gsplit")``; the plain data-parallel reference is ``metered_ddp``, since
Lightning's own ``ddp`` is unmetered) and its config schema in Hydra's ConfigStore. Per system,
its Strategy, DataModule and typed config are exported here; see docs/quickstart.md, "From your
own Lightning script".
"""

from .callbacks import CollectiveAudit, CommStats, EpochStats, RunSummary, StepSeed
from .errors import ConfigError
from .graph.batch import Batch
from .graph.csc import Graph
from .graph.datasets import DATASETS, load_dataset
from .models.gnn import BlockGNN, SubgraphModel, build_model
from .models.module import GNNModule
from .schema import DataConfig, ModelConfig, RunConfig, SystemConfig, TrainerConfig
from .systems.base import GNNDataModule, SystemStrategy
from .systems.bytegnn import ByteGNNConfig, ByteGNNDataModule, ByteGNNStrategy
from .systems.contract import Evaluation, ModuleRuntime, RankContext, rank_context
from .systems.ddp import DataParallelDataModule, DataParallelStrategy, DDPConfig
from .systems.distdgl import DistDGLConfig, DistDGLDataModule, DistDGLStrategy
from .systems.granndis import GraNNDISConfig, GraNNDISDataModule, GraNNDISStrategy
from .systems.grappa import GrappaConfig, GrappaDataModule, GrappaStrategy
from .systems.gsplit import GSplitConfig, GSplitDataModule, GSplitStrategy
from .systems.hopgnn import HopGNNConfig, HopGNNDataModule, HopGNNStrategy
from .systems.registry import SYSTEMS, SystemSpec, register_systems
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
    "ByteGNNStrategy",
    "CollectiveAudit",
    "CommStats",
    "ConfigError",
    "DDPConfig",
    "DataConfig",
    "DataParallelDataModule",
    "DataParallelStrategy",
    "DistDGLConfig",
    "DistDGLDataModule",
    "DistDGLStrategy",
    "EpochStats",
    "Evaluation",
    "GNNDataModule",
    "GNNModule",
    "GSplitConfig",
    "GSplitDataModule",
    "GSplitStrategy",
    "GraNNDISConfig",
    "GraNNDISDataModule",
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
    "RankContext",
    "RunConfig",
    "RunSummary",
    "SancusConfig",
    "SancusDataModule",
    "SancusStrategy",
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
    "load_dataset",
    "rank_context",
    "register_systems",
]
