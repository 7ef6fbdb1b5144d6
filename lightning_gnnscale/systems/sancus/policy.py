"""Staleness policies as pure functions (docs/systems/sancus.md#policies).

A flag vector ``flags[j]`` (bool ``[P]``) says whether root ``j`` broadcasts its block of one
layer input this epoch (ACTIVE) or the receivers reuse their cached copy (STALE).
``last_bcast[j]`` is the epoch of ``j``'s last broadcast of that layer input (``NEVER`` before
the first); it is identical on every rank because every broadcast reaches every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .config import POLICIES, SancusConfig

NEVER = -(1 << 40)
"""``last_bcast`` of a block never broadcast: older than any bound."""


def epoch_fixed_flags(epoch: int, last_bcast: Tensor, bound: int) -> Tensor:
    """SCS-E: ACTIVE iff the copy the others hold is older than ``bound`` epochs, so every block
    broadcasts every ``bound + 1`` epochs; ``bound = 0`` broadcasts every epoch."""
    return (epoch - last_bcast) > bound


def adaptive_flags(epoch: int, last_bcast: Tensor, bound: int, consumer: Tensor) -> Tensor:
    """SCS-A: ``OR_k request_k(j)`` with ``request_k(j) = consumer[k, j] and e - ver_k(j) >
    bound``; since ``ver_k(j) = last_bcast[j]`` on every ``k``, computable locally. A block
    nobody consumes never broadcasts."""
    return consumer.any(0) & ((epoch - last_bcast) > bound)


def relative_frobenius(h: Tensor, reference: Tensor) -> float:
    """``||h - reference||_F / (||reference||_F + 1e-12)``."""
    return float(torch.linalg.norm(h - reference) / (torch.linalg.norm(reference) + 1e-12))


def variation_flag(h: Tensor, last_sent: Tensor | None, gap: float) -> tuple[bool, float]:
    """SCS-H, one root: ACTIVE iff never sent or the relative Frobenius distance between its
    block now and the copy the others hold exceeds ``gap``. Returns ``(active, distance)``
    (distance ``inf`` before the first broadcast)."""
    if last_sent is None:
        return True, float("inf")
    distance = relative_frobenius(h, last_sent)
    return distance > gap, distance


@dataclass(frozen=True)
class StalenessPolicy:
    """The run's staleness rules, as pure functions of the versions every rank holds.

    Built from a validated :class:`~.config.SancusConfig` (:meth:`of`), which checks the
    values.

    The defaults are ``strategy=sancus``'s: SCS-A1 (``adaptive``, ε_A = 1), the variant the
    paper reports its time breakdown with and recommends. Under lockstep training it sends every
    consumed hidden block every other epoch from epoch 0, so it halves the hidden broadcasts from
    the start of any run (SCS-H, in contrast, sends every epoch while the embeddings still move
    fast, and saves nothing in a short run).

    Args:
        name: one of :data:`POLICIES`; ``none`` is bound 0 (CAGNET).
        epoch_bound: ε_E (``epoch_fixed``), ε_A (``adaptive``) or ε_G (``skipg``), in epochs.
        variation_gap: ε_H (``variation``), relative Frobenius distance.
        input_policy: ``once`` (X broadcast at epoch 0, cached for good; exact) or
            ``same_as_hidden`` (X follows the policy like a hidden layer; with ``none`` it is
            re-broadcast every epoch, as the public CAGNET code does).
    """

    name: str = "adaptive"
    epoch_bound: int = 1
    variation_gap: float = 0.01
    input_policy: str = "once"

    @classmethod
    def of(cls, config: SancusConfig) -> StalenessPolicy:
        """The staleness policy ``config``'s settings describe."""
        return cls(config.policy, config.epoch_bound, config.variation_gap, config.input_policy)

    def root_decides(self, layer: int) -> bool:
        """Whether each root decides layer input ``layer``'s flag alone (SCS-H), so that the
        flags need an ``all_gather`` and the root keeps the copy the others hold."""
        return self.name == "variation" and not (layer == 0 and self.input_policy == "once")

    def stores_blocks(self, layer: int) -> bool:
        """Whether received blocks of layer input ``layer`` are kept: a later epoch may read
        them stale. X always (it never changes, and evaluation reads it); hidden blocks not
        under ``none`` (CAGNET), SkipG's forward, and ``epoch_fixed``/``adaptive`` with bound
        0, which broadcast every block that is read every epoch."""
        if layer == 0:
            return True
        if self.name in ("epoch_fixed", "adaptive"):
            return self.epoch_bound > 0
        return self.name == "variation"

    def local_flags(
        self, layer: int, epoch: int, last_bcast: Tensor, consumer: Tensor
    ) -> Tensor | None:
        """Forward flags of layer input ``layer`` that every rank computes alone (no traffic),
        or ``None`` when each root decides for itself (:meth:`root_decides`)."""
        if self.root_decides(layer):
            return None
        if layer == 0 and self.input_policy == "once":
            return last_bcast == NEVER
        if self.name in ("none", "skipg"):
            return torch.ones_like(last_bcast, dtype=torch.bool)
        if self.name == "epoch_fixed":
            return epoch_fixed_flags(epoch, last_bcast, self.epoch_bound)
        if self.name == "adaptive":
            return adaptive_flags(epoch, last_bcast, self.epoch_bound, consumer)
        raise ValueError(f"unknown staleness policy {self.name!r}; valid: {list(POLICIES)}")

    def gradient_flags(self, epoch: int, last_bcast: Tensor) -> Tensor:
        """Backward δ flags: every root every epoch, except SkipG's epoch-fixed bound ε_G."""
        if self.name == "skipg":
            return epoch_fixed_flags(epoch, last_bcast, self.epoch_bound)
        return torch.ones_like(last_bcast, dtype=torch.bool)
