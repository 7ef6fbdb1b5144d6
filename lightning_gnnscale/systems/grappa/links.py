"""Link prediction inside an isolated partition (docs/systems/grappa.md, "Link prediction").

A partition trains the training pairs whose destination lies in one of its seed chunks and
whose source it owns (``pair_sources=owned``, the default): a pair whose source lies in a chunk
the partition does not own is excluded in that super-epoch, and counted
(:func:`excluded_pairs`); the schedule brings the two chunks together in another. With
``pair_sources=held`` (and the 1-hop halo) it also trains those, scored through the halo:
every pair of its seed chunks, since a training pair's source is an in-neighbour of its owned
destination. A halo node has no in-edges in the partition, so its embedding there is its own
features alone, unlike the full neighbourhood it has in evaluation (docs/systems/grappa.md,
"Link prediction", for what that costs on Cora).

Negatives are the task's (:func:`~...tasks.link.negatives.uniform_negatives` /
``joint_negatives``, keyed by ``(seed, epoch, step, position)``, the position offset by the
partition id so that partitions do not share draws), kept where the partition owns the drawn
node and otherwise redrawn among its owned (core) nodes with a key of their own: a partition
cannot embed a node it does not hold, and a halo node has no in-edges there. Where the
partition owns every node (one chunk) no draw is replaced, so the step is ``single``'s.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...graph.sampler import splitmix64, uniform_below
from ...tasks.link.keys import stream_key
from ...tasks.link.negatives import joint_negatives, uniform_negatives
from .partition import IsolatedPartition
from .schedule import PartitionSpec

REDRAW = 0x47726170706152  # "GrappaR": the stream of negatives redrawn inside a partition
PARTITION_SHIFT = 32  # partition p's positions are p << 32 + the position in its step


def _core_negatives(part: IsolatedPartition, negs: Tensor, ids: Tensor, key: int) -> Tensor:
    """Local ids of the global negatives ``negs``: the partition's own row where it owns the
    node, else a keyed draw (element ids ``ids``) among its ``num_core`` owned nodes."""
    local = part.local_of(negs)
    redraw = (local < 0) | (local >= part.num_core)
    if bool(redraw.any()):
        draws = uniform_below(splitmix64(ids[redraw] ^ key), torch.tensor(part.num_core))
        local[redraw] = draws
    return local


def step_rows(
    task,
    part: IsolatedPartition,
    pair_ids: Tensor,
    partition: int,
    *,
    seed: int,
    epoch: int,
    step: int,
    num_nodes: int,
) -> tuple[Tensor, Tensor]:
    """``(nodes, y)`` of one partition step over its training pairs ``pair_ids`` (positions
    among the run's training pairs, all trained by ``part``): ``nodes`` the sorted *local* ids
    of the pairs' endpoints and negatives (the net's output rows, in this order), ``y``
    ``[pairs, 3]`` as the task's ``step_rows`` (source row, destination row, 1 for a positive;
    a typed graph's ``[pairs, 4]`` adds the relation, a negative keeping its positive's)."""
    c = task.config
    at = torch.searchsorted(part.pair_ids, pair_ids)
    src, dst = part.pairs[0, at], part.pairs[1, at]
    n, k = src.numel(), c.num_negatives
    positions = torch.arange(n, dtype=torch.int64) + (partition << PARTITION_SHIFT)
    key = stream_key(REDRAW, seed, epoch, step, partition)
    if c.negatives == "uniform":
        negs = uniform_negatives(
            src, positions, num_nodes, seed=seed, epoch=epoch, step=step, k=k
        ).flatten()
        ids = positions.repeat_interleave(k) * k + torch.arange(k).repeat(n)
        local_negs = _core_negatives(part, negs, ids, key)
    else:
        shared = joint_negatives(num_nodes, seed=seed, epoch=epoch, step=step, k=k)
        local_negs = _core_negatives(part, shared, torch.arange(k), key).repeat(n)
    local_src, local_dst = part.local_of(src), part.local_of(dst)
    pair_src = torch.cat([local_src, local_src.repeat_interleave(k)])
    pair_dst = torch.cat([local_dst, local_negs])
    positive = torch.cat([torch.ones(n, dtype=torch.int64), torch.zeros(n * k, dtype=torch.int64)])
    nodes, rows = torch.unique(torch.cat([pair_src, pair_dst]), return_inverse=True)
    m = pair_src.numel()
    columns = [rows[:m], rows[m:], positive]
    if part.pair_rel is not None:
        rel = part.pair_rel[at]
        columns.append(torch.cat([rel, rel.repeat_interleave(k)]))
    return nodes, torch.stack(columns, 1)


def excluded_pairs(pair_counts: list[list[int]], spec: PartitionSpec, halo_pairs: bool) -> int:
    """Training pairs a partition of ``spec`` does not train, from the replicated
    ``pair_counts[dst chunk][src chunk]``: none when it trains halo sources (``halo_pairs``,
    :attr:`~.config.GrappaConfig.trains_halo_pairs`: a pair's source is an in-neighbour of
    its destination, so in the 1-hop halo), else those whose source chunk it does not own."""
    if halo_pairs:
        return 0
    owned = set(spec.owned_chunks)
    return sum(n for a in spec.seed_chunks for b, n in enumerate(pair_counts[a]) if b not in owned)


def held_pairs(pair_counts: list[list[int]], spec: PartitionSpec, halo_pairs: bool) -> int:
    """Training pairs a partition of ``spec`` trains (:func:`excluded_pairs`' complement)."""
    total = sum(sum(pair_counts[a]) for a in spec.seed_chunks)
    return total - excluded_pairs(pair_counts, spec, halo_pairs)
