"""Which address a rank's graph-store service listens on and publishes to its peers.

Each rank chooses its own, as gloo chooses its interface: the IPv4 address of
``GLOO_SOCKET_IFNAME`` when it is set, else the local address of the route to ``MASTER_ADDR``
(a UDP ``connect`` is a route lookup: no packet is sent). A single-node run, whose
``MASTER_ADDR`` is loopback, gets ``127.0.0.1``; a rank on another node gets the address its
peers reach it by, never loopback. ``strategy.host`` set to an address overrides the choice
(single node only: one address cannot serve ranks on several nodes).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping

from ...errors import ConfigError

HOST_KEY = "strategy.host"


def check_host(host: str) -> None:
    """``host`` is an IPv4 address of this machine, or a :class:`ConfigError` names the key."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(
            f"{HOST_KEY}={host!r} is not an IP address; give this machine's IPv4 address "
            "(e.g. 127.0.0.1), or null to let every rank choose its own (GLOO_SOCKET_IFNAME, "
            "else the route to MASTER_ADDR)"
        ) from None
    if address.version != 4:
        raise ConfigError(f"{HOST_KEY}={host!r}: the graph-store service speaks IPv4 only")
    try:
        with socket.create_server((host, 0)):
            pass
    except OSError as exc:
        raise ConfigError(
            f"{HOST_KEY}={host!r} cannot be listened on here ({exc.strerror or exc}): it is "
            "not an address of this machine; give one of its addresses or null"
        ) from None


def interface_address(ifname: str) -> str:
    """The first IPv4 address of network interface ``ifname``."""
    import psutil

    addresses = psutil.net_if_addrs()
    if ifname not in addresses:
        raise ConfigError(
            f"GLOO_SOCKET_IFNAME={ifname!r} names no interface of this machine; "
            f"valid: {sorted(addresses)}"
        )
    for entry in addresses[ifname]:
        if entry.family == socket.AF_INET:
            return entry.address
    raise ConfigError(f"GLOO_SOCKET_IFNAME={ifname!r} has no IPv4 address")


def route_source_address(target: str) -> str:
    """The local IPv4 address of the route to ``target`` (a host name or address)."""
    try:
        resolved = socket.gethostbyname(target)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((resolved, 9))  # a route lookup; UDP connect sends nothing
            return probe.getsockname()[0]
    except OSError as exc:
        raise ConfigError(
            f"no route to MASTER_ADDR={target!r} ({exc}); set GLOO_SOCKET_IFNAME or "
            f"{HOST_KEY} to the address the other ranks reach this one by"
        ) from None


def service_address(host: str | None, env: Mapping[str, str] | None = None) -> str:
    """The address this rank listens on and publishes: ``host`` if set, else the address of
    ``GLOO_SOCKET_IFNAME`` (its first name, as gloo), else the route to ``MASTER_ADDR``
    (default ``127.0.0.1``)."""
    if host is not None:
        return host
    env = os.environ if env is None else env
    ifname = env.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()
    if ifname:
        return interface_address(ifname)
    return route_source_address(env.get("MASTER_ADDR", "127.0.0.1"))
