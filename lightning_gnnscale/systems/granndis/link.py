"""Link prediction on GraNNDIS's layouts (docs/systems/granndis.md, "Link prediction").

Training runs the layouts over the *training* structure only (the task's
``training_structure``), with every node a loss row of the rank that owns it at level 0 (any
node may be an endpoint: the negatives are drawn over the whole graph). A full-graph step
scores every training pair once: each pair on the rank that computes its source's output
(:class:`LinkTrain`), its other endpoints' output rows pulled from their owners through one
:class:`~...comm.OwnerRoute` (ids, ``structure``) and one differentiable
:func:`~...comm.exchange_rows` (rows, ``activation``; gradients ``activation_grad``):
:class:`EndpointRows`, bounded by the endpoint rows the step needs. Evaluation embeds each
rank's own nodes over a stage's structure (:class:`LinkEval`) and scores its share of the
evaluation edges with :func:`~...kit.link_partitioned.owned_link_statistics`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...comm import Comm, OwnerRoute, exchange_rows
from ...tasks.link.split import LinkSplit
from ...tasks.link_prediction import LinkTargets
from .evalshare import EvalShare

STAGES = ("train", "test")  # the message-passing structures evaluation embeds over
EMPTY_PAIRS = torch.empty(2, 0, dtype=torch.int64)


def out_edges_of(
    indptr: Tensor, indices: Tensor, sources: Tensor, edge_type: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The CSC ``(indptr, indices, edge_type)`` over the same nodes keeping only the edges
    whose source is in ``sources``: what answers "is ``s -> d`` an edge" (a typed graph's:
    "of relation ``r``") for every ``s`` in ``sources`` (filtered negatives), in the CSC's
    order (so a typed CSC's segments stay sorted by relation, then source)."""
    num_nodes = indptr.numel() - 1
    member = torch.zeros(num_nodes, dtype=torch.bool)
    member[sources] = True
    keep = member[indices]
    dst = torch.repeat_interleave(torch.arange(num_nodes), indptr[1:] - indptr[:-1])
    out = torch.zeros(num_nodes + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst[keep], minlength=num_nodes), 0, out=out[1:])
    return out, indices[keep], None if edge_type is None else edge_type[keep]


@dataclass(frozen=True)
class LinkTrain:
    """A rank's share of link prediction's training at one preload depth.

    Attributes:
        owner: int64 ``[N]`` the rank whose last layer computes each node's output row.
        pairs: int64 ``[2, m]`` the training positives this rank scores (those whose source
            it owns), original ids; ``index`` ``[m]`` their positions among the split's
            training pairs (which the epoch order shuffles).
        num_pairs: the split's training pairs (every rank's together).
        lookup_indptr, lookup_indices: the training edges out of this rank's sources (CSC
            over all nodes): what ``task.filter_negatives`` redraws against.
        rel: a typed graph's int64 ``[m]`` relation of each of ``pairs`` (a step's negatives
            keep it); ``lookup_edge_type`` the relation of each lookup edge (inverse edges:
            ``r + R``). ``None``: homogeneous.
    """

    owner: Tensor
    pairs: Tensor
    index: Tensor
    num_pairs: int
    lookup_indptr: Tensor
    lookup_indices: Tensor
    rel: Tensor | None = None
    lookup_edge_type: Tensor | None = None

    @classmethod
    def build(cls, owner: Tensor, rank: int, targets: LinkTargets) -> LinkTrain:
        split = targets.split
        mine = (owner[split.train_pos[0]] == rank).nonzero().flatten()
        pairs = split.train_pos[:, mine]
        indptr, indices, kind = out_edges_of(
            *split.structure("train"), torch.unique(pairs[0]), split.structure_edge_type("train")
        )
        rel = targets.relations_of("train", mine)
        return cls(owner, pairs, mine, split.train_pos.shape[1], indptr, indices, rel, kind)

    def targets(
        self,
        num_nodes: int,
        out_dim: int,
        seed: int,
        relations: tuple[str, ...] = (),
        num_relations: int = 1,
    ) -> LinkTargets:
        """A :class:`LinkTargets` whose training pairs are this rank's (``step_rows`` takes
        seeds ``arange(m)``) and whose training structure holds the edges out of their
        sources only (all that filtering reads); it has no evaluation pairs. A typed graph's
        (``relations``: the message relations, inverses included; ``num_relations``: the
        pairs' ``R``) keeps each pair's relation and each lookup edge's."""
        empty = torch.zeros(num_nodes + 1, dtype=torch.int64)
        typed = {}
        if self.rel is not None:
            no_rel = torch.empty(0, dtype=torch.int64)
            typed = {
                "train_rel": self.rel,
                "val_rel": no_rel,
                "test_rel": no_rel,
                "train_edge_type": self.lookup_edge_type,
                "test_edge_type": no_rel,
                "relations": tuple(relations),
                "num_relations": num_relations,
            }
        split = LinkSplit(
            self.pairs,
            EMPTY_PAIRS,
            EMPTY_PAIRS,
            torch.empty(0, dtype=torch.int8),
            self.lookup_indptr,
            self.lookup_indices,
            empty,
            torch.empty(0, dtype=torch.int64),
            undirected=False,
            **typed,
        )
        return LinkTargets(split, num_nodes, out_dim, seed)

    def arrays(self, prefix: str) -> dict[str, Tensor]:
        arrays = {
            prefix + "owner": self.owner,
            prefix + "pairs": self.pairs,
            prefix + "index": self.index,
            prefix + "num_pairs": torch.tensor([self.num_pairs]),
            prefix + "lookup_indptr": self.lookup_indptr,
            prefix + "lookup_indices": self.lookup_indices,
        }
        if self.rel is not None:  # a typed graph's
            arrays[prefix + "rel"] = self.rel
            arrays[prefix + "lookup_edge_type"] = self.lookup_edge_type
        return arrays

    @classmethod
    def from_arrays(cls, part: dict[str, Tensor], prefix: str) -> LinkTrain:
        return cls(
            part[prefix + "owner"],
            part[prefix + "pairs"],
            part[prefix + "index"],
            int(part[prefix + "num_pairs"]),
            part[prefix + "lookup_indptr"],
            part[prefix + "lookup_indices"],
            part.get(prefix + "rel"),
            part.get(prefix + "lookup_edge_type"),
        )


