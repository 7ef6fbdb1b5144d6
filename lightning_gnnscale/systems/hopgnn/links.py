"""HopGNN's link-prediction plan: pure and deterministic, every rank derives the same one from
``(seed, epoch, step, partition)`` (docs/systems/hopgnn.md, "Link prediction").

A step's seeds are positive training pairs; model ``d``'s share ``B_d`` is its contiguous
chunk of the global batch, as under ``ddp``, and ``task.step_rows`` of that chunk gives its
scored pairs (positives and their negatives, keyed by position in the global batch, so any
split draws ``single``'s). A pair is a *root*: it lives where its source endpoint's features
live, and the micrograph planner (:func:`~.planner.micrograph_plan`) schedules the pairs as
it schedules node roots (time steps, merging). At kept step ``j`` server ``s`` scores the
pairs scheduled there; it computes the output rows of their sources and of every endpoint
whose home it is among the step's destinations (each endpoint's micrograph where its
features live), and receives the other destinations' rows from their homes in one
differentiable exchange per step (:func:`~...comm.exchange_rows`, ``activation`` forward and
``activation_grad`` back), each row once per (consumer, step): the rows the pairs need, never
every output. Under ``mode=model_centric`` a rank computes every endpoint of its pairs itself
(no exchange, the remote features fetched instead). All ids here are the dataset's original
ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .planner import IterationPlan, micrograph_plan

Home = Callable[[Tensor], Tensor]  # original ids -> the rank whose features they are


@dataclass(frozen=True)
class StepPairs:
    """The scored pairs of one global step, model by model.

    Attributes:
        src, dst, truth: int64 ``[M]`` every pair's endpoints (original ids) and truth (1 a positive, 0 a negative).
        batches: ``batches[d]``: model ``d``'s pair ids (into ``src``...), contiguous.
        rel: a typed graph's int64 ``[M]`` relation of every pair (a negative keeps its
            positive's); ``None`` when homogeneous.
    """

    src: Tensor
    dst: Tensor
    truth: Tensor
    batches: list[Tensor]
    rel: Tensor | None = None


def step_pairs(task, targets, global_seeds: Tensor, world_size: int, epoch: int, step: int):
    """:class:`StepPairs` of the global batch ``global_seeds`` (training pair positions): model
    ``d``'s share is its ``tensor_split`` chunk, its pairs ``task.step_rows`` of it."""
    positions = torch.tensor_split(torch.arange(global_seeds.numel()), world_size)
    src, dst, truth, rel, batches, offset = [], [], [], [], [], 0
    for share in positions:
        nodes, y = task.step_rows(targets, global_seeds[share], share, epoch=epoch, step=step)
        src.append(nodes[y[:, 0]])
        dst.append(nodes[y[:, 1]])
        truth.append(y[:, 2])
        rel.append(y[:, 3:])  # a typed graph's relation column ([pairs, 0] when homogeneous)
        batches.append(torch.arange(offset, offset + y.shape[0]))
        offset += y.shape[0]
    typed = torch.cat(rel)
    typed = typed[:, 0].contiguous() if typed.shape[1] else None
    return StepPairs(torch.cat(src), torch.cat(dst), torch.cat(truth), batches, typed)


@dataclass(frozen=True)
class LinkShare:
    """What one server computes and scores at one kept step.

    Attributes:
        nodes: int64 ``[n]`` sorted original ids whose output rows it computes (the
            micrograph set's roots).
        y: int64 ``[pairs, 3]`` its scored pairs: source row, destination row, truth (1 positive, 0 negative); rows
            index ``cat([its n output rows, the rows it receives])``. A typed graph's
            ``[pairs, 4]``: the pair's relation last (``task.loss_sum`` scores the triple).
        send_index: int64 rows of its output sent to the other servers, grouped by
            destination rank; ``send_splits`` / ``recv_splits``: rows sent to / received from
            each rank.
    """

    nodes: Tensor
    y: Tensor
    send_index: Tensor
    send_splits: list[int]
    recv_splits: list[int]


