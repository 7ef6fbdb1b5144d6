"""Seeded edge split for link prediction, as PyG's ``RandomLinkSplit``, on the suite's CSC.

Edges are split as *pairs*: with ``undirected=True`` (a symmetric graph) both directions of a
pair land in one split and the pair is counted once, written ``(src, dst)`` with ``src <= dst``.
Training blocks and validation pass messages over the training edges, test over training and
validation edges (docs/tasks.md, "Link prediction building blocks").

A typed graph's edges are triples ``(src, relation, dst)``: a pair is one triple (with
``undirected``, a triple and its reverse under the same relation), each positive keeps its
relation, and a directed split's message-passing structures add every edge's inverse under
relation ``r + R`` (named ``<r>_inverse``), as PyG's and Schlichtkrull et al.'s RGCN link
prediction do, so an entity hears its out-neighbours too (docs/tasks.md, "Typed link
prediction").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ...graph.csc import typed_csc_from_edges
from ...graph.sampler import splitmix64
from .keys import SPLIT, stream_key

STAGES = ("train", "val", "test")
INVERSE = "_inverse"  # the suffix of an inverse relation's name


def _dst_of(indptr: Tensor) -> Tensor:
    n = indptr.numel() - 1
    return torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])


def _csc_of(mask: Tensor, dst: Tensor, indices: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """The CSC of the edges ``mask`` selects (CSC order kept, so segments stay sorted)."""
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst[mask], minlength=num_nodes), 0, out=indptr[1:])
    return indptr, indices[mask]


def triple_keys(src: Tensor, dst: Tensor, rel: Tensor | int, n: int, r: int) -> Tensor:
    """int64 keys ``(dst * R + rel) * N + src``: CSC order of a typed graph (``dst * N + src``
    when ``R = 1``)."""
    return (dst * r + rel) * n + src


class EdgeLookup:
    """Edge ids of a CSC ``(indptr, indices)`` (typed: with ``edge_type`` of ``num_relations``)
    by endpoints (and relation), through one ``searchsorted``.

    The keys ``(dst * R + rel) * N + src`` of a CSC whose segments are sorted by (relation,
    source) (the invariant of ``graph.csc.Graph``) are sorted in CSC order, so the key's
    position is the edge id; homogeneous: ``R = 1``, the keys ``dst * N + src``.
    """

    def __init__(
        self,
        indptr: Tensor,
        indices: Tensor,
        edge_type: Tensor | None = None,
        num_relations: int = 1,
    ):
        self.num_nodes = indptr.numel() - 1
        self.typed = edge_type is not None
        self.num_relations = num_relations if self.typed else 1
        rel = 0 if edge_type is None else edge_type
        self.keys = triple_keys(indices, _dst_of(indptr), rel, self.num_nodes, self.num_relations)
        if self.keys.numel() > 1 and not bool((self.keys[1:] > self.keys[:-1]).all()):
            raise ValueError(
                "EdgeLookup needs each CSC segment sorted by source (a typed one by relation, "
                "then source) without duplicates (graph.csc.Graph's invariant)"
            )

    def find(self, src: Tensor, dst: Tensor, rel: Tensor | None = None) -> Tensor:
        """int64 edge ids of the edges ``src -> dst`` (of relation ``rel`` on a typed CSC;
        any equal shapes); ``-1`` where absent."""
        if self.typed != (rel is not None):
            raise ValueError(
                "a typed EdgeLookup finds edges by relation, a homogeneous one without"
            )
        query = triple_keys(src, dst, 0 if rel is None else rel, self.num_nodes, self.num_relations)
        if self.keys.numel() == 0:
            return torch.full_like(query, -1)
        pos = torch.searchsorted(self.keys, query).clamp_(max=self.keys.numel() - 1)
        return torch.where(self.keys[pos] == query, pos, -1)


@dataclass(frozen=True)
class LinkSplit:
    """A link-prediction split of one graph's edges.

    Attributes:
        train_pos, val_pos, test_pos: int64 ``[2, n]`` positive pairs ``(src, dst)`` of each
            split, in CSC order (sorted by ``(dst, relation, src)``); ``src <= dst`` when
            ``undirected``.
        edge_split: int8 ``[E]``: the split of each input edge (0 train, 1 val, 2 test).
        train_indptr, train_indices: CSC of the training edges, what training blocks and
            validation pass messages over.
        test_indptr, test_indices: CSC of training + validation edges, for test.
        undirected: whether a pair is both directions of an edge.
        train_rel, val_rel, test_rel: a typed graph's: int64 ``[n]`` relation of each
            positive (``None``: homogeneous).
        train_edge_type, test_edge_type: a typed graph's: int64 relation of each edge of the
            two message-passing CSCs (inverse edges: ``r + R``).
        relations: a typed graph's message-passing relations: the graph's ``R``, then (a
            directed split) their ``R`` inverses; ``()`` when homogeneous.
        num_relations: ``R``, the relations of the positives (1 when homogeneous).
    """

    train_pos: Tensor
    val_pos: Tensor
    test_pos: Tensor
    edge_split: Tensor
    train_indptr: Tensor
    train_indices: Tensor
    test_indptr: Tensor
    test_indices: Tensor
    undirected: bool
    train_rel: Tensor | None = None
    val_rel: Tensor | None = None
    test_rel: Tensor | None = None
    train_edge_type: Tensor | None = None
    test_edge_type: Tensor | None = None
    relations: tuple[str, ...] = ()
    num_relations: int = 1

    @property
    def is_typed(self) -> bool:
        return self.train_rel is not None

    def positives(self, split: str) -> Tensor:
        """The positive pairs ``[2, n]`` of ``split`` in ``STAGES``."""
        return {"train": self.train_pos, "val": self.val_pos, "test": self.test_pos}[_stage(split)]

    def positive_relations(self, split: str) -> Tensor | None:
        """The relation ``[n]`` of each positive of ``split`` (``None``: homogeneous)."""
        return {"train": self.train_rel, "val": self.val_rel, "test": self.test_rel}[_stage(split)]

    def structure(self, stage: str) -> tuple[Tensor, Tensor]:
        """``(indptr, indices)`` messages pass over in ``stage``: train edges for ``train``
        and ``val``, train + val edges for ``test`` (``Graph.with_structure`` takes them)."""
        if _stage(stage) == "test":
            return self.test_indptr, self.test_indices
        return self.train_indptr, self.train_indices

    def structure_edge_type(self, stage: str) -> Tensor | None:
        """The relation of each edge of :meth:`structure` ``(stage)`` (``None``:
        homogeneous)."""
        return self.test_edge_type if _stage(stage) == "test" else self.train_edge_type


def _stage(name: str) -> str:
    if name not in STAGES:
        raise ValueError(f"unknown split {name!r}; valid: {list(STAGES)}")
    return name


def check_fractions(val: float, test: float) -> None:
    """Refuse split fractions outside ``[0, 1)`` or summing to 1 or more."""
    for name, f in (("val", val), ("test", test)):
        if not 0.0 <= f < 1.0:
            raise ValueError(f"link split fraction {name}={f} must be in [0, 1)")
    if val + test >= 1.0:
        raise ValueError(f"link split fractions val={val} + test={test} must sum to less than 1")


def message_relations(relations: tuple[str, ...], undirected: bool) -> tuple[str, ...]:
    """The relations a typed split passes messages over: ``relations``, then (directed) each
    one's inverse ``<r>_inverse``."""
    if undirected or not relations:
        return tuple(relations)
    inverses = tuple(f"{r}{INVERSE}" for r in relations)
    taken = sorted(set(inverses) & set(relations))
    if taken:
        raise ValueError(
            f"relations {taken} are named as inverse relations ({INVERSE}), which a directed "
            "link-prediction split adds; rename them"
        )
    return (*relations, *inverses)


