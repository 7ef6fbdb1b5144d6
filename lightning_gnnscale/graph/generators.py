"""Seeded synthetic graphs: a stochastic block model and Graph500 R-MAT.

Both are vectorised torch (loops run over R-MAT recursion levels, and over fixed-size chunks of
edges and features) and return a :class:`~.node_targets.NodeDataset`: an undirected :class:`Graph` by default, with labels and splits, so they stand in for
real datasets in tests and benches. Chunks bound the temporaries without changing a single
draw: a graph is the same whatever :data:`~.csc.CHUNK` is (tested).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_gnnscale.graph.csc import CHUNK, Graph, csc_from_edges
from lightning_gnnscale.graph.node_targets import NodeDataset, NodeTargets


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def normal_(out: Tensor, gen: torch.Generator) -> Tensor:
    """Fill contiguous ``out`` with N(0, 1) draws in chunks of :data:`CHUNK` elements, the same
    numbers as one ``torch.randn`` of its shape (CPU draws in blocks of 16: every chunk but the
    last is a multiple of 16, and the last has at least 16 elements; tested), so the noise
    of a large feature matrix is drawn where it is stored, with no temporary of its size."""
    flat, start, step = out.view(-1), 0, max(16, CHUNK - CHUNK % 16)
    while start < flat.numel():
        end = min(flat.numel(), start + step)
        if flat.numel() - end < 16:
            end = flat.numel()
        flat[start:end].normal_(generator=gen)
        start = end
    return out


def random_split_masks(
    num_nodes: int, train_frac: float, val_frac: float, gen: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded disjoint bool ``[N]`` train / val / test masks; test gets every remaining node."""
    if train_frac < 0 or val_frac < 0 or train_frac + val_frac > 1:
        raise ValueError(
            f"need train_frac, val_frac >= 0 and train_frac + val_frac <= 1, "
            f"got {train_frac} and {val_frac}"
        )
    order = torch.randperm(num_nodes, generator=gen)
    num_train = round(train_frac * num_nodes)
    num_val = round(val_frac * num_nodes)
    masks = []
    for lo, hi in ((0, num_train), (num_train, num_train + num_val), (num_train + num_val, None)):
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[order[lo:hi]] = True
        masks.append(mask)
    return masks[0], masks[1], masks[2]


# Peak memory of generation, measured here (ru_maxrss over the imports' baseline, one thread):
# sbm 400k nodes avg_degree 10 / 64 features peaked at 470 MiB, avg_degree 40 / 8 features at
# 1422 MiB (about 184 bytes per drawn pair); rmat 2^19 nodes 2^22 edges 16 features at 535 MiB
# (about 125 bytes per drawn edge, as at 2^25 edges). Rounded up: an estimate errs high.
# Peak bytes held while generating, fitted above measurements (docs/partitioning.md, "Large
# synthetic graphs"): edges in chunks plus one sort key per stored edge; features drawn in place.
_SBM_BYTES_PER_PAIR = 64
_RMAT_BYTES_PER_EDGE = 56
_BYTES_PER_FEATURE = 6  # float32 features (drawn where they are stored)
_BYTES_PER_NODE = 80  # labels, permutations, indptr, masks, the CSC's row boundaries
_BYTES_PER_CHUNK_ELEMENT = 128  # the temporaries of one chunk of edges


def sbm_peak_bytes(
    num_nodes: int = 10_000, avg_degree: float = 10.0, num_features: int = 64, **_: object
) -> int:
    """About the most memory :func:`sbm` holds at once for these settings (errs high)."""
    pairs = round(num_nodes * avg_degree / 2)
    return (
        _SBM_BYTES_PER_PAIR * pairs
        + _BYTES_PER_FEATURE * num_nodes * num_features
        + _BYTES_PER_NODE * num_nodes
        + _BYTES_PER_CHUNK_ELEMENT * CHUNK
    )


