"""Grappa-50S: isolation broken on purpose, for the ablation only (docs/systems/grappa.md,
"Grappa-50S").

Each frontier node is, with probability ``remote_sample_frac`` (hash-keyed on its id and the
step), expanded through its owner from its *global* in-edges: the owner of chunk ``c`` is rank
``c mod W``, the rank whose partitions pin ``c`` as their base chunk (pinned sweep and fixed
schedules, ``C = kW``), and it serves from its base chunks' stored in-edge lists. The other frontier nodes are expanded
locally as usual. The ids go out and the sampled in-edges come back as ``structure`` bytes,
and input rows the partition lacks are pulled from their owners as ``feature`` bytes. So the
gradient-only invariant fails by design, and the audit shows it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...comm import OwnerRoute
from ...graph.block import Block
from ...graph.sampler import BlockBuilder, SampleKey, sample_neighbors, splitmix64, uniform_below
from .partition import IsolatedPartition

_COIN_RESOLUTION = 1 << 20


class RemoteSampler:
    """Samples like :class:`~.partition.PartitionSampler`, plus remote expansions; blocks hold
    global ids. Holds O(N) metadata (chunk id and degree per node): ablation only."""

    def __init__(self, dm, frac: float):
        self.dm, self.frac = dm, frac
        chunks = dm.chunks
        self.chunk = torch.empty(int(chunks.meta["num_nodes"]), dtype=torch.int64)
        deg = torch.zeros(int(chunks.meta["num_nodes"]), dtype=torch.int64)
        for c in range(chunks.num_chunks):  # node lists and degrees only
            index = chunks.index(c)
            self.chunk[index["nodes"]] = c
            deg[index["nodes"]] = index["deg"]
        self.build_block = BlockBuilder(deg.numel(), deg)
        # this rank's base (home) chunks with every in-edge of their nodes (the halo holds the
        # sources): the partition full-graph evaluation runs on too, built once
        self.base = dm.home_partition()

    def _coin(self, gids: Tensor, key: int) -> Tensor:
        draw = uniform_below(splitmix64(gids ^ key), torch.tensor(_COIN_RESOLUTION))
        return draw < int(self.frac * _COIN_RESOLUTION)

    def _route(self, ids: Tensor) -> OwnerRoute:
        """Send ``ids`` to their owner ranks (``structure``)."""
        owners = self.chunk[ids] % self.dm.world_size
        return OwnerRoute.build(self.dm.comm, ids, owners, category="structure")

    def _expand(self, part: IsolatedPartition, gids: Tensor, fanout: int, key: int):
        """Local in-edges of owned ``gids``: (global sources, position in ``gids``)."""
        src, pos = sample_neighbors(
            part.indptr, part.indices, part.local_of(gids), fanout, key, node_keys=gids
        )
        return part.local2global[src], pos

    def _serve(self, gids: Tensor, fanout: int, key: int):
        """Global in-edges of base-chunk nodes ``gids``: (global sources, position in ``gids``)."""
        base = self.base
        src, pos = sample_neighbors(
            base.indptr, base.indices, base.local_of(gids), fanout, key, node_keys=gids
        )
        return base.local2global[src], pos

    def sample(self, part: IsolatedPartition, seeds: Tensor, fanouts, epoch, step, salt):
        comm = self.dm.comm
        key = SampleKey(self.dm.seed, epoch, step, salt)
        shared = SampleKey(self.dm.seed, epoch, step, -1)  # the owner's key for remote expansions
        frontier = part.local2global[seeds]
        blocks: list[Block] = []
        for hop, fanout in enumerate(fanouts):
            local = part.local_of(frontier)
            remote = self._coin(frontier, shared.hop_key(hop))
            own_idx = (~remote & (local >= 0) & (local < part.num_core)).nonzero().flatten()
            src_own, pos = self._expand(part, frontier[own_idx], fanout, key.hop_key(hop))
            # remote expansions: ids to owners, sampled in-edges back (structure)
            rem_idx = remote.nonzero().flatten()
            route = self._route(frontier[rem_idx])
            src_srv, pos_srv = self._serve(route.served, fanout, shared.hop_key(hop))
            counts = torch.bincount(pos_srv, minlength=route.served.numel())
            back, src_rem = route.reply_varlen(comm, counts, src_srv, category="structure")
            pos_rem = torch.repeat_interleave(rem_idx, back)
            src = torch.cat([src_own, src_rem])
            dst_pos = torch.cat([own_idx[pos], pos_rem])
            sort = torch.argsort(dst_pos * (int(self.chunk.numel()) + 1) + src)
            block = self.build_block(frontier, src[sort], dst_pos[sort])
            blocks.append(block)
            frontier = block.src_ids
        return blocks[::-1], self.input_rows(part, frontier)

    def input_rows(self, part: IsolatedPartition, gids: Tensor) -> Tensor:
        """Rows of ``gids``: local ones from the partition, the rest pulled from owners."""
        local = part.local_of(gids)
        missing = (local < 0).nonzero().flatten()
        route = self._route(gids[missing])
        rows = self.base.x[self.base.local_of(route.served)]
        got = route.reply(self.dm.comm, rows, category="feature")
        x = part.x.new_empty((gids.numel(), part.x.shape[1]))
        have = (local >= 0).nonzero().flatten()
        x[have] = part.x[local[have]]
        x[missing] = got
        return x
