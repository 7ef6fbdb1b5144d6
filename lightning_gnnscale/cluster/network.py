"""Emulated hosts on one Linux machine: network namespaces on a bridge, egress shaped with ``tbf``.

Every host is a network namespace with one veth interface named ``eth0`` (address
``198.18.0.<i+1>/24``, the benchmarking range) whose other end sits on a bridge in the root
namespace. The bridge has no address, so nothing in a host can reach the machine's own network
or leave it. With a rate, ``tbf`` on each host's ``eth0`` limits what the host sends: a
full-duplex link of that rate per host. Ranks on one host talk over the host's own stack
(local routes go through its loopback), unshaped.

Names carry a prefix (by default ``lgc`` and 6 random letters and digits, unique across pid
namespaces too); each cluster has its own bridge, so their equal addresses never meet. A
cluster whose prefix is in use (any of its names exists) is refused before it creates
anything (:class:`PrefixInUse`), and a cluster removes only what it created itself: a name
another cluster took meanwhile is never deleted. Everything created is removed by
:meth:`EmulatedCluster.close` (also on errors and signals in the caller), processes still
inside a host first; what cannot be removed is named in the error it then raises. With
``memory_mb`` each host is also a memory cgroup of that size (``memory.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import string
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .memory import (
    CgroupNotRemoved,
    MemoryCapUnavailable,
    check_available,
    check_cap,
    create,
    joined,
    parent,
    remove,
    usage,
)
from .memory import leftovers as cgroup_leftovers

SUBNET = "198.18.0.{}/24"  # RFC 2544 benchmarking range: never routed
INTERFACE = "eth0"  # the host's interface, as on a real machine
COMMAND_TIMEOUT_S = 20.0
_PREFIX = re.compile(r"^[a-z][a-z0-9]{1,8}$")  # + "v199": at most 13 of Linux's 15 characters
_DEFAULT_SUFFIX = 6  # random letters/digits after "lgc": 36**6 (2e9) prefixes


class ClusterUnavailable(RuntimeError):
    """This machine cannot emulate hosts (not root, no ``ip``/``tc``, no namespaces or tbf)."""


class ClusterLeftovers(RuntimeError):
    """Part of a cluster could not be removed: the message names each part and how to remove
    it."""


class PrefixInUse(ClusterUnavailable):
    """Names with this cluster's prefix exist already (another cluster's, or a killed one's):
    nothing was created, and nothing of theirs is removed."""


def default_prefix() -> str:
    """``lgc`` and 6 random lowercase letters/digits: unique across pid namespaces (a pid is
    not: two containers that share a network namespace reuse pids)."""
    alphabet = string.ascii_lowercase + string.digits
    return "lgc" + "".join(secrets.choice(alphabet) for _ in range(_DEFAULT_SUFFIX))


def _owned_name(prefix: str) -> re.Pattern:
    """The names a cluster with ``prefix`` creates: its bridge, hosts and their links."""
    return re.compile(rf"^{re.escape(prefix)}(br|h\d+|v\d+)$")


def check_prefix_free(prefix: str) -> None:
    """Raise :class:`PrefixInUse` naming what exists when any name a cluster with ``prefix``
    would create (namespace, link, memory cgroup) is already there."""
    taken = leftovers(prefix)
    if taken:
        raise PrefixInUse(
            f"prefix {prefix!r} is in use on this machine: {', '.join(taken)} already exist "
            "(a cluster running with this prefix, or one killed before it could remove them: "
            "ip netns del / ip link del / rmdir each). Choose another --prefix, or leave it "
            "out for a unique one"
        )


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=check
    )


def preflight(rate_mbit: float | None, memory_cap: bool = False) -> None:
    """Raise :class:`ClusterUnavailable` with the reason unless hosts can be emulated here.

    Creates nothing that outlives it: the probe runs in an anonymous network namespace
    (``unshare --net``), which the kernel frees when the probe exits.
    """
    if os.geteuid() != 0:
        raise ClusterUnavailable("emulating hosts needs root (network namespaces, veth, tc)")
    missing = [tool for tool in ("ip", "tc", "unshare", "taskset") if shutil.which(tool) is None]
    if missing:
        raise ClusterUnavailable(f"missing tools: {', '.join(missing)} (iproute2, util-linux)")
    probe = "ip link add p0 type veth peer name p1 && ip link add b0 type bridge"
    if rate_mbit is not None:
        probe += " && tc qdisc add dev p0 root tbf rate 1mbit burst 32kb latency 50ms"
    try:
        result = _run("unshare", "--net", "sh", "-c", probe, check=False)
    except subprocess.TimeoutExpired:
        raise ClusterUnavailable("the namespace probe timed out") from None
    if result.returncode != 0:
        what = "network namespaces, veth and bridges" + (" and tc tbf" if rate_mbit else "")
        raise ClusterUnavailable(f"this kernel lacks {what}: {result.stderr.strip()}")
    if memory_cap:  # before the caller creates its run folder
        try:
            check_available()
        except MemoryCapUnavailable as err:
            raise ClusterUnavailable(str(err)) from None


def tbf_arguments(rate_mbit: float) -> list[str]:
    """``tc`` arguments of a token bucket at ``rate_mbit``: a 4 ms bucket (at least 16 KiB)
    so short transfers cannot run much faster than the rate, and a 100 ms queue."""
    rate_bytes = rate_mbit * 1e6 / 8
    burst = max(16 * 1024, int(rate_bytes * 0.004))
    return ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "100ms"]


@dataclass
class EmulatedCluster:
    """``hosts`` namespaces on a bridge; ``rate_mbit=None`` leaves the links unshaped.

    Use as a context manager (or call :meth:`open` and :meth:`close`); ``close`` is idempotent
    and removes whatever was created so far, so a half-built cluster is cleaned up too.
    """

    hosts: int
    rate_mbit: float | None = None
    prefix: str = field(default_factory=default_prefix)
    memory_mb: int | None = None  # each host's memory cap (docs/cluster.md); None: no cap
    _created: list[tuple[str, str]] = field(default_factory=list, init=False, repr=False)
    _cgroups: Path | None = field(default=None, init=False, repr=False)  # where, once opened

    def __post_init__(self) -> None:
        if not 1 <= self.hosts <= 200:
            raise ValueError(f"hosts must be in [1, 200], got {self.hosts}")
        if self.rate_mbit is not None and self.rate_mbit <= 0:
            raise ValueError(f"rate must be positive (Mbit/s), got {self.rate_mbit}")
        if self.memory_mb is not None:
            check_cap(self.memory_mb)
        if not _PREFIX.match(self.prefix):
            raise ValueError(
                f"prefix {self.prefix!r}: 2-9 lowercase letters/digits, starting with a letter"
            )

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    def namespace(self, host: int) -> str:
        return f"{self.prefix}h{host}"

    def address(self, host: int) -> str:
        return SUBNET.format(host + 1).split("/")[0]

    def cgroup(self, host: int) -> Path:
        """Host ``host``'s memory cgroup (with ``memory_mb``), inside this process's own (as it
        was when the cluster opened)."""
        if self._cgroups is None:
            self._cgroups = parent()
        return self._cgroups / self.namespace(host)

    def open(self) -> EmulatedCluster:
        preflight(self.rate_mbit, memory_cap=self.memory_mb is not None)
        check_prefix_free(self.prefix)  # before anything exists: nothing to remove
        try:
            self._add("link", self.bridge, "ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "link", "set", self.bridge, "up")
            for host in range(self.hosts):
                ns, outside = self.namespace(host), f"{self.prefix}v{host}"
                self._add("netns", ns, "ip", "netns", "add", ns)
                self._add(
                    "link",
                    outside,
                    *("ip", "link", "add", outside, "type", "veth"),
                    *("peer", "name", INTERFACE, "netns", ns),
                )
                _run("ip", "link", "set", outside, "master", self.bridge, "up")
                inside = ("ip", "netns", "exec", ns)
                _run(*inside, "ip", "addr", "add", SUBNET.format(host + 1), "dev", INTERFACE)
                _run(*inside, "ip", "link", "set", INTERFACE, "up")
                _run(*inside, "ip", "link", "set", "lo", "up")
                if self.rate_mbit is not None:
                    tbf = tbf_arguments(self.rate_mbit)
                    _run(*inside, "tc", "qdisc", "add", "dev", INTERFACE, "root", *tbf)
            for host in range(self.hosts if self.memory_mb is not None else 0):
                self._add_cgroup(host)
        except BaseException as err:
            self.__exit__(type(err), err, err.__traceback__)
            raise
        return self

    def _taken(self, name: str) -> PrefixInUse:
        return PrefixInUse(
            f"prefix {self.prefix!r} is in use on this machine: {name} was created by someone "
            "else after this cluster checked its names; choose another --prefix"
        )

    def _add(self, kind: str, name: str, *argv: str) -> None:
        """Create ``name`` with ``argv`` and own it. A name that exists (``File exists``) is
        another's: :class:`PrefixInUse`, and it is not removed. One whose command timed out may
        be half-made: owned, so that :meth:`close` removes it (the name was free)."""
        try:
            _run(*argv)
        except subprocess.CalledProcessError as err:
            if "exists" in (err.stderr or ""):
                raise self._taken(name) from None
            raise
        except subprocess.TimeoutExpired:
            self._created.append((kind, name))
            raise
        self._created.append((kind, name))

    def _add_cgroup(self, host: int) -> None:
        """Create host ``host``'s memory cgroup and own it (a half-made one too)."""
        path = self.cgroup(host)
        try:
            create(self.namespace(host), self.memory_mb)
        except FileExistsError:
            raise self._taken(str(path)) from None
        except BaseException:
            self._created.append(("cgroup", str(path)))
            raise
        self._created.append(("cgroup", str(path)))

    def popen(self, host: int, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside ``host`` in its own session (so one kill reaches its tree),
        charged to the host's memory cgroup when there is a cap."""
        argv = ["ip", "netns", "exec", self.namespace(host), *argv]
        if self.memory_mb is not None:  # joined outside: ip netns exec mounts its own /sys
            argv = joined(self.cgroup(host), argv)
        return subprocess.Popen(argv, start_new_session=True, **kwargs)

    def memory_usage(self, host: int) -> dict | None:
        """``{"limit_mb", "peak_mb", "oom_kills"}`` of host ``host`` so far (``None``: no cap)."""
        if self.memory_mb is None:
            return None
        return {"limit_mb": self.memory_mb, **usage(self.cgroup(host))}

    def close(self) -> None:
        """Kill what still runs in the hosts, then remove the cgroups, links and namespaces
        (the qdiscs go with their links); what is already gone is fine. Every removal is
        tried; then :class:`ClusterLeftovers` names whatever is still there. An interrupted
        close forgets nothing: a second one tries again."""
        created = list(self._created)
        problems = []
        for kind, name in reversed(created):
            if kind == "cgroup":
                try:
                    remove(Path(name))
                except CgroupNotRemoved as err:
                    problems.append(str(err))
            elif kind == "netns":
                kill_namespace_processes(name)
                _run("ip", "netns", "del", name, check=False)
            else:
                _run("ip", "link", "del", name, check=False)
        self._created = []
        netns, links = _names() if created else ([], [])
        present = {"netns": netns, "link": links}
        problems += [
            f"{kind} {name} is still there (ip {kind} del {name})"
            for kind, name in created
            if name in present.get(kind, ())
        ]
        if problems:
            raise ClusterLeftovers("the cluster was not fully removed: " + "; ".join(problems))

    def __enter__(self) -> EmulatedCluster:
        return self.open()

    def __exit__(self, exc_type, exc, traceback) -> None:
        """Close; when an error is already on its way out, leftovers are said beside it (on
        stderr, and as a note on it) rather than replacing it."""
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except ClusterLeftovers as leftovers:
            print(f"error: {leftovers}", file=sys.stderr)
            exc.add_note(str(leftovers))


def namespace_pids(namespace: str) -> list[int]:
    result = _run("ip", "netns", "pids", namespace, check=False)
    return [int(p) for p in result.stdout.split()]


def kill_namespace_processes(namespace: str, timeout_s: float = 5.0) -> None:
    """SIGKILL every process inside ``namespace`` (all started by this cluster) and wait."""
    deadline = time.monotonic() + timeout_s
    while (pids := namespace_pids(namespace)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _names() -> tuple[list[str], list[str]]:
    """The machine's network namespaces and links."""
    netns = [line.split()[0] for line in _run("ip", "netns", "list").stdout.splitlines() if line]
    links = [
        line.split()[0].split("@")[0] for line in _run("ip", "-br", "link").stdout.splitlines()
    ]
    return netns, links


def leftovers(prefix: str) -> list[str]:
    """The namespaces, links and memory cgroups (``cgroup:<name>``) that a cluster with
    ``prefix`` creates and that exist now: another prefix's names never match, even one that
    starts with ``prefix``."""
    owned = _owned_name(prefix)
    names, links = _names()
    found = [n for n in names + links if owned.match(n)]
    cgroups = [f"cgroup:{n}" for n in cgroup_leftovers(prefix) if owned.match(n)]
    return sorted(found + cgroups)
