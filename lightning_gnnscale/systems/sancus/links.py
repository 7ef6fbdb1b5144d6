"""Link prediction on SANCUS's row blocks (docs/systems/sancus.md#link-prediction).

Message passing runs over the training edges only (``Â`` of ``task.training_structure``; the
test stage's over training + validation edges). A step's pairs are scored from the full-graph
outputs: each positive training pair belongs to the rank that owns its source row, which
draws its negatives (the task's ``step_rows``, keyed by the pair's position in the step's
global batch, so the split over ranks draws the same negatives as one process) and reads the
output rows of the pairs' other endpoints from their owners (:class:`EndpointRows`: each
distinct remote row once, never every node's output).

On a typed graph a pair is a triple: the rank also holds its triples' relations, which the
negatives keep, and its filter reads the training triples from its transposed blocks
(docs/systems/sancus.md#typed-link-prediction).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ...comm import Comm, OwnerRoute, exchange_rows
from ...graph.csc import csc_from_edges, typed_csc_from_edges
from ...tasks.link.split import LinkSplit
from ...tasks.link_prediction import LinkTargets
from .layout import RowBlocks

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class LinkPart:
    """What rank ``i`` holds for link prediction beside its training row block.

    Attributes:
        test_layout: ``Â_i*`` over training + validation edges (the test stage's messages).
        full_layout: ``() -> RowBlocks``: ``Â_i*`` over every edge (predictions), built or
            mapped when first asked for.
        pairs: ``{split: (pos [2, m], index [m])}``: the pairs of each split whose source row
            this rank owns (original ids) and their positions in the split's positives.
        new2old: int64 ``[N]``: the original id of every row (which rank owns a node).
        num_train_pairs: the training pairs of the whole graph (a step's seeds are positions
            among them).
        relations: a typed graph's ``{split: int64 [m]}``, the relation of each of
            ``pairs``' triples (``None``: homogeneous).
        message_relations: a typed graph's relations messages pass over (the row blocks'
            stacked relations: the graph's, then a directed split's inverses).
        num_pair_relations: ``R``, the relations of the positives (the graph's, without
            the inverses); ``0`` when homogeneous.
    """

    test_layout: RowBlocks
    full_layout: Callable[[], RowBlocks]
    pairs: dict[str, tuple[Tensor, Tensor]]
    new2old: Tensor
    num_train_pairs: int
    relations: dict[str, Tensor] | None = None
    message_relations: tuple[str, ...] = ()
    num_pair_relations: int = 0


def owned_pairs(split: LinkSplit, owner: Tensor, rank: int) -> dict[str, tuple[Tensor, Tensor]]:
    """``{split: (pos, index)}``: the pairs whose source ``owner`` (int64 ``[N]`` rank of
    every original id) gives to ``rank``, and their positions in the split's positives."""
    out = {}
    for name in SPLITS:
        pos = split.positives(name)
        index = (owner[pos[0]] == rank).nonzero().flatten()
        out[name] = (pos[:, index], index)
    return out


def owned_relations(
    split: LinkSplit, pairs: dict[str, tuple[Tensor, Tensor]]
) -> dict[str, Tensor] | None:
    """A typed split's ``{split: int64 [m]}``: the relation of each of :func:`owned_pairs`'
    triples (``None``: homogeneous)."""
    if not split.is_typed:
        return None
    return {name: split.positive_relations(name)[index] for name, (_, index) in pairs.items()}


