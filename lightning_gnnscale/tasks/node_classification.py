"""Node classification: the dataset's labels ``[N]``; cross-entropy; accuracy."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from . import TASKS
from .base import NodeTask


class NodeClassification(NodeTask):
    """Labels ``[N]`` (``-1``: unlabelled), a head of ``num_classes``, the sum of per-seed
    cross-entropies, and accuracy (statistics: correct, count)."""

    spec = TASKS["node_classification"]
    statistic_names = ("correct", "count")

    def out_dim_of(self, meta: Mapping) -> int:
        return int(meta["num_classes"])

    def target_shape(self, rows: int, meta: Mapping) -> tuple[int, ...]:
        return (rows,)

    def loss_sum(self, out: Tensor, target: Tensor, weight: Tensor | None = None) -> Tensor:
        if weight is None:
            return F.cross_entropy(out, target, reduction="sum")
        return (F.cross_entropy(out, target, reduction="none") * weight).sum()

    def statistics(self, out: Tensor, target: Tensor) -> Tensor:
        correct = (out.argmax(1).cpu() == target.cpu()).sum()
        return torch.stack(
            [correct.to(torch.float64), torch.tensor(target.shape[0], dtype=torch.float64)]
        )

    def metric_values(self, stats: Tensor) -> dict[str, float]:
        return {"acc": float(stats[0] / stats[1].clamp(min=1))}
