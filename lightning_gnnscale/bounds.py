"""Bounds on the settings that start processes and threads on this machine, checked in the
launching process before anything is spawned (docs/configuration.md, "Bounds").

Torch-free (the standard library, the suite's errors and its schema), so a launcher can check a
composed config before it imports torch. The core-based bounds (ranks, loader workers, threads)
are lifted by ``launcher.allow_oversubscribe=true``, with a warning; a port outside 1-65535 or a
count that is not a positive integer is refused whatever the setting.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

from .config_types import RunConfig
from .errors import ConfigError

RANKS_PER_CORE = 8  # local ranks per usable core (the README runs 4 ranks on 2 cores)
THREADS_PER_CORE = 4  # loader workers, or threads, of one rank per usable core
PORT_RANGE = (1, 65535)
THREADS_ENV = "GNNSCALE_NUM_THREADS"  # torch threads of each rank (run.rank_threads)
OMP_THREADS_ENV = "OMP_NUM_THREADS"  # OpenMP threads (torch reads it; Lightning respects it)
PORT_ENV = "MASTER_PORT"
HATCH = "launcher.allow_oversubscribe=true"


def externally_launched() -> bool:
    """True when the ranks already exist: torchrun or a manual launch (``LOCAL_RANK`` set), or
    an ``srun`` with several tasks (each task is one rank; Lightning reads ``SLURM_PROCID``)."""
    return "LOCAL_RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) > 1


def cgroup_cpu_limit(
    root: Path = Path("/sys/fs/cgroup"), membership: str | None = None
) -> float | None:
    """Cores this process's cgroup quota allows (``cpu.max`` of cgroup v2, the tightest along
    the path to the root; ``cpu.cfs_quota_us`` of v1); ``None`` without a quota or where the
    files are not readable. ``membership``: the text of ``/proc/self/cgroup`` (default: read
    it)."""
    if membership is None:
        try:
            membership = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    lines = [line for line in membership.splitlines() if line.count(":") >= 2]
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: every ancestor's cpu.max applies
            folder = root / path.lstrip("/")
            while True:
                limits.append(_v2_limit(folder / "cpu.max"))
                if folder == root or root not in folder.parents:
                    break
                folder = folder.parent
        elif "cpu" in controllers.split(","):
            for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                limits.append(_v1_limit(root / mount / path.lstrip("/")))
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def _v2_limit(path: Path) -> float | None:
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_limit(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by its cgroup's CPU quota
    rounded up (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def env_count(name: str, environ: Mapping[str, str] | None = None) -> int | None:
    """The positive integer in environment variable ``name``; ``None`` when unset or empty.
    ``OMP_NUM_THREADS`` may list one count per nesting level (``4,2``): the largest counts."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    if not value:
        return None
    parts = value.split(",") if name == OMP_THREADS_ENV else [value]
    if not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ConfigError(f"{name}={value!r} must be a positive integer (or unset)")
    return max(int(p) for p in parts)


def check_port(environ: Mapping[str, str] | None = None, offset: int = 0) -> None:
    """``$MASTER_PORT`` (plus ``offset``: job k of a sweep meets at ``MASTER_PORT`` + k), when
    set, is a TCP port in 1-65535."""
    value = (os.environ if environ is None else environ).get(PORT_ENV)
    if value is None:
        return
    low, high = PORT_RANGE
    if not value.strip().isdigit():
        raise ConfigError(f"{PORT_ENV}={value!r} must be a TCP port, an integer in {low}-{high}")
    port = int(value) + offset
    if not low <= port <= high:
        shifted = f" + sweep job {offset} = {port}" if offset else ""
        raise ConfigError(f"{PORT_ENV}={value}{shifted} is outside the TCP ports {low}-{high}")


def _within(key: str, value: int, per_core: int, cores: int, what: str, allow: bool) -> None:
    """``value`` of ``key`` is at most ``per_core`` x ``cores`` (``what`` they count), unless
    ``allow`` lifts the bound, which a warning then says."""
    bound = per_core * cores
    if value <= bound:
        return
    message = f"{key}={value} exceeds {per_core} x {cores} usable cores = {bound} {what}"
    if not allow:
        raise ConfigError(f"{message}; set {HATCH} if you mean it")
    warnings.warn(f"{message}; allowed by {HATCH}", stacklevel=3)


def check_run_bounds(
    run: RunConfig,
    *,
    spawns_ranks: bool,
    environ: Mapping[str, str] | None = None,
    cores: int | None = None,
) -> None:
    """The bounds of ``run`` on this machine (raises :class:`ConfigError` naming the key or the
    variable and the bound).

    - ``trainer.devices`` (local ranks, when this process ``spawns_ranks``; under torchrun or
      srun the ranks exist already) at most ``RANKS_PER_CORE`` x the usable cores;
    - ``data.num_workers``, ``$GNNSCALE_NUM_THREADS`` and ``$OMP_NUM_THREADS`` (per rank) at
      most ``THREADS_PER_CORE`` x the usable cores;
    - ``$MASTER_PORT`` a port in 1-65535.

    ``launcher.allow_oversubscribe`` lifts the core-based bounds (with a warning), not the
    port's. ``cores``: the usable cores (default :func:`usable_cores`)."""
    environ = os.environ if environ is None else environ
    cores = usable_cores() if cores is None else cores
    allow = run.launcher.allow_oversubscribe
    if spawns_ranks:
        devices = run.trainer.devices
        _within("trainer.devices", devices, RANKS_PER_CORE, cores, "ranks per node", allow)
    workers = run.data.num_workers
    _within("data.num_workers", workers, THREADS_PER_CORE, cores, "workers per rank", allow)
    for name in (THREADS_ENV, OMP_THREADS_ENV):
        threads = env_count(name, environ)
        if threads is not None:
            _within(f"${name}", threads, THREADS_PER_CORE, cores, "threads per rank", allow)
    check_port(environ)


def check_threads_per_rank(key: str, threads: int, allow: bool, cores: int | None = None) -> None:
    """``threads`` (what ``key`` starts in each rank, e.g. a system's sampling threads) at most
    ``THREADS_PER_CORE`` x the usable cores, unless ``allow`` (``launcher.allow_oversubscribe``)
    lifts the bound, with a warning. ``cores``: default :func:`usable_cores`."""
    cores = usable_cores() if cores is None else cores
    _within(key, threads, THREADS_PER_CORE, cores, "threads per rank", allow)
