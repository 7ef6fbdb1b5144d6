"""Every system by name: its config, Strategy and DataModule, registered with Hydra's
ConfigStore (the config schema) and Lightning's ``StrategyRegistry`` (the strategy).

A name costs nothing until it is used: the registry imports a system's ``config`` module (light:
Hydra needs the schema of every name) and leaves its implementation (Strategy, DataModule, and
what they import) until a run asks for ``spec.strategy`` or ``spec.datamodule``. Lightning gets a
factory per name that imports the system when a ``Trainer(strategy=<name>)`` builds it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..schema import SystemConfig, register_schemas

if TYPE_CHECKING:  # the implementation is imported only when a name is used
    from ..kit.datamodule import GNNDataModule
    from ..kit.strategies import SystemStrategy


@dataclass(frozen=True)
class SystemSpec:
    """One strategy name.

    Attributes:
        name: the config name (``strategy=<name>``).
        system: the system's folder under ``systems/`` (several names may share one).
        classes: the names of its config, Strategy and DataModule classes (the config in
            ``systems/<system>/config.py``, the other two exported by ``systems/<system>``).
        description: one line for listings.
        lightning_name: the name in Lightning's ``StrategyRegistry`` (differs from ``name``
            only where Lightning already has that name).
        preset: the default config is ``config_type.preset(name)`` (a named variant of its
            system) rather than ``config_type()``; ``overrides``: fields set on top.
    """

    name: str
    system: str
    classes: tuple[str, str, str]
    description: str
    lightning_name: str = ""
    preset: bool = False
    overrides: tuple[tuple[str, Any], ...] = ()

    @property
    def config_type(self) -> type[SystemConfig]:
        return getattr(import_module(f"{__package__}.{self.system}.config"), self.classes[0])

    @property
    def strategy(self) -> type:
        """The system's ``SystemStrategy`` subclass (imports the system)."""
        return getattr(import_module(f"{__package__}.{self.system}"), self.classes[1])

    @property
    def datamodule(self) -> type:
        """The system's ``GNNDataModule`` subclass (imports the system)."""
        return getattr(import_module(f"{__package__}.{self.system}"), self.classes[2])

    @property
    def implementation(self) -> tuple[str, str]:
        """The modules of its Strategy and DataModule (what a rank imports to run it)."""
        return (f"{__package__}.{self.system}.strategy", f"{__package__}.{self.system}.datamodule")

    def default_config(self) -> SystemConfig:
        """The name's settings when none are given (presets differ from their system only
        here)."""
        if self.preset:
            return self.config_type.preset(self.name)
        return self.config_type(name=self.name, **dict(self.overrides))

    @property
    def registered_as(self) -> str:
        return self.lightning_name or self.name


def _system(name: str, prefix: str, description: str, **kwargs: Any) -> SystemSpec:
    """A name whose classes follow the ``<Prefix>Config/Strategy/DataModule`` pattern."""
    classes = (f"{prefix}Config", f"{prefix}Strategy", f"{prefix}DataModule")
    return SystemSpec(name, kwargs.pop("system", name), classes, description, **kwargs)


def _presets(system: str, prefix: str, presets: dict[str, str]) -> list[SystemSpec]:
    """One name per preset of a system (``config_type.preset(name)``), described by ``presets``."""
    return [
        _system(name, prefix, text, system=system, preset=True) for name, text in presets.items()
    ]


def _specs() -> list[SystemSpec]:
    from .granndis.config import GRANNDIS_PRESETS
    from .grappa.config import GRAPPA_PRESETS
    from .hopgnn.config import HOPGNN_PRESETS

    return [
        _system("single", "Single", "one process, the oracle"),
        SystemSpec(
            "ddp",
            "ddp",
            ("DDPConfig", "DataParallelStrategy", "DataParallelDataModule"),
            "replicated graph, plain data parallel (metered)",
            lightning_name="metered_ddp",
        ),
        _system("distdgl", "DistDGL", "DistDGL: partitioned graph, KV store, distributed sampling"),
        _system(
            "bytegnn",
            "ByteGNN",
            "ByteGNN: sampling DAGs on a thread pool, launch-score scheduler, socket graph store",
        ),
        _system(
            "gsplit",
            "GSplit",
            "GSplit: split-parallel mini-batches, row shuffle before every layer",
        ),
        _system("sancus", "Sancus", "SANCUS: full-graph, staleness-aware skipped broadcasts"),
        _system(
            "cagnet",
            "Sancus",
            "CAGNET-1D: full-graph exact broadcasts (SANCUS with bound 0)",
            system="sancus",
            overrides=(("policy", "none"),),
        ),
        *_presets("grappa", "Grappa", GRAPPA_PRESETS),
        *_presets("hopgnn", "HopGNN", HOPGNN_PRESETS),
        *_presets("granndis", "GraNNDIS", GRANNDIS_PRESETS),
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


class _LazyStrategy:
    """Lightning's registry entry for one name: imports the system when a Trainer builds it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, **kwargs: Any):
        return SYSTEMS[self.name].strategy(system_name=self.name, **kwargs)


def _register_strategies(strategies: Any) -> None:
    """Add every name to Lightning's ``StrategyRegistry``, and tell the contract those names
    (for its error when a Trainer runs another strategy); Lightning, so torch, is loaded."""
    from ..contract import SUITE_STRATEGY_NAMES

    registry = strategies.StrategyRegistry
    for name, spec in SYSTEMS.items():
        if spec.registered_as not in registry:
            registry.register(spec.registered_as, _LazyStrategy(name), spec.description)
    SUITE_STRATEGY_NAMES[:] = sorted(spec.registered_as for spec in SYSTEMS.values())


def register_systems() -> None:
    """Register every system's config schema with Hydra and its strategy with Lightning
    (``L.Trainer(strategy="gsplit")``); idempotent. Neither imports a system's implementation;
    the Lightning names are added the moment Lightning's strategies are imported (at once if
    they are), so registering does not import Lightning either."""
    register_schemas({name: spec.config_type for name, spec in SYSTEMS.items()})
    when_imported("lightning.pytorch.strategies", _register_strategies)


def when_imported(module: str, callback) -> None:
    """Call ``callback(module)`` once ``module`` is imported: now if it is, else right after
    its import (an import hook that removes itself)."""
    if module in sys.modules:
        callback(sys.modules[module])
    elif not any(getattr(f, "module", None) == module for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(module, callback))


class _AfterImport:
    """``sys.meta_path`` finder for one module: wraps its loader to run a callback after it."""

    def __init__(self, module: str, callback) -> None:
        self.module, self.callback = module, callback

    def find_spec(self, fullname: str, path, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)
        from importlib.util import find_spec

        spec = find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _CallbackLoader(spec.loader, self.callback)
        return spec


class _CallbackLoader:
    def __init__(self, loader, callback) -> None:
        self.loader, self.callback = loader, callback

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        self.callback(module)

    def __getattr__(self, name: str):  # get_source, get_code...: the wrapped loader's
        return getattr(self.loader, name)