def _typed_structure(
    mask: Tensor, src: Tensor, dst: Tensor, rel: Tensor, n: int, r: int, undirected: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """The typed CSC of the edges ``mask`` selects, plus (directed) their inverses under
    ``rel + R``."""
    s, d, t = src[mask], dst[mask], rel[mask]
    if undirected:
        return typed_csc_from_edges(s, d, t, n, r, remove_self_loops=False)
    return typed_csc_from_edges(
        torch.cat([s, d]),
        torch.cat([d, s]),
        torch.cat([t, t + r]),
        n,
        2 * r,
        remove_self_loops=False,
    )


def random_link_split(
    indptr: Tensor,
    indices: Tensor,
    *,
    seed: int,
    val: float = 0.05,
    test: float = 0.1,
    undirected: bool = True,
    edge_type: Tensor | None = None,
    relations: tuple[str, ...] = (),
    fixed: Tensor | None = None,
) -> LinkSplit:
    """Split the edges of CSC ``(indptr, indices)`` into train / val / test pairs.

    As ``RandomLinkSplit(num_val=val, num_test=test, is_undirected=undirected)``: of the ``P``
    pairs, ``int(val * P)`` go to validation, ``int(test * P)`` to test and the rest to
    training. The order is a hash of ``(seed, pair)``, so a pair's split depends on the seed
    and the pair set only. ``undirected=True`` refuses a graph with an edge lacking its reverse.

    A typed graph (``edge_type`` ``[E]`` of the ``relations``): a pair is a triple, and its
    reverse is the reverse edge of the same relation. ``fixed``: int8 ``[E]``, the data's own
    split of every edge (0 train, 1 val, 2 test; a pair's two edges must agree), used instead
    of the fractions.
    """
    n = indptr.numel() - 1
    r = len(relations) if edge_type is not None else 1
    lookup = EdgeLookup(indptr, indices, edge_type, r)
    src, dst = indices, _dst_of(indptr)
    rel = torch.zeros_like(src) if edge_type is None else edge_type
    if undirected:
        reverse = lookup.find(dst, src, None if edge_type is None else rel)
        missing = int((reverse < 0).sum())
        if missing:
            raise ValueError(
                f"undirected=True needs a symmetric graph: {missing} of {src.numel()} edges "
                "lack their reverse"
                + (" under their relation" if edge_type is not None else "")
                + "; pass undirected=False"
            )
        pair_edges = (src <= dst).nonzero().flatten()  # one edge per pair, its keys sorted
        edge_pair = torch.searchsorted(
            lookup.keys[pair_edges],
            triple_keys(torch.minimum(src, dst), torch.maximum(src, dst), rel, n, r),
        )
    else:
        pair_edges = torch.arange(src.numel())
        edge_pair = pair_edges
    num_pairs = pair_edges.numel()
    if fixed is None:
        check_fractions(val, test)
        num_val, num_test = int(val * num_pairs), int(test * num_pairs)
        num_train = num_pairs - num_val - num_test
        if num_train <= 0:
            raise ValueError(
                f"link split leaves no training pair: {num_pairs} pairs, {num_val} val, "
                f"{num_test} test"
            )
        order = torch.argsort(
            splitmix64(lookup.keys[pair_edges] ^ stream_key(SPLIT, seed)), stable=True
        )
        pair_split = torch.zeros(num_pairs, dtype=torch.int8)
        pair_split[order[num_train : num_train + num_val]] = 1
        pair_split[order[num_train + num_val :]] = 2
        edge_split = pair_split[edge_pair]
    else:
        edge_split = _checked_fixed(fixed, src.numel())
        pair_split = edge_split[pair_edges]
        disagree = int((pair_split[edge_pair] != edge_split).sum())
        if disagree:
            raise ValueError(
                f"the data's edge split puts {disagree} edges in another split than their "
                "reverse (undirected=True keeps a pair in one split); fix the split or pass "
                "undirected=False"
            )
        if not bool((pair_split == 0).any()):
            raise ValueError("the data's edge split has no training edge")
    pos = torch.stack([src[pair_edges], dst[pair_edges]])
    kind = {0: pair_split == 0, 1: pair_split == 1, 2: pair_split == 2}
    if edge_type is None:
        train = _csc_of(edge_split == 0, dst, indices, n)
        train_val = _csc_of(edge_split <= 1, dst, indices, n)
        typed = {}
    else:
        pair_rel = rel[pair_edges]
        train = _typed_structure(edge_split == 0, src, dst, rel, n, r, undirected)
        train_val = _typed_structure(edge_split <= 1, src, dst, rel, n, r, undirected)
        typed = {
            "train_rel": pair_rel[kind[0]],
            "val_rel": pair_rel[kind[1]],
            "test_rel": pair_rel[kind[2]],
            "train_edge_type": train[2],
            "test_edge_type": train_val[2],
            "relations": message_relations(tuple(relations), undirected),
            "num_relations": r,
        }
    return LinkSplit(
        train_pos=pos[:, kind[0]],
        val_pos=pos[:, kind[1]],
        test_pos=pos[:, kind[2]],
        edge_split=edge_split,
        train_indptr=train[0],
        train_indices=train[1],
        test_indptr=train_val[0],
        test_indices=train_val[1],
        undirected=undirected,
        **typed,
    )


def _checked_fixed(fixed: Tensor, num_edges: int) -> Tensor:
    """The data's edge split, refused unless int8 ``[E]`` of 0, 1 and 2 (outside input)."""
    if fixed.shape != (num_edges,) or fixed.dtype != torch.int8:
        raise ValueError(
            f"the data's edge split must be int8 [{num_edges}], got {fixed.dtype} "
            f"{tuple(fixed.shape)}"
        )
    if fixed.numel() and (int(fixed.min()) < 0 or int(fixed.max()) > 2):
        raise ValueError(
            "the data's edge split holds values other than 0 (train), 1 (val), 2 (test)"
        )
    return fixed


def message_graph(graph, split: LinkSplit) -> tuple:
    """``(graph, stage)``: the graph a typed split passes messages over, whole (every stage),
    and the stage int8 ``[E']`` of each of its edges. Undirected: ``graph`` itself; directed:
    every edge plus its inverse under ``r + R`` (``split.relations``), the inverse in its
    edge's stage, so that ``stage <= s`` is ``split.structure`` of stage ``s`` with its edge
    types. Homogeneous: ``graph`` and ``split.edge_split``."""
    if not graph.is_typed or split.undirected:
        return graph, split.edge_split
    src, dst, rel, r = graph.indices, graph.dst_of_edges(), graph.edge_type, graph.num_relations
    src, dst = torch.cat([src, dst]), torch.cat([dst, src])
    rel, stage = torch.cat([rel, rel + r]), split.edge_split.repeat(2)
    indptr, indices, kinds = typed_csc_from_edges(
        src, dst, rel, graph.num_nodes, 2 * r, remove_self_loops=False
    )
    if indices.numel() != src.numel():
        raise RuntimeError("the message graph merged edges: the graph holds duplicate triples")
    at = EdgeLookup(indptr, indices, kinds, 2 * r).find(src, dst, rel)
    edge_stage = torch.empty_like(stage)
    edge_stage[at] = stage
    typed = replace(
        graph,
        indptr=indptr,
        indices=indices,
        edge_type=kinds,
        relations=split.relations,
        meta=dict(graph.meta),
    )
    return typed, edge_stage
