"""Seeded edge split for link prediction, as PyG's ``RandomLinkSplit``, on the suite's CSC.

Edges are split as *pairs*: with ``undirected=True`` (a symmetric graph) both directions of a
pair land in one split and the pair is counted once, written ``(src, dst)`` with ``src <= dst``.
Training blocks and validation pass messages over the training edges, test over training and
validation edges (docs/tasks.md, "Link prediction building blocks").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...graph.sampler import splitmix64
from .keys import SPLIT, stream_key

STAGES = ("train", "val", "test")


def _dst_of(indptr: Tensor) -> Tensor:
    n = indptr.numel() - 1
    return torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])


def _csc_of(mask: Tensor, dst: Tensor, indices: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """The CSC of the edges ``mask`` selects (CSC order kept, so segments stay sorted)."""
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst[mask], minlength=num_nodes), 0, out=indptr[1:])
    return indptr, indices[mask]


class EdgeLookup:
    """Edge ids of a CSC ``(indptr, indices)`` by endpoints, through one ``searchsorted``.

    The keys ``dst * N + src`` of a CSC whose segments are sorted by source (the invariant of
    ``graph.csc.Graph``) are sorted in CSC order, so the key's position is the edge id.
    """

    def __init__(self, indptr: Tensor, indices: Tensor):
        self.num_nodes = indptr.numel() - 1
        self.keys = _dst_of(indptr) * self.num_nodes + indices
        if self.keys.numel() > 1 and not bool((self.keys[1:] > self.keys[:-1]).all()):
            raise ValueError(
                "EdgeLookup needs each CSC segment sorted by source without duplicates "
                "(graph.csc.Graph's invariant)"
            )

    def find(self, src: Tensor, dst: Tensor) -> Tensor:
        """int64 edge ids of the edges ``src -> dst`` (any equal shapes); ``-1`` where absent."""
        query = dst * self.num_nodes + src
        if self.keys.numel() == 0:
            return torch.full_like(query, -1)
        pos = torch.searchsorted(self.keys, query).clamp_(max=self.keys.numel() - 1)
        return torch.where(self.keys[pos] == query, pos, -1)


@dataclass(frozen=True)
class LinkSplit:
    """A link-prediction split of one graph's edges.

    Attributes:
        train_pos, val_pos, test_pos: int64 ``[2, n]`` positive pairs ``(src, dst)`` of each
            split, sorted by ``(dst, src)``; ``src <= dst`` when ``undirected``.
        edge_split: int8 ``[E]``: the split of each input edge (0 train, 1 val, 2 test).
        train_indptr, train_indices: CSC of the training edges, what training blocks and
            validation pass messages over.
        test_indptr, test_indices: CSC of training + validation edges, for test.
        undirected: whether a pair is both directions of an edge.
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

    def positives(self, split: str) -> Tensor:
        """The positive pairs ``[2, n]`` of ``split`` in ``STAGES``."""
        return {"train": self.train_pos, "val": self.val_pos, "test": self.test_pos}[_stage(split)]

    def structure(self, stage: str) -> tuple[Tensor, Tensor]:
        """``(indptr, indices)`` messages pass over in ``stage``: train edges for ``train``
        and ``val``, train + val edges for ``test`` (``Graph.with_structure`` takes them)."""
        if _stage(stage) == "test":
            return self.test_indptr, self.test_indices
        return self.train_indptr, self.train_indices


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


def random_link_split(
    indptr: Tensor,
    indices: Tensor,
    *,
    seed: int,
    val: float = 0.05,
    test: float = 0.1,
    undirected: bool = True,
) -> LinkSplit:
    """Split the edges of CSC ``(indptr, indices)`` into train / val / test pairs.

    As ``RandomLinkSplit(num_val=val, num_test=test, is_undirected=undirected)``: of the ``P``
    pairs, ``int(val * P)`` go to validation, ``int(test * P)`` to test and the rest to
    training. The order is a hash of ``(seed, pair)``, so a pair's split depends on the seed
    and the pair set only. ``undirected=True`` refuses a graph with an edge lacking its reverse.
    """
    check_fractions(val, test)
    n = indptr.numel() - 1
    lookup = EdgeLookup(indptr, indices)
    src, dst = indices, _dst_of(indptr)
    if undirected:
        missing = int((lookup.find(dst, src) < 0).sum())
        if missing:
            raise ValueError(
                f"undirected=True needs a symmetric graph: {missing} of {src.numel()} edges "
                "lack their reverse; pass undirected=False"
            )
        pair_edges = (src <= dst).nonzero().flatten()  # one edge per pair, its keys sorted
        edge_pair = torch.searchsorted(
            lookup.keys[pair_edges], torch.maximum(src, dst) * n + torch.minimum(src, dst)
        )
    else:
        pair_edges = torch.arange(src.numel())
        edge_pair = pair_edges
    num_pairs = pair_edges.numel()
    num_val, num_test = int(val * num_pairs), int(test * num_pairs)
    num_train = num_pairs - num_val - num_test
    if num_train <= 0:
        raise ValueError(
            f"link split leaves no training pair: {num_pairs} pairs, {num_val} val, {num_test} test"
        )
    order = torch.argsort(
        splitmix64(lookup.keys[pair_edges] ^ stream_key(SPLIT, seed)), stable=True
    )
    pair_split = torch.zeros(num_pairs, dtype=torch.int8)
    pair_split[order[num_train : num_train + num_val]] = 1
    pair_split[order[num_train + num_val :]] = 2
    edge_split = pair_split[edge_pair]
    pos = torch.stack([src[pair_edges], dst[pair_edges]])
    train = _csc_of(edge_split == 0, dst, indices, n)
    train_val = _csc_of(edge_split <= 1, dst, indices, n)
    return LinkSplit(
        train_pos=pos[:, pair_split == 0],
        val_pos=pos[:, pair_split == 1],
        test_pos=pos[:, pair_split == 2],
        edge_split=edge_split,
        train_indptr=train[0],
        train_indices=train[1],
        test_indptr=train_val[0],
        test_indices=train_val[1],
        undirected=undirected,
    )
