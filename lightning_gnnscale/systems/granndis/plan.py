"""One-hop graphs and their halo-exchange plans (spec §4.2; docs/systems/granndis.md).

A *layout* places the vertices of a graph ``G_s`` (the whole graph for FB_base, a server graph
for FLX / FLX-EAS / CoB) on ranks. Each rank then holds one static one-hop graph: its owned
rows, the halo rows (in-neighbours of owned vertices owned elsewhere in the layout) and every
edge of ``G_s`` into an owned vertex. Before every layer the owners send the halo rows with one
all-to-all (the same plan every layer). One-hop graph masking is a per-layer :class:`Block`
whose edges from masked sources are dropped: a vertex first reached at hop ``d`` feeds only
layers ``j`` with ``d <= K - j``, so the static structure computes what a shrinking per-layer
computation graph would (the mean of SAGE then runs over the unmasked neighbours, spec's
``unmasked`` normaliser).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ...graph.block import Block
from ...graph.csc import Graph
from .expand import in_edges

GCN_DEGREES = ("global", "layout")


@dataclass(frozen=True)
class OneHopPlan:
    """One rank's one-hop graph in one layout.

    Local rows are ``[owned | halo]``. Owned rows put the loss rows (level-0 targets) first,
    then the other owned vertices, each group in ascending global id; halo rows are grouped by
    owning rank (rank order), ascending within a group, which is the order the owners send
    them in.

    Attributes:
        owned: int64 ``[n_owned]`` global ids of the owned rows.
        halo: int64 ``[n_halo]`` global ids of the halo rows.
        level: int64 ``[n_owned + n_halo]`` hop at which the extraction reached each row.
        send_index: int64 local owned rows to send, grouped by destination rank.
        send_splits, recv_splits: rows sent to / received from every rank (world size).
        blocks: one :class:`Block` per layer over the local rows (``src_ids`` global ids):
            destinations are the owned rows (the loss rows only in the last layer), edges from
            sources masked at that layer are dropped.
        num_loss: loss rows (a prefix of ``owned``).
    """

    owned: Tensor
    halo: Tensor
    level: Tensor
    send_index: Tensor
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]
    blocks: tuple[Block, ...]
    num_loss: int

    @property
    def rows(self) -> Tensor:
        """Global ids of all local rows ``[n_owned + n_halo]``."""
        return torch.cat([self.owned, self.halo])

    def to(self, device: torch.device | str) -> OneHopPlan:
        return OneHopPlan(
            self.owned.to(device),
            self.halo.to(device),
            self.level.to(device),
            self.send_index.to(device),
            self.send_splits,
            self.recv_splits,
            tuple(b.to(device) for b in self.blocks),
            self.num_loss,
        )


def keep_mask(level: Tensor, stage_layers: int, layer: int, masking: bool = True) -> Tensor:
    """Rows whose value is meaningful at the input of ``layer`` (spec §4.2.1):
    ``level <= K - layer`` with ``K = stage_layers``; all rows without masking. bool
    ``[len(level)]``."""
    if not masking:
        return torch.ones_like(level, dtype=torch.bool)
    return level <= stage_layers - layer


def induced_edges(graph: Graph, vertices: Tensor) -> tuple[Tensor, Tensor]:
    """Edges of ``graph`` with both ends in ``vertices`` (int64 ascending), as positions into
    ``vertices``: ``(src, dst)`` ``[E_s]``."""
    position = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    position[vertices] = torch.arange(vertices.numel())
    src, dst = in_edges(graph, vertices)  # dst: positions into vertices
    src = position[src]
    keep = src >= 0
    return src[keep], dst[keep]


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
    gcn_degree: str = "global",
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
        gcn_degree: ``global`` (in-degree in ``graph``: exact full-graph GCN) or ``layout``
            (in-degree in the induced subgraph: renormalised on a sampled graph).
        masking: apply the per-layer masks.
        final: the layout runs the model's last layer, which then computes the loss rows
            only (``False`` for FLX's preload stage with ``k < L``: every owned row goes on).

    Returns:
        ``{rank: plan}`` for every rank of ``ranks``.
    """
    if gcn_degree not in GCN_DEGREES:
        raise ValueError(f"unknown gcn_degree {gcn_degree!r}; valid: {list(GCN_DEGREES)}")
    n = vertices.numel()
    if not (level.numel() == owner.numel() == is_target.numel() == n):
        raise ValueError("level, owner and is_target must have one entry per vertex")
    ranks = list(ranks)
    if n and not bool(torch.isin(owner, torch.tensor(ranks)).all()):
        raise ValueError(f"owner holds ranks outside {ranks}")
    src, dst = induced_edges(graph, vertices)
    if gcn_degree == "global":
        degree = graph.in_degree()[vertices]
    else:
        degree = torch.bincount(dst, minlength=n)
    # per rank: owned rows (loss rows first) and halo rows (by owner, then id)
    owned, halo, local = {}, {}, {}
    for r in ranks:
        mine = (owner == r).nonzero().flatten()
        target = is_target[mine]
        owned[r] = torch.cat([mine[target], mine[~target]])
        into = owner[dst] == r
        outside = src[into][owner[src[into]] != r]
        key = torch.unique(owner[outside] * n + outside)  # sorted by (owner, id)
        halo[r] = key % n if n else key
        table = torch.full((n,), -1, dtype=torch.int64)
        table[owned[r]] = torch.arange(owned[r].numel())
        table[halo[r]] = owned[r].numel() + torch.arange(halo[r].numel())
        local[r] = table
    plans = {}
    for r in ranks:
        send_rows, send_splits = [], [0] * world_size
        recv_splits = [0] * world_size
        for q in ranks:
            if q == r:
                continue
            rows = halo[q][owner[halo[q]] == r]
            send_rows.append(local[r][rows])
            send_splits[q] = rows.numel()
            recv_splits[q] = int((owner[halo[r]] == q).sum())
        into = owner[dst] == r
        edge_src, edge_dst = local[r][src[into]], local[r][dst[into]]
        order = torch.argsort(edge_dst * max(n, 1) + edge_src)
        edge_src, edge_dst = edge_src[order], edge_dst[order]
        rows = torch.cat([owned[r], halo[r]])
        row_level = level[rows]
        num_loss = int(is_target[owned[r]].sum())
        blocks = []
        for j in range(num_layers):
            keep = keep_mask(row_level, num_layers, j, masking)[edge_src]
            num_dst = owned[r].numel()
            if final and j == num_layers - 1:
                keep &= edge_dst < num_loss
                num_dst = num_loss
            edge_index = torch.stack([edge_src[keep], edge_dst[keep]])
            blocks.append(Block(vertices[rows], num_dst, edge_index, degree[rows]))
        plans[r] = OneHopPlan(
            owned=vertices[owned[r]],
            halo=vertices[halo[r]],
            level=row_level,
            send_index=torch.cat([torch.empty(0, dtype=torch.int64), *send_rows]),
            send_splits=tuple(send_splits),
            recv_splits=tuple(recv_splits),
            blocks=tuple(blocks),
            num_loss=num_loss,
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
        return len(self.preload.blocks) if self.preload is not None else 0

    def layer_input(self, layer: int, h: Tensor) -> tuple[OneHopPlan, Tensor]:
        """The plan of ``layer`` and the owned rows it exchanges (reshaped before the first
        layer of ``final`` when a preload stage ran)."""
        if layer < self.preload_layers:
            return self.preload, h
        if self.preload is not None and layer == self.preload_layers:
            return self.final, h.index_select(0, self.reshape)
        return self.final, h

    def to(self, device: torch.device | str) -> StepPlan:
        return StepPlan(
            self.final.to(device),
            None if self.preload is None else self.preload.to(device),
            None if self.reshape is None else self.reshape.to(device),
        )