class RankLinks:
    """A rank's view of link prediction: who owns a node, its own rows, its pairs and the
    task's targets restricted to them (:meth:`targets`, what ``task.step_rows`` reads).

    Args:
        part: the rank's :class:`LinkPart`.
        layout: the rank's training row blocks (their offsets say who owns which row).
        embedding_dim, seed: the task's embedding width and the run's seed.
        filter_negatives: build the lookup of the training edges leaving this rank's nodes
            (``task.filter_negatives``: every negative keeps its source, which this rank owns).
    """

    def __init__(
        self,
        part: LinkPart,
        layout: RowBlocks,
        embedding_dim: int,
        seed: int,
        filter_negatives: bool,
    ):
        self.part, self.layout = part, layout
        n = part.new2old.numel()
        self.num_nodes = n
        self.old2new = torch.empty(n, dtype=torch.int64)
        self.old2new[part.new2old] = torch.arange(n)
        self.lo = int(layout.offsets[layout.rank])
        train, val, test = (part.pairs[name][0] for name in SPLITS)
        if part.relations is None:
            structure = self._own_edges() if filter_negatives else self._no_edges()
            typed = {}
        else:  # a typed split: the triples keep their relations, the lookup its edge types
            structure = self._own_typed_edges() if filter_negatives else self._no_typed_edges()
            rel = part.relations
            typed = dict(
                train_rel=rel["train"],
                val_rel=rel["val"],
                test_rel=rel["test"],
                train_edge_type=structure[2],
                test_edge_type=structure[2],
                relations=part.message_relations,
                num_relations=part.num_pair_relations,
            )
        split = LinkSplit(
            train_pos=train,
            val_pos=val,
            test_pos=test,
            edge_split=torch.zeros(0, dtype=torch.int8),
            train_indptr=structure[0],
            train_indices=structure[1],
            test_indptr=structure[0],
            test_indices=structure[1],
            undirected=part.relations is None,
            **typed,
        )
        self.targets = LinkTargets(split, n, embedding_dim, seed)
        self.train_index = part.pairs["train"][1]

    def _no_edges(self) -> tuple[Tensor, Tensor]:
        return torch.zeros(self.num_nodes + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)

    def _own_edges(self) -> tuple[Tensor, Tensor]:
        """The CSC (original ids) of the training edges whose source this rank owns: ``Â``'s
        row block holds every edge into its rows, and ``Â`` is symmetric (self loops left out:
        a negative equal to its source is redrawn anyway)."""
        layout, new2old = self.layout, self.part.new2old
        src, dst = [], []
        for j, block in enumerate(layout.blocks):
            crow, col = block.crow_indices(), block.col_indices()
            rows = torch.repeat_interleave(torch.arange(crow.numel() - 1), crow.diff())
            src.append(new2old[self.lo + rows])
            dst.append(new2old[int(layout.offsets[j]) + col])
        return csc_from_edges(torch.cat(src), torch.cat(dst), self.num_nodes)

    def _no_typed_edges(self) -> tuple[Tensor, Tensor, Tensor]:
        return (*self._no_edges(), torch.zeros(0, dtype=torch.int64))

    def _own_typed_edges(self) -> tuple[Tensor, Tensor, Tensor]:
        """A typed graph's CSC (original ids, with edge types) of the training edges whose
        source this rank owns: the entries of its transposed row blocks (row ``r * n_i + a``
        of ``(Â_rᵀ)[R_i, R_j]`` holds the edges of relation ``r`` leaving its row ``a``),
        inverse relations included, as the whole training structure holds them."""
        layout, new2old = self.layout, self.part.new2old
        n_i = max(layout.num_rows, 1)
        src, dst, kind = [], [], []
        for j, block in enumerate(layout.transposed):
            crow, col = block.crow_indices(), block.col_indices()
            rows = torch.repeat_interleave(torch.arange(crow.numel() - 1), crow.diff())
            src.append(new2old[self.lo + rows % n_i])
            kind.append(rows // n_i)
            dst.append(new2old[int(layout.offsets[j]) + col])
        return typed_csc_from_edges(
            torch.cat(src),
            torch.cat(dst),
            torch.cat(kind),
            self.num_nodes,
            layout.num_relations,
            remove_self_loops=False,
        )

    def owner(self, ids: Tensor) -> Tensor:
        """int64 owning rank of original ids ``ids``."""
        return torch.bucketize(self.old2new[ids], self.layout.offsets[1:], right=True)

    def local_row(self, ids: Tensor) -> Tensor:
        """Rows in this rank's block of original ids it owns."""
        return self.old2new[ids] - self.lo

    def own_seeds(self, global_seeds: Tensor) -> tuple[Tensor, Tensor]:
        """``(seeds, positions)``: the step's global seeds (training-pair positions) this rank
        scores, as rows of its own training pairs, and their positions in the step."""
        index = self.train_index
        if index.numel() == 0:
            empty = torch.zeros(0, dtype=torch.int64)
            return empty, empty
        at = torch.searchsorted(index, global_seeds).clamp_(max=index.numel() - 1)
        mine = index[at] == global_seeds
        return at[mine], mine.nonzero().flatten()


@dataclass
class EndpointRows:
    """The output rows ``[n, d]`` of a step's endpoint nodes ``nodes`` (sorted original ids),
    the net's last block in a link-prediction batch.

    The rows this rank owns are read in place; the others are requested from their owners
    when the batch is built (each distinct id once, ``structure`` bytes) and exchanged in the
    forward by :func:`~...comm.exchange_rows` (``activation``; their gradients go back in the
    backward, ``activation_grad``): bounded by the step's endpoints.

    Attributes:
        own_rows: local rows of the endpoints this rank owns.
        send_index: local rows this rank sends, grouped by the requesting rank.
        send_splits, recv_splits: rows sent to / received from each rank.
        inverse: ``[n]``: row ``p`` of the result is row ``inverse[p]`` of
            ``cat([own rows, received rows])``.
    """

    own_rows: Tensor
    send_index: Tensor
    send_splits: list[int]
    recv_splits: list[int]
    inverse: Tensor

    @classmethod
    def build(cls, comm: Comm, nodes: Tensor, links: RankLinks) -> EndpointRows:
        """Route the endpoints ``nodes`` (original ids) to their owners. Collective: every
        rank calls it once per step, also with no endpoints."""
        owners = links.owner(nodes)
        own = owners == links.layout.rank
        own_pos, remote_pos = own.nonzero().flatten(), (~own).nonzero().flatten()
        route = OwnerRoute.build(comm, nodes[remote_pos], owners[remote_pos], category="structure")
        served_owner = links.owner(route.served)
        if not bool((served_owner == links.layout.rank).all()):
            raise RuntimeError("a rank was asked for output rows of nodes it does not own")
        combined = torch.cat([own_pos, remote_pos[route.order]])
        inverse = torch.empty_like(combined)
        inverse[combined] = torch.arange(combined.numel())
        return cls(
            links.local_row(nodes[own_pos]),
            links.local_row(route.served),
            route.recv_splits,
            route.send_splits,
            inverse,
        )

    def gather(self, out: Tensor, comm: Comm) -> Tensor:
        """``[n, d]`` endpoint rows of this rank's output rows ``out [n_i, d]``
        (differentiable; collective)."""
        received = exchange_rows(out, self.send_index, self.send_splits, self.recv_splits, comm)
        return torch.cat([out.index_select(0, self.own_rows), received]).index_select(
            0, self.inverse
        )

    def to(self, device) -> EndpointRows:
        return replace(
            self,
            own_rows=self.own_rows.to(device),
            send_index=self.send_index.to(device),
            inverse=self.inverse.to(device),
        )