_TYPED_SBM_BYTES_PER_PAIR = 160  # the pairs, their relations, the typed CSC's slot keys


def typed_sbm_peak_bytes(
    num_nodes: int = 10_000,
    num_relations: int = 4,
    avg_degree: float = 5.0,
    num_features: int = 32,
    **_: object,
) -> int:
    """About the most memory :func:`typed_sbm` holds at once for these settings (errs high)."""
    pairs = round(num_nodes * avg_degree / 2) * num_relations
    return (
        _TYPED_SBM_BYTES_PER_PAIR * pairs
        + 2 * _BYTES_PER_FEATURE * num_nodes * num_features
        + (_BYTES_PER_NODE + 16 * num_relations) * num_nodes
        + _BYTES_PER_CHUNK_ELEMENT * CHUNK
    )


def rmat_peak_bytes(
    num_nodes: int = 1 << 20, num_edges: int = 1 << 24, num_features: int = 16, **_: object
) -> int:
    """About the most memory :func:`rmat` holds at once for these settings (errs high)."""
    return (
        _RMAT_BYTES_PER_EDGE * num_edges
        + _BYTES_PER_FEATURE * num_nodes * num_features
        + _BYTES_PER_NODE * num_nodes
        + _BYTES_PER_CHUNK_ELEMENT * CHUNK
    )


