"""One-hop graphs and their halo-exchange plans (spec §4.2; docs/systems/granndis.md).

A *layout* places the vertices of a graph ``G_s`` (the whole graph for FB_base, a server graph
for FLX / FLX-EAS / CoB) on ranks. Each rank then holds one static one-hop graph: its owned
rows, the halo rows (in-neighbours of owned vertices owned elsewhere in the layout) and every
edge of ``G_s`` into an owned vertex. Before every layer the owners send the halo rows with one
all-to-all (the same plan every layer). One-hop graph masking keeps that one structure and the
rows' hop levels; each layer's :class:`Block` (edges from masked sources dropped) is derived
when the step runs: a vertex first reached at hop ``d`` feeds only layers ``j`` with
``d <= K - j``, so the static structure computes what a shrinking per-layer computation graph
would (the mean of SAGE then runs over the unmasked neighbours, spec's ``unmasked``
normaliser). What a plan holds is therefore flat in the number of layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ...graph.block import Block
from ...graph.csc import Graph
from .expand import in_edge_ids


@dataclass(frozen=True)
class OneHopPlan:
    """One rank's one-hop graph in one layout: one static structure, and the per-layer masking
    as the rows' hop levels (a layer's :class:`Block` is derived on use by :meth:`block`, so
    what a plan holds does not grow with the number of layers).

    Local rows are ``[owned | halo]``. Owned rows put the loss rows (level-0 targets) first,
    then the other owned vertices, each group in ascending global id; halo rows are grouped by
    owning rank (rank order), ascending within a group, which is the order the owners send
    them in.

    Attributes:
        owned: int64 ``[n_owned]`` global ids of the owned rows (from a partition directory,
            which keeps no ids of them: the local rows ``[0, n_owned)``).
        halo: int64 ``[n_halo]`` global ids of the halo rows (from a partition directory: the
            local rows ``[n_owned, n_owned + n_halo)``).
        level: int64 ``[n_owned + n_halo]`` hop at which the extraction reached each row.
        send_index: int64 local owned rows to send, grouped by destination rank.
        send_splits, recv_splits: rows sent to / received from every rank (world size).
        edge_src, edge_dst: int64 ``[E]`` every edge of the layout into an owned row, as local
            rows, sorted by (dst, src).
        degree: int64 ``[n_owned + n_halo]`` in-degree of every row in the whole graph (GCN).
        num_layers: layers ``K`` run on this plan.
        num_loss: loss rows (a prefix of ``owned``).
        masking: whether layer ``j`` drops edges from rows with ``level > K - j``.
        final: the plan runs the model's last layer, which computes the loss rows only.
        edge_type: int64 ``[E]`` a typed graph's relation of every edge (edges sorted by
            (dst, relation, src)); ``None`` for a homogeneous graph.
    """

    owned: Tensor
    halo: Tensor
    level: Tensor
    send_index: Tensor
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]
    edge_src: Tensor
    edge_dst: Tensor
    degree: Tensor
    num_layers: int
    num_loss: int
    masking: bool = True
    final: bool = True
    edge_type: Tensor | None = None

    TENSORS = ("owned", "halo", "level", "send_index", "edge_src", "edge_dst", "degree")
    VALUES = ("send_splits", "recv_splits", "num_layers", "num_loss", "masking", "final")

    @property
    def rows(self) -> Tensor:
        """Global ids of all local rows ``[n_owned + n_halo]``."""
        return torch.cat([self.owned, self.halo])

    def block(self, layer: int) -> Block:
        """Layer ``layer``'s :class:`Block` (``0 <= layer < K``): destinations are the owned
        rows (the loss rows only in a final plan's last layer); edges from sources masked at
        that layer are dropped."""
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} outside [0, {self.num_layers})")
        src, dst, kind = self.edge_src, self.edge_dst, self.edge_type
        num_dst = self.owned.numel()
        if self.final and layer == self.num_layers - 1:  # edges sorted by dst: a prefix
            cut = int(torch.searchsorted(dst, torch.tensor(self.num_loss, device=dst.device)))
            src, dst, num_dst = src[:cut], dst[:cut], self.num_loss
            kind = None if kind is None else kind[:cut]
        keep = keep_mask(self.level, self.num_layers, layer, self.masking)[src]
        edge_index = torch.stack([src[keep], dst[keep]])
        kind = None if kind is None else kind[keep]
        return Block(self.rows, num_dst, edge_index, self.degree, kind)

    @property
    def blocks(self) -> tuple[Block, ...]:
        """Every layer's block, built now (input layer first)."""
        return tuple(self.block(j) for j in range(self.num_layers))

    def nbytes(self) -> int:
        """Bytes of the tensors the plan holds."""
        typed = 0 if self.edge_type is None else self.edge_type.nbytes
        return sum(getattr(self, n).nbytes for n in self.TENSORS) + typed

    def state(self) -> dict:
        """Tensors and plain values only (what the artifact cache stores; ``edge_type`` only
        for a typed graph)."""
        state = {n: getattr(self, n) for n in (*self.TENSORS, *self.VALUES)}
        if self.edge_type is not None:
            state["edge_type"] = self.edge_type
        return state

    @classmethod
    def from_state(cls, state: dict) -> OneHopPlan:
        values = dict(state)
        for name in ("send_splits", "recv_splits"):
            values[name] = tuple(values[name])
        return cls(**values)

    def to(self, device: torch.device | str) -> OneHopPlan:
        moved = {n: getattr(self, n).to(device) for n in self.TENSORS}
        kind = None if self.edge_type is None else self.edge_type.to(device)
        return OneHopPlan(**moved, **{n: getattr(self, n) for n in self.VALUES}, edge_type=kind)


def keep_mask(level: Tensor, stage_layers: int, layer: int, masking: bool = True) -> Tensor:
    """Rows whose value is meaningful at the input of ``layer`` (spec §4.2.1):
    ``level <= K - layer`` with ``K = stage_layers``; all rows without masking. bool
    ``[len(level)]``."""
    if not masking:
        return torch.ones_like(level, dtype=torch.bool)
    return level <= stage_layers - layer


def induced_edges(graph: Graph, vertices: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """Edges of ``graph`` with both ends in ``vertices`` (int64 ascending), as positions into
    ``vertices``: ``(src, dst, edge_type)`` ``[E_s]`` (``edge_type``: a typed graph's relation
    of each, else ``None``)."""
    position = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    position[vertices] = torch.arange(vertices.numel())
    eid, dst = in_edge_ids(graph, vertices)  # dst: positions into vertices
    src = position[graph.indices[eid]]
    keep = src >= 0
    kind = None if graph.edge_type is None else graph.edge_type[eid[keep]]
    return src[keep], dst[keep], kind


def build_layout(
    graph: Graph,
    vertices: Tensor,
    level: Tensor,
    owner: Tensor,
    ranks: Sequence[int],
    world_size: int,
    num_layers: int,
    *,
    is_target: Tensor,
    masking: bool = True,
    final: bool = True,
) -> dict[int, OneHopPlan]:
    """The one-hop plans of ``ranks`` for a layout of the subgraph of ``graph`` induced on
    ``vertices``.

    Args:
        vertices: int64 ``[n]`` ascending global ids of the layout's vertices.
        level: int64 ``[n]`` hop level of each vertex (0 everywhere for an unmasked layout).
        owner: int64 ``[n]`` owning rank of each vertex (every value in ``ranks``).
        ranks: the ranks of the layout (a rank without vertices gets an empty plan); all
            halo traffic stays among them.
        world_size: length of the split vectors.
        num_layers: layers run on this layout (``K``).
        is_target: bool ``[n]``: the loss rows (level-0 training targets).
        masking: apply the per-layer masking.
        final: the layout runs the model's last layer, which then computes the loss rows
            only (``False`` for FLX's preload stage with ``k < L``: every owned row goes on).

    Returns:
        ``{rank: plan}`` for every rank of ``ranks``.
    """
    n = vertices.numel()
    if not (level.numel() == owner.numel() == is_target.numel() == n):
        raise ValueError("level, owner and is_target must have one entry per vertex")
    ranks = list(ranks)
    if n and not bool(torch.isin(owner, torch.tensor(ranks)).all()):
        raise ValueError(f"owner holds ranks outside {ranks}")
    src, dst, kind = induced_edges(graph, vertices)
    num_rel = graph.num_relations
    # GCN normalises by whole-graph in-degrees in every mode, as the suite's sampled blocks
    # do (Block.src_deg): what was sampled does not change a vertex's degree
    degree = graph.in_degree()[vertices]
    # per rank: owned rows (loss rows first) and halo rows (by owner, then id)
    owned, halo = {}, {}
    for r in ranks:
        mine = (owner == r).nonzero().flatten()
        target = is_target[mine]
        owned[r] = torch.cat([mine[target], mine[~target]])
        into = owner[dst] == r
        outside = src[into][owner[src[into]] != r]
        key = torch.unique(owner[outside] * n + outside)  # sorted by (owner, id)
        halo[r] = key % n if n else key
    plans = {}
    local = torch.full((n,), -1, dtype=torch.int64)  # one full-size table, reused per rank
    for r in ranks:
        local.fill_(-1)
        local[owned[r]] = torch.arange(owned[r].numel())
        local[halo[r]] = owned[r].numel() + torch.arange(halo[r].numel())
        send_rows, send_splits = [], [0] * world_size
        recv_splits = [0] * world_size
        for q in ranks:
            if q == r:
                continue
            rows = halo[q][owner[halo[q]] == r]
            send_rows.append(local[rows])
            send_splits[q] = rows.numel()
            recv_splits[q] = int((owner[halo[r]] == q).sum())
        into = owner[dst] == r
        edge_src, edge_dst = local[src[into]], local[dst[into]]
        if kind is None:
            order = torch.argsort(edge_dst * max(n, 1) + edge_src)
            edge_type = None
        else:  # a destination's edges by (relation, source), as the graph's CSC segments
            edge_type = kind[into]
            order = torch.argsort((edge_dst * num_rel + edge_type) * max(n, 1) + edge_src)
            edge_type = edge_type[order]
        edge_src, edge_dst = edge_src[order], edge_dst[order]
        rows = torch.cat([owned[r], halo[r]])
        plans[r] = OneHopPlan(
            owned=vertices[owned[r]],
            halo=vertices[halo[r]],
            level=level[rows],
            send_index=torch.cat([torch.empty(0, dtype=torch.int64), *send_rows]),
            send_splits=tuple(send_splits),
            recv_splits=tuple(recv_splits),
            edge_src=edge_src,
            edge_dst=edge_dst,
            degree=degree[rows],
            num_layers=num_layers,
            num_loss=int(is_target[owned[r]].sum()),
            masking=masking,
            final=final,
            edge_type=edge_type,
        )
    return plans


@dataclass(frozen=True)
class StepPlan:
    """One rank's plans of one training step.

    ``final`` runs the model's last layers; its loss rows are the step's targets. With FLX's
    partial preloading (``k < L``), ``preload`` runs the first ``k`` layers on the server
    graph, then ``reshape`` picks from its owned rows those of ``final``'s owned vertices, in
    ``final``'s order: a local gather, no communication (spec §4.3).
    """

    final: OneHopPlan
    preload: OneHopPlan | None = None
    reshape: Tensor | None = None

    @property
    def blocks(self) -> tuple[Block, ...]:
        """Every layer's block, input layer first."""
        first = self.preload.blocks if self.preload is not None else ()
        return (*first, *self.final.blocks)

    @property
    def input_ids(self) -> Tensor:
        """Global ids of the owned rows layer 0 reads ``[n]``."""
        return (self.preload if self.preload is not None else self.final).owned

    @property
    def preload_layers(self) -> int:
        return self.preload.num_layers if self.preload is not None else 0

    def layer_input(self, layer: int, h: Tensor) -> tuple[OneHopPlan, Tensor]:
        """The plan of ``layer`` and the owned rows it exchanges (reshaped before the first
        layer of ``final`` when a preload stage ran)."""
        if layer < self.preload_layers:
            return self.preload, h
        if self.preload is not None and layer == self.preload_layers:
            return self.final, h.index_select(0, self.reshape)
        return self.final, h

    def nbytes(self) -> int:
        """Bytes of the tensors the step's plans hold."""
        first = 0 if self.preload is None else self.preload.nbytes() + self.reshape.nbytes
        return first + self.final.nbytes()

    def state(self) -> dict:
        """Tensors and plain values only (what the artifact cache stores)."""
        return {
            "final": self.final.state(),
            "preload": None if self.preload is None else self.preload.state(),
            "reshape": self.reshape,
        }

    @classmethod
    def from_state(cls, state: dict) -> StepPlan:
        preload = state["preload"]
        return cls(
            OneHopPlan.from_state(state["final"]),
            None if preload is None else OneHopPlan.from_state(preload),
            state["reshape"],
        )

    def to(self, device: torch.device | str) -> StepPlan:
        return StepPlan(
            self.final.to(device),
            None if self.preload is None else self.preload.to(device),
            None if self.reshape is None else self.reshape.to(device),
        )
