"""GSplit's link prediction: a rank's share of the edge split and of each step's pairs.

A training pair, and an evaluation edge, belongs to the rank that owns its source. Each step
every rank keeps its pairs of the step's global batch (``single``'s), draws their negatives
(``task.step_rows``: keyed by the pair's position in the global batch, so they are
``single``'s), and asks the owners of the endpoints for their output rows: the union of the
requests a rank receives is its local frontier ``D^L``, whose outputs it alone samples, loads
and computes; after the last layer the rows go back along the same route (``activation``
forward, ``activation_grad`` backward), bounded by the distinct endpoints each rank's pairs
need (docs/systems/gsplit.md#link-prediction).

On a typed graph each pair keeps its relation (``<split>_rel``), the negatives filter under it
(:class:`SourceKeyLookup` keys ``(dst * R' + relation) * N + src`` over the ``R'`` message
relations), and the stage structures carry their edges' relations, inverses included
(docs/systems/gsplit.md#typed-graphs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ...graph.csc_rows import CSCRows
from ...tasks.link.split import EdgeLookup, LinkSplit, triple_keys
from ...tasks.link_prediction import LinkTargets

EVAL_SPLITS = ("val", "test")
STAGES = ("train", "test")  # the message-passing structures evaluation embeds over


class SourceKeyLookup(EdgeLookup):
    """:class:`EdgeLookup` of the training edges whose source a rank owns (sorted keys
    ``dst * N + src``; typed: ``(dst * R' + relation) * N + src`` over ``num_relations`` message
    relations): what ``task.filter_negatives`` asks of a negative ``(s, d)`` (typed: under its
    positive's relation) with ``s`` the rank's own source, answered as the whole lookup would
    (a hit's position differs, only ``>= 0`` is read)."""

    def __init__(self, keys: Tensor, num_nodes: int, num_relations: int | None = None):
        self.keys, self.num_nodes = keys, num_nodes
        self.typed, self.num_relations = num_relations is not None, num_relations or 1


@dataclass(frozen=True)
class RankLinkTargets(LinkTargets):
    """:class:`LinkTargets` of one rank: ``split.train_pos`` holds only its training pairs
    (original ids), and the negatives are filtered (``task.filter_negatives``) against the
    training edges from its own sources (:class:`SourceKeyLookup`)."""

    lookup: EdgeLookup | None = field(default=None, compare=False)

    @property
    def train_lookup(self) -> EdgeLookup:  # type: ignore[override]
        return self.lookup


@dataclass(frozen=True)
class LinkPart:
    """What a rank holds of the edge split.

    Attributes:
        targets: its training pairs as :class:`RankLinkTargets` (``task.step_rows`` reads them).
        train_index: int64 ``[m]`` sorted positions of those pairs among all training pairs
            (the seeds every rank's epoch permutation draws).
        eval_pairs: ``{split: (pos [2, n] original ids, index [n])}``: the evaluation edges
            whose source it owns and their positions in the split.
        eval_relations: a typed graph's ``{split: int64 [n]}``, the relation of each of
            ``eval_pairs``' edges; ``None``: homogeneous.
        stages: ``{stage: CSCRows}``: its own vertices' rows of the structure each evaluation
            stage passes messages over (``train``: validation's, ``test``: test's).
        to_ids: original ids -> the sampler's ids (a partition directory's relabelled ones);
            ``None``: the same.
    """

    targets: RankLinkTargets
    train_index: Tensor
    eval_pairs: dict[str, tuple[Tensor, Tensor]]
    stages: dict[str, CSCRows]
    to_ids: Callable[[Tensor], Tensor] | None
    eval_relations: dict[str, Tensor] | None = None

    def ids(self, orig: Tensor) -> Tensor:
        return orig if self.to_ids is None else self.to_ids(orig)

    def step_pairs(self, seeds: Tensor) -> tuple[Tensor, Tensor]:
        """``(local, positions)``: of a step's global seeds (training-pair positions), this
        rank's as rows of ``targets.split.train_pos`` and their positions in the step."""
        index = self.train_index
        if index.numel() == 0:
            empty = torch.zeros(0, dtype=torch.int64)
            return empty, empty
        at = torch.searchsorted(index, seeds).clamp_(max=index.numel() - 1)
        mine = index[at] == seeds
        return at[mine], mine.nonzero().flatten()


def source_keys(
    indptr: Tensor,
    indices: Tensor,
    own_source: Tensor,
    edge_type: Tensor | None = None,
    num_relations: int = 1,
) -> Tensor:
    """Sorted keys ``dst * N + src`` of the CSC's edges whose source ``own_source`` marks
    (bool ``[N]``); a typed CSC's (``edge_type`` ``[E]`` of ``num_relations``)
    ``(dst * R + relation) * N + src``, sorted as its segments are."""
    n = indptr.numel() - 1
    dst = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    keep = own_source.index_select(0, indices)
    rel = 0 if edge_type is None else edge_type[keep]
    return triple_keys(indices[keep], dst[keep], rel, n, num_relations)


def owned_pairs(pos: Tensor, own_source: Tensor) -> tuple[Tensor, Tensor]:
    """``(pos[:, mine], positions)`` of the pairs ``pos [2, n]`` whose source ``own_source``
    (bool ``[N]``) marks."""
    mine = own_source.index_select(0, pos[0]).nonzero().flatten()
    return pos[:, mine], mine


def split_arrays(split: LinkSplit, own_source: Tensor) -> dict[str, Tensor]:
    """What a rank's part holds of the edge split (original ids): its training pairs and their
    positions (``train_pos``, ``train_index``), its evaluation edges and their positions
    (``val_pos``, ``val_index``, ``test_pos``, ``test_index``), and the keys of the training
    edges from its sources (``train_source_keys``); a typed split's also each pair's relation
    (``train_rel``, ``val_rel``, ``test_rel``)."""
    arrays = {}
    for name in ("train", *EVAL_SPLITS):
        arrays[f"{name}_pos"], arrays[f"{name}_index"] = owned_pairs(
            split.positives(name), own_source
        )
        if split.is_typed:
            arrays[f"{name}_rel"] = split.positive_relations(name)[arrays[f"{name}_index"]]
    typed = {}
    if split.is_typed:
        typed = {"edge_type": split.train_edge_type, "num_relations": len(split.relations)}
    arrays["train_source_keys"] = source_keys(*split.structure("train"), own_source, **typed)
    return arrays


def link_part(
    arrays: dict[str, Tensor],
    num_nodes: int,
    out_dim: int,
    seed: int,
    stages: dict[str, CSCRows],
    to_ids: Callable[[Tensor], Tensor] | None,
    relations: tuple[tuple[str, ...], tuple[str, ...]] | None = None,
) -> LinkPart:
    """The :class:`LinkPart` of :func:`split_arrays`' ``arrays``; a typed split's
    ``relations`` are ``(pair relations, message relations)`` (the graph's ``R``, then the
    ``R'`` messages pass over), and ``arrays`` then hold each pair's relation, checked here
    (a directory's: outside input)."""
    empty = torch.zeros(0, dtype=torch.int64)
    typed, eval_relations, num_relations = {}, None, None
    if relations is not None:
        pair_relations, message = relations
        for s in ("train", *EVAL_SPLITS):
            check_pair_relations(arrays, s, len(pair_relations))
        typed = {f"{s}_rel": arrays[f"{s}_rel"] for s in ("train", *EVAL_SPLITS)}
        typed |= {"relations": tuple(message), "num_relations": len(pair_relations)}
        eval_relations = {s: arrays[f"{s}_rel"] for s in EVAL_SPLITS}
        num_relations = len(message)
    split = LinkSplit(
        train_pos=arrays["train_pos"],
        val_pos=arrays["val_pos"],
        test_pos=arrays["test_pos"],
        edge_split=torch.zeros(0, dtype=torch.int8),
        train_indptr=empty,
        train_indices=empty,
        test_indptr=empty,
        test_indices=empty,
        undirected=False,
        **typed,
    )
    lookup = SourceKeyLookup(arrays["train_source_keys"], num_nodes, num_relations)
    targets = RankLinkTargets(split, num_nodes, out_dim, seed, lookup)
    pairs = {s: (arrays[f"{s}_pos"], arrays[f"{s}_index"]) for s in EVAL_SPLITS}
    return LinkPart(targets, arrays["train_index"], pairs, stages, to_ids, eval_relations)


def check_pair_relations(arrays: dict[str, Tensor], split: str, num_relations: int) -> None:
    """``arrays[f"{split}_rel"]`` is int64 with one relation in ``[0, num_relations)`` per
    pair of ``arrays[f"{split}_pos"]``; else ``ValueError``."""
    rel, pos = arrays.get(f"{split}_rel"), arrays[f"{split}_pos"]
    if rel is None:
        raise ValueError(f"a typed split's {split} pairs come without their relations")
    if rel.dtype != torch.int64 or rel.shape != pos.shape[1:]:
        raise ValueError(
            f"{split} pair relations must be int64 {list(pos.shape[1:])}, got {rel.dtype} "
            f"{list(rel.shape)}"
        )
    if rel.numel() and (int(rel.min()) < 0 or int(rel.max()) >= num_relations):
        raise ValueError(f"{split} pair relations hold values outside [0, {num_relations})")