def block_edges(
    blocks: Tensor, num_blocks: int, num_pairs: int, homophily: float, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """``num_pairs`` seeded pairs ``(src, dst)`` of a block model over ``blocks`` (``[N]`` in
    ``[0, num_blocks)``): a uniform source, and with probability ``homophily`` a uniform
    destination in the source's block, otherwise a uniform one outside it."""
    num_nodes = blocks.numel()
    # Nodes sorted by block: block c occupies positions [block_start[c], block_start[c] + size[c]).
    by_block = torch.argsort(blocks, stable=True)
    block_size = torch.bincount(blocks, minlength=num_blocks)
    block_start = torch.cumsum(block_size, 0) - block_size
    src = torch.randint(num_nodes, (num_pairs,), generator=gen)
    uniform = torch.rand(num_pairs, generator=gen, dtype=torch.float64)
    dst = torch.empty(num_pairs, dtype=torch.int64)
    for i in range(0, num_pairs, CHUNK):  # chunks of pairs: no temporary grows with the graph
        j = min(num_pairs, i + CHUNK)
        same = torch.rand(j - i, generator=gen) < homophily  # the draws of one full-size call
        src_block = blocks[src[i:j]]
        size, start = block_size[src_block], block_start[src_block]
        # Inside the block: a uniform position in it. Outside: a uniform position among the
        # other N - size positions, skipping over the block's own range.
        inside = start + (uniform[i:j] * size).long()
        outside = (uniform[i:j] * (num_nodes - size)).long()
        outside = torch.where(outside >= start, outside + size, outside)
        dst[i:j] = by_block[torch.where(same, inside, outside)]
    return src, dst


def sbm(
    num_nodes: int = 10_000,
    num_classes: int = 8,
    avg_degree: float = 10.0,
    homophily: float = 0.8,
    num_features: int = 64,
    feature_signal: float = 1.0,
    train_frac: float = 0.3,
    val_frac: float = 0.2,
    seed: int = 0,
) -> NodeDataset:
    """Stochastic block model whose blocks are the class labels.

    Nodes get balanced random classes. ``num_nodes * avg_degree / 2`` undirected edges are
    drawn: a uniform source, and with probability ``homophily`` a uniform destination in the
    source's block, otherwise a uniform destination outside it. Stored undirected (self-loops
    and duplicates dropped), so the mean degree is about ``avg_degree`` and the fraction of
    edges inside a block about ``homophily``.

    Features are ``centroid[y] + N(0, I)`` where each class centroid is a random direction of
    norm ``feature_signal``. At the default 1.0 a single node's features barely separate the
    classes (an MLP does poorly) while averaging over homophilous neighbours does (a GNN
    learns it). Splits are seeded random fractions; test gets the remaining nodes.
    """
    if num_nodes < 2 or num_classes < 1 or num_classes > num_nodes:
        raise ValueError(
            f"sbm needs num_nodes >= 2 and 1 <= num_classes <= num_nodes, "
            f"got num_nodes={num_nodes}, num_classes={num_classes}"
        )
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"sbm homophily must lie in [0, 1], got {homophily}")
    if num_classes == 1 and homophily < 1.0:
        raise ValueError("sbm with one class has no other block: use homophily=1.0")
    if avg_degree < 0 or num_features < 1:
        raise ValueError(
            f"sbm needs avg_degree >= 0 and num_features >= 1, got {avg_degree} and {num_features}"
        )
    gen = _generator(seed)
    y = torch.randperm(num_nodes, generator=gen) % num_classes
    src, dst = block_edges(y, num_classes, round(num_nodes * avg_degree / 2), homophily, gen)

    centroids = torch.randn(num_classes, num_features, generator=gen)
    centroids *= feature_signal / centroids.norm(dim=1, keepdim=True)
    x = normal_(torch.empty(num_nodes, num_features), gen)
    rows = max(1, CHUNK // num_features)
    for i in range(0, num_nodes, rows):
        x[i : i + rows] += centroids[y[i : i + rows]]  # noise + centroid == centroid + noise
    train_mask, val_mask, test_mask = random_split_masks(num_nodes, train_frac, val_frac, gen)

    indptr, indices = csc_from_edges(src, dst, num_nodes, undirected=True)
    params = dict(
        num_nodes=num_nodes,
        num_classes=num_classes,
        avg_degree=avg_degree,
        homophily=homophily,
        num_features=num_features,
        feature_signal=feature_signal,
        train_frac=train_frac,
        val_frac=val_frac,
        seed=seed,
    )
    graph = Graph(
        indptr=indptr, indices=indices, x=x, name="sbm", meta={"generator": "sbm", **params}
    )
    return NodeDataset(graph, NodeTargets(y, train_mask, val_mask, test_mask, num_classes))


def rmat(
    num_nodes: int = 1 << 20,
    num_edges: int = 1 << 24,
    a: float = 0.57,
    b: float = 0.19,
    c: float = 0.19,
    num_features: int = 16,
    num_classes: int = 16,
    undirected: bool = True,
    train_frac: float = 0.3,
    val_frac: float = 0.2,
    seed: int = 0,
) -> NodeDataset:
    """Graph500 R-MAT graph with random features, labels and splits.

    ``num_edges`` is the number of *directed* edges drawn, before symmetrisation,
    self-loop removal and merging of duplicates; the stored graph has up to ``2 * num_edges``
    edges when ``undirected`` (fewer in practice: R-MAT repeats edges between hubs).

    Each edge picks one quadrant per level of the ``ceil(log2 N)``-level recursion with
    probabilities ``(a, b, c, 1 - a - b - c)``, which sets one bit of its source and
    destination ids. When ``N`` is not a power of two, ids ``>= N`` are folded to
    ``id mod N``; those ids have their top bit set, the least likely outcome at every level,
    so folding moves only the sparse tail. As in Graph500, ids are then randomly permuted so
    that the hubs are not all at small ids (id-range partitioners would see them otherwise).

    Features are ``N(0, 1)`` float32 ``[N, num_features]``; labels are uniform in
    ``[0, num_classes)``. Memory: with ``undirected=True`` the CSC build peaks at about 45 bytes
    per edge drawn (:func:`rmat_peak_bytes`; docs/partitioning.md, "Large synthetic graphs").
    """
    d = 1.0 - a - b - c
    if min(a, b, c, d) < 0:
        raise ValueError(f"rmat needs a, b, c >= 0 and a + b + c <= 1, got {a}, {b}, {c}")
    if num_nodes < 1 or num_edges < 0 or num_features < 1 or num_classes < 1:
        raise ValueError("rmat needs num_nodes, num_features, num_classes >= 1 and num_edges >= 0")
    gen = _generator(seed)
    levels = max(1, math.ceil(math.log2(num_nodes)))
    # int32 ids halve the memory traffic of the loop; buffers are reused across levels.
    id_dtype = torch.int32 if levels < 31 else torch.int64
    src = torch.zeros(num_edges, dtype=id_dtype)
    dst = torch.zeros(num_edges, dtype=id_dtype)
    r = torch.empty(num_edges)
    src_bit = torch.empty(num_edges, dtype=torch.bool)
    dst_bit = torch.empty(num_edges, dtype=torch.bool)
    bottom_right = torch.empty(num_edges, dtype=torch.bool)
    # Quadrants by one uniform draw r: [0, a) top-left, [a, a+b) top-right (dst bit),
    # [a+b, a+b+c) bottom-left (src bit), [a+b+c, 1) bottom-right (both bits).
    for level in range(levels):
        bit = 1 << (levels - 1 - level)
        torch.rand(num_edges, generator=gen, out=r)
        torch.ge(r, a + b, out=src_bit)
        torch.ge(r, a, out=dst_bit).logical_xor_(src_bit)  # top-right
        torch.ge(r, a + b + c, out=bottom_right)
        dst_bit.logical_or_(bottom_right)
        src.add_(src_bit, alpha=bit)
        dst.add_(dst_bit, alpha=bit)
    del r, src_bit, dst_bit, bottom_right
    if num_nodes != 1 << levels:
        src.remainder_(num_nodes)
        dst.remainder_(num_nodes)
    relabel = torch.randperm(num_nodes, generator=gen)
    src = relabel[src]
    dst = relabel[dst]
    del relabel
    indptr, indices = csc_from_edges(src, dst, num_nodes, undirected=undirected)
    del src, dst

    x = normal_(torch.empty(num_nodes, num_features), gen)
    y = torch.randint(num_classes, (num_nodes,), generator=gen)
    train_mask, val_mask, test_mask = random_split_masks(num_nodes, train_frac, val_frac, gen)
    params = dict(
        num_nodes=num_nodes,
        num_edges=num_edges,
        a=a,
        b=b,
        c=c,
        num_features=num_features,
        num_classes=num_classes,
        undirected=undirected,
        train_frac=train_frac,
        val_frac=val_frac,
        seed=seed,
    )
    graph = Graph(
        indptr=indptr, indices=indices, x=x, name="rmat", meta={"generator": "rmat", **params}
    )
    return NodeDataset(graph, NodeTargets(y, train_mask, val_mask, test_mask, num_classes))


def typed_sbm(
    num_nodes: int = 10_000,
    num_classes: int = 4,
    num_relations: int = 4,
    num_node_types: int = 2,
    avg_degree: float = 5.0,
    homophily: float = 0.9,
    num_features: int = 32,
    feature_signal: float = 0.5,
    typed: bool = True,
    train_frac: float = 0.3,
    val_frac: float = 0.2,
    seed: int = 0,
    featureless_node_types: int = 0,
) -> NodeDataset:
    """A typed stochastic block model: every relation a block model of its own over the same
    nodes, the label one relation's blocks (docs/datasets.md, "typed_sbm").

    Relation ``rel_0``'s blocks are the classes; each other relation ``rel_r`` has its own
    balanced random blocks, independent of the classes. Each relation draws ``num_nodes *
    avg_degree / 2`` undirected pairs as :func:`sbm` does (``homophily`` inside its blocks),
    so a node has about ``avg_degree`` neighbours per relation. Features are ``centroid[y] +
    N(0, I)`` with centroids of norm ``feature_signal``; node types (``type_t``) are uniform
    and independent of the classes, so neither types nor features alone solve the task.

    A relational model averages ``rel_0`` apart and sees its homophily; a type-blind one
    averages every relation together, where a neighbour shares the class with probability
    about ``(homophily + (R - 1) / C) / R``. ``num_relations`` and ``homophily`` set how much
    the types matter. ``typed=False`` gives the same draws with the types erased (the pairs
    several relations join merged into one edge). The last ``featureless_node_types`` node
    types have no features: their rows are zero and ``meta["featureless_node_types"]`` names
    them (``data.featureless=learned`` learns them).
    """
    if not 0 <= featureless_node_types <= num_node_types:
        raise ValueError(
            f"typed_sbm needs 0 <= featureless_node_types <= num_node_types ({num_node_types}), "
            f"got {featureless_node_types}"
        )
    if num_relations < 1 or num_node_types < 1:
        raise ValueError(
            f"typed_sbm needs num_relations >= 1 and num_node_types >= 1, got "
            f"{num_relations} and {num_node_types}"
        )
    if num_nodes < 2 or not 2 <= num_classes <= num_nodes:
        raise ValueError(
            f"typed_sbm needs num_nodes >= 2 and 2 <= num_classes <= num_nodes, got "
            f"num_nodes={num_nodes}, num_classes={num_classes}"
        )
    if not 0.0 <= homophily <= 1.0 or avg_degree < 0 or num_features < 1:
        raise ValueError(
            "typed_sbm needs homophily in [0, 1], avg_degree >= 0 and num_features >= 1, got "
            f"{homophily}, {avg_degree} and {num_features}"
        )
    gen = _generator(seed)
    y = torch.randperm(num_nodes, generator=gen) % num_classes
    num_pairs = round(num_nodes * avg_degree / 2)
    sources, destinations, kinds = [], [], []
    for relation in range(num_relations):  # bounded by the relations, not the graph
        blocks = y if relation == 0 else torch.randperm(num_nodes, generator=gen) % num_classes
        src, dst = block_edges(blocks, num_classes, num_pairs, homophily, gen)
        sources.append(src)
        destinations.append(dst)
        kinds.append(torch.full((num_pairs,), relation, dtype=torch.int64))
    centroids = torch.randn(num_classes, num_features, generator=gen)
    centroids *= feature_signal / centroids.norm(dim=1, keepdim=True)
    x = normal_(torch.empty(num_nodes, num_features), gen) + centroids[y]
    node_type = torch.randint(num_node_types, (num_nodes,), generator=gen)
    featureless = list(range(num_node_types - featureless_node_types, num_node_types))
    x[torch.isin(node_type, torch.tensor(featureless, dtype=torch.int64))] = 0.0
    train_mask, val_mask, test_mask = random_split_masks(num_nodes, train_frac, val_frac, gen)
    params = dict(
        num_nodes=num_nodes,
        num_classes=num_classes,
        num_relations=num_relations,
        num_node_types=num_node_types,
        avg_degree=avg_degree,
        homophily=homophily,
        num_features=num_features,
        feature_signal=feature_signal,
        typed=typed,
        train_frac=train_frac,
        val_frac=val_frac,
        seed=seed,
    )
    if featureless_node_types:
        params["featureless_node_types"] = [f"type_{t}" for t in featureless]
    graph = Graph.from_edge_index(
        torch.stack([torch.cat(sources), torch.cat(destinations)]),
        num_nodes,
        undirected=True,
        edge_type=torch.cat(kinds),
        x=x,
        name="typed_sbm",
        meta={"generator": "typed_sbm", **params},
        relations=tuple(f"rel_{r}" for r in range(num_relations)),
        node_type=node_type,
        node_types=tuple(f"type_{t}" for t in range(num_node_types)),
    )
    if not typed:
        graph = graph.without_types()
    return NodeDataset(graph, NodeTargets(y, train_mask, val_mask, test_mask, num_classes))
