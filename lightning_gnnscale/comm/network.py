"""Modelled communication time: counted bytes and messages on an assumed cluster network.

``modeled_time`` = sum over link classes of ``bytes / bandwidth + messages * latency`` for
one rank's snapshot (what that rank sends, serialised: no overlap between links or with
compute). The caller takes the max over ranks for the step or epoch figure. The result is a
model, never a measurement; label it so.

Profile numbers (rough, one direction, per rank):

- Ethernet line rate / 8: 100 Mbit/s 12.5 MB/s, 1 GbE 125 MB/s (the emulated links of
  ``bench cluster``, same latency as ``10gbe``), 10GbE 1.25 GB/s, 25GbE 3.125 GB/s, 100GbE 12.5 GB/s. Small-message
  latency: ~20 us for kernel TCP on 10GbE, ~10 us on 25GbE, ~5 us for RDMA-class 100GbE.
- Inside a server for the Ethernet profiles: PCIe 3.0 x16, ~12 GB/s effective (also the order
  of a shared-memory copy between CPU worker processes), ~2 us.
- ``nvlink``: NVLink 3 (A100), 600 GB/s bidirectional = 300 GB/s per direction, ~2 us inside
  a server; 100GbE between servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning_gnnscale.comm.topology import INTER_SERVER, INTRA_SERVER

_PCIE3_BANDWIDTH, _PCIE3_LATENCY = 12e9, 2e-6


@dataclass(frozen=True)
class NetworkModel:
    """Bandwidth (bytes/s) and per-message latency (s) of each link class."""

    name: str
    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float

    def __post_init__(self) -> None:
        if min(self.intra_bandwidth, self.inter_bandwidth) <= 0:
            raise ValueError("bandwidths must be positive")
        if min(self.intra_latency, self.inter_latency) < 0:
            raise ValueError("latencies must be non-negative")

    @classmethod
    def from_name(cls, name: str) -> NetworkModel:
        """One of the named ``PROFILES``; raises ValueError listing them if unknown."""
        try:
            return PROFILES[name]
        except KeyError:
            raise ValueError(f"unknown network profile {name!r}; valid: {list(PROFILES)}") from None

    def modeled_time(self, snapshot: dict[str, Any]) -> float:
        """Seconds one rank needs to send what ``snapshot`` (one rank's meter) counted."""
        link_bytes, link_messages = snapshot["link_bytes"], snapshot["link_messages"]
        return (
            link_bytes[INTRA_SERVER] / self.intra_bandwidth
            + link_messages[INTRA_SERVER] * self.intra_latency
            + link_bytes[INTER_SERVER] / self.inter_bandwidth
            + link_messages[INTER_SERVER] * self.inter_latency
        )


PROFILES = {
    "10gbe": NetworkModel("10gbe", _PCIE3_BANDWIDTH, _PCIE3_LATENCY, 1.25e9, 20e-6),
    "25gbe": NetworkModel("25gbe", _PCIE3_BANDWIDTH, _PCIE3_LATENCY, 3.125e9, 10e-6),
    "100gbe": NetworkModel("100gbe", _PCIE3_BANDWIDTH, _PCIE3_LATENCY, 12.5e9, 5e-6),
    "nvlink": NetworkModel("nvlink", 300e9, 2e-6, 12.5e9, 5e-6),
    "100mbe": NetworkModel("100mbe", _PCIE3_BANDWIDTH, _PCIE3_LATENCY, 12.5e6, 20e-6),
    "1gbe": NetworkModel("1gbe", _PCIE3_BANDWIDTH, _PCIE3_LATENCY, 125e6, 20e-6),
}
