"""Server-aware collectives: an all-reduce that crosses servers only between their heads.

``ServerGroups`` holds one process group per server (its ranks) and one of the server heads
(the first rank of every server). Its ``all_reduce`` sums in three stages: inside each server,
then among the heads, then from each head back to its server's ranks. Only the middle stage
crosses servers: ``2 (S - 1) / S * nbytes`` per head (ring model), ``2 (S - 1) * nbytes`` in
all, against about ``2 * nbytes`` per rank on the flat ring when servers are large.

Counting (the same conventions as ``collectives.py``): the two all-reduces use the ring model
inside their group, charged to the link to the ring successor in that group; the broadcast
charges the head ``nbytes`` per other rank of its server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist
from torch import Tensor

from lightning_gnnscale.comm.audit import metered_call
from lightning_gnnscale.comm.collectives import ring_allreduce_bytes
from lightning_gnnscale.comm.meter import CommMeter, check_category
from lightning_gnnscale.comm.topology import INTER_SERVER, INTRA_SERVER, Topology


class ServerGroups:
    """The intra-server groups and the head group of ``topology``, for rank ``rank``.

    Collective to build: every rank creates every group, in the same order (servers in
    order, then the heads). With one process nothing is created and ``all_reduce`` is a no-op.
    """

    def __init__(
        self, meter: CommMeter, topology: Topology, rank: int, timeout: timedelta | None = None
    ):
        self.meter, self.topology, self.rank = meter, topology, rank
        workers = topology.workers_per_server
        self.server = topology.server_of(rank)
        self.head = self.server * workers
        self.is_head = rank == self.head
        self.intra = self.heads = None
        if topology.world_size == 1:
            return
        options = {} if timeout is None else {"timeout": timeout}
        for s in range(topology.num_servers):
            group = dist.new_group(list(range(s * workers, (s + 1) * workers)), **options)
            if s == self.server:
                self.intra = group
        heads = dist.new_group(list(range(0, topology.world_size, workers)), **options)
        self.heads = heads if self.is_head else None

    @contextmanager
    def _metered(self, category: str, counted_bytes: int) -> Iterator[None]:
        """Mark the call for the audit and add its wall time to ``meter.wait_s``."""
        start = time.perf_counter()
        with metered_call(category, counted_bytes):
            yield
        self.meter.wait_s += time.perf_counter() - start

    def all_reduce(self, tensor: Tensor, *, category: str) -> Tensor:
        """Sum ``tensor`` in place over all ranks (intra-server sum, head sum, intra-server
        broadcast) and return it. Collective on every rank."""
        check_category(category)
        topology = self.topology
        if topology.world_size == 1:
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        workers, servers = topology.workers_per_server, topology.num_servers
        if workers > 1:
            sent = ring_allreduce_bytes(nbytes, workers)
            with self._metered(category, sent):
                dist.all_reduce(tensor, group=self.intra)
            if sent:
                self.meter.record(category, INTRA_SERVER, sent, 2 * (workers - 1))
        if self.is_head and servers > 1:
            sent = ring_allreduce_bytes(nbytes, servers)
            with self._metered(category, sent):
                dist.all_reduce(tensor, group=self.heads)
            if sent:
                self.meter.record(category, INTER_SERVER, sent, 2 * (servers - 1))
        if workers > 1:
            sent = nbytes * (workers - 1) if self.is_head else 0
            with self._metered(category, sent):
                dist.broadcast(tensor, src=self.head, group=self.intra)
            if sent:
                self.meter.record(category, INTRA_SERVER, sent, workers - 1)
        return tensor
