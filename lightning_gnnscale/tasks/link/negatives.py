"""Hash-keyed negatives for link prediction: corrupted destinations that no rank split changes.

Negative ``j`` of an element is ``uniform_below(splitmix64(splitmix64(id ^ key) + j), N)``
(the sampler's hash, graph/sampler.py), where ``id`` is the element's own id and ``key`` is
hashed from the stream's parts. It depends on nothing else, so a step's positives split over
any number of ranks draw exactly the negatives one process draws (docs/tasks.md, "Link
prediction building blocks").

Filtering (``filter_by``, off by default as in DGL and GraphStorm): a negative ``(s, d)`` is
*redrawn* (never removed, so every row keeps its ``k``) when ``d == s`` or the edge ``s -> d``
is in ``filter_by`` (a typed graph's: ``s -> d`` under the positive's relation). Redraw ``r`` of a negative hashes with the key ``stream_key(key, r)``, so it
too depends only on the element; one still true after ``max_rounds`` redraws is an error.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...graph.sampler import splitmix64, uniform_below
from .keys import EVAL, JOINT, TRAIN, stream_key
from .split import STAGES, EdgeLookup

MAX_ROUNDS = 16


def _draw(ids: Tensor, cols: Tensor, key: int, num_nodes: int) -> Tensor:
    """Destinations in ``[0, num_nodes)`` of negatives ``cols`` of elements ``ids`` (broadcast)."""
    return uniform_below(splitmix64(splitmix64(ids ^ key) + cols), torch.tensor(num_nodes))


def _negatives(
    src: Tensor,
    ids: Tensor,
    num_nodes: int,
    k: int,
    key: int,
    filter_by: EdgeLookup | None,
    max_rounds: int,
    rel: Tensor | None = None,
) -> Tensor:
    """int64 ``[n, k]``: ``k`` destinations per element ``ids[i]`` with source ``src[i]`` (and
    relation ``rel[i]``, which a typed ``filter_by`` filters by)."""
    _check_rows(src, ids, num_nodes, k)
    cols = torch.arange(k)
    dst = _draw(ids.unsqueeze(1), cols, key, num_nodes)
    if filter_by is None:
        return dst
    for r in range(1, max_rounds + 1):
        rows, col = _true_edges(src, dst, filter_by, rel)
        if rows.numel() == 0:
            return dst
        dst[rows, col] = _draw(ids[rows], col, stream_key(key, r), num_nodes)
    rows, col = _true_edges(src, dst, filter_by, rel)
    if rows.numel():
        raise ValueError(
            f"{rows.numel()} filtered negatives are still true edges after {max_rounds} "
            f"redraws (sources {src[rows[:5]].tolist()}...): a source adjacent to nearly "
            "every node; sample unfiltered or raise max_rounds"
        )
    return dst


def _true_edges(
    src: Tensor, dst: Tensor, filter_by: EdgeLookup, rel: Tensor | None
) -> tuple[Tensor, Tensor]:
    s = src.unsqueeze(1).expand_as(dst)
    t = None if rel is None else rel.unsqueeze(1).expand_as(dst)
    bad = (dst == s) | (filter_by.find(s, dst, t) >= 0)
    return bad.nonzero(as_tuple=True)


def _check_rows(src: Tensor, ids: Tensor, num_nodes: int, k: int) -> None:
    if src.dim() != 1 or src.shape != ids.shape:
        raise ValueError(
            f"sources and ids must be 1-D of one length, got {tuple(src.shape)} and "
            f"{tuple(ids.shape)}"
        )
    if src.dtype != torch.int64 or ids.dtype != torch.int64:
        raise ValueError("sources and ids must be int64")
    if k < 1 or num_nodes < 1:
        raise ValueError(f"need at least one negative and one node, got k={k}, N={num_nodes}")


def uniform_negatives(
    src: Tensor,
    positions: Tensor,
    num_nodes: int,
    *,
    seed: int,
    epoch: int,
    step: int,
    k: int = 1,
    filter_by: EdgeLookup | None = None,
    max_rounds: int = MAX_ROUNDS,
    rel: Tensor | None = None,
) -> Tensor:
    """Training negatives: ``k`` corrupted destinations per positive, int64 ``[n, k]``.

    Args:
        src: int64 ``[n]``, the positives' sources (kept; the destination is corrupted).
        positions: int64 ``[n]``, each positive's position in the step's global batch (over
            every rank): with ``(seed, epoch, step)`` the whole key of its negatives.
        filter_by: redraw negatives that are true edges of this CSC (module docstring).
        rel: int64 ``[n]``, a typed graph's positives' relations (kept by their negatives; a
            typed ``filter_by`` filters under them).
    """
    key = stream_key(TRAIN, seed, epoch, step)
    return _negatives(src, positions, num_nodes, k, key, filter_by, max_rounds, rel)


def joint_negatives(num_nodes: int, *, seed: int, epoch: int, step: int, k: int) -> Tensor:
    """Training negatives shared by a whole step: int64 ``[k]`` destinations, each positive
    scored against all of them (not filtered: one set cannot avoid every source's edges)."""
    one = torch.zeros(1, dtype=torch.int64)
    _check_rows(one, one, num_nodes, k)
    return _draw(one, torch.arange(k), stream_key(JOINT, seed, epoch, step), num_nodes)


def evaluation_negatives(
    src: Tensor,
    index: Tensor,
    num_nodes: int,
    *,
    seed: int,
    split: str,
    m: int = 100,
    filter_by: EdgeLookup | None = None,
    max_rounds: int = MAX_ROUNDS,
) -> Tensor:
    """The fixed negatives of evaluation edges: int64 ``[n, m]`` destinations.

    Keyed by ``(seed, split, index)`` only (``index`` int64 ``[n]``: each edge's position in
    the split's positives), so every strategy and world size scores the same candidates.
    """
    if split not in STAGES:
        raise ValueError(f"unknown split {split!r}; valid: {list(STAGES)}")
    key = stream_key(EVAL, seed, STAGES.index(split))
    return _negatives(src, index, num_nodes, m, key, filter_by, max_rounds)
