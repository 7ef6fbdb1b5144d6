"""Node partitioners (random, contiguous, METIS k-way) and a partition quality report.

A partition is an int64 ``[N]`` tensor of part ids in ``[0, num_parts)``. Edges are owned by
their destination's part (DistDGL), so "edges per part" counts in-edges of owned nodes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from lightning_gnnscale.graph.csc import Graph, csc_from_edges

PARTITION_METHODS = ("random", "contiguous", "metis")
_METHOD_OPTIONS = {"random": (), "contiguous": ("permute",), "metis": ("ufactor", "niter")}


def partition(
    graph: Graph,
    method: str,
    num_parts: int,
    *,
    seed: int = 0,
    node_weights: Tensor | None = None,
    edge_weights: Tensor | None = None,
    **options,
) -> Tensor:
    """Assign every node of ``graph`` to one of ``num_parts`` parts; int64 ``[N]``.

    Methods and their ``options``:
        ``random``: uniform part per node, seeded.
        ``contiguous``: node-id range cut into equal chunks; ``permute=True`` shuffles the ids
            first (seeded), SANCUS's public-code baseline.
        ``metis``: METIS k-way min edge cut (pymetis, ``recursive=False``) on the symmetrised
            graph without self-loops. ``ufactor`` (default 30, i.e. 3% imbalance) and
            ``niter`` (default 10). ``node_weights``: one non-negative integer column ``[N]``
            (or ``[N, 1]``) to balance instead of node counts; ``edge_weights``: positive
            integers ``[E]`` per stored edge, summed over both directions of a pair.
    """
    if method not in PARTITION_METHODS:
        raise ValueError(f"unknown partition method {method!r}; valid: {list(PARTITION_METHODS)}")
    unknown = sorted(set(options) - set(_METHOD_OPTIONS[method]))
    if unknown:
        raise ValueError(
            f"partition method {method!r} got unknown options {unknown}; "
            f"valid: {list(_METHOD_OPTIONS[method])}"
        )
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if method != "metis" and (node_weights is not None or edge_weights is not None):
        raise ValueError(
            f"node_weights / edge_weights are only supported by 'metis', not {method!r}"
        )
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
    return _metis(
        graph,
        num_parts,
        seed,
        node_weights,
        edge_weights,
        ufactor=options.get("ufactor", 30),
        niter=options.get("niter", 10),
    )


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
    import pymetis

    num_nodes = graph.num_nodes
    src, dst = graph.edge_index()
    if edge_weights is None:
        xadj, adjncy = csc_from_edges(src, dst, num_nodes, undirected=True)
        eweights = None
    else:
        xadj, adjncy, eweights = _symmetric_weighted(src, dst, edge_weights, num_nodes)
    del src, dst
    vweights = None if node_weights is None else _check_node_weights(node_weights, num_nodes)

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
    """One non-negative integer weight per node, not all zero (pymetis limits, see DESIGN §8)."""
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


def partition_report(graph: Graph, parts: Tensor, num_parts: int | None = None) -> dict:
    """Quality of a partition, as JSON-ready numbers.

    Keys: ``num_parts``; ``edge_cut`` / ``edge_cut_fraction`` (stored directed edges whose
    endpoints lie in different parts); per part ``nodes``, ``edges`` (in-edges of owned
    nodes), ``train_nodes`` and ``halo_nodes`` (distinct 1-hop in-neighbours owned elsewhere);
    ``node_balance`` / ``edge_balance`` / ``train_balance`` (max over mean; 1.0 is perfect);
    ``halo_fraction`` (total halo nodes over N).
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
    src, dst = graph.edge_index()
    src_part, dst_part = parts[src], parts[dst]
    cut = src_part != dst_part
    halo_pairs = torch.unique(dst_part[cut] * num_nodes + src[cut])
    counts = {
        "nodes": torch.bincount(parts, minlength=num_parts),
        "edges": torch.bincount(dst_part, minlength=num_parts),
        "train_nodes": torch.bincount(parts[graph.train_mask], minlength=num_parts),
        "halo_nodes": torch.bincount(halo_pairs // max(num_nodes, 1), minlength=num_parts),
    }
    num_cut = int(cut.sum())
    return {
        "num_parts": num_parts,
        "edge_cut": num_cut,
        "edge_cut_fraction": num_cut / max(graph.num_edges, 1),
        **{f"{name}_per_part": count.tolist() for name, count in counts.items()},
        "node_balance": _balance(counts["nodes"]),
        "edge_balance": _balance(counts["edges"]),
        "train_balance": _balance(counts["train_nodes"]),
        "halo_fraction": int(halo_pairs.numel()) / max(num_nodes, 1),
    }


def _balance(per_part: Tensor) -> float:
    """max / mean of per-part counts; 1.0 when perfectly even (or when all are zero)."""
    total = int(per_part.sum())
    return 1.0 if total == 0 else float(per_part.max()) * per_part.numel() / total
