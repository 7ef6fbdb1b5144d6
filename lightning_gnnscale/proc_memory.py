"""Memory of processes read from Linux's ``/proc``: peak RSS of one process, and samples of a
whole process tree (a launcher, its rank server, the ranks) for ``bench memory``.

Standard library only. Elsewhere than Linux every reader returns ``None`` / empty results.

- ``VmHWM`` (``/proc/<pid>/status``) is the process's own peak resident set, exact whenever it
  is read: a sampler that reads it late still sees the peak.
- ``Pss`` (``/proc/<pid>/smaps_rollup``) is the proportional set: each page shared by ``n``
  processes counts ``1/n`` in each, so summing it over a job's processes gives the job's memory
  on the node without counting shared pages (the graph in shared memory, the rank server's
  imports inherited by forked ranks) once per process. It has no peak counter: its peak is the
  largest sum seen while sampling.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


def _status_kb(pid: int | str, key: str, proc: Path = PROC) -> int | None:
    """The ``key:`` line of ``/proc/<pid>/status`` in KiB (``None``: no such process / key)."""
    try:
        with open(proc / str(pid) / "status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss_mb_of(pid: int | str = "self", proc: Path = PROC) -> float | None:
    """Peak resident set (``VmHWM``) of process ``pid`` in MiB; ``None`` when it cannot be
    read (no such process, not Linux)."""
    kb = _status_kb(pid, "VmHWM", proc)
    return None if kb is None else kb / 1024.0


def pss_mb_of(pid: int | str, proc: Path = PROC) -> float | None:
    """Current proportional set size (``Pss`` of ``smaps_rollup``) of ``pid`` in MiB."""
    try:
        with open(proc / str(pid) / "smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def rank_server_pid() -> int | None:
    """The pid of this process's rank server (multiprocessing's forkserver), if one runs."""
    try:
        from multiprocessing import forkserver

        pid = forkserver._forkserver._forkserver_pid  # noqa: SLF001 - no public accessor
    except (ImportError, AttributeError):
        return None
    return pid if pid and (PROC / str(pid)).exists() else None


def parent_map(proc: Path = PROC) -> dict[int, int]:
    """``{pid: parent pid}`` of every process visible in ``proc`` (one pass over it)."""
    parents = {}
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def process_tree(root: int, parents: dict[int, int]) -> dict[int, int]:
    """``{pid: depth}`` of ``root`` (depth 0) and every descendant in ``parents``."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    tree, frontier, depth = {root: 0}, [root], 0
    while frontier:
        depth += 1
        frontier = [c for pid in frontier for c in children.get(pid, ()) if c not in tree]
        tree.update((c, depth) for c in frontier)
    return tree


def cmdline(pid: int, proc: Path = PROC) -> str:
    try:
        return (
            (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def role_of(pid: int, root: int, parents: dict[int, int], proc: Path = PROC) -> str:
    """What ``pid`` is in the job started as ``root``: ``launcher`` (the root), ``rank server``
    (the forkserver the launcher started), ``rank`` (a child of the rank server, or a spawned
    child of the launcher), ``helper`` (multiprocessing's resource tracker) or ``other`` (e.g. a
    rank's loader workers). Forked processes keep their parent's command line, so the server is
    the forkserver whose parent is not one."""
    if pid == root:
        return "launcher"
    parent = parents.get(pid)
    line = cmdline(pid, proc)
    if "multiprocessing.resource_tracker" in line:
        return "helper"
    if parent is None:
        return "other"
    server = "multiprocessing.forkserver"
    if server in line and server not in cmdline(parent, proc):
        return "rank server"
    if parent != root and role_of(parent, root, parents, proc) == "rank server":
        return "rank"
    if parent == root and "multiprocessing.spawn" in line:
        return "rank"
    return "other"


@dataclass
class ProcessPeak:
    """What sampling saw of one process: its role, its peak RSS (``VmHWM``, exact up to the
    last sample) and its largest PSS sample."""

    pid: int
    role: str
    peak_rss_mb: float = 0.0
    peak_pss_mb: float = 0.0


class TreeSampler:
    """Samples every process of a job (``root`` and its descendants) each time :meth:`sample`
    is called: per process the peak RSS and PSS, and for the job the largest PSS total."""

    def __init__(self, root: int, proc: Path = PROC):
        self.root, self.proc = root, proc
        self.processes: dict[int, ProcessPeak] = {}
        self.peak_pss_total_mb = 0.0
        self.samples = 0

    def sample(self) -> float:
        """Read every live process of the tree once; the job's PSS total now (MiB)."""
        parents = parent_map(self.proc)
        total = 0.0
        for pid in process_tree(self.root, parents):
            rss, pss = peak_rss_mb_of(pid, self.proc), pss_mb_of(pid, self.proc)
            if rss is None or pss is None:  # exited meanwhile (or a zombie)
                continue
            seen = self.processes.get(pid)
            if seen is None:
                seen = self.processes[pid] = ProcessPeak(pid, "other")
            if seen.role == "other":  # again: a process seen between its fork and its exec
                seen.role = role_of(pid, self.root, parents, self.proc)
            seen.peak_rss_mb = max(seen.peak_rss_mb, rss)
            seen.peak_pss_mb = max(seen.peak_pss_mb, pss)
            total += pss
        self.peak_pss_total_mb = max(self.peak_pss_total_mb, total)
        self.samples += 1
        return total

    def by_role(self, role: str) -> list[ProcessPeak]:
        """The processes of one role, in start order (pid order within one run)."""
        return sorted((p for p in self.processes.values() if p.role == role), key=lambda p: p.pid)


def linux_proc_available() -> bool:
    return os.path.exists("/proc/self/smaps_rollup")
