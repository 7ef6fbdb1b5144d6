"""The systems: one folder each (config, Strategy, DataModule, report callbacks).

Each system's package declares its ``SYSTEM`` (``spec.SystemSpec``); ``registry.SYSTEMS`` maps
every strategy name to its spec; :mod:`lightning_gnnscale.kit` holds what the systems share
(strategies, the DataModule and its loaders, partition I/O) and :mod:`lightning_gnnscale.contract`
the typed objects their pieces exchange (docs/architecture.md).

A system's package imports its ``config`` module (what Hydra's schema needs) and nothing else
until one of its other names is used (:func:`lazy_exports`): choosing one system never imports
the others.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, exports: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each public name to
    the submodule (``.strategy``) that defines it, imported on first use."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(exports[name], package), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
