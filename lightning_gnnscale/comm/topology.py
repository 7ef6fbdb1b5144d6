"""Which ranks share a server: the link class of every rank-to-rank transfer.

Ranks are laid out server-major, as Lightning numbers them (``global_rank = node_rank *
devices + local_rank``): server ``s`` holds ranks ``s * workers_per_server ...``.
"""

from __future__ import annotations

from dataclasses import dataclass

INTRA_SERVER = "intra_server"
INTER_SERVER = "inter_server"
LINK_CLASSES = (INTRA_SERVER, INTER_SERVER)


@dataclass(frozen=True)
class Topology:
    """``num_servers x workers_per_server`` ranks; links inside a server are ``intra_server``."""

    world_size: int
    workers_per_server: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.workers_per_server < 1:
            raise ValueError(
                f"world_size and workers_per_server must be >= 1, got {self.world_size} "
                f"and {self.workers_per_server}"
            )
        if self.world_size % self.workers_per_server:
            raise ValueError(
                f"workers_per_server={self.workers_per_server} does not divide "
                f"world_size={self.world_size}"
            )

    @classmethod
    def single(cls) -> Topology:
        """One process on one server (the local, non-distributed case)."""
        return cls(1, 1)

    @classmethod
    def from_launch(
        cls, world_size: int, num_nodes: int = 1, servers: int | None = None
    ) -> Topology:
        """Topology of a launch: ``servers`` (config ``topology.servers``, to simulate several
        servers on one machine) if given, else Lightning's ``num_nodes``."""
        num_servers = num_nodes if servers is None else servers
        if num_servers < 1 or world_size % num_servers:
            raise ValueError(f"{num_servers} servers cannot split world_size={world_size} evenly")
        return cls(world_size, world_size // num_servers)

    @property
    def num_servers(self) -> int:
        return self.world_size // self.workers_per_server

    def server_of(self, rank: int) -> int:
        """Index of the server that hosts ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of size {self.world_size}")
        return rank // self.workers_per_server

    def link_class(self, src_rank: int, dst_rank: int) -> str:
        """``intra_server`` or ``inter_server`` for a transfer between two different ranks."""
        if src_rank == dst_rank:
            raise ValueError(f"rank {src_rank} to itself is not a link")
        same = self.server_of(src_rank) == self.server_of(dst_rank)
        return INTRA_SERVER if same else INTER_SERVER

    def peer_link_classes(self, rank: int) -> tuple[str | None, ...]:
        """Link class from ``rank`` to every rank, indexed by peer; ``None`` at ``rank`` itself."""
        return tuple(
            None if peer == rank else self.link_class(rank, peer) for peer in range(self.world_size)
        )
