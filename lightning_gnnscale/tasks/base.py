"""The task interface every system trains through (docs/architecture.md, "Tasks")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from ..errors import ConfigError
from ..graph.node_targets import NodeDataset, NodeTargets
from .spec import TaskSpec


class NodeTask:
    """A task whose targets are per-node rows (:class:`~..graph.node_targets.NodeTargets`).

    A system never interprets its :class:`NodeTargets`: it selects the rows of the nodes it
    holds, carries a step's seed rows' ``target`` in ``Batch.y`` and hands evaluation this
    task's :func:`split_statistics` over its own rows. A task's evaluation is a vector of *summable* statistics per split (classification:
    correct, count; regression: squared-error sum, absolute-error sum, count), so a system sums
    them across ranks (one ``all_reduce``) and :meth:`metric_values` turns the sums into metrics.

    A step's seeds are ids into the task's training seeds (:meth:`train_seeds`: nodes for a
    node task, training pairs for link prediction). :meth:`step_rows` turns a rank's share of
    them into the nodes whose output rows it needs and the targets of its loss terms, and
    :meth:`training_structure` is the CSC its blocks are sampled on; node tasks: the seeds,
    their rows of ``targets``, the graph's own edges.
    """

    spec: ClassVar[TaskSpec]
    # the weight initialisation of the suite's layers when model.init is unset (BlockGNN's)
    default_init: ClassVar[str] = "torch"

    def __init__(self, config: Any = None):
        self.config = config  # the run's TaskConfig (None: the defaults)

    @property
    def name(self) -> str:
        return self.spec.name

    def prepare(self, dataset: NodeDataset, seed: int) -> NodeTargets:
        """This task's rows for every node of ``dataset`` (default: the dataset's own, which
        must be :meth:`labelled`)."""
        return self.labelled(dataset).targets

    def labelled(self, dataset: NodeDataset) -> NodeDataset:
        """``dataset``, refused (``ConfigError``) when it has no classes: a graph built from an
        edge-only spec, whose nodes come from the edges, has nothing a node task trains on."""
        if dataset.targets.out_dim == 0 and not dataset.targets.target.is_floating_point():
            raise ConfigError(
                f"dataset {dataset.graph.name!r} has no labels (built from an edge-only spec: "
                f"nodes from the edges); task={self.name} needs a node table with a label "
                'column (docs/datasets.md, "Edge-only specs"); task=link_prediction trains on '
                "its edges"
            )
        return dataset

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

    def training_structure(self, graph, targets) -> tuple[Tensor, Tensor]:
        """``(indptr, indices)`` a training step's blocks are sampled on (node tasks: the
        graph's edges)."""
        return graph.indptr, graph.indices

    def training_edge_type(self, graph, targets) -> Tensor | None:
        """The relation of each edge of :meth:`training_structure` (node tasks: the graph's
        ``edge_type``; ``None``: homogeneous)."""
        return graph.edge_type

    def message_relations(self, graph) -> tuple[str, ...]:
        """The relations messages pass over, what an RGCN layer has weights for (node tasks:
        the graph's; link prediction adds inverse relations)."""
        return tuple(graph.relations)

    def step_rows(
        self, targets, seeds: Tensor, positions: Tensor, *, epoch: int, step: int
    ) -> tuple[Tensor, Tensor]:
        """``(nodes, y)`` of a rank's share ``seeds`` of a step (``positions``: their places
        in the step's global batch): the nodes whose output rows the loss needs, in the
        order of the net's output rows, and ``Batch.y`` (node tasks: the seeds and their
        rows of ``targets.target``)."""
        return seeds, targets.target.index_select(0, seeds)

    def partition_settings(self) -> dict[str, Any]:
        """The task's settings a partition directory's contents depend on, recorded in it and
        checked against a run (node tasks: none beyond the task's name)."""
        return {}

    def trained_head(self) -> torch.nn.Module | None:
        """The task's own parameters, trained with the net (the module registers them, so the
        optimiser, the gradient sync and the checkpoint carry them), or ``None`` (node tasks:
        none; the net's last layer is the head)."""
        return None

    def excluded_edges(self, targets, global_seeds: Tensor) -> Tensor | None:
        """Sorted int64 keys ``dst * N + src`` of the edges a step of ``global_seeds`` (all
        ranks' seeds) leaves out of its blocks, or ``None`` (node tasks: none)."""
        return None

    def check_step(self, batch_size: int) -> None:
        """Refuse a step of ``batch_size`` global seeds this task cannot hold (node tasks:
        any the data settings allow)."""

    def loss_terms(self, global_seeds: int) -> int:
        """The loss terms of a step of ``global_seeds`` seeds over all ranks: the loss
        denominator (node tasks: one per seed)."""
        return global_seeds

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
