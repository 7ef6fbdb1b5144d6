"""Errors shared by every layer, and the two checks that raise them (a leaf module: it
imports nothing of the suite, so the config modules of ``graph`` and ``systems`` and the
schema can all use it)."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A bad config value; the message names the key and the valid choices."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition``."""
    if not condition:
        raise ConfigError(message)


def choice(key: str, value: Any, valid) -> None:
    """``value`` is one of ``valid``; the error names ``key`` and lists the valid values."""
    require(value in valid, f"{key}={value!r} is unknown; valid: {list(valid)}")
