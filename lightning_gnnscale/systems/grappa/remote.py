"""Grappa-50S: isolation broken on purpose, for the ablation only (docs/systems/grappa.md,
"Grappa-50S").

Each frontier node is, with probability ``remote_sample_frac`` (hash-keyed on its id and the
step), expanded through its owner from its *global* in-edges: the owner is the rank whose base
chunk holds it (``partitions_per_rank = 1`` and ``C = W``, so owner rank = chunk id), and it
serves from its base chunk's stored in-edge lists. The other frontier nodes are expanded
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
        store = dm.store
        self.chunk = store.chunk_ids()
        deg = torch.zeros(int(store.meta["num_nodes"]), dtype=torch.int64)
        for c in range(store.num_chunks):
            record = store.load(c)
            deg[record["nodes"]] = record["deg"]
        self.build_block = BlockBuilder(deg.numel(), deg)
        self.base = store.load(dm.rank)  # this rank's base chunk: every in-edge of its nodes

    def _coin(self, gids: Tensor, key: int) -> Tensor:
        draw = uniform_below(splitmix64(gids ^ key), torch.tensor(_COIN_RESOLUTION))
        return draw < int(self.frac * _COIN_RESOLUTION)

    def _route(self, ids: Tensor) -> OwnerRoute:
        """Send ``ids`` to their owner ranks (``structure``)."""
        return OwnerRoute.build(self.dm.comm, ids, self.chunk[ids], category="structure")

    def _expand(self, part: IsolatedPartition, gids: Tensor, fanout: int, key: int):
        """Local in-edges of owned ``gids``: (global sources, position in ``gids``)."""
        src, pos = sample_neighbors(
            part.indptr, part.indices, part.local_of(gids), fanout, key, node_keys=gids
        )
        return part.local2global[src], pos

    def _serve(self, gids: Tensor, fanout: int, key: int):
        """Global in-edges of base-chunk nodes ``gids``: (global sources, position in ``gids``)."""
        rows = torch.searchsorted(self.base["nodes"], gids)
        return sample_neighbors(self.base["indptr"], self.base["indices"], rows, fanout, key, gids)

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
        rows = part.x[part.local_of(route.served)]
        got = route.reply(self.dm.comm, rows, category="feature")
        x = part.x.new_empty((gids.numel(), part.x.shape[1]))
        have = (local >= 0).nonzero().flatten()
        x[have] = part.x[local[have]]
        x[missing] = got
        return x
