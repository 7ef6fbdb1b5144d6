"""Link-prediction metrics: MRR and Hits@K as summable statistics, and exact AUC.

Ranking follows OGB's tie rule: a positive scored against its ``m`` negatives has the rank
``1 + (#(neg > pos) + #(neg >= pos)) / 2``, the mean of its optimistic and pessimistic ranks.
MRR is the mean of ``1 / rank``, Hits@K the fraction with ``rank <= K``. Their statistics are
sums, so ranks sum them (one ``all_reduce``) before :func:`ranking_metrics`. AUC's are sums too
when every rank holds every negative's score (:func:`auc_statistics`; docs/tasks.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import HITS_KS


def ranking_statistic_names(ks: tuple[int, ...] = HITS_KS) -> tuple[str, ...]:
    """Names of :func:`ranking_statistics`' entries."""
    return ("count", "reciprocal_rank_sum", *(f"hits@{k}" for k in ks))


def _check_finite(name: str, scores: Tensor) -> None:
    if torch.isnan(scores).any():
        raise ValueError(f"{name} scores hold NaN")


def ranking_statistics(pos: Tensor, neg: Tensor, ks: tuple[int, ...] = HITS_KS) -> Tensor:
    """float64 ``[2 + len(ks)]``: count, sum of ``1 / rank`` and hits count per ``K``.

    Args:
        pos: ``[n]`` scores of the positives.
        neg: ``[n, m]`` scores of each positive's ``m`` negatives; every ``K`` must be below
            ``m`` (Hits@K with ``K >= m`` counts every positive).
    """
    if neg.dim() != 2 or pos.shape != (neg.shape[0],):
        raise ValueError(
            f"need pos [n] and neg [n, m], got {tuple(pos.shape)} and {tuple(neg.shape)}"
        )
    m = neg.shape[1]
    bad = [k for k in ks if not 1 <= k < m]
    if bad:
        raise ValueError(f"Hits@K needs 1 <= K < m = {m} negatives per positive; got K={bad}")
    _check_finite("positive", pos)
    _check_finite("negative", neg)
    p = pos.unsqueeze(1)
    rank = 1.0 + ((neg > p).sum(1) + (neg >= p).sum(1)).to(torch.float64) / 2.0
    count = torch.full((), pos.numel(), dtype=torch.float64, device=rank.device)
    hits = [(rank <= k).sum().to(torch.float64) for k in ks]
    return torch.stack([count, (1.0 / rank).sum(), *hits]).cpu()


def filtered_ranking_statistics(
    pos: Tensor, scores: Tensor, filtered: Tensor, ks: tuple[int, ...] = HITS_KS
) -> Tensor:
    """float64 ``[2 + len(ks)]`` as :func:`ranking_statistics`, of positives ranked against
    every candidate but the filtered ones (the knowledge-graph literature's filtered setting).

    Args:
        pos: ``[n]`` scores of the positives.
        scores: ``[n, N]`` scores of every candidate of each positive.
        filtered: bool ``[n, N]``: candidates left out of a positive's ranking (the other true
            triples, and the positive itself).

    OGB's tie rule: rank ``1 + (#(kept > pos) + #(kept >= pos)) / 2`` over the kept candidates.
    """
    if scores.dim() != 2 or pos.shape != (scores.shape[0],) or filtered.shape != scores.shape:
        raise ValueError(
            f"need pos [n], scores [n, N] and filtered [n, N], got {tuple(pos.shape)}, "
            f"{tuple(scores.shape)} and {tuple(filtered.shape)}"
        )
    _check_finite("positive", pos)
    _check_finite("candidate", scores)
    p, kept = pos.unsqueeze(1), ~filtered
    above = ((scores > p) & kept).sum(1)
    at_or_above = ((scores >= p) & kept).sum(1)
    rank = 1.0 + (above + at_or_above).to(torch.float64) / 2.0
    count = torch.full((), pos.numel(), dtype=torch.float64, device=rank.device)
    hits = [(rank <= k).sum().to(torch.float64) for k in ks]
    return torch.stack([count, (1.0 / rank).sum(), *hits]).cpu()


def ranking_metrics(stats: Tensor, ks: tuple[int, ...] = HITS_KS) -> dict[str, float]:
    """``{"mrr": ..., "hits@K": ...}`` from :func:`ranking_statistics` summed over ranks."""
    if stats.shape != (2 + len(ks),):
        raise ValueError(f"need {2 + len(ks)} statistics for K={list(ks)}, got {stats.shape}")
    count = float(stats[0])
    if count <= 0:
        raise ValueError("no evaluation edge was counted")
    return {"mrr": float(stats[1]) / count} | {
        f"hits@{k}": float(h) / count for k, h in zip(ks, stats[2:])
    }


def auc_statistics(pos: Tensor, neg: Tensor) -> Tensor:
    """float64 ``[2]``: twice the Mann-Whitney wins of positives ``pos [n]`` over negatives
    ``neg [q]`` (``2 #(pos > neg) + #(pos == neg)``) and twice the pairs (``2 n q``).

    Summable: ranks that each hold a share of the positives and *every* negative sum them,
    and :func:`auc_of` divides. Counted by sorting the negatives and two ``searchsorted``
    (``O((n + q) log q)``)."""
    if pos.dim() != 1 or neg.dim() != 1 or neg.numel() == 0:
        raise ValueError(
            f"auc needs 1-D scores and non-empty 1-D negatives, got {tuple(pos.shape)} and "
            f"{tuple(neg.shape)}"
        )
    _check_finite("positive", pos)
    _check_finite("negative", neg)
    ordered = torch.sort(neg.to(torch.float64)).values
    p = pos.to(torch.float64)
    below = torch.searchsorted(ordered, p, right=False).sum()
    at_or_below = torch.searchsorted(ordered, p, right=True).sum()
    pairs_twice = torch.tensor(2.0 * pos.numel() * neg.numel(), dtype=torch.float64)
    return torch.stack([(below + at_or_below).to(torch.float64).cpu(), pairs_twice])


def auc_of(stats: Tensor) -> float:
    """AUC from :func:`auc_statistics` summed over ranks."""
    if float(stats[1]) <= 0:
        raise ValueError("no evaluation edge was counted")
    return float(stats[0]) / float(stats[1])


def auc(pos: Tensor, neg: Tensor) -> float:
    """ROC AUC of positives ``pos [n]`` against negatives ``neg [q]``, ties counting 1/2: the
    Mann-Whitney statistic ``(#(pos > neg) + #(pos == neg) / 2) / (n q)`` over all pairs."""
    if pos.numel() == 0:
        raise ValueError(f"auc needs non-empty 1-D scores, got {tuple(pos.shape)} positives")
    return auc_of(auc_statistics(pos, neg))
