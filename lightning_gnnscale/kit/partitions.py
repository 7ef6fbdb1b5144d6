"""A rank's share of a partitioned graph: its statistics, its predictions, and the check
that every rank holds the same partition."""

from __future__ import annotations

import torch

from ..comm import Comm
from ..graph.book import LocalPartition
from ..graph.cache import tensor_digest
from ..tasks.base import NodeTask, split_statistics


def core_statistics(
    task: NodeTask, local: LocalPartition, out: torch.Tensor, splits: tuple[str, ...]
) -> torch.Tensor:
    """The task's statistics (:func:`~..tasks.base.split_statistics`) of a local partition's
    core rows, from their output rows ``out [n_core, d]``."""
    return split_statistics(task, out, local.targets, splits)


def own_predictions(
    own_ids: torch.Tensor, rows: torch.Tensor, node_ids: torch.Tensor | None, num_nodes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A rank's share of ``trainer.predict`` when it computes the rows of the nodes it owns:
    ``(ids, rows)`` of its own nodes (original ids ``own_ids [n]``, ``rows [n, d]``); with
    ``node_ids`` (1-D, each in ``[0, num_nodes)``) the requested ids it owns, in the requested
    order and with repeats, as the one-process split (:func:`node_rows`) returns them."""
    if node_ids is None:
        return own_ids, rows
    node_ids = node_ids.cpu()
    if node_ids.dim() != 1:
        raise ValueError(f"node ids must be 1-D, got shape {tuple(node_ids.shape)}")
    if node_ids.numel() and (int(node_ids.min()) < 0 or int(node_ids.max()) >= num_nodes):
        raise ValueError(f"node ids must be in [0, {num_nodes})")
    sorted_ids, order = torch.sort(own_ids)
    position = torch.searchsorted(sorted_ids, node_ids).clamp_(max=max(own_ids.numel() - 1, 0))
    mine = sorted_ids[position] == node_ids if own_ids.numel() else node_ids < 0
    return node_ids[mine], rows[order[position[mine]].to(rows.device)]


def assert_same_on_all_ranks(comm: Comm, values: torch.Tensor, what: str) -> None:
    """Fail loudly if ``values`` (e.g. a partition every rank computed or loaded) differs
    between ranks: mismatched split functions would silently corrupt results or hang."""
    digest = torch.tensor([int(tensor_digest(values)[:15], 16)], dtype=torch.int64)
    digests = comm.all_gather_tensor(digest, category="control")
    if bool((digests != digests[0]).any()):
        raise RuntimeError(
            f"{what} differs between ranks (digests {digests.tolist()}); "
            "every rank must use the same dataset, config and code version"
        )
