"""Node partitioners (random, contiguous, METIS k-way, balanced METIS, ByteGNN's K-hop blocks)
and a quality report.

A partition is an int64 ``[N]`` tensor of part ids in ``[0, num_parts)``. Edges are owned by
their destination's part (DistDGL), so "edges per part" counts in-edges of owned nodes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from lightning_gnnscale.graph.csc import Graph, csc_from_edges
from lightning_gnnscale.graph.khop_blocks import bytegnn_partition, khop_locality
from lightning_gnnscale.graph.partition_config import (
    BALANCE_SCHEMES,
    bytegnn_partition_options,
    check_partition_options,
    metis_balanced_options,
)


def partition(
    graph: Graph,
    method: str,
    num_parts: int,
    *,
    seed: int = 0,
    splits: Tensor | None = None,
    node_weights: Tensor | None = None,
    edge_weights: Tensor | None = None,
    **options,
) -> Tensor:
    """Assign every node of ``graph`` to one of ``num_parts`` parts; int64 ``[N]``.

    ``splits``: bool ``[N, 3]``, each node's membership in train, val and test (the task's:
    ``NodeTargets.split_matrix``), which ``metis_balanced`` and ``bytegnn`` balance.

    Methods and their ``options``:
        ``random``: uniform part per node, seeded.
        ``contiguous``: node-id range cut into equal chunks; ``permute=True`` shuffles the ids
            first (seeded), SANCUS's public-code baseline.
        ``metis``: METIS k-way min edge cut (pymetis, ``recursive=False``) on the symmetrised
            graph without self-loops. ``ufactor`` (default 30, i.e. 3% imbalance) and
            ``niter`` (default 10). ``node_weights``: one non-negative integer column ``[N]``
            (or ``[N, 1]``) to balance instead of node counts; ``edge_weights``: positive
            integers ``[E]`` per stored edge, summed over both directions of a pair.
        ``metis_balanced``: low edge cut that also balances several per-node columns, which
            pymetis cannot (it honours one; docs/systems/distdgl.md): METIS clusters
            (``overpartition * num_parts`` of them, default 8 per part) are bin-packed
            greedily, then moved / swapped to cut fewer edges (:func:`_metis_balanced`).
            ``balance`` picks the columns (:func:`balance_constraints`: ``"train"`` (default),
            ``"split"`` or ``"none"``), ``balance_edges`` (default True) adds in-degree;
            ``ufactor`` (also the imbalance the refinement may use) / ``niter`` as for ``metis``.
        ``bytegnn``: ByteGNN's GNN-aware partitioner (graph/khop_blocks.py): one block per
            labelled vertex holding the vertices nearest to it within ``hops`` in-hops (default
            2, the number of GNN layers), a block per connected component of the rest, blocks
            placed greedily for cross edges and train / val / test balance. ``weights``
            (alpha, beta, gamma summing to 1; default None: the split sizes' shares),
            ``smoothing`` (lambda >= 0, default 1), ``order`` of the centers (``"random"``,
            seeded, default; or ``"gid"``), ``imbalance`` (default 0.05: no split may exceed
            ``ceil(1.05 * mean)`` in a part; None: the paper's score alone), ``block_bfs``
            (``"level_sync"``, default: nearest center wins; ``"sequential"``: the first
            center in π order within ``hops`` wins).
    """
    check_partition_options(method, options)
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if method != "metis" and (node_weights is not None or edge_weights is not None):
        raise ValueError(
            f"node_weights / edge_weights are only supported by 'metis', not {method!r}"
        )
    if method == "metis_balanced":
        overpartition, balance, balance_edges = metis_balanced_options(**options)
    if method == "bytegnn":
        bytegnn_options = bytegnn_partition_options(**options)
    num_nodes = graph.num_nodes
    if num_parts == 1 or num_nodes == 0:
        return torch.zeros(num_nodes, dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed)
    if method == "random":
        return torch.randint(num_parts, (num_nodes,), generator=gen)
    if method == "contiguous":
        chunk_of_position = torch.arange(num_nodes) * num_parts // max(num_nodes, 1)
        if not options.get("permute", False):
            return chunk_of_position
        parts = torch.empty(num_nodes, dtype=torch.int64)
        parts[torch.randperm(num_nodes, generator=gen)] = chunk_of_position
        return parts
    if method == "bytegnn":
        return bytegnn_partition(
            graph, _splits(graph, splits, method), num_parts, seed=seed, **bytegnn_options
        )
    metis_options = {"ufactor": options.get("ufactor", 30), "niter": options.get("niter", 10)}
    if method == "metis":
        return _metis(graph, num_parts, seed, node_weights, edge_weights, **metis_options)
    constraints = balance_constraints(graph, _splits(graph, splits, method), balance, balance_edges)
    return _metis_balanced(graph, num_parts, seed, constraints, overpartition, **metis_options)


def _splits(graph: Graph, splits: Tensor | None, method: str) -> Tensor:
    """``splits``, checked: bool ``[N, 3]`` (what ``method`` balances)."""
    if splits is None:
        raise ValueError(
            f"partition method {method!r} balances the splits: pass splits= (bool [N, 3], "
            "the task's NodeTargets.split_matrix())"
        )
    if splits.shape != (graph.num_nodes, 3) or splits.dtype != torch.bool:
        raise ValueError(
            f"splits must be bool [N={graph.num_nodes}, 3], got {splits.dtype} "
            f"{tuple(splits.shape)}"
        )
    return splits


def balance_constraints(
    graph: Graph, splits: Tensor, balance: str = "train", balance_edges: bool = True
) -> Tensor:
    """int64 ``[N, ncon]`` per-node columns a balanced partition evens out across parts
    (``splits``: bool ``[N, 3]`` membership in train, val, test).

    ``balance``: ``"train"`` gives [is train, 1]; ``"split"`` gives [is train, is val, is test,
    in no split, 1]; ``"none"`` gives [1]. On a graph with several node types each of these
    columns is split per type (column and type ``t``, for every ``t``: DistDGL's
    ``balance_ntypes``, which balances a typed graph's node types by default). ``balance_edges``
    appends the in-degree (edges are owned by their destination). All-zero columns are
    dropped: they have no share to balance.
    """
    if balance not in BALANCE_SCHEMES:
        raise ValueError(f"unknown balance {balance!r}; valid: {list(BALANCE_SCHEMES)}")
    columns = [torch.ones(graph.num_nodes, dtype=torch.int64)]
    train, val, test = splits.unbind(1)
    if balance == "train":
        columns.insert(0, train)
    elif balance == "split":
        columns[:0] = [train, val, test, ~(train | val | test)]
    if graph.node_type is not None and len(graph.node_types) > 1:
        types = range(len(graph.node_types))  # bounded by the node types
        columns = [column & (graph.node_type == t) for column in columns for t in types]
    if balance_edges:
        columns.append(graph.in_degree())
    constraints = torch.stack([column.to(torch.int64) for column in columns], dim=1)
    return constraints[:, constraints.sum(0) > 0]


def _metis_balanced(
    graph: Graph,
    num_parts: int,
    seed: int,
    constraints: Tensor,
    overpartition: int,
    *,
    ufactor: int,
    niter: int,
) -> Tensor:
    """Balance ``constraints`` ``[N, ncon]`` across parts at a low edge cut (DistDGL's multi-constraint partitioning, plus
    a refinement step of ours).

    1. METIS cuts the graph into ``C = overpartition * num_parts`` clusters (single nodes
       when N <= C), each node weighted by its summed share of every constraint total. So no
       cluster holds much more than ``ncon / C`` of any one constraint (say all of a
       spatially clustered training set): the packing is only as fine as its coarsest cluster.
    2. :func:`_pack_clusters` bin-packs the clusters greedily for balance.
    3. :func:`_refine_clusters` moves and swaps clusters to even out what the packing left
       over ``1 + ufactor / 1000`` times the mean and to win back edge cut: the packing ignores
       edges, which on an SBM doubles the cut of plain METIS.
    """
    num_nodes = graph.num_nodes
    num_clusters = min(overpartition * num_parts, num_nodes)
    if num_clusters == num_nodes:  # tiny graph: one node per cluster (METIS leaves some empty)
        cluster = torch.arange(num_nodes)
    else:
        share_weights = constraints.double() * (num_nodes / constraints.sum(0).double())
        cluster = _metis(
            graph,
            num_clusters,
            seed,
            share_weights.sum(1).round().to(torch.int64),
            None,
            ufactor=ufactor,
            niter=niter,
        )
    cluster_weights = torch.zeros(num_clusters, constraints.shape[1], dtype=torch.int64)
    cluster_weights.index_add_(0, cluster, constraints)
    src, dst = graph.edge_index()
    cluster_edges = torch.bincount(
        cluster[src] * num_clusters + cluster[dst], minlength=num_clusters * num_clusters
    ).reshape(num_clusters, num_clusters)
    cluster_edges = (cluster_edges + cluster_edges.T).fill_diagonal_(0)
    part_of_cluster = _pack_clusters(cluster_weights, cluster_edges, num_parts)
    part_of_cluster = _refine_clusters(
        part_of_cluster, cluster_weights, cluster_edges, num_parts, imbalance=ufactor / 1000
    )
    return part_of_cluster[cluster]


def _pack_clusters(cluster_weights: Tensor, cluster_edges: Tensor, num_parts: int) -> Tensor:
    """Part of each cluster, int64 ``[C]``, from weights ``[C, ncon]`` and edge counts ``[C, C]``.

    Clusters go heaviest first (largest share of any constraint total) into the part that
    minimises the largest resulting load share; ties go to the smallest summed load share
    (ours: on tiny graphs one full constraint ties every part otherwise), then to the part
    with most edges to the cluster, then to the lowest part id.
    """
    totals = cluster_weights.sum(0).double()
    heaviest_share = (cluster_weights.double() / totals).max(1).values
    order = torch.sort(heaviest_share, descending=True, stable=True).indices
    load = torch.zeros(num_parts, cluster_weights.shape[1], dtype=torch.int64)
    part_of = torch.full((cluster_weights.shape[0],), -1, dtype=torch.int64)
    for c in order.tolist():
        share = (load + cluster_weights[c]) / totals  # [P, ncon]
        largest, summed = share.max(1).values, share.sum(1)
        candidate = largest == largest.min()
        candidate &= summed == summed[candidate].min()
        placed = part_of >= 0
        edges_to_part = torch.zeros(num_parts, dtype=torch.int64).index_add_(
            0, part_of[placed], cluster_edges[c, placed]
        )
        best = torch.where(candidate, edges_to_part, -1).argmax()  # first max
        part_of[c] = best
        load[best] += cluster_weights[c]
    return part_of


def _refine_clusters(
    part_of: Tensor,
    cluster_weights: Tensor,
    cluster_edges: Tensor,
    num_parts: int,
    imbalance: float,
) -> Tensor:
    """Moves and swaps of clusters between parts that even out loads, then cut fewer edges.

    A part's overload is the sum over constraints of its load above ``(1 + imbalance)``
    times the mean, as a share of the constraint's total. Each round applies one move (a
    cluster to another part) or swap (two clusters in different parts): while some step
    lowers the total overload, the one of those that keeps the most edges inside parts;
    otherwise the one that keeps the most edges inside parts without raising the overload,
    if it gains any. No part is left without weight. (overload, cut) falls every round, so
    the loop ends. Costs O(C^2 * ncon) memory and time per round: meant for C up to a few
    hundred. Returns a new int64 ``[C]``.
    """
    num_clusters = part_of.numel()
    part_of = part_of.clone()
    load = torch.zeros(num_parts, cluster_weights.shape[1], dtype=torch.int64)
    load.index_add_(0, part_of, cluster_weights)
    totals = cluster_weights.sum(0).double()
    allowed = totals * (1 + imbalance) / num_parts
    weight_change = cluster_weights[None, :] - cluster_weights[:, None]  # [a, b]: w_b - w_a

    def overload(part_load: Tensor) -> Tensor:
        return ((part_load - allowed).clamp_min(0) / totals).sum(-1)

    def change(old: Tensor, new: Tensor) -> tuple[Tensor, Tensor]:
        """Overload change of one part's load going old -> new, and whether new keeps weight."""
        return overload(new) - overload(old), new.sum(-1) > 0

    while True:
        edges_to_part = cluster_edges @ torch.nn.functional.one_hot(part_of, num_parts)  # [C, P]
        own = edges_to_part.gather(1, part_of[:, None])  # [C, 1]
        own_load = load[part_of]  # [C, ncon]
        # move c -> p: p gains w_c, c's part loses it
        target_change, _ = change(load[None], load[None] + cluster_weights[:, None])
        source_change, source_kept = change(own_load, own_load - cluster_weights)
        move_overload = target_change + source_change[:, None]  # [C, P]
        move_valid = source_kept[:, None] & (torch.arange(num_parts) != part_of[:, None])
        move_gain = edges_to_part - own
        # swap a <-> b: each gains its edges to the other's part, less its own part's, less
        # the a-b edges that were cut and stay cut
        a_change, a_kept = change(own_load[:, None], own_load[:, None] + weight_change)
        b_change, b_kept = change(own_load[None], own_load[None] - weight_change)
        swap_overload = a_change + b_change  # [a, b]
        swap_valid = a_kept & b_kept & (part_of[:, None] != part_of[None, :])
        to_other_part = edges_to_part[:, part_of] - own  # [a, b]
        swap_gain = to_other_part + to_other_part.T - 2 * cluster_edges

        overload_change = torch.cat([move_overload.flatten(), swap_overload.flatten()])
        gain = torch.cat([move_gain.flatten(), swap_gain.flatten()])
        valid = torch.cat([move_valid.flatten(), swap_valid.flatten()])
        lowers = valid & (overload_change < -1e-12)  # margin for float rounding
        if not lowers.any():
            lowers = valid & (overload_change <= 1e-12) & (gain > 0)
            if not lowers.any():
                return part_of
        step = int(torch.where(lowers, gain, torch.iinfo(torch.int64).min).argmax())
        if step < num_clusters * num_parts:
            cluster, part = divmod(step, num_parts)
            moves = [(cluster, part)]
        else:
            a, b = divmod(step - num_clusters * num_parts, num_clusters)
            moves = [(a, int(part_of[b])), (b, int(part_of[a]))]
        for cluster, part in moves:
            load[part_of[cluster]] -= cluster_weights[cluster]
            load[part] += cluster_weights[cluster]
            part_of[cluster] = part


def _metis(
    graph: Graph,
    num_parts: int,
    seed: int,
    node_weights: Tensor | None,
    edge_weights: Tensor | None,
    *,
    ufactor: int,
    niter: int,
) -> Tensor:
    """pymetis k-way on the symmetrised, loop-free graph (CSC == CSR when symmetric)."""
    num_nodes = graph.num_nodes
    src, dst = graph.edge_index()
    if edge_weights is None:
        xadj, adjncy = csc_from_edges(src, dst, num_nodes, undirected=True)
        eweights = None
    else:
        xadj, adjncy, eweights = _symmetric_weighted(src, dst, edge_weights, num_nodes)
    del src, dst
    vweights = None if node_weights is None else _check_node_weights(node_weights, num_nodes)

    return metis_kway(
        xadj,
        adjncy,
        num_parts,
        vweights=vweights,
        eweights=eweights,
        seed=seed,
        ufactor=ufactor,
        niter=niter,
    )


def metis_kway(
    xadj: Tensor,
    adjncy: Tensor,
    num_parts: int,
    *,
    vweights: Tensor | None = None,
    eweights: Tensor | None = None,
    seed: int = 0,
    ufactor: int = 30,
    niter: int = 10,
) -> Tensor:
    """pymetis k-way min edge cut (``recursive=False``: pymetis would bisect for <= 8 parts) on
    a symmetric CSR without self-loops; optional integer vertex / edge weights. int64 ``[N]``."""
    import pymetis  # deferred: only METIS partitioning needs it

    idx_dtype = pymetis.zero_copy_dtype()  # METIS's idx_t, so pymetis does not copy
    xadj, adjncy, vweights, eweights = (
        None if t is None else np.ascontiguousarray(t.numpy(), dtype=idx_dtype)
        for t in (xadj, adjncy, vweights, eweights)
    )
    result = pymetis.part_graph(
        num_parts,
        pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy),
        vweights=vweights,
        eweights=eweights,
        recursive=False,
        options=pymetis.Options(seed=seed, ufactor=ufactor, niter=niter),
    )
    return torch.as_tensor(np.asarray(result.vertex_part), dtype=torch.int64)


def _check_node_weights(node_weights: Tensor, num_nodes: int) -> Tensor:
    """One non-negative integer weight per node, not all zero (pymetis limits: docs/testing.md)."""
    if node_weights.dim() == 2 and node_weights.shape[1] != 1:
        raise ValueError(
            f"metis takes one node-weight column, got {node_weights.shape[1]}: pymetis silently "
            "ignores extra balance constraints"
        )
    weights = node_weights.reshape(-1)
    if weights.numel() != num_nodes or weights.is_floating_point() or weights.dtype == torch.bool:
        raise ValueError(
            f"node_weights must be integers of shape [N={num_nodes}] or [N, 1], "
            f"got {node_weights.dtype} {tuple(node_weights.shape)}"
        )
    if num_nodes and int(weights.min()) < 0:
        raise ValueError("node_weights must be non-negative")
    if num_nodes and int(weights.max()) == 0:
        raise ValueError("node_weights are all zero: pymetis would put every node in one part")
    return weights.to(torch.int64)


def _symmetric_weighted(
    src: Tensor, dst: Tensor, edge_weights: Tensor, num_nodes: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Symmetric CSR without self-loops; a pair's weight is the sum over both directions."""
    if (
        edge_weights.shape != src.shape
        or edge_weights.is_floating_point()
        or edge_weights.dtype == torch.bool
    ):
        raise ValueError(
            f"edge_weights must be integers of shape [E={src.numel()}], "
            f"got {edge_weights.dtype} {tuple(edge_weights.shape)}"
        )
    if edge_weights.numel() and int(edge_weights.min()) < 1:
        raise ValueError("edge_weights must be >= 1 (METIS needs positive edge weights)")
    keep = src != dst
    src, dst, weights = src[keep], dst[keep], edge_weights[keep].to(torch.int64)
    key = torch.cat([dst * num_nodes + src, src * num_nodes + dst])
    pairs, slot = torch.unique(key, return_inverse=True)
    summed = torch.zeros(pairs.numel(), dtype=torch.int64).index_add_(0, slot, weights.repeat(2))
    xadj = torch.zeros(num_nodes + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(pairs // num_nodes, minlength=num_nodes), 0, out=xadj[1:])
    return xadj, pairs % num_nodes, summed


def partition_report(
    graph: Graph,
    parts: Tensor,
    num_parts: int | None = None,
    *,
    splits: Tensor,
    hops: int | None = None,
) -> dict:
    """Quality of a partition, as JSON-ready numbers (``splits``: bool ``[N, 3]`` membership
    in train, val, test).

    Keys: ``num_parts``; ``edge_cut`` / ``edge_cut_fraction`` (stored directed edges whose
    endpoints lie in different parts); per part ``nodes``, ``edges`` (in-edges of owned
    nodes), ``train_nodes`` / ``val_nodes`` / ``test_nodes`` and ``halo_nodes`` (distinct 1-hop
    in-neighbours owned elsewhere); ``node_balance`` / ``edge_balance`` / ``train_balance`` /
    ``val_balance`` / ``test_balance`` (max over mean; 1.0 is perfect); ``halo_fraction``
    (total halo nodes over N). With ``hops`` also ``khop_hops``, ``local_khop_ratio``,
    ``remote_vertices_per_epoch`` and ``remote_bytes_per_epoch``
    (:func:`~lightning_gnnscale.graph.khop_blocks.khop_locality`).
    """
    num_nodes = graph.num_nodes
    if parts.shape != (num_nodes,) or parts.dtype != torch.int64:
        raise ValueError(
            f"parts must be int64 [N={num_nodes}], got {parts.dtype} {tuple(parts.shape)}"
        )
    if num_parts is None:
        num_parts = int(parts.max()) + 1 if num_nodes else 1
    if num_nodes and (int(parts.min()) < 0 or int(parts.max()) >= num_parts):
        raise ValueError(f"parts must lie in [0, {num_parts})")
    train, val, test = _splits(graph, splits, "partition_report").unbind(1)
    src, dst = graph.edge_index()
    src_part, dst_part = parts[src], parts[dst]
    cut = src_part != dst_part
    halo_pairs = torch.unique(dst_part[cut] * num_nodes + src[cut])
    counts = {
        "nodes": torch.bincount(parts, minlength=num_parts),
        "edges": torch.bincount(dst_part, minlength=num_parts),
        "train_nodes": torch.bincount(parts[train], minlength=num_parts),
        "val_nodes": torch.bincount(parts[val], minlength=num_parts),
        "test_nodes": torch.bincount(parts[test], minlength=num_parts),
        "halo_nodes": torch.bincount(halo_pairs // max(num_nodes, 1), minlength=num_parts),
    }
    num_cut = int(cut.sum())
    khop = {} if hops is None else khop_locality(graph, splits, parts, hops)
    return {
        "num_parts": num_parts,
        "edge_cut": num_cut,
        "edge_cut_fraction": num_cut / max(graph.num_edges, 1),
        **{f"{name}_per_part": count.tolist() for name, count in counts.items()},
        "node_balance": _balance(counts["nodes"]),
        "edge_balance": _balance(counts["edges"]),
        "train_balance": _balance(counts["train_nodes"]),
        "val_balance": _balance(counts["val_nodes"]),
        "test_balance": _balance(counts["test_nodes"]),
        "halo_fraction": int(halo_pairs.numel()) / max(num_nodes, 1),
        **khop,
        **_type_report(graph, parts, num_parts),
    }


def _type_report(graph: Graph, parts: Tensor, num_parts: int) -> dict:
    """A graph with node types: ``type_nodes_per_part`` (``[T][P]``) and ``type_balance``
    (the worst type's max over mean); nothing for one type."""
    if graph.node_type is None or len(graph.node_types) < 2:
        return {}
    num_types = len(graph.node_types)
    counts = torch.bincount(
        graph.node_type * num_parts + parts, minlength=num_types * num_parts
    ).view(num_types, num_parts)
    return {
        "type_nodes_per_part": counts.tolist(),
        "type_balance": max(_balance(row) for row in counts),
    }


def _balance(per_part: Tensor) -> float:
    """max / mean of per-part counts; 1.0 when perfectly even (or when all are zero)."""
    total = int(per_part.sum())
    return 1.0 if total == 0 else float(per_part.max()) * per_part.numel() / total
