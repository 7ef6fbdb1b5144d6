"""Every strategy name, discovered: the ``SYSTEM`` spec of each package under ``systems/``, then
those of the entry points in group ``lightning_gnnscale.systems`` (systems outside the
repository). Each name's default run settings go to Hydra's ConfigStore (group ``strategy``:
``strategy=<name>``) and its strategy to Lightning's ``StrategyRegistry``.

A name costs nothing until it is used: discovery imports each system's package, which imports its
``config`` module only (light: Hydra needs the schema of every name), and leaves its
implementation (Strategy, DataModule, and what they import) until a run asks for
``spec.strategy`` or ``spec.datamodule``. Lightning gets a factory per name that imports the
system when a ``Trainer(strategy=<name>)`` builds it.
"""

from __future__ import annotations

import pkgutil
import sys
from importlib import import_module
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from ..config_types import SystemConfig, register_run_schema, schema_node
from ..errors import ConfigError
from ..warm_client import GROUP
from .spec import SystemSpec

if TYPE_CHECKING:  # the implementation is imported only when a name is used
    from ..kit.datamodule import GNNDataModule
    from ..kit.strategies import SystemStrategy

# the entry-point group of systems outside the repository (warm_client owns the name: it reads
# the group for the warm server's fingerprint without importing the package)
ENTRY_POINT_GROUP = GROUP


def _specs_of(value: Any, source: str) -> tuple[SystemSpec, ...]:
    """A ``SYSTEM`` value (one spec or a tuple of them) as a tuple; anything else is refused."""
    specs = value if isinstance(value, tuple) else (value,)
    if not specs or not all(isinstance(spec, SystemSpec) for spec in specs):
        raise ConfigError(f"{source} must give a SystemSpec or a tuple of them, got {value!r}")
    return specs


def in_tree_sources() -> list[tuple[str, Any]]:
    """``(source, SYSTEM)`` of every package under ``systems/`` that declares one."""
    package = sys.modules[__package__]
    found = []
    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if module.ispkg:
            system = import_module(f"{__package__}.{module.name}")
            if hasattr(system, "SYSTEM"):
                found.append((f"{system.__name__}.SYSTEM", system.SYSTEM))
    return found


def entry_point_sources() -> list[tuple[str, Any]]:
    """``(source, loaded value)`` of every entry point in :data:`ENTRY_POINT_GROUP`."""
    found = []
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: (p.name, p.value)):
        source = f"entry point {point.name!r} ({point.value})"
        try:
            found.append((source, point.load()))
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"{source} does not load: {err}") from err
    return found


def discover(sources: list[tuple[str, Any]]) -> dict[str, SystemSpec]:
    """Every name of ``sources`` to its spec, sorted by name; a name (or a Lightning name)
    given twice is refused with both sources named."""
    owner: dict[str, str] = {}
    specs: dict[str, SystemSpec] = {}
    for source, value in sources:
        for spec in _specs_of(value, source):
            for key in dict.fromkeys((spec.name, spec.registered_as)):
                if key in owner:
                    raise ConfigError(
                        f"strategy name {key!r} is declared twice: by {owner[key]} and by {source}"
                    )
                owner[key] = source
            specs[spec.name] = spec
    return dict(sorted(specs.items()))


SYSTEMS: dict[str, SystemSpec] = discover([*in_tree_sources(), *entry_point_sources()])


def system(name: str) -> tuple[type[SystemStrategy], type[GNNDataModule], SystemConfig]:
    """``(Strategy, DataModule, config)`` of a strategy name: any ``SYSTEMS`` key (presets
    included) or its Lightning name (``data_parallel`` is ``ddp``). The config is the name's
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


def _run_node(spec: SystemSpec) -> dict[str, Any]:
    """``spec.run_defaults()`` as a ConfigStore node: the strategy typed by its config class."""
    tree = spec.run_defaults()
    return {**tree, "strategy": schema_node(tree["strategy"])}


def register_systems() -> None:
    """Register every name's run settings with Hydra (``strategy=<name>``) and its strategy
    with Lightning (``L.Trainer(strategy="gsplit")``); idempotent. Neither imports a system's implementation;
    the Lightning names are added the moment Lightning's strategies are imported (at once if
    they are), so registering does not import Lightning either."""
    from hydra.core.config_store import ConfigStore

    register_run_schema()
    store = ConfigStore.instance()
    for name, spec in SYSTEMS.items():
        store.store(group="strategy", name=name, node=_run_node(spec), package="_global_")
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
