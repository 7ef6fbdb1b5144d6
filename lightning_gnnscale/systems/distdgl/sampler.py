"""DistDGL's distributed neighbour sampler and trainer split (docs/systems/distdgl.md).

Each hop, a trainer sends the frontier nodes it does not own to their owners (one id
all-to-all, ``structure``); every owner samples its local CSC, keyed by the nodes' *global* ids
so that it draws exactly what one process would on the whole (relabelled) graph; the sampled
sources travel back (two all-to-alls: per-node counts and source ids, ``structure``) and are
stitched into a block. Core nodes own all their in-edges, so owners never need each other.
A rank's own frontier nodes go through the same collective as its self chunk, which moves no
bytes over the network and is not counted (DistDGL's local shortcut).

On a typed graph the owners sample every relation's in-edges apart (``fanouts[r]`` each,
keyed on ``gid * R + r``, :func:`~...graph.sampler.sample_typed_edge_ids`) and answer each
source as ``gid * R + relation``: the relation travels inside the id word, as DistDGL's own
answers carry it inside the edge id (its edges are numbered by type), so it adds no bytes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...comm import Comm, OwnerRoute
from ...graph.block import Block
from ...graph.book import LocalPartition, RangeBook
from ...graph.csc import relation_indptr
from ...graph.sampler import (
    BlockBuilder,
    SampleKey,
    build_block_sorted,
    drop_excluded,
    kept_edges,
    sample_neighbors,
    sample_typed_edge_ids,
)


class DistNeighborSampler:
    """Samples the blocks of a mini-batch over a partitioned graph (collective: every rank
    calls ``sample`` for every step, in the same order, even with no seeds).

    Args:
        comm: the data-exchange ``Comm``.
        book: node ownership.
        local: this rank's partition (core + halo, local CSC in global neighbour order).
        degree: int64 ``[N]`` replicated full-graph in-degrees (GCN normalisation, block
            ``src_deg``); ``None`` (a rank loaded from a partition directory, which holds no
            ``[N]`` array): blocks are built without dense id tables and carry zero
            ``src_deg``, which the caller fills from the owners (the DataModule's KV store).
        fanouts: by hop from the seeds; ``-1`` = all.
        seed: base of the sampling keys.
        relation_fanouts: a typed graph's (``local.edge_type`` set) per hop, the fanout of
            every relation (``GNNDataModule.relation_fanouts``); ``None``: homogeneous.
    """

    def __init__(
        self,
        comm: Comm,
        book: RangeBook,
        local: LocalPartition,
        degree: Tensor | None,
        fanouts: list[int],
        seed: int,
        relation_fanouts: list[tuple[int, ...]] | None = None,
    ):
        if (local.edge_type is None) != (relation_fanouts is None):
            raise ValueError(
                "a typed partition (edge_type) is sampled with relation_fanouts, a homogeneous "
                "one without"
            )
        if relation_fanouts is not None and len(relation_fanouts) != len(fanouts):
            raise ValueError(f"relation_fanouts must have one entry per hop ({len(fanouts)})")
        self.comm, self.book, self.local = comm, book, local
        self.fanouts, self.seed = list(fanouts), seed
        self.relation_fanouts = relation_fanouts
        self.num_relations = 1 if relation_fanouts is None else len(relation_fanouts[0])
        # the CSC over (core node, relation) slots of the local graph (typed only)
        self.slots = relation_indptr(local.indptr, local.edge_type, self.num_relations)
        self.first_gid = int(book.node_offsets[comm.rank])
        self.local_src_gid = local.local2global[local.indices]  # [E_k] source gids
        self.build_block = (
            build_block_sorted if degree is None else BlockBuilder(degree.numel(), degree)
        )

    def _serve(self, gids: Tensor, fanout, key: int) -> tuple[Tensor, Tensor]:
        """Owner side: sample the requested core nodes; ``(counts per node, source gids)``
        (a typed graph's: ``gid * R + relation``, ``fanout`` a fanout per relation)."""
        local_ids = gids - self.first_gid
        if self.relation_fanouts is None:
            src, dst_pos = sample_neighbors(
                self.local.indptr, self.local_src_gid, local_ids, fanout, key, node_keys=gids
            )
        else:
            eids, dst_pos = sample_typed_edge_ids(self.slots, local_ids, fanout, key, gids)
            src = self.local_src_gid[eids] * self.num_relations + self.local.edge_type[eids]
        return torch.bincount(dst_pos, minlength=gids.numel()), src

    def sample_hop(
        self, frontier: Tensor, fanout, key: int
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Sample one hop for ``frontier`` (``fanout``: an int, or a typed graph's tuple of
        one per relation); ``(src gids, dst positions, relations or None)`` sorted by dst
        position."""
        route = OwnerRoute.build(
            self.comm, frontier, self.book.nid2part(frontier), category="structure"
        )
        counts, src = self._serve(route.served, fanout, key)
        # The served sources come request after request, so the route can bring them back in
        # frontier order: no sort needed.
        per_node, src_out = route.reply_varlen(self.comm, counts, src, category="structure")
        dst_pos = torch.repeat_interleave(torch.arange(frontier.numel()), per_node)
        if self.relation_fanouts is None:
            return src_out, dst_pos, None
        return src_out // self.num_relations, dst_pos, src_out % self.num_relations

    def sample(
        self, seeds: Tensor, epoch: int, step: int, exclude: Tensor | None = None
    ) -> list[Block]:
        """The blocks of this rank's seeds, input layer first (``blocks[-1].dst_ids == seeds``).
        ``exclude``: sorted int64 keys ``dst * N + src`` (gids) of edges left out of every
        block after sampling, as ``graph.sampler.NeighborSampler`` leaves them out."""
        key = SampleKey(self.seed, epoch, step)
        frontier, blocks = seeds.to(torch.int64), []
        n = self.book.num_nodes
        for hop, fanout in enumerate(self.relation_fanouts or self.fanouts):
            src, dst_pos, types = self.sample_hop(frontier, fanout, key.hop_key(hop))
            if types is None:
                src, dst_pos = drop_excluded(src, dst_pos, frontier, src, n, exclude)
            elif exclude is not None and exclude.numel():
                kept = kept_edges(frontier[dst_pos], src, n, exclude)
                src, dst_pos, types = src[kept], dst_pos[kept], types[kept]
            block = self.build_block(frontier, src, dst_pos, edge_type=types)
            blocks.append(block)
            frontier = block.src_ids
        return blocks[::-1]
