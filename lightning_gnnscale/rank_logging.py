"""How a started rank logs: as its launcher does, and knowing its rank.

Hydra configures logging (the console and the run's ``train.log``) in the launching process
only. A rank starts with none, and Lightning, imported before any configuration (in the rank
server), gave its own loggers a console handler and stopped them propagating. So the launcher
describes its root logger (:func:`launcher_logging`) and each rank rebuilds it
(:func:`adopt_launcher_logging`): the same files, appended to, the same standard streams,
levels and formats. Standard library only (the launcher imports it before torch).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass

_STREAMS = {1: "stdout", 2: "stderr"}


@dataclass(frozen=True)
class HandlerSpec:
    """One root handler a rank can rebuild: ``target`` is a file path (appended to) or
    ``"stdout"`` / ``"stderr"``."""

    target: str
    is_file: bool
    level: int
    formatter: logging.Formatter | None


@dataclass(frozen=True)
class LoggingSpec:
    """The launcher's root logger: its level and the handlers a rank can rebuild."""

    level: int
    handlers: tuple[HandlerSpec, ...]


def launcher_logging() -> LoggingSpec:
    """This process's root logger as a :class:`LoggingSpec`: its file handlers and its handlers
    on the standard output and error. Others (a handler into memory, a socket) cannot be shared
    with another process and are left out."""
    handlers = []
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            target, is_file = handler.baseFilename, True
        elif isinstance(handler, logging.StreamHandler):
            fd = None
            with contextlib.suppress(Exception):  # a stream without a descriptor (StringIO)
                fd = handler.stream.fileno()
            if fd not in _STREAMS:
                continue
            target, is_file = _STREAMS[fd], False
        else:
            continue
        handlers.append(HandlerSpec(target, is_file, handler.level, handler.formatter))
    return LoggingSpec(logging.getLogger().level, tuple(handlers))


def adopt_launcher_logging(spec: LoggingSpec, global_rank: int) -> None:
    """Log in this rank as :func:`launcher_logging` described the launcher; tell Lightning's
    rank-zero-only functions (loggers, ``rank_zero_info``) that this process is
    ``global_rank``: Lightning reads it from the environment once, when imported, which for a
    forked rank was in the rank server (rank 0 in every rank, so every rank opened a W&B run)."""
    from lightning_utilities.core.rank_zero import rank_zero_only

    rank_zero_only.rank = global_rank
    if not spec.handlers:
        return
    root = logging.getLogger()
    root.setLevel(spec.level)
    for described in spec.handlers:
        if described.is_file:
            handler: logging.Handler = logging.FileHandler(described.target, mode="a")
        else:
            handler = logging.StreamHandler(getattr(sys, described.target))
        handler.setLevel(described.level)
        handler.setFormatter(described.formatter)
        root.addHandler(handler)
    as_before_logging_is_configured()


def as_before_logging_is_configured() -> None:
    """Lightning gives its loggers a handler of their own, and stops them propagating, when it
    is imported before logging is configured (in a rank server, a warm server); a cold
    ``train.py`` imports it after Hydra has configured logging, so its lines go to Hydra's
    handlers (the run's log file). Undo what the early import did."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
