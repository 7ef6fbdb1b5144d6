"""The task interface every system trains through (docs/architecture.md, "Tasks")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import Tensor

from ..graph.node_targets import NodeDataset, NodeTargets
from .spec import TaskSpec


class NodeTask:
    """A task whose targets are per-node rows (:class:`~..graph.node_targets.NodeTargets`).

    A system never interprets its :class:`NodeTargets`: it selects the rows of the nodes it
    holds, carries a step's seed rows' ``target`` in ``Batch.y`` and hands evaluation this
    task's :func:`split_statistics` over its own rows. A task's evaluation is a vector of *summable* statistics per split (classification:
    correct, count; regression: squared-error sum, absolute-error sum, count), so a system sums
    them across ranks (one ``all_reduce``) and :meth:`metric_values` turns the sums into metrics.

    For tasks whose seeds are not nodes (link prediction, next): :meth:`seed_nodes` names the
    nodes a step's seeds need outputs for, and :meth:`excluded_edges` the edges sampling must not
    use; node tasks return the seeds themselves and nothing.
    """

    spec: ClassVar[TaskSpec]

    @property
    def name(self) -> str:
        return self.spec.name

    def prepare(self, dataset: NodeDataset, seed: int) -> NodeTargets:
        """This task's rows for every node of ``dataset`` (default: the dataset's own)."""
        return dataset.targets

    def out_dim_of(self, meta: Mapping) -> int:
        """The head's width from a partition directory's metadata (no graph is loaded)."""
        raise NotImplementedError

    def target_shape(self, rows: int, meta: Mapping) -> tuple[int, ...]:
        """The shape of ``rows`` rows of ``NodeTargets.target`` in a partition directory with
        metadata ``meta``: what a system checks its stored targets against."""
        raise NotImplementedError

    def is_train_seed(self, targets: NodeTargets) -> Tensor:
        """bool ``[n]``: which of these rows a step may train on."""
        return targets.train

    def train_seeds(self, targets: NodeTargets) -> Tensor:
        """The training seeds ``[n_train]`` (row ids of ``targets``), in id order."""
        return self.is_train_seed(targets).nonzero().flatten()

    def seed_nodes(self, seeds: Tensor) -> Tensor:
        """The nodes whose output rows a step on ``seeds`` needs (node tasks: the seeds)."""
        return seeds

    def excluded_edges(self, seeds: Tensor) -> Tensor | None:
        """Edge ids a step on ``seeds`` must not sample (node tasks: none)."""
        return None

    def loss_sum(self, out: Tensor, target: Tensor, weight: Tensor | None = None) -> Tensor:
        """Sum over seeds of the per-seed loss of ``out [n, out_dim]`` against ``target``
        (each weighted by ``weight [n]`` when given)."""
        raise NotImplementedError

    def statistics(self, out: Tensor, target: Tensor) -> Tensor:
        """float64 ``[len(self.statistic_names)]`` summable statistics of these rows (on CPU)."""
        raise NotImplementedError

    statistic_names: ClassVar[tuple[str, ...]] = ()

    def metric_values(self, stats: Tensor) -> dict[str, float]:
        """``{metric: value}`` from statistics summed over every rank."""
        raise NotImplementedError


def split_statistics(
    task: NodeTask,
    out: Tensor,
    targets: NodeTargets,
    splits: tuple[str, ...],
    within: Tensor | None = None,
) -> Tensor:
    """float64 ``[len(splits), k]``: ``task.statistics`` of the rows of ``targets`` in each
    split (restricted to the rows ``within``, a bool mask, when given), ``out`` holding one
    output row per row of ``targets``. What every system's evaluation returns for the caller to
    sum over ranks."""
    rows = {}
    for split in splits:
        rows[split] = targets.split(split) if within is None else targets.split(split) & within
    return row_statistics(task, out, targets.target, rows, splits)


def row_statistics(
    task: NodeTask, out: Tensor, target: Tensor, rows: Mapping[str, Tensor], splits: tuple[str, ...]
) -> Tensor:
    """float64 ``[len(splits), k]``: ``task.statistics`` of the rows ``rows[split]`` (a bool mask
    or positions into ``out`` and ``target``) of each split."""
    return torch.stack(
        [task.statistics(out[rows[split]], target[rows[split]]) for split in splits]
    ).reshape(len(splits), len(task.statistic_names))