@dataclass(frozen=True)
class LinkEval:
    """A rank's share of link prediction's evaluation: its inference core's embeddings over
    each stage's structure, and the evaluation edges it scores.

    Attributes:
        owner: int64 ``[N]`` the rank whose inference core holds each node.
        shares: ``{stage: EvalShare}`` over ``"train"`` (validation) and ``"test"`` (train +
            validation edges), on the same core as the part's whole-graph share.
        pairs: ``{split: (pos [2, m], index [m])}`` the validation and test edges whose
            source is in this rank's core, and their positions in the split's positives.
        relations: a typed graph's ``{split: int64 [m]}`` relation of each of ``pairs``
            (``None``: homogeneous).
    """

    owner: Tensor
    shares: dict[str, EvalShare]
    pairs: dict[str, tuple[Tensor, Tensor]]
    relations: dict[str, Tensor] | None = None

    def arrays(self) -> dict[str, Tensor]:
        arrays = {"link_eval_owner": self.owner}
        for stage, share in self.shares.items():
            arrays |= share.arrays(prefix=f"link_{stage}_")
        for split, (pos, index) in self.pairs.items():
            arrays[f"link_{split}_pos"], arrays[f"link_{split}_index"] = pos, index
        for split, rel in (self.relations or {}).items():
            arrays[f"link_{split}_rel"] = rel
        return arrays

    @classmethod
    def from_arrays(cls, part: dict[str, Tensor]) -> LinkEval:
        shares = {s: EvalShare.from_arrays(part, prefix=f"link_{s}_") for s in STAGES}
        splits = ("val", "test")
        pairs = {s: (part[f"link_{s}_pos"], part[f"link_{s}_index"]) for s in splits}
        relations = {s: part[f"link_{s}_rel"] for s in splits if f"link_{s}_rel" in part}
        return cls(part["link_eval_owner"], shares, pairs, relations or None)


def own_positions(own_ids: Tensor, ids: Tensor) -> Tensor:
    """Positions of ``ids`` in ``own_ids`` (every id must be there)."""
    ordered, order = torch.sort(own_ids)
    at = torch.searchsorted(ordered, ids).clamp_(max=max(ordered.numel() - 1, 0))
    if ids.numel() and not bool((ordered[at] == ids).all()):
        raise RuntimeError("a rank was asked for output rows of nodes it does not compute")
    return order[at]


@dataclass(frozen=True)
class EndpointRows:
    """How a rank turns its last layer's rows (its loss rows) into the rows of the step's
    endpoint nodes: the rows other ranks asked for go out (``send_index``, grouped by
    requester), the ones it asked for come in, and ``index`` picks every endpoint's row from
    ``[own rows | received rows]``."""

    index: Tensor
    send_index: Tensor
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]

    @classmethod
    def route(cls, comm: Comm, nodes: Tensor, owner: Tensor, own_ids: Tensor) -> EndpointRows:
        """Collective: ``nodes`` (sorted unique endpoint ids) -> the route of their rows, the
        remote ids sent once each to their owners (``structure``)."""
        own = owner[nodes] == comm.rank
        remote = nodes[~own]
        route = OwnerRoute.build(comm, remote, owner[remote], category="structure")
        index = torch.empty(nodes.numel(), dtype=torch.int64)
        index[own] = own_positions(own_ids, nodes[own])
        received_at = torch.empty(remote.numel(), dtype=torch.int64)
        received_at[route.order] = torch.arange(remote.numel())
        index[~own] = own_ids.numel() + received_at
        return cls(
            index,
            own_positions(own_ids, route.served),
            tuple(route.recv_splits),
            tuple(route.send_splits),
        )

    @property
    def num_received(self) -> int:
        return sum(self.recv_splits)

    def rows(self, h: Tensor, comm: Comm) -> Tensor:
        """``[len(index), d]`` the endpoints' rows from this rank's last-layer rows ``h``
        (differentiable: the rows sent back carry their gradients, ``activation_grad``)."""
        received = exchange_rows(
            h, self.send_index, self.send_splits, self.recv_splits, comm, "activation"
        )
        return torch.cat([h, received]).index_select(0, self.index)

    def to(self, device: torch.device | str) -> EndpointRows:
        return EndpointRows(
            self.index.to(device), self.send_index.to(device), self.send_splits, self.recv_splits
        )


def pair_positions(index: Tensor, num_pairs: int, order) -> Tensor:
    """Positions in the epoch's global batch (``order``: the epoch's permutation of the
    training pairs, a full-graph step taking all of them) of the pairs ``index``."""
    inverse = torch.empty(num_pairs, dtype=torch.int64)
    inverse[order] = torch.arange(num_pairs)
    return inverse[index]
