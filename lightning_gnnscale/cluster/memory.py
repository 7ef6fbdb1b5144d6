"""A memory cap per emulated host: one cgroup (v1 ``memory`` controller) per host.

The hosts' cgroups nest inside this process's own memory cgroup (``/proc/self/cgroup``), so
whatever limits this process already has (a CI slice, a container) bounds the hosts too. A
host's launcher joins its cgroup before it execs (:func:`joined`), so everything the host
starts (its rank server, its ranks) is charged to it, as to a machine of that size. With swap
accounting (``memory.memsw.*``) the cap holds memory and swap together. The kernel reclaims
the host's page cache first, then kills inside the host when its charge would pass the cap
(the OOM killer, counted in ``memory.oom_control``). The peak charge
(``memory.max_usage_in_bytes``) is resident memory plus the page cache the host read.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from pathlib import Path

MIN_MB = 64
REMOVE_TIMEOUT_S = 5.0
_JOIN = 'echo $$ > "$0" && exec "$@"'  # sh: move this shell into the cgroup, then exec


class MemoryCapUnavailable(RuntimeError):
    """No writable cgroup v1 memory controller here."""


class CgroupNotRemoved(RuntimeError):
    """A host's cgroup could not be removed: the message names it and the pids still in it."""


def check_cap(limit_mb) -> int:
    """``limit_mb`` if it is a valid cap (an integer number of MiB, at least :data:`MIN_MB`);
    ``ValueError`` otherwise. The one rule of ``--memory-mb``, ``ClusterJob`` and
    ``EmulatedCluster``."""
    if isinstance(limit_mb, bool) or not isinstance(limit_mb, int) or limit_mb < MIN_MB:
        raise ValueError(f"memory cap must be an integer >= {MIN_MB} (MiB), got {limit_mb!r}")
    return limit_mb


def cgroup_folder(proc_cgroup: str, mountinfo: str) -> Path:
    """The folder of the memory cgroup named in ``proc_cgroup`` (``/proc/<pid>/cgroup``'s
    text), as mounted per ``mountinfo`` (``/proc/<pid>/mountinfo``'s): the v1 ``memory``
    mount's point plus the cgroup's path below the mount's root (a container without its own
    cgroup namespace mounts its own cgroup, ``/docker/<id>``, as the root)."""
    path = next(
        (
            line.split(":", 2)[2]
            for line in proc_cgroup.splitlines()
            if "memory" in line.split(":", 2)[1].split(",")
        ),
        None,
    )
    if path is None:
        raise MemoryCapUnavailable(
            "a memory cap per host needs cgroup v1's memory controller; /proc/self/cgroup names "
            "no memory cgroup of this process"
        )
    for line in mountinfo.splitlines():
        mount, _, fs = line.partition(" - ")
        mount, fs = mount.split(), fs.split()
        if len(fs) >= 3 and fs[0] == "cgroup" and "memory" in fs[2].split(","):
            root, point = mount[3], Path(mount[4])
            relative = os.path.relpath(path, root)
            if relative == ".":
                return point
            if relative.startswith(".."):
                raise MemoryCapUnavailable(
                    f"this process's memory cgroup {path} is outside the memory mount at "
                    f"{point} (its root: {root})"
                )
            return point / relative
    raise MemoryCapUnavailable(
        "a memory cap per host needs cgroup v1's memory controller; /proc/self/mountinfo has "
        "no cgroup mount with 'memory'"
    )


def parent() -> Path:
    """This process's own memory cgroup folder, where the hosts' cgroups go."""
    return cgroup_folder(
        Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text()
    )


def check_available() -> None:
    """Raise :class:`MemoryCapUnavailable` with the reason unless caps can be set here."""
    root = parent()
    if not (root / "memory.limit_in_bytes").is_file():
        raise MemoryCapUnavailable(
            f"a memory cap per host needs cgroup v1's memory controller: this process's "
            f"memory cgroup {root} has no memory.limit_in_bytes"
        )
    probe = root / f"lgcprobe{secrets.token_hex(4)}"  # not the pid: pid namespaces reuse it
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        raise MemoryCapUnavailable(f"cannot create a cgroup under {root}: {err}") from None


def create(name: str, limit_mb: int) -> Path:
    """A new cgroup ``name`` under :func:`parent`, capped at ``limit_mb`` MiB (with swap
    accounting: memory and swap together); returns its folder."""
    path = parent() / name
    path.mkdir()
    limit = str(limit_mb * 2**20)
    (path / "memory.limit_in_bytes").write_text(limit)
    memsw = path / "memory.memsw.limit_in_bytes"
    if memsw.is_file():  # after the memory limit: the kernel keeps memsw >= it
        memsw.write_text(limit)
    return path


def joined(path: Path, argv: list[str]) -> list[str]:
    """``argv`` run as a member of the cgroup at ``path`` (it joins before it execs)."""
    return ["sh", "-c", _JOIN, str(path / "cgroup.procs"), *argv]


def usage(path: Path) -> dict:
    """``{"peak_mb", "oom_kills"}`` of the cgroup at ``path`` so far."""
    peak = int((path / "memory.max_usage_in_bytes").read_text()) / 2**20
    fields = dict(line.split() for line in (path / "memory.oom_control").read_text().splitlines())
    return {"peak_mb": round(peak, 1), "oom_kills": int(fields.get("oom_kill", 0))}


def remove(path: Path) -> None:
    """SIGKILL what is left in the cgroup, then remove it (nothing to do if it is gone).

    Raises :class:`CgroupNotRemoved`, naming the cgroup and the pids still in it, when it
    cannot be removed within :data:`REMOVE_TIMEOUT_S`."""
    deadline = time.monotonic() + REMOVE_TIMEOUT_S
    while True:
        pids: list[str] = []
        with contextlib.suppress(OSError):  # gone, or unreadable: rmdir below says which
            pids = (path / "cgroup.procs").read_text().split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as err:
            if time.monotonic() > deadline:
                raise CgroupNotRemoved(
                    f"cannot remove the memory cgroup {path} ({err.strerror}); pids still in "
                    f"it: {' '.join(pids) or 'none'}; remove it with rmdir once they exit"
                ) from None
        time.sleep(0.05)


def leftovers(prefix: str) -> list[str]:
    """Cgroups under :func:`parent` whose names start with ``prefix`` (what a cluster would
    leave); none without a memory controller."""
    try:
        root = parent()
    except MemoryCapUnavailable:
        return []
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(prefix))
