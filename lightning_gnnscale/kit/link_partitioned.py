"""Link prediction's evaluation on ranks that hold only their own nodes' embeddings.

A rank embeds the nodes it owns (over a stage's message-passing structure), scores the
evaluation edges it was given, and pulls the other rows an edge needs (its far endpoint, its
fixed negatives) from their owners, chunk by chunk: no rank ever holds every node's
embedding (docs/tasks.md, "Evaluation on partitioned ranks").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from ..comm import Comm, OwnerRoute
from ..tasks.link.metrics import auc_statistics, ranking_statistics
from ..tasks.link.negatives import evaluation_negatives
from ..tasks.link_prediction import SCORED_ELEMENTS, SPLIT_STAGE, LinkPrediction


class OwnedRows:
    """Embedding rows ``rows [n_own, d]`` of the nodes ``own_ids [n_own]`` (original ids) this
    rank owns; :meth:`gather` returns the rows of any ids, pulling the others from their owners
    (``owner(ids)``: each id's owning rank) through one :class:`~..comm.OwnerRoute`."""

    def __init__(self, own_ids: Tensor, rows: Tensor, owner: Callable[[Tensor], Tensor]):
        self.sorted_ids, self.order = torch.sort(own_ids)
        self.rows, self.owner = rows, owner

    def _local(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """``(is_own [n], row [n])``: which ids this rank owns and their rows' positions."""
        if self.sorted_ids.numel() == 0:
            return torch.zeros(ids.shape, dtype=torch.bool), torch.zeros_like(ids)
        at = torch.searchsorted(self.sorted_ids, ids).clamp_(max=self.sorted_ids.numel() - 1)
        return self.sorted_ids[at] == ids, self.order[at]

    def gather(self, ids: Tensor, comm: Comm) -> Tensor:
        """``[n, d]`` rows of ``ids`` (int64 ``[n]``, duplicates allowed). Collective: every
        rank calls it once per round, also with no ids. Each distinct remote id is requested
        once (``structure`` bytes) and its row comes back as ``activation`` bytes."""
        is_own, at = self._local(ids)
        remote, inverse = torch.unique(ids[~is_own], return_inverse=True)
        route = OwnerRoute.build(comm, remote, self.owner(remote), category="structure")
        served_own, served_at = self._local(route.served)
        if not bool(served_own.all()):
            raise RuntimeError("a rank was asked for embedding rows of nodes it does not own")
        received = route.reply(comm, self.rows[served_at], category="activation")
        out = self.rows.new_empty((ids.numel(), self.rows.shape[1]))
        out[is_own] = self.rows[at[is_own]]
        out[~is_own] = received[inverse]
        return out


@torch.no_grad()
def owned_link_statistics(
    task: LinkPrediction,
    embed: Callable[[str], Tensor],
    own_ids: Tensor,
    owner: Callable[[Tensor], Tensor],
    pairs: Mapping[str, tuple[Tensor, Tensor]],
    num_nodes: int,
    seed: int,
    splits: tuple[str, ...],
    comm: Comm,
    relations: Mapping[str, Tensor] | None = None,
) -> Tensor:
    """float64 ``[len(splits), k]``: this rank's link statistics, summing over ranks to the
    one-process statistics of :meth:`~..tasks.link_prediction.LinkPrediction.link_statistics`.

    Args:
        task: the link-prediction task (its decoder and ``eval_negatives``).
        embed: ``embed(stage)`` -> ``[n_own, d]``: this rank's nodes' embeddings over the
            stage's structure (``"train"`` for validation, ``"test"`` for test), in the order of
            ``own_ids``; called once per stage.
        own_ids: int64 ``[n_own]`` original ids of this rank's embedding rows.
        owner: original ids -> int64 owning rank of each.
        pairs: ``{split: (pos [2, m], index [m])}``: the evaluation edges this rank scores
            (original ids) and their positions in the split's positives (which key their fixed
            negatives). Every edge of a split is given to exactly one rank.
        num_nodes, seed: the graph's node count and the run's seed (the negatives' keys).
        comm: the metered communicator (``Comm.local()`` on one process).
        relations: a typed graph's ``{split: int64 [m]}``, the relation of each of ``pairs``'
            edges (the decoder scores triples; a negative keeps its positive's relation);
            ``None`` when homogeneous.

    Every rank scores its edges in the same number of rounds (the largest rank's), each
    pulling at most ``SCORED_ELEMENTS`` embedding elements; the AUC negatives' scores (one
    float per edge) are all-gathered so that each rank counts its positives' wins against all
    of them.
    """
    m = task.config.eval_negatives
    embedded: dict[str, OwnedRows] = {}
    out = []
    for split in splits:
        stage = SPLIT_STAGE[split]
        if stage not in embedded:
            embedded[stage] = OwnedRows(own_ids, embed(stage), owner)
        rows = embedded[stage]
        pos, index = pairs[split]
        rel = None if relations is None else relations[split]
        _check_pairs(split, pos, index, num_nodes, rel, _relation_count(task))
        width = rows.rows.shape[1]
        chunk = max(1, SCORED_ELEMENTS // ((m + 2) * max(width, 1)))
        rounds = torch.tensor([-(-index.numel() // chunk)], dtype=torch.int64)
        comm.all_reduce(rounds, "max", category="control")
        total = torch.zeros(len(task.statistic_names), dtype=torch.float64)
        pos_scores, auc_neg = [], []
        for r in range(int(rounds)):
            part = slice(r * chunk, (r + 1) * chunk)
            src, dst, at = pos[0, part], pos[1, part], index[part]
            r = None if rel is None else rel[part]
            negs = evaluation_negatives(src, at, num_nodes, seed=seed, split=split, m=m)
            h = rows.gather(torch.cat([src, dst, negs.flatten()]), comm)
            n = src.numel()
            h_src, h_dst, h_neg = h[:n], h[n : 2 * n], h[2 * n :].reshape(n, m, width)
            scores = task.pair_scores(h_src, h_dst, r)
            total[2:] += ranking_statistics(scores, task.decoder.score_candidates(h_src, h_neg, r))
            pos_scores.append(scores)
            auc_neg.append(task.pair_scores(h_src, h_neg[:, 0], r))
        every_auc_neg, _ = comm.all_gather_varlen(torch.cat(auc_neg), category="activation")
        total[:2] = auc_statistics(torch.cat(pos_scores), every_auc_neg)
        out.append(total)
    return torch.stack(out)


def _relation_count(task: LinkPrediction) -> int | None:
    """The relations the task's decoder scores (``None``: it scores pairs, not triples)."""
    return None if task.relations is None else max(1, len(task.relations))


def _check_pairs(
    split: str,
    pos: Tensor,
    index: Tensor,
    num_nodes: int,
    rel: Tensor | None = None,
    num_relations: int | None = None,
) -> None:
    """A rank's evaluation pairs (from a partition directory: outside input) are ``[2, m]``
    node ids in ``[0, num_nodes)`` with ``m`` non-negative positions (and, typed, ``m``
    relations in ``[0, num_relations)``); else ``ValueError``."""
    if pos.dim() != 2 or pos.shape[0] != 2 or index.shape != pos.shape[1:]:
        raise ValueError(
            f"{split} pairs {tuple(pos.shape)} and positions {tuple(index.shape)} do not match"
        )
    if rel is not None:
        if rel.dtype != torch.int64 or rel.shape != index.shape:
            raise ValueError(
                f"{split} pair relations must be int64 {tuple(index.shape)}, got {rel.dtype} "
                f"{tuple(rel.shape)}"
            )
        limit = num_relations or 1
        if rel.numel() and (int(rel.min()) < 0 or int(rel.max()) >= limit):
            raise ValueError(f"{split} pair relations hold values outside [0, {limit})")
    if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= num_nodes):
        raise ValueError(f"{split} pairs hold node ids outside [0, {num_nodes})")
    if index.numel() and int(index.min()) < 0:
        raise ValueError(f"{split} pair positions must be non-negative")
