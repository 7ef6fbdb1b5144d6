"""Grappa-50S: isolation broken on purpose, for the ablation only (docs/systems/grappa.md,
"Grappa-50S").

Each frontier node is, with probability ``remote_sample_frac`` (hash-keyed on its id and the
step), expanded through its owner from its *global* in-edges: the owner of chunk ``c`` is rank
``c mod W``, the rank whose partitions pin ``c`` as their base chunk (pinned sweep and fixed
schedules, ``C = kW``), and it serves from its base chunks' stored in-edge lists. The other frontier nodes are expanded
locally as usual. The ids go out and the sampled in-edges come back as ``structure`` bytes,
and input rows the partition lacks are pulled from their owners as ``feature`` bytes. So the
gradient-only invariant fails by design, and the audit shows it. On a typed graph every
expansion samples per relation (keyed on ``gid * R + r``, as the whole graph's sampler) and
the served in-edges come back with their relations (``structure`` bytes too).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...comm import OwnerRoute
from ...graph.block import Block
from ...graph.csc import relation_indptr
from ...graph.sampler import (
    BlockBuilder,
    SampleKey,
    sample_neighbors,
    sample_typed_edge_ids,
    splitmix64,
    uniform_below,
)
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
        self.relation_fanouts = dm.part_relation_fanouts  # None: homogeneous
        # the (node, relation) slot CSCs of the base partition and of the last partition
        # sampled (a typed graph's), each built once
        self._slots: tuple[IsolatedPartition, Tensor] | None = None
        self._base_slots = None
        if self.relation_fanouts is not None:
            base = self.base
            self._base_slots = relation_indptr(base.indptr, base.edge_type, base.num_relations)

    def _slot_indptr(self, part: IsolatedPartition) -> Tensor:
        """``part``'s CSC over ``(node, relation)`` slots."""
        if part is self.base:
            return self._base_slots
        if self._slots is None or self._slots[0] is not part:
            self._slots = (part, relation_indptr(part.indptr, part.edge_type, part.num_relations))
        return self._slots[1]

    def _draw(self, part: IsolatedPartition, gids: Tensor, hop: int, fanout: int, key: int):
        """In-edges of ``gids`` (held with their in-edges by ``part``): (global sources,
        relations or ``None``, position in ``gids``)."""
        local = part.local_of(gids)
        if self.relation_fanouts is None:
            src, pos = sample_neighbors(
                part.indptr, part.indices, local, fanout, key, node_keys=gids
            )
            return part.local2global[src], None, pos
        eids, pos = sample_typed_edge_ids(
            self._slot_indptr(part), local, self.relation_fanouts[hop], key, node_keys=gids
        )
        return part.local2global[part.indices[eids]], part.edge_type[eids], pos

    def _coin(self, gids: Tensor, key: int) -> Tensor:
        draw = uniform_below(splitmix64(gids ^ key), torch.tensor(_COIN_RESOLUTION))
        return draw < int(self.frac * _COIN_RESOLUTION)

    def _route(self, ids: Tensor) -> OwnerRoute:
        """Send ``ids`` to their owner ranks (``structure``)."""
        owners = self.chunk[ids] % self.dm.world_size
        return OwnerRoute.build(self.dm.comm, ids, owners, category="structure")

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
            # local expansions of owned nodes; remote ones: ids to owners, which serve their
            # base chunks' global in-edges (the home partition), sampled, back (structure)
            src_own, et_own, pos = self._draw(
                part, frontier[own_idx], hop, fanout, key.hop_key(hop)
            )
            rem_idx = remote.nonzero().flatten()
            route = self._route(frontier[rem_idx])
            src_srv, et_srv, pos_srv = self._draw(
                self.base, route.served, hop, fanout, shared.hop_key(hop)
            )
            counts = torch.bincount(pos_srv, minlength=route.served.numel())
            served = src_srv if et_srv is None else torch.stack([src_srv, et_srv], 1)
            back, got = route.reply_varlen(comm, counts, served, category="structure")
            pos_rem = torch.repeat_interleave(rem_idx, back)
            src = torch.cat([src_own, got if et_srv is None else got[:, 0]])
            dst_pos = torch.cat([own_idx[pos], pos_rem])
            order = dst_pos * (int(self.chunk.numel()) + 1) + src
            edge_type = None
            if et_srv is not None:  # each destination's in-edges by relation, then source
                edge_type = torch.cat([et_own, got[:, 1]])
                slot = dst_pos * self.base.num_relations + edge_type
                order = slot * (int(self.chunk.numel()) + 1) + src
            sort = torch.argsort(order)
            block = self.build_block(
                frontier,
                src[sort],
                dst_pos[sort],
                None if edge_type is None else edge_type[sort],
            )
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
