"""Which chunks each partition owns and seeds at super-epoch ``t``.

Schedules and their rationale: docs/systems/grappa.md, "Schedules".

Everything here is a pure function of the config, so every rank computes the same schedule and
no schedule bytes are ever sent. Partition ``p`` runs on rank ``p % W`` in phase ``p // W``.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("pinned_sweep", "tournament", "fixed")
SWEEP_ORDERS = ("cyclic", "shuffled")


@dataclass(frozen=True)
class PartitionSpec:
    """Seeds are the training nodes of ``seed_chunks``; ``owned_chunks`` hold the nodes whose
    in-edges (and features) the partition has."""

    seed_chunks: tuple[int, ...]
    owned_chunks: tuple[int, ...]


class Schedule:
    """A chunk schedule over ``num_chunks`` chunks.

    Args:
        kind: ``pinned_sweep`` (base chunk ``p`` + a variable chunk swept over the others),
            ``tournament`` (round-robin pairs, both chunks seed) or ``fixed`` (the ``t = 0``
            pinned pairs forever: the Grappa-FP ablation).
        num_chunks: ``C``.
        sweep_order: ``cyclic`` or ``shuffled`` (cycle order permuted per cycle, seeded).
        seed: seed of the shuffled order.
    """

    def __init__(self, kind: str, num_chunks: int, sweep_order: str = "cyclic", seed: int = 0):
        if kind not in SCHEDULES:
            raise ValueError(f"unknown schedule {kind!r}; valid: {list(SCHEDULES)}")
        if sweep_order not in SWEEP_ORDERS:
            raise ValueError(f"unknown sweep_order {sweep_order!r}; valid: {list(SWEEP_ORDERS)}")
        if num_chunks < 1:
            raise ValueError("num_chunks must be >= 1")
        self.kind, self.num_chunks = kind, num_chunks
        self.sweep_order, self.seed = sweep_order, seed

    @property
    def cycle(self) -> int:
        """Super-epochs per cycle (every pairing once): ``C - 1`` (``C`` rounded up to even for
        the tournament), at least 1."""
        c = self.num_chunks + (self.num_chunks % 2 if self.kind == "tournament" else 0)
        return max(1, c - 1)

    @property
    def num_partitions(self) -> int:
        if self.kind == "tournament":
            return -(-self.num_chunks // 2)
        return self.num_chunks

    def round(self, t: int) -> int:
        """Position in the cycle of super-epoch ``t`` (after the optional per-cycle shuffle)."""
        if self.kind == "fixed":
            return 0
        pos = t % self.cycle
        if self.sweep_order == "cyclic":
            return pos
        import torch  # late: the config reads this module, and configs load without torch

        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + t // self.cycle)
        return int(torch.randperm(self.cycle, generator=gen)[pos])

    def partition(self, p: int, t: int) -> PartitionSpec:
        """Partition ``p`` at super-epoch ``t``."""
        if not 0 <= p < self.num_partitions:
            raise ValueError(f"partition {p} outside [0, {self.num_partitions})")
        r, c = self.round(t), self.num_chunks
        if self.kind == "tournament":
            return PartitionSpec(*(tournament_pairs(c, r)[p],) * 2)
        if c == 1:
            return PartitionSpec((0,), (0,))
        return PartitionSpec((p,), (p, partner(p, r, c)))

    def partitions(self, t: int) -> list[PartitionSpec]:
        return [self.partition(p, t) for p in range(self.num_partitions)]


def partner(p: int, r: int, num_chunks: int) -> int:
    """Pinned sweep: the variable chunk of base ``p`` in round ``r``: ``(p + 1 + r % (C-1)) % C``."""
    return (p + 1 + r % (num_chunks - 1)) % num_chunks


def tournament_pairs(num_chunks: int, r: int) -> list[tuple[int, ...]]:
    """Circle method: round ``r`` of a round robin over ``num_chunks`` chunks, as sorted pairs
    (with an odd count, the chunk paired with the bye is alone)."""
    n = num_chunks + num_chunks % 2
    bye = n - 1 if num_chunks % 2 else None
    ring = list(range(1, n))
    ring = ring[r % (n - 1) :] + ring[: r % (n - 1)]
    players = [0, *ring]
    pairs = []
    for i in range(n // 2):
        a, b = players[i], players[n - 1 - i]
        pair = tuple(sorted(x for x in (a, b) if x != bye))
        pairs.append(pair)
    return sorted(pairs)


def super_epoch_len(setting, max_epochs: int | None, cycle: int) -> int:
    """``auto`` (or ``None``) -> ``max(1, floor(E / cycle))`` epochs, one schedule cycle spread
    over the run's ``max_epochs`` ``E`` (docs/systems/grappa.md, "Super-epochs"); an int is
    taken as is."""
    if setting not in (None, "auto"):
        return setting
    if max_epochs is None:
        raise ValueError(
            "strategy.super_epoch_len=auto derives the length from the Trainer's max_epochs, "
            "and there is no Trainer; set super_epoch_len to an int"
        )
    return max(1, max_epochs // max(cycle, 1))
