"""HopGNN's iteration planner: pure and deterministic, so every rank derives the same plan from
``(seed, epoch, step, partition)`` without exchanging a byte (docs/systems/hopgnn.md).

global shuffle -> the step's global mini-batch -> one share ``B_d`` per model replica ->
roots grouped by home server ``R[d][s]`` -> time-step schedule (model ``d`` on server
``(d + direction * k) mod N`` at step ``k``) -> merge plan (``T < N`` kept steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...graph.block import Block
from ...graph.book import RangeBook
from ...graph.sampler import NeighborSampler

Part = Tensor | RangeBook  # int64 [N] home server of every node, or the [P + 1] offsets


def owners_of(part: Part, ids: Tensor) -> Tensor:
    """The home server of each of ``ids``: a lookup in the ``[N]`` partition, or a binary
    search in the offsets of a contiguously relabelled graph (a partition directory)."""
    if isinstance(part, RangeBook):
        return part.nid2part(ids)
    return part.index_select(0, ids)


def model_batches(global_seeds: Tensor, world_size: int) -> list[Tensor]:
    """``B_d``: model ``d``'s share of the step's global mini-batch (the ranks' shares under
    ``ddp``: ``tensor_split`` into ``world_size`` contiguous chunks)."""
    return list(torch.tensor_split(global_seeds, world_size))


def redistribute(batches: list[Tensor], part: Part, world_size: int) -> list[list[Tensor]]:
    """``R[d][s]``: the roots of ``B_d`` whose home server is ``s`` (batch order kept)."""
    out = []
    for seeds in batches:
        owners = owners_of(part, seeds)
        order = torch.argsort(owners, stable=True)
        sizes = torch.bincount(owners, minlength=world_size).tolist()
        out.append(list(torch.split(seeds[order], sizes)))
    return out


def split_evenly(items: Tensor, parts: int) -> list[Tensor]:
    """``parts`` contiguous chunks whose sizes differ by at most 1, larger chunks first."""
    return list(torch.tensor_split(items, parts))


@dataclass(frozen=True)
class IterationPlan:
    """One iteration's global plan: which roots every server trains with which replica.

    Attributes:
        kept: ``K``, the kept time-step indices (increasing), ``T = len(kept)``.
        hosted: int64 ``[T, N]``: the model replica server ``s`` hosts at kept step ``j``
            (a permutation of ``[0, N)`` for every ``j``).
        roots: ``roots[j][s]``: int64 ``[n_js]`` roots server ``s`` trains at kept step ``j``.
        owner_model: ``owner_model[j][s]``: int64 ``[n_js]`` the model whose batch each of those
            roots came from (``hosted[j, s]`` except under ``merge_policy=home``).
        direction: ``+1`` / ``-1``, the rotation of the replicas.
        global_seed_count: ``sum_d |B_d|`` (the loss denominator).
    """

    kept: tuple[int, ...]
    hosted: Tensor
    roots: list[list[Tensor]]
    owner_model: list[list[Tensor]]
    direction: int
    global_seed_count: int

    @property
    def num_steps(self) -> int:
        return len(self.kept)

    @property
    def world_size(self) -> int:
        return self.hosted.shape[1]

    def load(self) -> Tensor:
        """int64 ``[T, N]``: roots trained per kept step and server (the load matrix)."""
        return torch.tensor([[r.numel() for r in row] for row in self.roots], dtype=torch.int64)

    def hop(self, j: int, rank: int) -> tuple[int, int]:
        """``(send_to, recv_from)`` of ``rank`` for the migration before kept step ``j >= 1``."""
        shift = self.direction * (self.kept[j] - self.kept[j - 1])
        n = self.world_size
        return (rank + shift) % n, (rank - shift) % n


def hosted_model(server: int, step: int, world_size: int, direction: int) -> int:
    """The model on ``server`` at time step ``step``: ``(server - direction * step) mod N``."""
    return (server - direction * step) % world_size


def model_centric_plan(global_seeds: Tensor, world_size: int) -> IterationPlan:
    """The baseline: one step, rank ``s`` trains model ``s`` on its whole ``B_s``."""
    batches = model_batches(global_seeds, world_size)
    hosted = torch.arange(world_size).unsqueeze(0)
    owners = [[torch.full_like(b, d) for d, b in enumerate(batches)]]
    return IterationPlan((0,), hosted, [batches], owners, 1, global_seeds.numel())


def micrograph_plan(
    global_seeds: Tensor,
    part: Part,
    world_size: int,
    steps: int | None = None,
    *,
    score: str = "sum_roots",
    policy: str = "model",
    direction: int = 1,
    recount: bool | None = None,
    batches: list[Tensor] | None = None,
) -> IterationPlan:
    """HopGNN's plan: roots redistributed to their home servers, ``T = steps`` (default ``N``)
    kept time steps, the dropped steps' roots merged into the kept ones (spec §3.5).

    ``batches``: the models' shares ``B_d`` when they are not ``model_batches(global_seeds)``
    (link prediction's: each model's scored pairs, ids into ``part``, a pair's home being its
    source's; :func:`link_plan`).

    Merging removes, one at a time, the step with the smallest load (``sum_roots``: roots over
    all servers; ``min_roots``: the least-loaded server's), ties to the smallest index. Under
    ``policy=model`` the dropped roots join the kept steps at once; ``recount`` (default
    ``True`` there) compares the loads after those moves, ``False`` the steps' original loads
    (the artifact's). Under ``policy=home`` the dropped roots are redistributed only after
    all removals, so every removal compares the original loads (``recount`` must not be
    ``True``). ``policy=model``: the dropped roots of model ``d`` are split
    into ``T`` near-equal contiguous chunks (larger first) appended to its kept steps in
    increasing order; ``policy=home``: they stay on their server and fill its kept steps up to
    ``total // T + 1`` roots each, in increasing step order.
    """
    n = world_size
    t = n if steps is None else steps
    if not 1 <= t <= n:
        raise ValueError(f"steps={steps} must lie in [1, {n}]")
    recount = policy == "model" if recount is None else recount
    if recount and policy == "home":
        raise ValueError("recount=True needs policy='model' (home moves roots after all removals)")
    r = redistribute(model_batches(global_seeds, n) if batches is None else batches, part, n)

    def server(d: int, k: int) -> int:
        return (d + direction * k) % n

    sets = {(d, k): r[d][server(d, k)] for d in range(n) for k in range(n)}
    owner = {(d, k): torch.full_like(sets[d, k], d) for d in range(n) for k in range(n)}
    original = {key: roots.numel() for key, roots in sets.items()}
    kept, removed = list(range(n)), []
    while len(kept) > t:
        size = {key: roots.numel() for key, roots in sets.items()} if recount else original
        load = {k: [size[hosted_model(s, k, n, direction), k] for s in range(n)] for k in kept}
        reduce = sum if score == "sum_roots" else min
        kmin = min(kept, key=lambda k: (reduce(load[k]), k))
        kept.remove(kmin)
        removed.append(kmin)
        if policy == "model":
            for d in range(n):
                moved, moved_owner = sets.pop((d, kmin)), owner.pop((d, kmin))
                chunks = zip(split_evenly(moved, len(kept)), split_evenly(moved_owner, len(kept)))
                for k, (chunk, chunk_owner) in zip(kept, chunks):
                    sets[d, k] = torch.cat([sets[d, k], chunk])
                    owner[d, k] = torch.cat([owner[d, k], chunk_owner])
    if policy == "home" and removed:
        for s in range(n):
            keys = [(hosted_model(s, k, n, direction), k) for k in sorted(removed)]
            moved = torch.cat([sets.pop(key) for key in keys])
            moved_owner = torch.cat([owner.pop(key) for key in keys])
            mine = [(hosted_model(s, k, n, direction), k) for k in kept]
            cap = (moved.numel() + sum(sets[key].numel() for key in mine)) // len(kept) + 1
            start = 0
            for key in mine:
                need = max(0, cap - sets[key].numel())
                sets[key] = torch.cat([sets[key], moved[start : start + need]])
                owner[key] = torch.cat([owner[key], moved_owner[start : start + need]])
                start += need
            assert start >= moved.numel()
    hosted = torch.tensor(
        [[hosted_model(s, k, n, direction) for s in range(n)] for k in kept], dtype=torch.int64
    )
    roots = [[sets[int(hosted[j, s]), k] for s in range(n)] for j, k in enumerate(kept)]
    owners = [[owner[int(hosted[j, s]), k] for s in range(n)] for j, k in enumerate(kept)]
    return IterationPlan(tuple(kept), hosted, roots, owners, direction, global_seeds.numel())


def sample_steps(
    plan: IterationPlan, rank: int, sampler: NeighborSampler, epoch: int, step: int
) -> list[list[Block] | None]:
    """The micrograph set of every kept step on ``rank``: its blocks (keyed like the global
    batch's, so each root's cone is the one a single process samples), ``None`` when empty."""
    return [
        sampler.sample(row[rank], epoch=epoch, step=step) if row[rank].numel() else None
        for row in plan.roots
    ]


def remote_inputs(blocks: list[Block] | None, part: Part, rank: int) -> Tensor:
    """Sorted unique input ids of a micrograph set that ``rank`` does not own."""
    if blocks is None:
        return torch.empty(0, dtype=torch.int64)
    ids = blocks[0].src_ids
    return torch.unique(ids[owners_of(part, ids) != rank])


def remote_row_counts(
    plan: IterationPlan,
    sampler: NeighborSampler,
    part: Tensor,
    epoch: int,
    step: int,
    pregather: bool,
) -> Tensor:
    """int64 ``[N]``: remote feature rows every server fetches in one iteration (``pregather``:
    the union over its kept steps; otherwise the sum of the per-step sets)."""
    counts = []
    for rank in range(plan.world_size):
        sets = [
            remote_inputs(b, part, rank) for b in sample_steps(plan, rank, sampler, epoch, step)
        ]
        if pregather:
            counts.append(torch.unique(torch.cat(sets)).numel())
        else:
            counts.append(sum(s.numel() for s in sets))
    return torch.tensor(counts, dtype=torch.int64)
