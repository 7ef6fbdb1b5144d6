"""GraNNDIS's rank part (:class:`GraNNDISPart`, its server's share: the same object in memory
and from a partition directory) and its files (docs/systems/granndis.md#from-a-partition-directory).

A rank's part holds its plans (every step's one-hop graphs over local rows: the ids of the
rows are not kept, only their numbers), the targets of their loss rows, and its share of
full-graph inference (:class:`EvalShare`); the input rows of every rank of a server (its
preloaded set, and its partition's rows for inference) are one shared group per server,
which each rank reads as contiguous slices. Plans keep the row order of the in-memory ones,
so a step computes the same values bit for bit.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ...comm import Topology
from ...graph.book import PartitionBook
from ...graph.csc import Graph
from ...graph.node_targets import NodeTargets
from .callbacks import LayoutSummary
from .evalshare import EvalShare
from .expand import in_edge_ids
from .plan import OneHopPlan, StepPlan

if TYPE_CHECKING:
    from .link import LinkEval, LinkTrain

# a plan's tensors a part stores: everything but the ids of its owned and halo rows
LOCAL_TENSORS = tuple(name for name in OneHopPlan.TENSORS if name not in ("owned", "halo"))


def plan_arrays(plan: OneHopPlan, prefix: str) -> dict[str, Tensor]:
    """``plan``'s tensors but ``owned`` and ``halo``, and its plain values with the numbers of
    owned and halo rows as one int64 array ``values`` ``[2 W + 6]``, named
    ``<prefix><name>``. The ids of the rows are not stored: a rank reads its input rows and
    targets from the part, and everything else addresses rows by local position."""
    arrays = {name: getattr(plan, name) for name in LOCAL_TENSORS}
    if plan.edge_type is not None:  # a typed graph's relation of every edge
        arrays["edge_type"] = plan.edge_type
    arrays["values"] = torch.tensor(
        [*plan.send_splits, *plan.recv_splits, plan.num_layers, plan.num_loss]
        + [int(plan.masking), int(plan.final), plan.owned.numel(), plan.halo.numel()],
        dtype=torch.int64,
    )
    return {prefix + name: tensor for name, tensor in arrays.items()}


def plan_from_arrays(part: dict[str, Tensor], prefix: str, world: int) -> OneHopPlan:
    """The plan :func:`plan_arrays` wrote under ``prefix`` (tensors stay memory-mapped); its
    ``owned`` and ``halo`` are the local row positions ``[0, n_owned)`` and ``[n_owned,
    n_owned + n_halo)`` (the directory keeps no ids of them); ``edge_type`` if written (a
    typed graph's)."""
    values = part[prefix + "values"].tolist()
    splits, rest = values[: 2 * world], values[2 * world :]
    layers, loss, masking, final, n_owned, n_halo = rest
    return OneHopPlan(
        owned=torch.arange(n_owned),
        halo=torch.arange(n_owned, n_owned + n_halo),
        **{name: part[prefix + name] for name in LOCAL_TENSORS},
        send_splits=tuple(splits[:world]),
        recv_splits=tuple(splits[world:]),
        num_layers=layers,
        num_loss=loss,
        masking=bool(masking),
        final=bool(final),
        edge_type=part.get(prefix + "edge_type"),
    )


def step_arrays(step: StepPlan, prefix: str) -> dict[str, Tensor]:
    """A step's plans (``final``, and ``preload`` with ``reshape`` when present)."""
    arrays = plan_arrays(step.final, prefix + "final_")
    if step.preload is not None:
        arrays |= plan_arrays(step.preload, prefix + "preload_")
        arrays[prefix + "reshape"] = step.reshape
    return arrays


def step_from_arrays(part: dict[str, Tensor], prefix: str, world: int) -> StepPlan:
    final = plan_from_arrays(part, prefix + "final_", world)
    if prefix + "reshape" not in part:
        return StepPlan(final)
    preload = plan_from_arrays(part, prefix + "preload_", world)
    return StepPlan(final, preload, part[prefix + "reshape"])


def core_in_edges(
    graph: Graph, book: PartitionBook, rank: int
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(src, pos, edge_type)``: the in-edges of rank ``rank``'s core (its ``node_offsets``
    range), the sources as relabelled ids, ``pos`` the destination's position in the core,
    ``edge_type`` a typed graph's relation of each (else ``None``)."""
    lo, hi = book.node_offsets[rank : rank + 2].tolist()
    eid, pos = in_edge_ids(graph, book.new2old[lo:hi])
    kind = None if graph.edge_type is None else graph.edge_type[eid]
    return book.old2new[graph.indices[eid]], pos, kind


def eval_halos(graph: Graph, book: PartitionBook) -> list[Tensor]:
    """Every rank's inference halo: the relabelled ids, ascending, of the sources of its
    core's in-edges that other ranks own (grouped by owner in rank order)."""
    offsets, halos = book.node_offsets.tolist(), []
    for k in range(book.num_parts):
        src, _, _ = core_in_edges(graph, book, k)
        halos.append(torch.unique(src[(src < offsets[k]) | (src >= offsets[k + 1])]))
    return halos


def eval_share(graph: Graph, book: PartitionBook, halos: list[Tensor], k: int) -> EvalShare:
    """Rank ``k``'s :class:`EvalShare` of ``graph`` (original ids) under ``book``, given every
    rank's halo (:func:`eval_halos`)."""
    offsets, world = book.node_offsets.tolist(), book.num_parts
    lo, hi = offsets[k], offsets[k + 1]
    src, pos, kind = core_in_edges(graph, book, k)
    outside = (src < lo) | (src >= hi)
    local = torch.where(outside, (hi - lo) + torch.searchsorted(halos[k], src), src - lo)
    indptr = torch.zeros(hi - lo + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(pos, minlength=hi - lo), 0, out=indptr[1:])
    send_rows, send_splits, recv_splits = [], [0] * world, [0] * world
    for q in range(world):
        if q == k:
            continue
        wanted = halos[q]  # ascending: rank k's rows are one run
        a, b = torch.searchsorted(wanted, torch.tensor([lo, hi])).tolist()
        send_rows.append(wanted[a:b] - lo)
        send_splits[q] = b - a
        a, b = torch.searchsorted(halos[k], torch.tensor(offsets[q : q + 2])).tolist()
        recv_splits[q] = b - a
    rows = torch.cat([book.new2old[lo:hi], book.new2old[halos[k]]])
    return EvalShare(
        indptr,
        local,
        graph.indptr[rows + 1] - graph.indptr[rows],  # whole-graph in-degrees
        torch.cat([torch.empty(0, dtype=torch.int64), *send_rows]),
        tuple(send_splits),
        tuple(recv_splits),
        kind,
    )


def depth_tag(k: int | None) -> str:
    """The prefix of a preload depth's arrays in a part (``plan``: a mode without ``k``)."""
    return "plan" if k is None else f"k{k}"


@dataclass(frozen=True)
class RankLayout:
    """A rank's steps at one preload depth: its plans and their :class:`LayoutSummary`, per
    step the ``[start, stop)`` rows of its ``input_ids`` in the part's ``x`` and the task's
    targets of its loss rows (``NodeTargets.target`` rows: a step's ``Batch.y``; link
    prediction: none). Link prediction's layouts also hold, per step, the original ids of the
    loss rows (``loss_ids``: the nodes whose output rows this rank computes) and the rank's
    share of the training pairs (``link``, :class:`~.link.LinkTrain`)."""

    plans: list[StepPlan]
    summary: LayoutSummary
    x_ranges: list[tuple[int, int]]
    targets: list[Tensor]
    loss_ids: list[Tensor] | None = None
    link: LinkTrain | None = None


@dataclass(frozen=True)
class GraNNDISPart:
    """One rank's share of its server: what ``part_of`` builds in memory, ``write_parts``
    saves and ``load_part`` reads back (docs/systems/granndis.md).

    Attributes:
        topology: the servers x workers the plans were laid out for.
        layouts: per preload depth (``None``: a mode without ``k``) the rank's steps.
        x: ``[n, F]`` the input rows the ranges address: from a directory its server's
            shared group, memory-mapped; in memory the whole graph's, addressed by ``x_ids``.
        dtype: the run's feature dtype (``x`` is cast slice by slice).
        eval_share: its share of full-graph inference; ``eval_x_range`` its core's input rows
            in ``x``; ``eval_targets`` (``n_core`` rows) the task's rows of that core;
            ``orig_ids`` ``[n_core]`` their ids.
        num_nodes, train_count: the whole graph's nodes and training nodes.
        x_ids: in memory ``[n]`` the rows' ids in ``x`` (gathered when read: a rank holds
            the input rows of the depth it runs only); ``None``: ``x`` is the rows.
        link: link prediction's evaluation share (:class:`~.link.LinkEval`; ``None`` for
            node tasks).
    """

    topology: Topology
    layouts: dict[int | None, RankLayout]
    x: Tensor
    dtype: torch.dtype
    eval_share: EvalShare
    eval_x_range: tuple[int, int]
    eval_targets: NodeTargets
    orig_ids: Tensor
    num_nodes: int
    train_count: int
    x_ids: Tensor | None = None
    link: LinkEval | None = None

    def rows(self, span: tuple[int, int]) -> Tensor:
        """Input rows ``[start, stop)`` in the run's dtype."""
        start, stop = span
        if self.x_ids is None:
            return self.x[start:stop].to(self.dtype)
        return self.x.index_select(0, self.x_ids[start:stop]).to(self.dtype)

    def input_rows(self) -> Tensor:
        """``[n, F]`` every input row the ranges address (what its server's group holds)."""
        return self.x if self.x_ids is None else self.x.index_select(0, self.x_ids)

    def at_depth(self, k: int | None) -> GraNNDISPart:
        """The part with depth ``k``'s layout only (the one its rank runs)."""
        return replace(self, layouts={k: self.layouts[k]})

    def check_relations(self, num_relations: int, where: str, num_pair_relations: int = 0) -> None:
        """A part read from a directory (outside input): with ``num_relations > 0`` (its
        metadata names relations) every plan and inference share (link prediction's stage
        shares and training lookup too) carry one relation in ``[0, R)`` per edge, and link
        prediction's pairs (training, validation, test) one in ``[0, num_pair_relations)``
        each; with ``0`` none carries any. ``ValueError`` naming ``where``."""
        edges = [
            (f"step {i} {name} plan", plan.edge_src.numel(), plan.edge_type, num_relations)
            for layout in self.layouts.values()
            for i, step in enumerate(layout.plans)
            for name, plan in (("final", step.final), ("preload", step.preload))
            if plan is not None
        ]
        share = self.eval_share
        edges.append(("eval plan", share.indices.numel(), share.edge_type, num_relations))
        pair_limit = num_pair_relations if num_relations else 0
        for k, layout in self.layouts.items():
            train = layout.link
            if train is not None:
                what = f"depth {k} training"
                edges.append((f"{what} lookup", train.lookup_indices.numel(),
                              train.lookup_edge_type, num_relations))  # fmt: skip
                edges.append((f"{what} pairs'", train.pairs.shape[1], train.rel, pair_limit))
        if self.link is not None:
            for stage, stage_share in self.link.shares.items():
                edges.append((f"link {stage} share", stage_share.indices.numel(),
                              stage_share.edge_type, num_relations))  # fmt: skip
            relations = self.link.relations or {}
            for split, (pos, _) in self.link.pairs.items():
                edges.append((f"{split} pairs'", pos.shape[1], relations.get(split), pair_limit))
        for what, count, kind, limit in edges:
            if limit == 0:
                if kind is not None:
                    raise ValueError(
                        f"{where}: its {what} holds edge types, but the metadata names no "
                        "relations; partition again"
                    )
                continue
            if kind is None or kind.dtype != torch.int64 or kind.shape != (count,):
                have = None if kind is None else f"{kind.dtype} {list(kind.shape)}"
                raise ValueError(
                    f"{where}: the metadata names {limit} relations, but its {what} "
                    f"edge_type is {have} for {count} edges; partition again"
                )
            if count and (int(kind.min()) < 0 or int(kind.max()) >= limit):
                raise ValueError(
                    f"{where}: its {what} edge_type holds relations outside [0, {limit}); "
                    "partition again"
                )

    def arrays(self, offset: int) -> dict[str, Tensor]:
        """The part's files: every depth's plans (:func:`step_arrays`), ranges of ``x`` and
        targets, then its inference share; the ranges shifted by ``offset`` (where its rows
        start in its server's group)."""

        def span(start: int, stop: int) -> Tensor:
            return torch.tensor([start + offset, stop + offset], dtype=torch.int64)

        arrays: dict[str, Tensor] = {}
        for k, layout in self.layouts.items():
            tag = depth_tag(k)
            arrays[f"{tag}_summary"] = torch.tensor([*astuple(layout.summary), len(layout.plans)])
            steps = zip(layout.plans, layout.x_ranges, layout.targets, strict=True)
            for i, (step, x_range, y) in enumerate(steps):
                prefix = f"{tag}_s{i}_"
                arrays |= step_arrays(step, prefix)
                arrays[prefix + "x_range"] = span(*x_range)
                arrays[prefix + "y"] = y
                if layout.loss_ids is not None:
                    arrays[prefix + "loss_ids"] = layout.loss_ids[i]
            if layout.link is not None:
                arrays |= layout.link.arrays(f"{tag}_link_")
        if self.link is not None:
            arrays |= self.link.arrays()
        arrays |= self.eval_share.arrays()
        arrays["eval_x_range"] = span(*self.eval_x_range)
        arrays |= self.eval_targets.arrays(prefix="eval_")
        arrays["orig_ids"] = self.orig_ids
        return arrays

    @classmethod
    def from_arrays(
        cls,
        part: dict[str, Tensor],
        x: Tensor,
        depths: list[int | None],
        out_dim: int,
        **fields,
    ) -> GraNNDISPart:
        """The part :meth:`arrays` wrote (its ranges address ``x``, its server's group;
        ``out_dim``: the targets' head width, the task's from the directory's metadata);
        ``fields``: ``topology``, ``dtype``, ``num_nodes``, ``train_count``."""
        from .link import LinkEval, LinkTrain

        world = fields["topology"].world_size
        layouts = {}
        for k in depths:
            tag = depth_tag(k)
            *summary, steps = part[f"{tag}_summary"].tolist()
            prefixes = [f"{tag}_s{i}_" for i in range(steps)]
            link = f"{tag}_link_owner" in part
            layouts[k] = RankLayout(
                [step_from_arrays(part, p, world) for p in prefixes],
                LayoutSummary(*summary),
                [tuple(part[p + "x_range"].tolist()) for p in prefixes],
                [part[p + "y"] for p in prefixes],
                [part[p + "loss_ids"] for p in prefixes] if link else None,
                LinkTrain.from_arrays(part, f"{tag}_link_") if link else None,
            )
        if "link_eval_owner" in part:
            fields["link"] = LinkEval.from_arrays(part)
        return cls(
            layouts=layouts,
            x=x,
            eval_share=EvalShare.from_arrays(part),
            eval_x_range=tuple(part["eval_x_range"].tolist()),
            eval_targets=NodeTargets.from_arrays(part, out_dim, prefix="eval_"),
            orig_ids=part["orig_ids"],
            **fields,
        )
