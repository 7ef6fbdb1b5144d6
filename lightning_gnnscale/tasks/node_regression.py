"""Node regression: float targets ``[N, d]``; MSE; RMSE and MAE.

On a labelled dataset (``sbm``'s blocks, Cora's classes) the targets are synthetic
(:func:`synthetic_targets`): learnable from structure and features, deterministic from the
run's seed (docs/configuration.md, "Tasks")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch
from torch import Tensor

from ..graph.node_targets import NodeDataset, NodeTargets
from . import TASKS
from .base import NodeTask

TARGET_DIM = 1  # width of the synthetic target
NOISE = 0.1  # standard deviation of its noise


def synthetic_targets(dataset: NodeDataset, seed: int) -> Tensor:
    """float32 ``[N, TARGET_DIM]``: a fixed random linear map of each node's neighbourhood mean
    feature (itself and its in-neighbours), plus an offset of its class (its community on
    ``sbm``; none for unlabelled nodes), plus Gaussian noise ``NOISE``; every random draw
    from ``seed``. Computed in float64 from the features, so the targets do not depend on the
    run's dtype."""
    graph, labels = dataset.graph, dataset.targets.target
    gen = torch.Generator().manual_seed(seed)
    n, f = graph.num_nodes, graph.num_features
    weight = torch.randn(f, TARGET_DIM, generator=gen, dtype=torch.float64) / f**0.5
    offset = torch.randn(dataset.num_classes, TARGET_DIM, generator=gen, dtype=torch.float64)
    noise = torch.randn(n, TARGET_DIM, generator=gen, dtype=torch.float64) * NOISE
    x = graph.x.to(torch.float64)
    summed = x.clone().index_add_(0, graph.dst_of_edges(), x.index_select(0, graph.indices))
    mean = summed / (graph.in_degree() + 1).unsqueeze(1)
    labelled = labels >= 0
    community = torch.zeros(n, TARGET_DIM, dtype=torch.float64)
    community[labelled] = offset[labels[labelled]]
    return (mean @ weight + community + noise).to(torch.float32)


class NodeRegression(NodeTask):
    """Float targets ``[N, d]``, a head of ``d``, the sum of per-seed squared errors, and RMSE
    and MAE over every target element (statistics: squared-error sum, absolute-error sum,
    element count)."""

    spec = TASKS["node_regression"]
    statistic_names = ("squared_error", "absolute_error", "count")

    def prepare(self, dataset: NodeDataset, seed: int) -> NodeTargets:
        """:func:`synthetic_targets` over the dataset's splits when its targets are labels; a
        dataset whose targets are already floating is used as it is."""
        targets = self.labelled(dataset).targets
        if targets.target.is_floating_point():
            return targets
        return replace(targets, target=synthetic_targets(dataset, seed), out_dim=TARGET_DIM)

    def out_dim_of(self, meta: Mapping) -> int:
        return int(meta["target_dim"])

    def target_shape(self, rows: int, meta: Mapping) -> tuple[int, ...]:
        return (rows, self.out_dim_of(meta))

    def loss_sum(self, out: Tensor, target: Tensor, weight: Tensor | None = None) -> Tensor:
        per_seed = (out - target.to(out.dtype)).square().sum(1)
        return per_seed.sum() if weight is None else (per_seed * weight).sum()

    def statistics(self, out: Tensor, target: Tensor) -> Tensor:
        err = (out.cpu().to(torch.float64) - target.cpu().to(torch.float64)).flatten()
        return torch.stack(
            [err.square().sum(), err.abs().sum(), torch.tensor(err.numel(), dtype=torch.float64)]
        )

    def metric_values(self, stats: Tensor) -> dict[str, float]:
        count = stats[2].clamp(min=1)
        return {"rmse": float((stats[0] / count).sqrt()), "mae": float(stats[1] / count)}
