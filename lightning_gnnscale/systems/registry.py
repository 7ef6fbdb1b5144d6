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
    """One strategy name: what it is, where its classes are, and what it supports.

    Attributes:
        name: the config name (``strategy=<name>``).
        description: one line for listings.
        config_type: its settings class (torch-free; ``default_config()`` builds its defaults).
        package: the system's package; it exports ``strategy_class`` and ``datamodule_class``
            (loaded on use) and holds them in its ``strategy`` and ``datamodule`` modules.
        strategy_class, datamodule_class: the names of its Strategy and DataModule.
        lightning_name: the name in Lightning's ``StrategyRegistry`` (differs from ``name``
            only where Lightning already has that name).
        default_devices: ``trainer.devices`` of a plain ``strategy=<name>`` run.
        run_settings: other settings of a plain run, outside ``strategy:`` and ``model:``
            (``(("topology.servers", 2),)``); the model settings are the config's
            ``MODEL_SETTINGS``.
        ranks_per_host: the ranks ``bench cluster`` starts on each emulated host.
        bench_baseline: the ``bench cluster`` variant this name is measured against (a name,
            or one of a system's ``bench_variants``); ``None``: it is a baseline only.
        bench_model: the model its ``bench cluster`` runs must train; ``""``: the bench's.
        bench_variants: further ``bench cluster`` variants of this name, ``(label,
            train.py overrides)``.
        exact: it equals ``single`` on the same batches as configured by default.
        exact_settings: the ``strategy.<key>`` settings under which an approximate name is
            exact (``()`` for exact ones, and for those no setting makes exact).
        supports_predict: ``trainer.predict`` gives every node's rows.
        tasks: the tasks it trains.
    """

    name: str
    description: str
    config_type: type[SystemConfig]
    package: str
    strategy_class: str
    datamodule_class: str
    lightning_name: str = ""
    default_devices: int = 1
    run_settings: tuple[tuple[str, Any], ...] = ()
    ranks_per_host: int = 1
    bench_baseline: str | None = None
    bench_model: str = ""
    bench_variants: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exact: bool = True
    exact_settings: tuple[tuple[str, Any], ...] = ()
    supports_predict: bool = True
    tasks: tuple[str, ...] = ("node_classification",)

    @property
    def strategy(self) -> type[SystemStrategy]:
        """The system's ``SystemStrategy`` subclass (imports the system)."""
        return getattr(import_module(self.package), self.strategy_class)

    @property
    def datamodule(self) -> type[GNNDataModule]:
        """The system's ``GNNDataModule`` subclass (imports the system)."""
        return getattr(import_module(self.package), self.datamodule_class)

    @property
    def system(self) -> str:
        """The system's folder (several names may share one)."""
        return self.package.rpartition(".")[2]

    @property
    def implementation(self) -> tuple[str, str]:
        """The modules of its Strategy and DataModule (what a rank imports to run it)."""
        return (f"{self.package}.strategy", f"{self.package}.datamodule")

    @property
    def supports_partition_dir(self) -> bool:
        """Its ranks can load from ``data.partition_dir`` (its config's rule, which the
        config checks)."""
        return self.config_type.loads_partition_dir(self.name)

    def default_config(self) -> SystemConfig:
        """The name's settings when none are given: a preset's defining settings applied
        (``config_type.PRESETS``)."""
        cls = self.config_type
        if self.name in cls.NAMES:
            return cls.preset(self.name)
        return cls(name=self.name, **cls.PRESETS.get(self.name, {}))

    @property
    def registered_as(self) -> str:
        return self.lightning_name or self.name


def _system(name: str, prefix: str, description: str, **kwargs: Any) -> SystemSpec:
    """A name whose classes follow the ``<Prefix>Config/Strategy/DataModule`` pattern."""
    system = kwargs.pop("system", name)
    package = f"{__package__}.{system}"
    config = getattr(import_module(f"{package}.config"), f"{prefix}Config")
    return SystemSpec(
        name, description, config, package, f"{prefix}Strategy", f"{prefix}DataModule", **kwargs
    )


def _presets(system: str, prefix: str, presets: dict[str, str], **kwargs) -> list[SystemSpec]:
    """One name per preset of a system (``config_type.preset(name)``), described by ``presets``."""
    return [
        _system(name, prefix, text, system=system, **kwargs.get(name, kwargs.get("*", {})))
        for name, text in presets.items()
    ]


def _specs() -> list[SystemSpec]:
    from .granndis.config import GRANNDIS_PRESETS
    from .grappa.config import GRAPPA_PRESETS
    from .hopgnn.config import HOPGNN_PRESETS

    granndis = dict(
        default_devices=4,
        run_settings=(("topology.servers", 2), ("trainer.max_epochs", 200)),
        ranks_per_host=2,
    )
    return [
        _system(
            "single",
            "Single",
            "one process, the oracle",
            run_settings=(("trainer.num_nodes", 1),),
        ),
        SystemSpec(
            "ddp",
            "replicated graph, plain data parallel (metered)",
            import_module(f"{__package__}.ddp.config").DDPConfig,
            f"{__package__}.ddp",
            "DataParallelStrategy",
            "DataParallelDataModule",
            lightning_name="metered_ddp",
            default_devices=2,
            exact=False,
            exact_settings=(("salt_by_rank", False),),
        ),
        _system(
            "distdgl",
            "DistDGL",
            "DistDGL: partitioned graph, KV store, distributed sampling",
            default_devices=2,
            bench_baseline="distdgl_random",
            bench_variants=(("distdgl_random", ("strategy.partition.method=random",)),),
        ),
        _system(
            "bytegnn",
            "ByteGNN",
            "ByteGNN: sampling DAGs on a thread pool, launch-score scheduler, socket graph store",
            default_devices=2,
            bench_baseline="distdgl",
        ),
        _system(
            "gsplit",
            "GSplit",
            "GSplit: split-parallel mini-batches, row shuffle before every layer",
            default_devices=2,
            bench_baseline="ddp",
        ),
        _system(
            "sancus",
            "Sancus",
            "SANCUS: full-graph, staleness-aware skipped broadcasts",
            default_devices=2,
            bench_baseline="cagnet",
            bench_model="gcn",
            exact=False,
            exact_settings=(("policy", "none"),),
        ),
        _system(
            "cagnet",
            "Sancus",
            "CAGNET-1D: full-graph exact broadcasts (SANCUS with bound 0)",
            system="sancus",
            default_devices=2,
            bench_model="gcn",
        ),
        *_presets(
            "grappa",
            "Grappa",
            GRAPPA_PRESETS,
            grappa={"default_devices": 2, "exact": False, "bench_baseline": "ddp"},
            **{"*": {"default_devices": 2, "exact": False}},
        ),
        *_presets(
            "hopgnn",
            "HopGNN",
            HOPGNN_PRESETS,
            hopgnn={"default_devices": 2, "bench_baseline": "hopgnn_mc"},
            **{"*": {"default_devices": 2}},
        ),
        *_presets(
            "granndis",
            "GraNNDIS",
            GRANNDIS_PRESETS,
            granndis={**granndis, "exact": False, "bench_baseline": "granndis_fb_base"},
            granndis_cob={**granndis, "exact": False, "exact_settings": (("cob.sampler", "none"),)},
            granndis_mb_base={**granndis, "exact": False},
            **{"*": granndis},
        ),
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
