"""DistDGL's distributed neighbour sampler and trainer split (docs/systems/distdgl.md).

Each hop, a trainer sends the frontier nodes it does not own to their owners (one id
all-to-all, ``structure``); every owner samples its local CSC, keyed by the nodes' *global* ids
so that it draws exactly what one process would on the whole (relabelled) graph; the sampled
sources travel back (two all-to-alls: per-node counts and source ids, ``structure``) and are
stitched into a block. Core nodes own all their in-edges, so owners never need each other.
A rank's own frontier nodes go through the same collective as its self chunk, which moves no
bytes over the network and is not counted (DistDGL's local shortcut).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...comm import Comm, OwnerRoute
from ...graph.block import Block
from ...graph.book import LocalPartition, RangeBook
from ...graph.sampler import (
    BlockBuilder,
    SampleKey,
    build_block_sorted,
    sample_neighbors,
    splitmix64_int,
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
    """

    def __init__(
        self,
        comm: Comm,
        book: RangeBook,
        local: LocalPartition,
        degree: Tensor | None,
        fanouts: list[int],
        seed: int,
    ):
        self.comm, self.book, self.local = comm, book, local
        self.fanouts, self.seed = list(fanouts), seed
        self.first_gid = int(book.node_offsets[comm.rank])
        self.local_src_gid = local.local2global[local.indices]  # [E_k] source gids
        self.build_block = (
            build_block_sorted if degree is None else BlockBuilder(degree.numel(), degree)
        )

    def _serve(self, gids: Tensor, fanout: int, key: int) -> tuple[Tensor, Tensor]:
        """Owner side: sample the requested core nodes; ``(counts per node, source gids)``."""
        local_ids = gids - self.first_gid
        src, dst_pos = sample_neighbors(
            self.local.indptr, self.local_src_gid, local_ids, fanout, key, node_keys=gids
        )
        return torch.bincount(dst_pos, minlength=gids.numel()), src

    def sample_hop(self, frontier: Tensor, fanout: int, key: int) -> tuple[Tensor, Tensor]:
        """Sample one hop for ``frontier``; ``(src gids, dst positions)`` sorted by dst position."""
        route = OwnerRoute.build(
            self.comm, frontier, self.book.nid2part(frontier), category="structure"
        )
        counts, src = self._serve(route.served, fanout, key)
        # The served sources come request after request, so the route can bring them back in
        # frontier order: no sort needed.
        per_node, src_out = route.reply_varlen(self.comm, counts, src, category="structure")
        dst_pos = torch.repeat_interleave(torch.arange(frontier.numel()), per_node)
        return src_out, dst_pos

    def sample(self, seeds: Tensor, epoch: int, step: int) -> list[Block]:
        """The blocks of this rank's seeds, input layer first (``blocks[-1].dst_ids == seeds``)."""
        key = SampleKey(self.seed, epoch, step)
        frontier, blocks = seeds.to(torch.int64), []
        for hop, fanout in enumerate(self.fanouts):
            src, dst_pos = self.sample_hop(frontier, fanout, key.hop_key(hop))
            block = self.build_block(frontier, src, dst_pos)
            blocks.append(block)
            frontier = block.src_ids
        return blocks[::-1]


def even_offsets(n: int, parts: int) -> Tensor:
    """Offsets of ``parts`` contiguous chunks of ``n`` items whose sizes differ by at most 1."""
    sizes = torch.full((parts,), n // parts, dtype=torch.int64)
    sizes[: n % parts] += 1
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(sizes, 0)])


class TrainerSplit:
    """DistDGL's even split of the (relabelled, hence partition-sorted) training ids.

    Rank ``r`` gets the ``r``-th of ``P`` contiguous chunks of the sorted training gids; chunk
    ``r`` overlaps partition ``r`` the most. Every epoch each rank shuffles its chunk with its
    own generator and cuts it into ``steps`` parts, where ``steps`` is the same on every rank,
    so every training node is a seed exactly once per epoch and all ranks run in lockstep.

    Args:
        train_gids: sorted int64 training ids (global, relabelled); replicated metadata.
        world_size, rank: the trainers.
        batch_size: global seeds per step (``-1``: one step per epoch).
        seed: base of the per-rank shuffles.
    """

    def __init__(self, train_gids: Tensor, world_size: int, rank: int, batch_size: int, seed: int):
        offsets = even_offsets(train_gids.numel(), world_size)
        mine = train_gids[offsets[rank] : offsets[rank + 1]]
        self._init(mine, offsets.diff(), world_size, rank, batch_size, seed)

    @classmethod
    def from_chunk(
        cls, mine: Tensor, sizes: Tensor, rank: int, batch_size: int, seed: int
    ) -> TrainerSplit:
        """The split of a rank that holds only its own chunk ``mine`` and every rank's chunk
        size ``sizes`` ``[P]`` (what a partition directory stores), not the training ids."""
        split = cls.__new__(cls)
        split._init(mine, sizes, sizes.numel(), rank, batch_size, seed)
        return split

    @staticmethod
    def chunks(train_gids: Tensor, world_size: int) -> list[Tensor]:
        """Every rank's chunk of the sorted training gids."""
        offsets = even_offsets(train_gids.numel(), world_size).tolist()
        return [train_gids[offsets[r] : offsets[r + 1]] for r in range(world_size)]

    def _init(
        self, mine: Tensor, sizes: Tensor, world_size: int, rank: int, batch_size: int, seed: int
    ) -> None:
        self.sizes, self.mine = sizes, mine
        self.rank, self.seed = rank, seed
        self._epoch, self._steps = None, ()
        smallest = int(self.sizes.min())
        if batch_size == -1:
            self.steps = 1
        else:
            local_batch = max(1, batch_size // world_size)
            self.steps = max(1, -(-smallest // local_batch))

    def seeds(self, epoch: int, step: int) -> Tensor:
        """This rank's seeds of ``step`` in ``epoch`` (the shuffle is computed once an epoch)."""
        if epoch != self._epoch:
            key = splitmix64_int((self.seed << 24) ^ (epoch << 8) ^ self.rank) & ((1 << 63) - 1)
            perm = torch.randperm(self.mine.numel(), generator=torch.Generator().manual_seed(key))
            self._epoch, self._steps = epoch, torch.tensor_split(self.mine[perm], self.steps)
        return self._steps[step]

    def global_seed_count(self, step: int) -> int:
        """Seeds of ``step`` summed over all ranks (``tensor_split`` sizes, no communication)."""
        base, extra = self.sizes // self.steps, self.sizes % self.steps
        return int((base + (step < extra).long()).sum())
