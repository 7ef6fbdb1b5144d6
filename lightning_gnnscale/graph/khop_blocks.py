"""ByteGNN's GNN-aware partitioner: K-hop neighbourhood blocks around labelled vertices,
assigned greedily to parts (spec §3.2.4; decisions in docs/systems/bytegnn.md).

Direction: the suite's graphs are CSC over in-edges and sampling a seed reads its
in-neighbours, so every "hop" here follows in-edges: the K-hop neighbourhood of ``c`` is the
set of vertices with a directed path of at most K edges *into* ``c``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.partition_config import BLOCK_BFS, CENTER_ORDERS

SPLITS = ("train", "val", "test")


FREE_PIECES_PER_PART = 16


def _in_edges(graph: Graph, nodes: Tensor) -> tuple[Tensor, Tensor]:
    """Sources of the in-edges of ``nodes`` (CSC segments concatenated) and, per edge, the
    position in ``nodes`` of its destination; both int64 ``[sum of in-degrees]``."""
    starts = graph.indptr[nodes]
    counts = graph.indptr[nodes + 1] - starts
    slot = torch.repeat_interleave(torch.arange(nodes.numel()), counts)
    first = torch.cumsum(counts, 0) - counts
    position = torch.arange(int(counts.sum())) - first[slot] + starts[slot]
    return graph.indices[position], slot


def center_order(splits: Tensor, order: str, seed: int) -> Tensor:
    """Labelled vertex ids (train ∪ val ∪ test of ``splits``, bool ``[N, 3]``) in priority
    order π: a seeded permutation (``random``) or ascending id (``gid``). int64 ``[L]``."""
    if order not in CENTER_ORDERS:
        raise ValueError(f"unknown bytegnn order {order!r}; valid: {list(CENTER_ORDERS)}")
    centers = splits.any(1).nonzero().flatten()
    if order == "gid":
        return centers
    gen = torch.Generator().manual_seed(seed)
    return centers[torch.randperm(centers.numel(), generator=gen)]


def khop_owner(graph: Graph, centers: Tensor, hops: int) -> Tensor:
    """Level-synchronous multi-source BFS over in-edges; int64 ``[N]`` owner per vertex.

    ``centers[i]`` owns itself with id ``i`` (its π-rank). At hop h every unowned in-neighbour
    of a vertex owned at hop h-1 takes the smallest owner id offered to it: the nearest center
    wins, ties go to the smallest π-rank. Vertices farther than ``hops`` from every center
    keep ``-1``. Centers never change owner, so each block holds exactly one center.
    """
    num_nodes = graph.num_nodes
    owner = torch.full((num_nodes,), -1, dtype=torch.int64)
    owner[centers] = torch.arange(centers.numel())
    frontier = centers
    no_owner = torch.iinfo(torch.int64).max
    for _ in range(hops):
        src, slot = _in_edges(graph, frontier)
        unowned = owner[src] == -1
        src, offered = src[unowned], owner[frontier][slot[unowned]]
        if src.numel() == 0:
            break
        best = torch.full((num_nodes,), no_owner, dtype=torch.int64)
        best.scatter_reduce_(0, src, offered, reduce="amin")
        frontier = torch.unique(src)
        owner[frontier] = best[frontier]
    return owner


def first_center_owner(graph: Graph, centers: Tensor, hops: int) -> Tensor:
    """The ``sequential`` reading of block construction; int64 ``[N]`` owner per vertex.

    One BFS per center in π order, each passing through vertices earlier centers claimed, so
    a vertex goes to the smallest π-rank among the centers within ``hops`` in-hops of it, near
    or far; centers keep their own id, unreached vertices ``-1``. Computed as ``hops`` rounds
    of min-propagation along edges. Unlike :func:`khop_owner`, a block may be disconnected.
    """
    num_nodes = graph.num_nodes
    no_owner = torch.iinfo(torch.int64).max
    reach = torch.full((num_nodes,), no_owner, dtype=torch.int64)
    reach[centers] = torch.arange(centers.numel())
    src, dst = graph.edge_index()
    for _ in range(hops):  # reach[v]: smallest rank with a path v -> ... -> center so far
        reach = reach.scatter_reduce(0, src, reach[dst], reduce="amin")
    owner = torch.where(reach == no_owner, -1, reach)
    owner[centers] = torch.arange(centers.numel())
    return owner


def connected_components(graph: Graph, nodes_mask: Tensor) -> Tensor:
    """Weakly connected components of the subgraph induced by ``nodes_mask`` (bool ``[N]``).

    int64 ``[N]``: the smallest vertex id of each vertex's component (``-1`` outside the
    mask). Vectorised hooking with pointer jumping: each round hooks every root to the
    smallest root across an edge, then shortcuts every vertex to its root; O(log N) rounds.
    """
    src, dst = graph.edge_index()
    keep = nodes_mask[src] & nodes_mask[dst] & (src != dst)
    src, dst = src[keep], dst[keep]
    parent = torch.arange(graph.num_nodes)
    while True:
        root_src, root_dst = parent[src], parent[dst]
        differ = root_src != root_dst
        if not differ.any():
            break
        low = torch.minimum(root_src[differ], root_dst[differ])
        high = torch.maximum(root_src[differ], root_dst[differ])
        parent.scatter_reduce_(0, high, low, reduce="amin")  # roots only point lower: no cycle
        while True:
            jumped = parent[parent]
            if torch.equal(jumped, parent):
                break
            parent = jumped
    return torch.where(nodes_mask, parent, -1)


def neighbourhood_blocks(
    graph: Graph,
    centers: Tensor,
    hops: int,
    block_bfs: str = "level_sync",
    max_free_block: int | None = None,
) -> tuple[Tensor, int]:
    """Block id per vertex (int64 ``[N]``) and the number of labelled blocks ``L``.

    Blocks ``0..L-1`` are the K-hop blocks of ``centers`` in π order (``block_bfs``:
    ``level_sync``, :func:`khop_owner`, or ``sequential``, :func:`first_center_owner`); the
    vertices no center reaches form one label-free block per connected component of the
    subgraph they induce, numbered ``L, L+1, ...`` by smallest vertex id. A component larger
    than ``max_free_block`` is cut into pieces of at most that many vertices, in vertex-id
    order (sampling never reaches these vertices, so only the vertex balance depends on them,
    and one giant component would otherwise fill a part on its own).
    """
    if block_bfs not in BLOCK_BFS:
        raise ValueError(f"unknown bytegnn block_bfs {block_bfs!r}; valid: {list(BLOCK_BFS)}")
    if max_free_block is not None and max_free_block < 1:
        raise ValueError(f"max_free_block must be None or >= 1, got {max_free_block}")
    build = khop_owner if block_bfs == "level_sync" else first_center_owner
    owner = build(graph, centers, hops)
    free = owner < 0
    if free.any():
        component = connected_components(graph, free)
        _, rank = torch.unique(component[free], return_inverse=True)  # free ids ascend
        if max_free_block is not None:
            order = torch.argsort(rank, stable=True)  # by component, then by vertex id
            sorted_rank = rank[order]
            start = torch.searchsorted(sorted_rank, sorted_rank, side="left")
            piece = torch.empty_like(rank)
            piece[order] = (torch.arange(rank.numel()) - start) // max_free_block
            _, rank = torch.unique(rank * rank.numel() + piece, return_inverse=True)
        owner[free] = centers.numel() + rank
    return owner, centers.numel()


def block_cross_edges(graph: Graph, block_of: Tensor) -> Tensor:
    """int64 ``[2, M]``: one column per unordered vertex pair {u, v} adjacent in either
    direction whose endpoints lie in different blocks, as the pair of blocks."""
    src, dst = graph.edge_index()
    keep = src != dst
    low, high = torch.minimum(src[keep], dst[keep]), torch.maximum(src[keep], dst[keep])
    num_nodes = max(graph.num_nodes, 1)
    pairs = torch.unique(low * num_nodes + high)
    blocks = torch.stack([block_of[pairs // num_nodes], block_of[pairs % num_nodes]])
    return blocks[:, blocks[0] != blocks[1]]


def assign_blocks(
    sizes: Tensor,
    split_counts: Tensor,
    cross_edges: Tensor,
    num_parts: int,
    *,
    weights: tuple[float, float, float] | None = None,
    smoothing: float = 1.0,
    imbalance: float | None = 0.05,
) -> Tensor:
    """ByteGNN's Algorithm 2 with the spec's fixes; part per block, int64 ``[B]``.

    Args:
        sizes: int64 ``[B]`` vertices per block.
        split_counts: int64 ``[B, 3]`` train / val / test vertices per block.
        cross_edges: int64 ``[2, M]`` one column per edge between two different blocks.
        weights: (alpha, beta, gamma), or None for the split sizes' shares.
        smoothing: lambda in ``CE_j = (cross_j + lambda) / (|P_j| + lambda)``; 0 is the
            paper's ``cross_j / |P_j|`` with 0/0 read as 0.
        imbalance: epsilon of a hard cap (ours): a block may only go to a part where each of
            its splits stays within ``ceil((1 + epsilon) |V_t| / P)``; None: no cap (the
            paper's rule alone, which balances only the weighted sum of the splits). A block
            with one labelled vertex always fits somewhere; one with several (never built by
            :func:`neighbourhood_blocks`) that fits nowhere is placed ignoring the cap.

    Blocks go labelled first, then larger first, then by id. Each goes to the part with the
    highest ``CE_j * max(BS_j, 0)`` where ``BS_j = 1 - sum_t w_t |P_j ∩ t| / (|V_t| / P)``
    (splits with no vertex drop out) for a labelled block and ``BS_j = 1 - |P_j| / (N / P)``
    for a label-free one (ours: it carries no split to balance, so it balances the vertex
    counts); when every score is 0, to the highest ``BS_j``; ties go
    to the part with fewer vertices, then the lower part id. The loop runs once per block;
    each step touches only that block's cross edges (cost O(B * P + M)).
    """
    num_blocks = sizes.numel()
    sizes_np = sizes.numpy()
    splits_np = split_counts.numpy().astype(np.float64)
    labelled = splits_np.sum(1) > 0
    order = np.lexsort((np.arange(num_blocks), -sizes_np, ~labelled))

    # Block adjacency as CSR with edge multiplicities, both directions.
    a = torch.cat([cross_edges[0], cross_edges[1]])
    b = torch.cat([cross_edges[1], cross_edges[0]])
    keys, counts = torch.unique(a * num_blocks + b, return_counts=True)
    neighbour = (keys % max(num_blocks, 1)).numpy()
    multiplicity = counts.numpy().astype(np.float64)
    ptr = np.zeros(num_blocks + 1, dtype=np.int64)
    np.cumsum(np.bincount((keys // max(num_blocks, 1)).numpy(), minlength=num_blocks), out=ptr[1:])

    totals = splits_np.sum(0)
    if weights is None:
        weights = totals / totals.sum() if totals.sum() > 0 else np.zeros(3)
    capacity = totals / num_parts
    # the relative nudge keeps a product that rounds just above an integer (1.05 * 100 / 3 =
    # 35.00000000000001) from raising the ceiling by one
    cap = np.inf if imbalance is None else np.ceil((1.0 + imbalance) * capacity * (1 - 1e-12))
    coef = np.divide(
        np.asarray(weights, dtype=np.float64),
        capacity,
        out=np.zeros(3),
        where=capacity > 0,
    )

    vertex_share = max(float(sizes_np.sum()) / num_parts, 1.0)
    part_of = np.full(num_blocks, -1, dtype=np.int64)
    part_size = np.zeros(num_parts, dtype=np.float64)
    part_load = np.zeros((num_parts, 3), dtype=np.float64)
    denominator = part_size + smoothing  # of CE, kept up to date
    every_part = np.ones(num_parts, dtype=bool)
    for block in order.tolist():
        lo, hi = ptr[block], ptr[block + 1]
        their_part = part_of[neighbour[lo:hi]]
        placed = their_part >= 0
        cross = np.bincount(
            their_part[placed], weights=multiplicity[lo:hi][placed], minlength=num_parts
        )
        ce = np.divide(
            cross + smoothing, denominator, out=np.zeros(num_parts), where=denominator > 0
        )
        fits = every_part
        if labelled[block]:
            bs = 1.0 - part_load @ coef  # from the integer loads: equal loads tie exactly
            fits = (part_load + splits_np[block] <= cap).all(1)
            if not fits.any():
                fits = every_part
        else:  # a label-free block (ours): balance vertices, as BS balances the splits
            bs = 1.0 - part_size / vertex_share
        key = np.where(fits, ce * np.maximum(bs, 0.0), -1.0)  # scores are >= 0
        if key.max() <= 0:
            key = np.where(fits, bs, -np.inf)
        # first of the best keys with the fewest vertices: fewer vertices, then lower id
        part = int(np.where(key == key.max(), part_size, np.inf).argmin())
        part_of[block] = part
        part_size[part] += sizes_np[block]
        denominator[part] += sizes_np[block]
        part_load[part] += splits_np[block]
    return torch.from_numpy(part_of)


def bytegnn_partition(
    graph: Graph,
    splits: Tensor,
    num_parts: int,
    *,
    seed: int = 0,
    hops: int = 2,
    weights: tuple[float, float, float] | None = None,
    smoothing: float = 1.0,
    order: str = "random",
    imbalance: float | None = 0.05,
    block_bfs: str = "level_sync",
) -> Tensor:
    """Part per vertex, int64 ``[N]``: :func:`neighbourhood_blocks` then :func:`assign_blocks`
    (``splits``: bool ``[N, 3]`` membership in train, val, test: the centers and the balance)."""
    centers = center_order(splits, order, seed)
    # label-free pieces of at most 1/16 of a part's share, so the greedy packing can balance them
    max_free_block = -(-graph.num_nodes // (FREE_PIECES_PER_PART * num_parts)) or None
    block_of, _ = neighbourhood_blocks(graph, centers, hops, block_bfs, max_free_block)
    num_blocks = int(block_of.max()) + 1 if graph.num_nodes else 0
    sizes = torch.bincount(block_of, minlength=num_blocks)
    split_counts = torch.zeros(num_blocks, 3, dtype=torch.int64)
    split_counts.index_add_(0, block_of, splits.to(torch.int64))
    part_of_block = assign_blocks(
        sizes,
        split_counts,
        block_cross_edges(graph, block_of),
        num_parts,
        weights=weights,
        smoothing=smoothing,
        imbalance=imbalance,
    )
    return part_of_block[block_of]


def _khop_pairs(graph: Graph, centers: Tensor, hops: int, chunk: int):
    """Yield ``(center position, vertex, distance)`` int64 triples, chunk by chunk of
    ``centers``: every vertex with an in-path of at most ``hops`` edges into the center,
    once, at its shortest distance."""
    num_nodes = graph.num_nodes
    for start in range(0, centers.numel(), chunk):
        seeds = centers[start : start + chunk]
        position = torch.arange(start, start + seeds.numel())
        frontier_slot, frontier = torch.arange(seeds.numel()), seeds
        visited = frontier_slot * num_nodes + frontier
        yield position, seeds, torch.zeros_like(seeds)
        for hop in range(1, hops + 1):
            src, slot = _in_edges(graph, frontier)
            keys = torch.unique(frontier_slot[slot] * num_nodes + src)
            keys = keys[~torch.isin(keys, visited)]
            if keys.numel() == 0:
                break
            visited = torch.cat([visited, keys])
            frontier_slot, frontier = keys // num_nodes, keys % num_nodes
            yield position[frontier_slot], frontier, torch.full_like(frontier, hop)


def khop_locality(
    graph: Graph, splits: Tensor, parts: Tensor, hops: int, chunk: int = 4096
) -> dict:
    """How much of the labelled vertices' K-hop in-neighbourhoods each part holds itself
    (labelled: in a split of ``splits``, bool ``[N, 3]``: train, val, test).

    For a labelled vertex ``c`` let ``S(c)`` be the vertices within ``hops - 1`` in-hops of
    ``c`` (``c`` included) and ``E(c)`` the in-edges of ``S(c)``: the edges a full
    ``hops``-layer expansion of ``c`` traverses. Keys:

    - ``local_khop_ratio``: sum over labelled ``c`` of the edges of ``E(c)`` whose two
      endpoints both lie in ``c``'s part, over the sum of ``|E(c)|`` (1.0 if that is 0).
    - ``remote_vertices_per_epoch``: sum over training vertices ``c`` of the vertices within
      ``hops`` in-hops of ``c`` owned by another part: what one epoch fetches remotely when
      every training vertex is a seed once with full neighbourhoods (no sampling, no sharing
      between the seeds of a mini-batch, so an upper bound).
    - ``remote_bytes_per_epoch``: that count times ``8 + F * itemsize`` bytes (an int64 id
      request and one feature row per remote vertex).
    """
    if hops < 1:
        raise ValueError(f"hops must be >= 1, got {hops}")
    src, dst = graph.edge_index()
    same_part_in_degree = torch.bincount(dst[parts[src] == parts[dst]], minlength=graph.num_nodes)
    in_degree = graph.in_degree()
    centers = splits.any(1).nonzero().flatten()
    is_train = splits[centers, 0]
    local = total = remote = 0
    for position, vertex, distance in _khop_pairs(graph, centers, hops, chunk):
        center_part = parts[centers[position]]
        inner = distance < hops
        inner_vertex = vertex[inner]
        total += int(in_degree[inner_vertex].sum())
        at_home = parts[inner_vertex] == center_part[inner]
        local += int(same_part_in_degree[inner_vertex[at_home]].sum())
        remote += int((is_train[position] & (parts[vertex] != center_part)).sum())
    row_bytes = 8 + graph.num_features * graph.x.element_size()
    return {
        "khop_hops": hops,
        "local_khop_ratio": 1.0 if total == 0 else local / total,
        "remote_vertices_per_epoch": remote,
        "remote_bytes_per_epoch": remote * row_bytes,
    }
