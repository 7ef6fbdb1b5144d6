"""Errors shared by every layer, and the checks that raise them (a leaf module: it imports
nothing of the suite, so the config modules of ``graph`` and ``systems`` and the schema can all
use it)."""

from __future__ import annotations

import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import MISSING


class ConfigError(ValueError):
    """A bad config value; the message names the key and the valid choices."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition``."""
    if not condition:
        raise ConfigError(message)


def choice(key: str, value: Any, valid) -> None:
    """``value`` is one of ``valid``; the error names ``key`` and lists the valid values."""
    require(value in valid, f"{key}={value!r} is unknown; valid: {list(valid)}")


def _type_ok(value: Any, expected: Any) -> bool:
    """Whether ``value`` fits the annotation ``expected`` (int is not a bool; float takes int)."""
    if expected is Any:
        return True
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(expected))
    if origin in (list, tuple):
        item = typing.get_args(expected)[:1] or (Any,)
        return isinstance(value, list | tuple) and all(_type_ok(v, item[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if expected is type(None):
        return value is None
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(expected, type):
        return isinstance(value, expected)
    return True  # an annotation this check does not model


def check_field_types(config: Any, prefix: str = "") -> None:
    """Every field of the settings dataclass ``config`` holds a value of its annotated type
    (nested settings dataclasses too): ``partitions_per_rank=2.5`` or a dict where a nested
    config is expected fail at construction, with the key named."""
    hints = typing.get_type_hints(type(config))
    for f in fields(config):
        value, expected = getattr(config, f.name), hints.get(f.name, Any)
        if isinstance(value, str) and value == MISSING:
            continue
        if not _type_ok(value, expected):
            plain = isinstance(expected, type) and not typing.get_args(expected)
            shown = expected.__name__ if plain else str(expected).replace("typing.", "")
            raise ConfigError(
                f"{prefix}{f.name}={value!r} is a {type(value).__name__}, expected {shown}"
            )
        if is_dataclass(value) and not isinstance(value, type):
            check_field_types(value, f"{prefix}{f.name}.")
