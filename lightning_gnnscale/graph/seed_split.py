"""Which training nodes each rank seeds at each step: the even split of the sorted training
ids that DistDGL and ByteGNN share (docs/systems/distdgl.md, "Trainer split")."""

from __future__ import annotations

import threading

import torch
from torch import Tensor

from .sampler import splitmix64_int


def even_offsets(n: int, parts: int) -> Tensor:
    """Offsets of ``parts`` contiguous chunks of ``n`` items whose sizes differ by at most 1."""
    sizes = torch.full((parts,), n // parts, dtype=torch.int64)
    sizes[: n % parts] += 1
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(sizes, 0)])


class SeedSplit:
    """The seeds of every rank and step: DistDGL's even trainer split (``force_even``), also
    ByteGNN's Seed operator's input.

    Rank ``r`` takes the ``r``-th of ``P`` even contiguous chunks of the sorted training gids
    (relabelled ids are partition-sorted, so chunk ``r`` lies mostly in partition ``r``), shuffles
    it every epoch with its own generator and cuts it into ``steps`` parts. ``steps`` is the same
    on every rank (computed from replicated sizes), so every training vertex is a seed exactly
    once per epoch and the ranks' steps pair up for the gradient all-reduce.

    Args:
        train_gids: sorted int64 training gids (replicated).
        world_size, rank: the trainers.
        batch_size: global seeds per step (``-1``: one step per epoch).
        seed: base of the shuffles.

    The constructor splits the whole list: the definition :meth:`from_chunk` (what ranks
    build from their part) is tested against.
    """

    def __init__(self, train_gids: Tensor, world_size: int, rank: int, batch_size: int, seed: int):
        offsets = even_offsets(train_gids.numel(), world_size)
        mine = train_gids[offsets[rank] : offsets[rank + 1]]
        self._init(mine, offsets.diff(), world_size, rank, batch_size, seed)

    @classmethod
    def from_chunk(
        cls, mine: Tensor, sizes: Tensor, rank: int, batch_size: int, seed: int
    ) -> SeedSplit:
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
        smallest = int(self.sizes.min())
        local_batch = smallest if batch_size == -1 else max(1, batch_size // world_size)
        self.steps = max(1, -(-smallest // max(local_batch, 1)))
        self._lock = threading.Lock()
        self._chunks: dict[int, tuple[Tensor, ...]] = {}  # recent epochs' steps

    def epoch_order(self, epoch: int) -> Tensor:
        """This rank's training gids in the order of ``epoch``."""
        key = splitmix64_int((self.seed << 24) ^ (epoch << 8) ^ self.rank) & ((1 << 63) - 1)
        gen = torch.Generator().manual_seed(key)
        return self.mine[torch.randperm(self.mine.numel(), generator=gen)]

    def seeds(self, epoch: int, step: int) -> Tensor:
        """This rank's seeds of ``step`` in ``epoch`` (thread-safe)."""
        with self._lock:
            if epoch not in self._chunks:
                self._chunks[epoch] = torch.tensor_split(self.epoch_order(epoch), self.steps)
                for old in [e for e in self._chunks if e < epoch - 1]:
                    del self._chunks[old]
            return self._chunks[epoch][step]

    def global_seed_count(self, step: int) -> int:
        """Seeds of ``step`` summed over all ranks (``tensor_split`` sizes)."""
        base, extra = self.sizes // self.steps, self.sizes % self.steps
        return int((base + (step < extra).long()).sum())
