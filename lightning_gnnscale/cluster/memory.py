"""A memory cap per emulated host: one cgroup (v1 ``memory`` controller) per host.

A host's launcher joins its cgroup before it execs (:func:`joined`), so everything the host
starts (its rank server, its ranks) is charged to it, as to a machine of that size. The kernel
reclaims the host's page cache first, then kills inside the host when its charge would pass
the cap (the OOM killer, counted in ``memory.oom_control``). The peak charge
(``memory.max_usage_in_bytes``) is resident memory plus the page cache the host read.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/memory")  # cgroup v1's memory controller
_JOIN = 'echo $$ > "$0" && exec "$@"'  # sh: move this shell into the cgroup, then exec


class MemoryCapUnavailable(RuntimeError):
    """No writable cgroup v1 memory controller here."""


def check_available(root: Path = ROOT) -> None:
    """Raise :class:`MemoryCapUnavailable` with the reason unless caps can be set here."""
    if not (root / "memory.limit_in_bytes").is_file():
        raise MemoryCapUnavailable(
            f"a memory cap per host needs cgroup v1's memory controller at {root} "
            "(not mounted here)"
        )
    probe = root / f"lgcprobe{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        raise MemoryCapUnavailable(f"cannot create a cgroup under {root}: {err}") from None


def create(name: str, limit_mb: int, root: Path = ROOT) -> Path:
    """A new cgroup ``root/name`` capped at ``limit_mb`` MiB; returns its folder."""
    path = root / name
    path.mkdir()
    (path / "memory.limit_in_bytes").write_text(str(limit_mb * 1024 * 1024))
    return path


def joined(path: Path, argv: list[str]) -> list[str]:
    """``argv`` run as a member of the cgroup at ``path`` (it joins before it execs)."""
    return ["sh", "-c", _JOIN, str(path / "cgroup.procs"), *argv]


def usage(path: Path) -> dict:
    """``{"peak_mb", "oom_kills"}`` of the cgroup at ``path`` so far."""
    peak = int((path / "memory.max_usage_in_bytes").read_text()) / 2**20
    fields = dict(line.split() for line in (path / "memory.oom_control").read_text().splitlines())
    return {"peak_mb": round(peak, 1), "oom_kills": int(fields.get("oom_kill", 0))}


def remove(path: Path, timeout_s: float = 5.0) -> None:
    """SIGKILL what is left in the cgroup, then remove it; never raises for what is gone."""
    deadline = time.monotonic() + timeout_s
    while path.is_dir():
        with contextlib.suppress(OSError):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            path.rmdir()
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def leftovers(prefix: str, root: Path = ROOT) -> list[str]:
    """Cgroups whose names start with ``prefix`` (what a cluster would leave)."""
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(prefix))
