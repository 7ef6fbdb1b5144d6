"""``SancusDataModule``: this rank's row block, one full-graph batch per epoch (spec §4.4)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

from ...graph.batch import Batch
from ...graph.csc import Graph
from ..base import GNNDataModule, assert_same_on_all_ranks, collective_train_loader
from .layout import row_blocks
from .policy import StalenessPolicy
from .runtime import SkipBroadcast


@dataclass(frozen=True)
class SancusPrepared:
    """The graph relabelled into row-block order and the ``[P + 1]`` row-block boundaries."""

    graph: Graph
    offsets: torch.Tensor
    report: dict


class SancusDataModule(GNNDataModule):
    """Rank ``i`` keeps ``Â_i*`` (CSR per column block), ``X_i``, ``y_i`` and its masks; the
    :class:`SkipBroadcast` runtime (shared with the net) holds the caches.

    Each training batch is the whole own block: ``Batch([row blocks], X_i, y of own train rows,
    global train count)``. Evaluation is the exact stateless distributed forward.
    """

    def __init__(self, prepared: SancusPrepared, policy: StalenessPolicy, num_layers: int):
        super().__init__()
        self.prepared = prepared
        graph = prepared.graph
        self.input_dim, self.num_classes = graph.num_features, graph.num_classes
        self.runtime = SkipBroadcast(policy, num_layers)
        self.train_count = int(graph.train_mask.sum())
        self.layout = None

    def setup(self, stage: str) -> None:
        if self.layout is not None:
            return
        trainer = self.trainer
        rank, world = trainer.global_rank, trainer.world_size
        offsets = self.prepared.offsets
        if offsets.numel() - 1 != world:
            raise ValueError(f"row blocks for {offsets.numel() - 1} ranks, world size {world}")
        comm = trainer.strategy.comm
        assert_same_on_all_ranks(comm, offsets, "the SANCUS row blocks")
        graph = self.prepared.graph
        lo, hi = int(offsets[rank]), int(offsets[rank + 1])
        device = trainer.strategy.root_device  # the runtime multiplies on the model's device
        self.layout = row_blocks(graph, offsets, rank).to(device)
        self.x, self.y = graph.x[lo:hi].to(device), graph.y[lo:hi].to(device)
        self.masks = {
            s: getattr(graph, f"{s}_mask")[lo:hi].to(device) for s in ("train", "val", "test")
        }
        self.runtime.attach(comm, self.layout)

    @property
    def steps_per_epoch(self) -> int:
        return 1

    def make_batch(self, epoch: int, step: int) -> Batch:
        stats = {"sample_s": 0.0, "load_s": 0.0, "input_nodes": self.x.shape[0]}
        y = self.y[self.layout.seed_rows]
        return Batch([self.layout], self.x, y, self.train_count, epoch, step, stats)

    def train_dataloader(self) -> DataLoader:
        return collective_train_loader(self)

    def eval_counts(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        pred = net.exact_logits(self.x).argmax(1)
        counts = torch.zeros(len(splits), 2, dtype=torch.float64)
        for k, split in enumerate(splits):
            mask = self.masks[split]
            counts[k, 0] = (pred[mask] == self.y[mask]).sum()
            counts[k, 1] = mask.sum()
        return counts