def link_share(
    roots: list[Tensor],
    pairs: StepPairs,
    home: Home,
    num_nodes: int,
    rank: int,
    *,
    dst_at_home: bool = True,
) -> LinkShare:
    """Rank ``rank``'s :class:`LinkShare` of one kept step whose pairs ``roots[s]`` server ``s``
    scores. ``dst_at_home``: a destination's row is computed by its home server and sent to
    the scoring one (HopGNN); ``False``: by the scoring server itself (model-centric).
    Vectorised over the step's pairs on every server (the exchange's counts are known to all,
    so no control bytes)."""
    n, v = len(roots), num_nodes
    pid = torch.cat(roots)
    server = torch.repeat_interleave(torch.arange(n), torch.tensor([r.numel() for r in roots]))
    src, dst, truth = pairs.src[pid], pairs.dst[pid], pairs.truth[pid]
    dst_server = home(dst) if dst_at_home else server
    keys = torch.unique(torch.cat([server * v + src, dst_server * v + dst]))
    start = torch.searchsorted(keys, torch.arange(n + 1) * v)  # each server's node range
    local_count = start[1:] - start[:-1]
    src_row = torch.searchsorted(keys, server * v + src) - start[server]
    wanted = server * v + dst
    at = torch.searchsorted(keys, wanted).clamp_(max=max(keys.numel() - 1, 0))
    local = keys[at] == wanted if keys.numel() else torch.zeros_like(wanted, dtype=torch.bool)
    dst_row = torch.empty_like(dst)
    dst_row[local] = at[local] - start[server[local]]
    far = ~local  # rows received from the destination's home: one per (consumer, node)
    requests, inverse = torch.unique(
        (server[far] * n + dst_server[far]) * v + dst[far], return_inverse=True
    )
    consumer, owner, node = requests // (n * v), (requests // v) % n, requests % v
    first = torch.searchsorted(consumer, torch.arange(n + 1))
    dst_row[far] = local_count[server[far]] + inverse - first[server[far]]
    mine = server == rank
    nodes = keys[start[rank] : start[rank + 1]] - rank * v
    served = owner == rank  # sorted by (consumer, node): the consumers' receive order
    columns = [src_row[mine], dst_row[mine], truth[mine]]
    if pairs.rel is not None:  # the triple's relation travels with the pair (no bytes: pure)
        columns.append(pairs.rel[pid][mine])
    return LinkShare(
        nodes=nodes,
        y=torch.stack(columns, 1),
        send_index=torch.searchsorted(nodes, node[served]),
        send_splits=torch.bincount(consumer[served], minlength=n).tolist(),
        recv_splits=torch.bincount(owner[consumer == rank], minlength=n).tolist(),
    )


def link_plan(
    task,
    targets,
    global_seeds: Tensor,
    home: Home,
    num_nodes: int,
    world_size: int,
    rank: int,
    epoch: int,
    step: int,
    *,
    model_centric: bool = False,
    **planner,
) -> tuple[IterationPlan, list[LinkShare]]:
    """The iteration's plan over pairs (roots = pair ids, each homed with its source) and
    ``rank``'s :class:`LinkShare` of every kept step. ``planner``: :func:`micrograph_plan`'s
    keywords (``steps``, ``score``, ``policy``, ``direction``, ``recount``);
    ``model_centric``: one step, model ``d``'s pairs all on rank ``d``."""
    pairs = step_pairs(task, targets, global_seeds, world_size, epoch, step)
    if model_centric:
        owners = [[torch.full_like(b, d) for d, b in enumerate(pairs.batches)]]
        hosted = torch.arange(world_size).unsqueeze(0)
        plan = IterationPlan((0,), hosted, [pairs.batches], owners, 1, global_seeds.numel())
    else:
        steps = planner.pop("steps", None)
        plan = micrograph_plan(
            global_seeds,
            home(pairs.src),
            world_size,
            steps,
            batches=pairs.batches,
            **planner,
        )
    shares = [
        link_share(row, pairs, home, num_nodes, rank, dst_at_home=not model_centric)
        for row in plan.roots
    ]
    return plan, shares
