"""Every system by name: its config, Strategy and DataModule, registered with Hydra's
ConfigStore (the config schema) and Lightning's ``StrategyRegistry`` (the strategy)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..schema import SystemConfig, register_schemas
from .base import GNNDataModule, SystemStrategy
from .bytegnn import ByteGNNConfig, ByteGNNDataModule, ByteGNNStrategy
from .ddp import DataParallelDataModule, DataParallelStrategy, DDPConfig
from .distdgl import DistDGLConfig, DistDGLDataModule, DistDGLStrategy
from .granndis import GRANNDIS_PRESETS, GraNNDISConfig, GraNNDISDataModule, GraNNDISStrategy
from .grappa import GRAPPA_PRESETS, GrappaConfig, GrappaDataModule, GrappaStrategy
from .gsplit import GSplitConfig, GSplitDataModule, GSplitStrategy
from .hopgnn import HOPGNN_PRESETS, HopGNNConfig, HopGNNDataModule, HopGNNStrategy
from .sancus import SancusConfig, SancusDataModule, SancusStrategy
from .single import SingleConfig, SingleDataModule, SingleStrategy


@dataclass(frozen=True)
class SystemSpec:
    """One strategy name.

    Attributes:
        name: the config name (``strategy=<name>``).
        default_config: the name's settings when none are given (presets differ from their
            base system only here).
        strategy, datamodule: the system's classes; both receive the one config.
        description: one line for listings.
        lightning_name: the name in Lightning's ``StrategyRegistry`` (differs from ``name``
            only where Lightning already has that name).
    """

    name: str
    default_config: Callable[[], SystemConfig]
    strategy: type[SystemStrategy]
    datamodule: type[GNNDataModule]
    description: str
    lightning_name: str = ""

    @property
    def config_type(self) -> type[SystemConfig]:
        return self.strategy.config_type

    @property
    def registered_as(self) -> str:
        return self.lightning_name or self.name


def _presets(
    presets: dict[str, str],
    config_type: type[SystemConfig],
    strategy: type[SystemStrategy],
    datamodule: type[GNNDataModule],
) -> list[SystemSpec]:
    """One name per preset of a system (``config_type.preset(name)``), described by ``presets``."""
    return [
        SystemSpec(name, lambda name=name: config_type.preset(name), strategy, datamodule, text)
        for name, text in presets.items()
    ]


def _specs() -> list[SystemSpec]:
    return [
        SystemSpec(
            "single", SingleConfig, SingleStrategy, SingleDataModule, "one process, the oracle"
        ),
        SystemSpec(
            "ddp",
            DDPConfig,
            DataParallelStrategy,
            DataParallelDataModule,
            "replicated graph, plain data parallel (metered)",
            lightning_name="metered_ddp",
        ),
        SystemSpec(
            "distdgl",
            DistDGLConfig,
            DistDGLStrategy,
            DistDGLDataModule,
            "DistDGL: partitioned graph, KV store, distributed sampling",
        ),
        SystemSpec(
            "bytegnn",
            ByteGNNConfig,
            ByteGNNStrategy,
            ByteGNNDataModule,
            "ByteGNN: sampling DAGs on a thread pool, launch-score scheduler, socket graph store",
        ),
        SystemSpec(
            "gsplit",
            GSplitConfig,
            GSplitStrategy,
            GSplitDataModule,
            "GSplit: split-parallel mini-batches, row shuffle before every layer",
        ),
        SystemSpec(
            "sancus",
            SancusConfig,
            SancusStrategy,
            SancusDataModule,
            "SANCUS: full-graph, staleness-aware skipped broadcasts",
        ),
        SystemSpec(
            "cagnet",
            lambda: SancusConfig(name="cagnet", policy="none"),
            SancusStrategy,
            SancusDataModule,
            "CAGNET-1D: full-graph exact broadcasts (SANCUS with bound 0)",
        ),
        *_presets(GRAPPA_PRESETS, GrappaConfig, GrappaStrategy, GrappaDataModule),
        *_presets(HOPGNN_PRESETS, HopGNNConfig, HopGNNStrategy, HopGNNDataModule),
        *_presets(GRANNDIS_PRESETS, GraNNDISConfig, GraNNDISStrategy, GraNNDISDataModule),
    ]


SYSTEMS: dict[str, SystemSpec] = {spec.name: spec for spec in _specs()}


def system(name: str) -> tuple[type[SystemStrategy], type[GNNDataModule], SystemConfig]:
    """``(Strategy, DataModule, config)`` of a strategy name: any ``SYSTEMS`` key (presets
    included) or its Lightning name (``metered_ddp`` is ``ddp``). The config is the name's
    default settings; pass it to both classes."""
    by_lightning_name = {spec.registered_as: spec for spec in SYSTEMS.values()}
    spec = SYSTEMS.get(name) or by_lightning_name.get(name)
    if spec is None:
        raise KeyError(
            f"strategy {name!r} is unknown; valid: {sorted(SYSTEMS)} "
            f"(Lightning names: {sorted(set(by_lightning_name) - set(SYSTEMS))})"
        )
    return spec.strategy, spec.datamodule, spec.default_config()


def register_systems() -> None:
    """Register every system's config schema with Hydra and its strategy with Lightning
    (``L.Trainer(strategy="gsplit")``); idempotent."""
    from lightning.pytorch.strategies import StrategyRegistry

    register_schemas({name: spec.config_type for name, spec in SYSTEMS.items()})
    for name, spec in SYSTEMS.items():
        if spec.registered_as not in StrategyRegistry:
            StrategyRegistry.register(
                spec.registered_as, spec.strategy, spec.description, system_name=name
            )
