"""GSplit's offline probabilistic partitioning and its ablation partitioners.

Pre-sampling runs the training schedule and counts how often every vertex is a block
destination (``k_v``), every edge is sampled (``k_e``) and every vertex is an input (``k0_v``).
METIS then cuts the graph with ``k_v`` as vertex weights and ``k_e`` (summed over both
directions of a pair) as edge weights. The cut edges' share of ``k_e`` is then the expected
share of sampled edges that cross splits, and each split's ``k_v`` mass its expected compute.
The steps and the ablations: docs/systems/gsplit.md#partitioning.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ...graph.block import Block
from ...graph.cache import cached, graph_fingerprint, tensor_digest
from ...graph.csc import Graph
from ...graph.node_targets import NodeTargets
from ...graph.order import epoch_permutation
from ...graph.partition import metis_kway, partition
from ...graph.sampler import NeighborSampler
from .config import PARTITION_METHODS, ZERO_EDGE_POLICIES

_METIS_NITER = 10  # what graph.partition's "metis" uses, so all methods search equally hard
# Bump when pre-sampling, the METIS weights or the artifact's content change for the same
# inputs (the shared graph.cache.CODE_VERSION covers the partitioners themselves).
ARTIFACT_VERSION = 1
PROGRESS_EVERY_S = 30.0  # pre-sampling prints a progress line this often


def _check_choice(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {list(valid)}")


@dataclass(frozen=True)
class PresampleCounts:
    """Pre-sampling statistics (step 1 of docs/systems/gsplit.md#partitioning).

    Attributes:
        k_v: int64 ``[N]``: times ``v`` is a destination of a block (once per layer 1..L per
            mini-batch, so a vertex present at layers L..1 gets +L).
        k_e: int64 ``[E]`` per CSC edge id: times the directed edge is sampled, over all hops.
        k0_v: int64 ``[N]``: times ``v`` is an input (in ``blocks[0].src_ids``).
        num_batches: number of pre-sampled mini-batches.
    """

    k_v: Tensor
    k_e: Tensor
    k0_v: Tensor
    num_batches: int


def presample(
    graph: Graph,
    train_ids: Tensor,
    fanouts: list[int],
    batch_size: int,
    epochs: int,
    seed: int,
    *,
    drop_last: bool = False,
    step_nodes: Callable[[Tensor, int, int], Tensor] | None = None,
    relation_fanouts: list[tuple[int, ...]] | None = None,
) -> PresampleCounts:
    """Count ``k_v``, ``k_e``, ``k0_v`` over ``epochs`` epochs of the training schedule.

    ``train_ids``: the task's training seeds ``[n_train]``, in id order. Step ``t`` of epoch
    ``e`` samples ``epoch_permutation(train_ids, seed, e)[t*B:(t+1)*B]`` with
    ``NeighborSampler(..., fanouts, seed)``, exactly as training does, so the counts describe
    the distribution the online sampler draws from. ``batch_size=-1`` puts all training nodes
    in one step; ``drop_last`` skips a final partial batch. ``step_nodes(seeds, epoch, step)``
    turns a step's seeds into the nodes sampled (link prediction: the sorted endpoints of the
    step's positive pairs and their negatives); default the seeds themselves. A typed graph
    is sampled per relation with ``relation_fanouts`` (per hop, every relation's fanout), as
    training samples it.
    """
    if train_ids.numel() == 0:
        raise ValueError(f"graph {graph.name!r} has no training nodes to pre-sample from")
    if epochs < 1:
        raise ValueError(f"presample needs epochs >= 1, got {epochs}")
    batch = train_ids.numel() if batch_size == -1 else batch_size
    if batch < 1:
        raise ValueError(f"batch_size must be >= 1 or -1 (all), got {batch_size}")
    steps = train_ids.numel() // batch if drop_last else -(-train_ids.numel() // batch)
    if steps == 0:
        raise ValueError(
            f"batch_size {batch} exceeds the {train_ids.numel()} training nodes with drop_last"
        )
    num_nodes = graph.num_nodes
    if graph.is_typed:
        sampler = NeighborSampler(
            graph.indptr,
            graph.indices,
            fanouts,
            seed,
            edge_type=graph.edge_type,
            relation_fanouts=relation_fanouts,
            num_relations=graph.num_relations,
        )
    else:
        sampler = NeighborSampler(graph.indptr, graph.indices, fanouts, seed)
    # CSC order is sorted by (dst, src) (a typed graph's by (dst, relation, src)), so these keys
    # are sorted and an edge's id is the position of its key (no duplicate edges: a typed
    # graph holds a pair at most once per relation).
    edge_keys = edge_sort_keys(graph.dst_of_edges(), graph.indices, graph.edge_type, graph)
    k_v = torch.zeros(num_nodes, dtype=torch.int64)
    k_e = torch.zeros(graph.num_edges, dtype=torch.int64)
    k0_v = torch.zeros(num_nodes, dtype=torch.int64)
    started = said = time.monotonic()
    for epoch in range(epochs):
        order = epoch_permutation(train_ids, seed, epoch)
        for step in range(steps):
            if time.monotonic() - said >= PROGRESS_EVERY_S:  # minutes on large graphs
                said = time.monotonic()
                print(
                    f"[gsplit] pre-sampling: epoch {epoch + 1}/{epochs}, mini-batch "
                    f"{step + 1}/{steps} ({said - started:.0f} s)",
                    flush=True,
                )
            seeds = order[step * batch : (step + 1) * batch]
            if step_nodes is not None:
                seeds = step_nodes(seeds, epoch, step)
            blocks = sampler.sample(seeds, epoch, step)
            k0_v[blocks[0].src_ids] += 1  # ids, like the dst ids and edges below, are unique
            for block in blocks:
                k_v[block.dst_ids] += 1
                src, dst = block.src_ids[block.edge_index]
                keys = edge_sort_keys(dst, src, block.edge_type, graph)
                k_e[torch.searchsorted(edge_keys, keys)] += 1
    return PresampleCounts(k_v, k_e, k0_v, epochs * steps)


def edge_sort_keys(dst: Tensor, src: Tensor, edge_type: Tensor | None, graph: Graph) -> Tensor:
    """int64 keys in the graph's CSC order: ``dst * N + src``, a typed graph's
    ``(dst * R + relation) * N + src``."""
    num_nodes = graph.num_nodes
    if edge_type is None:
        return dst * num_nodes + src
    return (dst * graph.num_relations + edge_type) * num_nodes + src


def vertex_weight_scale(k_v: Tensor, num_edges: int) -> int:
    """``s`` of step 3 (docs/systems/gsplit.md#partitioning): the average degree
    ``max(1, E // N)``, raised when ``sum(k_v) * s < 100 N`` so that the ``+1`` offsets stay
    within 1% of the weight."""
    num_nodes = k_v.numel()
    scale = max(1, num_edges // max(num_nodes, 1))
    total = int(k_v.sum())
    if total and total * scale < 100 * num_nodes:
        scale = -(-100 * num_nodes // total)
    return scale


def integer_vertex_weights(k_v: Tensor, num_edges: int) -> Tensor:
    """METIS vertex weights ``k_v * s + 1`` (int64 ``[N]``, all positive)."""
    return k_v * vertex_weight_scale(k_v, num_edges) + 1


def integer_edge_weights(pair_weights: Tensor, zero_edge_policy: str) -> tuple[Tensor, Tensor]:
    """METIS edge weights from pair counts ``W_E`` (step 3 of the partitioning).

    ``drop`` removes pairs with ``W_E == 0`` and keeps ``W_E``; ``epsilon`` keeps every pair
    at ``10 W_E + 1``; ``auto`` drops when fewer than half of the pairs were ever sampled,
    else uses ``epsilon``. Returns ``(keep, weights)``: bool mask over ``pair_weights`` and the
    int64 weights of the kept entries.
    """
    _check_choice("zero_edge_policy", zero_edge_policy, ZERO_EDGE_POLICIES)
    sampled = pair_weights > 0
    if zero_edge_policy == "auto":
        sampled_share = int(sampled.sum()) / max(pair_weights.numel(), 1)
        zero_edge_policy = "drop" if sampled_share < 0.5 else "epsilon"
    if zero_edge_policy == "drop":
        return sampled, pair_weights[sampled]
    return torch.ones_like(sampled), pair_weights * 10 + 1


def symmetric_pair_weights(graph: Graph, k_e: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Symmetric CSR over unordered pairs ``{u, v}``, ``u != v``, with ``W_E = k_uv + k_vu``.

    Returns ``(xadj [N+1], adjncy [2M], pair_weights [2M])``: every pair appears once per
    endpoint, neighbours sorted, no self-loops, no duplicates (what METIS needs, step 2).
    """
    num_nodes = graph.num_nodes
    src, dst = graph.edge_index()
    not_loop = src != dst
    src, dst, counts = src[not_loop], dst[not_loop], k_e[not_loop]
    keys = torch.cat([dst * num_nodes + src, src * num_nodes + dst])
    entries, slot = torch.unique(keys, return_inverse=True)
    weights = torch.zeros(entries.numel(), dtype=torch.int64).index_add_(0, slot, counts.repeat(2))
    return _csr(entries // num_nodes, num_nodes), entries % num_nodes, weights


def _csr(rows: Tensor, num_nodes: int) -> Tensor:
    """``xadj`` [N+1] of entries sorted by row."""
    xadj = torch.zeros(num_nodes + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(rows, minlength=num_nodes), 0, out=xadj[1:])
    return xadj


def gsplit_metis_input(
    graph: Graph, counts: PresampleCounts, zero_edge_policy: str = "auto"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(xadj, adjncy, vweights, eweights)`` of the weighted METIS graph (steps 2-3)."""
    xadj, adjncy, pair_weights = symmetric_pair_weights(graph, counts.k_e)
    keep, eweights = integer_edge_weights(pair_weights, zero_edge_policy)
    rows = torch.repeat_interleave(torch.arange(graph.num_nodes), xadj[1:] - xadj[:-1])
    xadj = _csr(rows[keep], graph.num_nodes)
    vweights = integer_vertex_weights(counts.k_v, graph.num_edges)
    return xadj, adjncy[keep], vweights, eweights


def _metis_parts(
    metis_input: tuple[Tensor, Tensor, Tensor, Tensor], num_parts: int, seed: int, ufactor: int
) -> Tensor:
    """pymetis k-way edge cut with vertex and edge weights; int64 ``[N]``."""
    xadj, adjncy, vweights, eweights = metis_input
    return metis_kway(
        xadj,
        adjncy,
        num_parts,
        vweights=vweights,
        eweights=eweights,
        seed=seed,
        ufactor=ufactor,
        niter=_METIS_NITER,
    )


def edge_balance_weights(graph: Graph, is_train: Tensor) -> Tensor:
    """The ``edge`` baseline's folded vertex weight ``deg(v) + alpha * 1[train]`` with
    ``alpha = E / |train|`` (docs/systems/gsplit.md#ablations), times ``|train|`` to keep it
    an exact integer; ``is_train``: bool ``[N]``, the task's training seeds."""
    is_train = is_train.to(torch.int64)
    num_train = int(is_train.sum())
    if num_train == 0:
        raise ValueError(f"the 'edge' partitioner needs training nodes; {graph.name!r} has none")
    return graph.in_degree() * num_train + graph.num_edges * is_train


def probabilistic_partition(
    graph: Graph,
    num_parts: int,
    counts: PresampleCounts | None = None,
    *,
    method: str = "gsplit",
    is_train: Tensor | None = None,
    seed: int = 0,
    ufactor: int = 30,
    zero_edge_policy: str = "auto",
) -> Tensor:
    """Split function ``f``: int64 ``[N]`` part ids in ``[0, num_parts)``.

    Methods (docs/systems/gsplit.md#ablations): ``gsplit`` (vertex ``k_v``, edge ``k_e`` over
    the pair), ``node`` (vertex ``k_v``, uniform edges), ``edge`` (degree plus train mass,
    uniform edges), ``naive`` (unweighted METIS), ``random``. ``gsplit`` and ``node`` need
    ``counts``, ``edge`` needs ``is_train`` (bool ``[N]``: the task's training seeds).
    ``seed`` seeds METIS (or the random draw); ``ufactor`` is METIS's imbalance in 1/1000.
    """
    _check_choice("method", method, PARTITION_METHODS)
    _check_choice("zero_edge_policy", zero_edge_policy, ZERO_EDGE_POLICIES)
    if method in ("gsplit", "node"):
        if counts is None:
            raise ValueError(f"method {method!r} needs the pre-sampling counts")
        if counts.k_v.shape != (graph.num_nodes,) or counts.k_e.shape != (graph.num_edges,):
            raise ValueError("counts were not pre-sampled on this graph")
    if method == "edge" and is_train is None:
        raise ValueError("method 'edge' needs is_train (the task's training seeds)")
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if num_parts == 1 or graph.num_nodes == 0:
        return torch.zeros(graph.num_nodes, dtype=torch.int64)
    if method == "random":
        return partition(graph, "random", num_parts, seed=seed)
    if method == "gsplit":
        metis_input = gsplit_metis_input(graph, counts, zero_edge_policy)
        return _metis_parts(metis_input, num_parts, seed, ufactor)
    node_weights = None  # naive
    if method == "node":
        node_weights = integer_vertex_weights(counts.k_v, graph.num_edges)
    elif method == "edge":
        node_weights = edge_balance_weights(graph, is_train)
    return partition(
        graph, "metis", num_parts, seed=seed, node_weights=node_weights, ufactor=ufactor
    )


def expected_cross_fraction(graph: Graph, parts: Tensor, k_e: Tensor) -> float:
    """``sum_{e cut} k_e / sum_e k_e``: the predicted share of sampled edges crossing splits."""
    src, dst = graph.edge_index()
    total = int(k_e.sum())
    return int(k_e[parts[src] != parts[dst]].sum()) / total if total else 0.0


@dataclass(frozen=True)
class LinkSchedule:
    """Link prediction's training schedule for pre-sampling: seeds are training pairs.

    Attributes:
        train_seeds: ``[n_train]`` positions of the training pairs (the task's ``train_seeds``).
        step_nodes: ``(seeds, epoch, step) -> nodes``: a step's endpoint nodes (its positives'
            and their negatives', ``task.step_rows``; pre-sampling keys its negatives on its own
            seed, so it does not replay training's).
        key: what else the schedule depends on (the task's settings and the run's seed).
        digests: tensors the schedule depends on (the training pairs), digested into the key.
    """

    train_seeds: Tensor
    step_nodes: Callable[[Tensor, int, int], Tensor]
    key: dict
    digests: tuple[Tensor, ...]

    def fingerprint(self, graph: Graph) -> dict:
        """The cache identity of the training structure ``graph`` and of this schedule."""
        return {
            "name": graph.name,
            "num_nodes": graph.num_nodes,
            "num_edges": graph.num_edges,
            "structure": [tensor_digest(graph.indptr), tensor_digest(graph.indices)],
            "pairs": [tensor_digest(t) for t in self.digests],
            **self.key,
        }


def cached_probabilistic_partition(
    graph: Graph,
    num_parts: int,
    *,
    targets: NodeTargets | None,
    is_train: Tensor,
    method: str,
    fanouts: list[int],
    batch_size: int,
    presample_epochs: int,
    seed: int,
    cache_dir: str | os.PathLike,
    metis_seed: int = 0,
    ufactor: int = 30,
    zero_edge_policy: str = "auto",
    drop_last: bool = False,
    link: LinkSchedule | None = None,
    relation_fanouts: list[tuple[int, ...]] | None = None,
) -> dict:
    """Pre-sample, partition and keep the artifact in ``cache_dir`` (step 5).

    ``targets``: the task's rows of every node; ``is_train``: bool ``[N]``, its training seeds
    (what pre-sampling draws from). With ``link`` (link prediction, :class:`LinkSchedule`)
    ``graph`` is the training structure, the seeds are training pairs and a step samples their
    endpoints and negatives; ``is_train`` marks the training pairs' endpoints (the ``edge``
    baseline's train mass) and ``targets`` is unused. ``seed`` drives pre-sampling (schedule and sampler),
    ``metis_seed`` the partitioner. A typed graph pre-samples per relation
    (``relation_fanouts``); its relations and those fanouts are part of the key.
    Returns ``{"parts": int64 [N], "k_v": int64 [N], "k0_v": int64 [N], "num_batches": int,
    "expected_cross_fraction": float, "method": str}``; ``k_e`` ([E], large) is not kept.
    Every method pre-samples: ``k0_v`` ranks the feature cache and ``k_e`` gives the
    prediction.
    """
    _check_choice("method", method, PARTITION_METHODS)
    _check_choice("zero_edge_policy", zero_edge_policy, ZERO_EDGE_POLICIES)
    # Everything the artifact depends on: the graph's structure (through the fingerprint), the
    # training seeds, the pre-sampling schedule and sampler, and the partitioner's settings.
    key_parts = {
        "kind": "gsplit_partition",
        "version": ARTIFACT_VERSION,
        "graph": graph_fingerprint(graph, targets) if link is None else link.fingerprint(graph),
        "train_seeds": tensor_digest(is_train),
        "method": method,
        "num_parts": num_parts,
        "fanouts": list(fanouts),
        "batch_size": batch_size,
        "presample_epochs": presample_epochs,
        "drop_last": drop_last,
        "seed": seed,
        "metis_seed": metis_seed,
        "ufactor": ufactor,
        "zero_edge_policy": zero_edge_policy,
    }
    if graph.is_typed:  # homogeneous keys unchanged
        key_parts["edge_type"] = tensor_digest(graph.edge_type)
        key_parts["relation_fanouts"] = [list(hop) for hop in relation_fanouts or ()]

    def build() -> dict:
        train_ids = is_train.nonzero().flatten() if link is None else link.train_seeds
        counts = presample(
            graph,
            train_ids,
            fanouts,
            batch_size,
            presample_epochs,
            seed,
            drop_last=drop_last,
            step_nodes=None if link is None else link.step_nodes,
            relation_fanouts=relation_fanouts,
        )
        parts = probabilistic_partition(
            graph,
            num_parts,
            counts,
            method=method,
            is_train=is_train,
            seed=metis_seed,
            ufactor=ufactor,
            zero_edge_policy=zero_edge_policy,
        )
        return {
            "parts": parts,
            "k_v": counts.k_v,
            "k0_v": counts.k0_v,
            "num_batches": counts.num_batches,
            "expected_cross_fraction": expected_cross_fraction(graph, parts, counts.k_e),
            "method": method,
        }

    return cached(key_parts, build, cache_dir, prefix="gsplit-partition")


def cross_split_fraction(blocks: list[Block], parts: Tensor) -> tuple[int, int]:
    """``(cross_edges, total_edges)`` of global-id ``blocks``: sampled edges whose source and
    destination are owned by different splits under ``parts``, and all sampled edges."""
    cross = total = 0
    for block in blocks:
        src, dst = block.src_ids[block.edge_index]
        cross += int((parts[src] != parts[dst]).sum())
        total += block.num_edges
    return cross, total
