"""Server-graph extraction for GraNNDIS: k-hop BFS, expansion-aware sampling, CoB-SAGE, co-batches.

Every function takes an inner set ``I`` of global ids and returns ``(vertices, level)``:
``vertices`` int64 ascending (every reached vertex, ``I`` included) and ``level`` int64 aligned
with it (0 for ``I``, ``d`` for vertices first reached at hop ``d``). Edges are followed
backwards (``u -> v`` reaches ``u`` from ``v``), as message sources. All work is vectorised over
the frontier; the only Python loops run over hops (and over the ``f`` draws of a fanout).
Rationale and the choices the paper leaves open: docs/systems/granndis.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...graph.csc import Graph
from ...graph.order import epoch_permutation
from ...graph.sampler import SampleKey, sample_neighbors, sample_typed_edge_ids, splitmix64


def check_ids(graph: Graph, ids: Tensor, name: str) -> Tensor:
    """``ids`` as unique ascending int64, after checking dtype and range."""
    if not isinstance(ids, Tensor) or ids.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor of node ids")
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must hold integer node ids, got dtype {ids.dtype}")
    ids = ids.to(torch.int64)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= graph.num_nodes):
        raise ValueError(f"{name} holds ids outside [0, {graph.num_nodes})")
    return torch.unique(ids)


def _check_nonneg(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def in_edge_ids(graph: Graph, dst: Tensor) -> tuple[Tensor, Tensor]:
    """All in-edges of the nodes ``dst`` as CSC positions: ``(eid, pos)`` int64 ``[E']``
    (a typed graph's relations are ``graph.edge_type[eid]``), ordered as :func:`in_edges`."""
    start = graph.indptr[dst]
    count = graph.indptr[dst + 1] - start
    pos = torch.repeat_interleave(torch.arange(dst.numel()), count)
    group_start = torch.cumsum(count, 0) - count
    offset = torch.arange(pos.numel()) - group_start[pos]
    return start[pos] + offset, pos


def in_edges(graph: Graph, dst: Tensor) -> tuple[Tensor, Tensor]:
    """All in-edges of the nodes ``dst``: ``(src, pos)`` int64 ``[E']``.

    ``pos`` is the index in ``dst`` of each edge's destination; edges come grouped by ``pos``
    (ascending) and keep their CSC order within a group (ascending source; a typed graph's by
    relation, then source).
    """
    eid, pos = in_edge_ids(graph, dst)
    return graph.indices[eid], pos


def khop_levels(graph: Graph, inner: Tensor, hops: int) -> tuple[Tensor, Tensor]:
    """In-edge BFS from ``inner`` to depth ``hops``: ``(vertices, level)`` (module docstring).

    ``level`` is the BFS distance from ``inner`` over reversed edges, so ``vertices`` is the exact
    ``hops``-hop in-neighbourhood closure of ``inner`` (FLX preloading, CoB without sampling).
    """
    inner = check_ids(graph, inner, "inner")
    hops = _check_nonneg(hops, "hops")
    level = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    level[inner] = 0
    frontier = inner
    for d in range(1, hops + 1):
        if frontier.numel() == 0:
            break
        src, _ = in_edges(graph, frontier)
        src = torch.unique(src)
        frontier = src[level[src] < 0]
        level[frontier] = d
    vertices = (level >= 0).nonzero().flatten()
    return vertices, level[vertices]


SELECTIONS = ("uniform", "degree_topk", "degree_prob")
FANOUT_SCOPES = ("external", "all")
FRONTIERS = ("new", "all")


def _check_choice(value: str, valid: tuple[str, ...], name: str) -> None:
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {list(valid)}")


def _check_fanout(fanout: int) -> int:
    if isinstance(fanout, bool) or not isinstance(fanout, int) or fanout == 0 or fanout < -1:
        raise ValueError(f"fanout must be a positive int or -1 (unlimited), got {fanout!r}")
    return fanout


def _edge_uniform(src: Tensor, dst: Tensor, num_nodes: int, key: int) -> Tensor:
    """float64 in ``(0, 1)`` per edge, a hash of ``(dst, src, key)``: independent of the batch."""
    h = splitmix64(splitmix64(dst * num_nodes + src) ^ key)
    return (((h >> 11) & ((1 << 53) - 1)).to(torch.float64) + 0.5) * 2.0**-53


def _in_degree_outside(graph: Graph, nodes: Tensor, selected: Tensor) -> Tensor:
    """int64 ``[len(nodes)]``: in-neighbours of each node not in ``selected`` (bool ``[N]``)."""
    src, pos = in_edges(graph, nodes)
    return torch.bincount(pos[~selected[src]], minlength=nodes.numel())


def _first_per_group(pos: Tensor, priority: Tensor, num_groups: int, fanout: int) -> Tensor:
    """Indices of the ``fanout`` lowest-``priority`` entries of every ``pos`` group."""
    order = torch.argsort(priority, stable=True)
    order = order[torch.argsort(pos[order], stable=True)]
    counts = torch.bincount(pos, minlength=num_groups)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.numel()) - starts[pos[order]]
    return order[rank < fanout]


def eas_expand(
    graph: Graph,
    inner: Tensor,
    *,
    hops: int = 1,
    fanout: int = 15,
    selection: str = "uniform",
    fanout_scope: str = "external",
    frontier: str = "new",
    seed: int = 0,
    salt: int = 0,
) -> tuple[Tensor, Tensor]:
    """Expansion-aware sampling (spec §4.5): ``(vertices, level)`` as in the module docstring.

    Per hop ``d`` every frontier vertex ``v`` keeps at most ``fanout`` of its candidate
    in-neighbours: those not yet selected (``fanout_scope="external"``) or all of them (``"all"``,
    the artifact; already-selected picks add nothing). Picks not yet selected get level ``d``.
    The next frontier is the new vertices (``frontier="new"``) or everything selected (``"all"``).
    ``selection``: ``uniform`` (without replacement), ``degree_topk`` (highest
    ``|N_in(u) \\ selected|`` at the start of the hop, ties broken by a seeded key) or
    ``degree_prob`` (without replacement, probability proportional to that score + 1).
    Randomness is a hash of ``(seed, salt, hop, v, u)``, so it does not depend on the batch.
    ``hops=0`` returns ``inner`` (Cluster-GCN); ``fanout=-1`` keeps every candidate, and then
    ``hops=L`` equals :func:`khop_levels`. Edges among ``inner`` are not sampled at all: callers
    take the induced subgraph on ``vertices``. A typed graph's ``fanout`` applies per
    ``(v, relation)`` (each relation's in-neighbours are candidates of their own; the degree
    scores count every relation).
    """
    inner = check_ids(graph, inner, "inner")
    hops = _check_nonneg(hops, "hops")
    fanout = _check_fanout(fanout)
    _check_choice(selection, SELECTIONS, "selection")
    _check_choice(fanout_scope, FANOUT_SCOPES, "fanout_scope")
    _check_choice(frontier, FRONTIERS, "frontier")
    key = SampleKey(seed, salt=salt)
    num_rel = graph.num_relations
    level = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    level[inner] = 0
    front = inner
    for d in range(1, hops + 1):
        if front.numel() == 0:
            break
        selected = level >= 0
        eid, pos = in_edge_ids(graph, front)
        src = graph.indices[eid]
        # a typed graph's fanout is per (frontier vertex, relation): slot pos * R + r
        group = pos if graph.edge_type is None else pos * num_rel + graph.edge_type[eid]
        if fanout_scope == "external":
            cand = ~selected[src]
            src, pos, group = src[cand], pos[cand], group[cand]
        if fanout > 0:
            u = _edge_uniform(src, front[pos], graph.num_nodes, key.hop_key(d))
            if selection == "uniform":
                priority = u
            else:
                nodes, inverse = torch.unique(src, return_inverse=True)
                score = _in_degree_outside(graph, nodes, selected)[inverse]
                if selection == "degree_topk":  # highest score first; u breaks ties
                    priority = u - score.to(torch.float64)
                else:  # exponential keys: smallest -log(u)/w is a weighted draw w/o replacement
                    priority = -torch.log(u) / (score + 1).to(torch.float64)
            src = src[_first_per_group(group, priority, front.numel() * num_rel, fanout)]
        new = torch.unique(src)
        new = new[~selected[new]]
        level[new] = d
        front = new if frontier == "new" else (level >= 0).nonzero().flatten()
    vertices = (level >= 0).nonzero().flatten()
    return vertices, level[vertices]


def sage_expand(
    graph: Graph, inner: Tensor, *, fanout: int = 25, hops: int, seed: int = 0, salt: int = 0
) -> tuple[Tensor, Tensor]:
    """CoB-SAGE extraction (ShaDow k-hop, spec §4.4): ``(vertices, level)``.

    Per hop every vertex collected so far (all levels) keeps up to ``fanout`` in-neighbours,
    uniformly without replacement, drawn by the suite's hash-keyed sampler
    (``graph/sampler.py``, key ``SampleKey(seed, salt=salt)``); vertices reached for the first
    time get level = hop. ``fanout=-1`` keeps every in-neighbour (then equal to
    :func:`khop_levels`). A typed graph is sampled per relation (``fanout`` in-neighbours of
    every ``(v, relation)``, :func:`~...graph.sampler.sample_typed_edge_ids` keyed on global
    ids).
    """
    inner = check_ids(graph, inner, "inner")
    hops = _check_nonneg(hops, "hops")
    fanout = _check_fanout(fanout)
    key = SampleKey(seed, salt=salt)
    slots = graph.relation_indptr() if graph.edge_type is not None else None
    level = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    level[inner] = 0
    collected = inner
    for d in range(1, hops + 1):
        if collected.numel() == 0:
            break
        if graph.edge_type is None:
            src, _ = sample_neighbors(
                graph.indptr, graph.indices, collected, fanout, key.hop_key(d)
            )
        else:
            fanouts = (fanout,) * graph.num_relations
            eids, _ = sample_typed_edge_ids(slots, collected, fanouts, key.hop_key(d))
            src = graph.indices[eids]
        new = torch.unique(src)
        new = new[level[new] < 0]
        level[new] = d
        collected = (level >= 0).nonzero().flatten()
    return collected, level[collected]


def cobatches(
    targets: Tensor,
    num_per_epoch: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    server: int = 0,
) -> list[Tensor]:
    """Split one server's ``targets`` into exactly ``num_per_epoch`` co-batches (spec §4.4).

    Chunks are disjoint, their union is ``targets`` and sizes differ by at most one (a server
    with few targets gets empty ones, which still take part in the step's collectives). With
    ``shuffle`` the order is a permutation seeded by ``(seed, server, epoch)``; otherwise the
    targets are sorted. Each chunk is returned sorted ascending.
    """
    if isinstance(num_per_epoch, bool) or not isinstance(num_per_epoch, int) or num_per_epoch < 1:
        raise ValueError(f"num_per_epoch must be an int >= 1, got {num_per_epoch!r}")
    if not isinstance(targets, Tensor) or targets.dim() != 1:
        raise ValueError("targets must be a 1-D tensor of node ids")
    if targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must hold integer node ids, got dtype {targets.dtype}")
    ids = torch.unique(targets.to(torch.int64))
    if ids.numel() != targets.numel():
        raise ValueError("targets holds duplicate ids")
    if shuffle:
        server_seed = SampleKey(seed, salt=server).hop_key(0)
        ids = epoch_permutation(ids, server_seed, epoch)
    return [chunk.sort().values for chunk in torch.tensor_split(ids, num_per_epoch)]


def num_cobatches(
    max_targets_per_server: int, size_per_worker: int, workers_per_server: int
) -> int:
    """Co-batches per epoch ``B = ceil(max_s |T_s| / (N_g * size_per_worker))``, at least 1.

    Use the largest server's target count so every server runs the same number of steps.
    """
    for name, value, low in (
        ("max_targets_per_server", max_targets_per_server, 0),
        ("size_per_worker", size_per_worker, 1),
        ("workers_per_server", workers_per_server, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    size = size_per_worker * workers_per_server
    return max(1, -(-max_targets_per_server // size))
