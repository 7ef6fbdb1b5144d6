"""glibc's malloc set for a training process: freed step tensors stay in the process for reuse.

Every step allocates and frees the same tensors of 0.1-30 MB (gathered rows, dropout masks,
hidden rows, their gradients). With glibc's defaults each of them is a fresh ``mmap`` (above the
128 KiB mmap threshold, which glibc raises only after such a block is freed) or a heap top
handed back to the kernel (above the trim threshold), so the next step zero-fills the same pages
again through page faults. On the ``bench e2e`` graph that cost 10-35 % of a training epoch, more
in spawned ranks, which never free a large block before training and keep the 128 KiB threshold
(docs/benchmarks.md, issue 16). Fixing the mmap threshold at glibc's largest value (32 MiB) and
trimming only above 2 GiB of free heap keeps those pages: the process holds the memory of its
largest step instead of returning and re-faulting it.

``$GNNSCALE_MALLOC=system`` leaves glibc's defaults. Elsewhere than glibc (macOS, musl, Windows)
there is no ``mallopt`` and nothing changes; ``summary.json``'s ``cpu_allocator`` says which
applied. The settings hold for the rest of the process: ``train()`` applies them in each rank,
which for one process (``strategy=single``, or under ``torchrun``) is the caller's own.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings

from .errors import ConfigError

MALLOC_ENV = "GNNSCALE_MALLOC"
_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's maximum on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD_BYTES = (1 << 31) - 1  # the largest ``int`` mallopt takes: trim above 2 GiB only


def malloc_choice() -> str:
    """``$GNNSCALE_MALLOC`` (default ``retain``); ``ConfigError`` naming the valid values."""
    choice = os.environ.get(MALLOC_ENV, "retain")
    if choice not in ("retain", "system"):
        raise ConfigError(f"{MALLOC_ENV}={choice!r}; valid: retain, system")
    return choice


def retain_freed_memory() -> str:
    """Apply the settings above to this process; return what applies: ``"retain"`` (set now or
    before), ``"system"`` (``$GNNSCALE_MALLOC=system``), ``"unavailable"`` (no glibc
    ``mallopt``) or ``"refused"`` (glibc rejected a value, e.g. 32-bit builds; with a warning).

    Raises ``ConfigError`` for another value of ``$GNNSCALE_MALLOC``."""
    return _apply(
        (
            ("M_MMAP_THRESHOLD", _M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
            ("M_TRIM_THRESHOLD", _M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        ),
        "training runs slower",
    )


def apply_malloc_settings(share: bool) -> str:
    """A rank's settings at its start: :func:`retain_freed_memory`, then :func:`share_arenas`
    where ``share`` (``SystemConfig.shares_malloc_arenas``: before the rank's threads start,
    so none has an arena of its own). What :func:`retain_freed_memory` applied."""
    applied = retain_freed_memory()
    if share:
        share_arenas()
    return applied


def share_arenas() -> str:
    """Under ``retain``, threads started from now on allocate from the arenas already there
    (``M_ARENA_MAX`` = 1) rather than one arena each: retained, every arena keeps the most it
    ever held, so blocks built by helper threads and freed by the trainer (ByteGNN's batches)
    would stay in their threads' arenas, out of the trainer's reach. Returns what applies, as
    :func:`retain_freed_memory`."""
    return _apply((("M_ARENA_MAX", _M_ARENA_MAX, 1),), "each thread keeps its own arena")


def _apply(settings, consequence: str) -> str:
    """``mallopt`` each ``(name, parameter, value)`` under ``retain``; what applies."""
    if malloc_choice() == "system":
        return "system"
    if not sys.platform.startswith("linux"):
        return "unavailable"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return "unavailable"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    for name, param, value in settings:
        if not mallopt(param, value):
            warnings.warn(f"glibc refused mallopt({name}, {value}); {consequence}", stacklevel=3)
            return "refused"
    return "retain"
