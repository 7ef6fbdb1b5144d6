"""Full-neighbourhood inference, layer by layer over node chunks: in one process
(:func:`layerwise_inference`) and split across ranks (:func:`full_logits`, :func:`node_rows`,
:func:`replicated_eval_statistics` over a replicated graph; :func:`owned_rows` over the rows a rank
owns). Rows equal the one-process rows (tested in float64)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..comm import Comm, OwnerRoute
from ..contract import PREDICT_OUTPUTS
from ..graph.book import RangeBook
from ..graph.csc import Graph
from ..graph.csc_rows import CSCRows
from ..graph.node_targets import NodeTargets
from ..graph.sampler import BlockBuilder, build_block_sorted, sample_edge_ids
from ..tasks.base import NodeTask, row_statistics, split_statistics
from .gnn import BlockGNN, SubgraphModel


@torch.no_grad()
def layer_rows(
    net: BlockGNN,
    i: int,
    builder: BlockBuilder,
    indptr: Tensor,
    indices: Tensor,
    h: Tensor,
    start: int,
    stop: int,
    chunk_size: int,
    edge_type: Tensor | None = None,
) -> Tensor:
    """Layer ``i``'s full-neighbourhood output rows of nodes ``start..stop-1``, in chunks.

    ``h``: the previous layer's rows of every node ``[N, d]``; returns ``[stop - start, out]``.
    A node's row depends only on its own and its in-neighbours' rows, so any split of the node
    range gives the same rows. ``edge_type``: a typed graph's relation per edge of ``indices``
    (the blocks carry them).
    """
    outs = []
    for lo in range(start, stop, chunk_size) or [start]:  # an empty range: one empty chunk
        dst = torch.arange(lo, min(lo + chunk_size, stop))
        eids, dst_pos = sample_edge_ids(indptr, dst, -1, 0)
        types = None if edge_type is None else edge_type.index_select(0, eids)
        block = builder(dst, indices.index_select(0, eids), dst_pos, types)
        block = block.to(h.device)  # sampled on the CPU, run where h is
        outs.append(net.layer_output(i, block, h[block.src_ids]))
    return torch.cat(outs)


def inference_builder(indptr: Tensor, degree: Tensor | None = None) -> BlockBuilder:
    """The full-neighbourhood block builder of layer-wise inference (GCN degrees: ``degree``,
    default the in-degrees of ``indptr``)."""
    num_nodes = indptr.numel() - 1
    return BlockBuilder(num_nodes, indptr[1:] - indptr[:-1] if degree is None else degree)


@torch.no_grad()
def layerwise_inference(
    net: BlockGNN,
    indptr: Tensor,
    indices: Tensor,
    x: Tensor,
    chunk_size: int = 65536,
    degree: Tensor | None = None,
    layers: int | None = None,
    edge_type: Tensor | None = None,
) -> Tensor:
    """Full-neighbourhood logits of every node, one layer at a time over node chunks.

    Memory is ``O(N * hidden)`` instead of the ``O(fanout^L)`` blow-up of per-node sampling.
    ``degree``: the in-degree GCN normalises by (``Block.src_deg``), default the in-degree in
    ``indptr``; a subgraph that lacks some in-edges (a partition) passes the whole graph's.
    ``layers``: run only the first ``layers`` layers (the last one's input: node embeddings).
    ``edge_type``: a typed graph's relation per edge. Returns ``[N, out]``.
    """
    num_nodes = indptr.numel() - 1
    builder = inference_builder(indptr, degree)
    h = x
    for i in range(net.num_layers if layers is None else layers):
        h = layer_rows(
            net, i, builder, indptr, indices, h, 0, num_nodes, chunk_size, edge_type=edge_type
        )
    return h


def node_range(num_nodes: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, stop)``: rank ``rank``'s contiguous share of ``num_nodes`` node ids (sizes
    differ by at most one, as ``torch.tensor_split``)."""
    base, extra = divmod(num_nodes, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


@torch.no_grad()
def node_rows(
    graph: Graph,
    net: torch.nn.Module,
    node_ids: torch.Tensor | None,
    output: str,
    chunk_size: int,
    comm: Comm | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, rows)``: this rank's share (its :func:`node_range`) of ``node_ids`` (every node
    if ``None``), with their ``logits`` or ``embeddings`` (the last layer's input, i.e. after
    the previous layers and their ReLU) from full-neighbourhood inference split across ranks."""
    if output not in PREDICT_OUTPUTS:
        raise ValueError(f"output={output!r} is unknown; valid: {list(PREDICT_OUTPUTS)}")
    if not isinstance(net, BlockGNN):
        raise TypeError(f"predictions need a BlockGNN net, got {type(net).__name__}")
    world_size = comm.world_size if comm is not None else 1
    start, stop = node_range(graph.num_nodes, comm.rank if comm else 0, world_size)
    layers = net.num_layers - (output == "embeddings")
    if layers == 0:
        rows = graph.x[start:stop]
    else:
        rows = full_logits(graph, net, chunk_size, comm, gather=False, num_layers=layers)
    ids = torch.arange(start, stop) if node_ids is None else node_ids.cpu()
    if node_ids is not None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= graph.num_nodes):
            raise ValueError(f"node ids must be in [0, {graph.num_nodes})")
        ids = ids[(ids >= start) & (ids < stop)]
    return ids, rows[(ids - start).to(rows.device)]


@torch.no_grad()
def full_logits(
    graph: Graph,
    net: torch.nn.Module,
    chunk_size: int,
    comm: Comm | None = None,
    *,
    gather: bool = True,
    num_layers: int | None = None,
) -> torch.Tensor:
    """Full-neighbourhood logits ``[N, C]`` of every node (or, with ``gather=False``, of this
    rank's :func:`node_range` only: ``[stop - start, C]``).

    With a distributed ``comm`` the layer-wise inference is split across ranks: each rank
    computes every layer for its node range only, and each hidden layer's rows are all-gathered
    through the metered ``comm`` (``activation``). Without one (or for a user model, which runs
    on the whole graph) every rank computes everything. Rows equal the one-process rows
    (tested in float64). ``num_layers``: stop after that many layers (default: all).
    """
    device = next(net.parameters()).device
    rank, world_size = (comm.rank, comm.world_size) if comm is not None else (0, 1)
    start, stop = node_range(graph.num_nodes, rank, world_size)
    if isinstance(net, SubgraphModel):
        out = net.model(graph.x.to(device), graph.edge_index().to(device))
        return out if gather else out[start:stop]
    assert isinstance(net, BlockGNN)
    layers = net.num_layers if num_layers is None else num_layers
    if world_size == 1:
        x = graph.x.to(device)
        out = layerwise_inference(
            net,
            graph.indptr,
            graph.indices,
            x,
            chunk_size,
            layers=layers,
            edge_type=graph.edge_type,
        )
        return out if gather else out[start:stop]
    builder = inference_builder(graph.indptr)
    h = graph.x.to(device)
    for i in range(layers):
        rows = layer_rows(
            net,
            i,
            builder,
            graph.indptr,
            graph.indices,
            h,
            start,
            stop,
            chunk_size,
            edge_type=graph.edge_type,
        )
        last = i == layers - 1
        h = rows if last and not gather else comm.all_gather_varlen(rows, category="activation")[0]
    return h


def replicated_eval_statistics(
    task: NodeTask,
    graph: Graph,
    targets: NodeTargets,
    net: torch.nn.Module,
    splits: tuple[str, ...],
    rank: int,
    world_size: int,
    chunk_size: int,
    comm: Comm | None = None,
) -> torch.Tensor:
    """``[len(splits), k]`` float64 task statistics over this rank's share of each split.

    For systems whose ranks hold the whole graph (and ``targets``, the task's rows of its
    nodes); the caller sums the statistics over ranks.

    - With a distributed ``comm`` (rank and world size must be its own): the inference is split
      across ranks (:func:`full_logits`; the hidden layers' rows are all-gathered as
      ``activation``) and each rank scores the nodes of its own :func:`node_range`.
    - Without one: each rank runs the whole inference and scores every ``world_size``-th node.

    Either way the sums over ranks are the one-process statistics.
    """
    if comm is not None and comm.world_size > 1:
        if (comm.rank, comm.world_size) != (rank, world_size):
            raise ValueError(
                f"rank {rank} / world size {world_size} differ from the comm's "
                f"{comm.rank} / {comm.world_size}"
            )
        start, stop = node_range(graph.num_nodes, rank, world_size)
        out = full_logits(graph, net, chunk_size, comm, gather=False)
        return split_statistics(task, out, targets.rows(slice(start, stop)), splits)
    out = full_logits(graph, net, chunk_size)
    rows = {split: targets.split(split).nonzero().flatten()[rank::world_size] for split in splits}
    return row_statistics(task, out, targets.target, rows, splits)


def owned_range_rows(
    net: torch.nn.Module,
    comm: Comm,
    book: RangeBook,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    x: torch.Tensor,
    layers: int,
    chunk_size: int,
    edge_type: torch.Tensor | None = None,
    num_relations: int = 1,
) -> torch.Tensor:
    """:func:`owned_rows` for a rank whose own vertices are the contiguous range ``book``
    gives it, from the whole CSC (``indptr``, ``indices``, a topology every rank holds; a typed
    graph's relations ``edge_type``) and its own input rows ``x`` (``[n_own, F]``): what a rank
    that loaded its part of a partition directory evaluates and predicts with, no rank holding
    another's rows. Collective."""
    first, stop = int(book.node_offsets[comm.rank]), int(book.node_offsets[comm.rank + 1])
    whole = CSCRows.whole(indptr, indices)
    own = CSCRows(
        indptr[first : stop + 1],
        indices,
        whole.degree,
        torch.arange(first, stop),
        edge_type,
        num_relations,
    )
    return owned_rows(net, comm, book.nid2part, own, x, layers, chunk_size)


@torch.no_grad()
def owned_rows(
    net: torch.nn.Module,
    comm: Comm,
    owner: Callable[[torch.Tensor], torch.Tensor],
    topology: CSCRows,
    x: torch.Tensor,
    layers: int,
    chunk_size: int,
) -> torch.Tensor:
    """Full-neighbourhood output rows ``[n_own, d]`` of the first ``layers`` layers for this
    rank's own vertices ``topology.ids`` (sorted; ``owner`` maps ids to ranks), from their CSC
    rows (all the topology it needs; a typed graph's with their relations) and their input rows ``x`` (``[n_own, F]``, in
    ``topology.ids`` order).

    Before each layer the rows of the in-neighbours owned elsewhere come from their owners in
    one exchange (``feature`` before layer 0, ``activation`` after; the route is built once,
    ``structure``); each layer runs over ``chunk_size`` vertices at a time. A row depends only
    on its own and its in-neighbours' rows and the segment order of its in-edges, so rows equal
    the whole-graph inference's (to the rounding of matrix products over other row sets).
    Collective."""
    if not isinstance(net, BlockGNN):
        raise TypeError(f"inference over owned rows needs a BlockGNN net, got {type(net).__name__}")
    own_ids = topology.ids
    num_own = own_ids.numel()
    neighbours = topology.indices[topology.indptr[0] : topology.indptr[-1]]
    halo = torch.unique(neighbours[owner(neighbours) != comm.rank])
    route = OwnerRoute.build(comm, halo, owner(halo), category="structure")
    served_rows = topology.rows(route.served)
    device = next(net.parameters()).device
    h = x.to(device)
    for i in range(layers):
        served = h.index_select(0, served_rows.to(device)).cpu()
        category = "feature" if i == 0 else "activation"
        table = torch.cat([h, route.reply(comm, served, category=category).to(device)])
        outs = []
        for lo in range(0, num_own, chunk_size) or [0]:
            dst = own_ids[lo : lo + chunk_size]
            if topology.edge_type is None:
                src, dst_pos = topology.sample(dst, -1, 0)
                types = None
            else:  # every in-edge, in segment order, with its relation
                full = (-1,) * topology.num_relations
                src, dst_pos, types = topology.sample_typed(dst, full, 0)
            block = build_block_sorted(dst, src, dst_pos, topology.degree, types)
            ids = block.src_ids
            own = owner(ids) == comm.rank
            rows = num_own + torch.searchsorted(halo, ids)
            rows[own] = topology.rows(ids[own])
            outs.append(net.layer_output(i, block.to(device), table[rows.to(device)]))
        h = torch.cat(outs)
    return h
