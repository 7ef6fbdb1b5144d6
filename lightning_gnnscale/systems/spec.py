"""What a system declares about itself: :class:`SystemSpec`, one per strategy name.

A system's package (``systems/<name>/__init__.py``, or a package outside the repository named by
an entry point in group ``lightning_gnnscale.systems``) sets ``SYSTEM`` to its spec, or to a
tuple of specs where it serves several names (presets, aliases); the registry discovers them.
A spec names its Strategy and DataModule by package and class name, so declaring it imports the
system's config only, not its implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any

from ..config_types import SystemConfig


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
        exact_full_batch: its steps take other seeds than ``single``'s mini-batches
            (partition-local seeds, full-graph steps), so it equals ``single`` where both train
            full batches: ``data.batch_size=-1`` and every ``data.fanouts`` ``-1``.
        supports_predict: ``trainer.predict`` gives every node's rows.

    What it trains is its config's (``config_type.TASKS``, :attr:`tasks`), which the config
    checks for ``train.py`` and a plain script alike.
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
    exact_full_batch: bool = False
    supports_predict: bool = True

    @property
    def strategy(self) -> type:
        """The system's ``SystemStrategy`` subclass (imports the system)."""
        return getattr(import_module(self.package), self.strategy_class)

    @property
    def datamodule(self) -> type:
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

    @property
    def tasks(self) -> tuple[str, ...]:
        """The tasks it trains (its config's ``TASKS``, which the config checks)."""
        return self.config_type.TASKS

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

    def run_defaults(self) -> dict[str, Any]:
        """What ``strategy=<name>`` sets in the run config: ``strategy`` (the default config),
        the config's ``MODEL_SETTINGS`` under ``model``, ``trainer.devices`` and the
        ``run_settings``, nested by their dotted keys."""
        tree: dict[str, Any] = {"strategy": self.default_config()}
        settings = {
            **{f"model.{key}": value for key, value in self.config_type.MODEL_SETTINGS.items()},
            "trainer.devices": self.default_devices,
            **dict(self.run_settings),
        }
        for dotted, value in settings.items():
            *parents, key = dotted.split(".")
            node = tree
            for parent in parents:
                node = node.setdefault(parent, {})
            node[key] = value
        return tree
