"""``GNNModule``: the one LightningModule every strategy trains.

Loss is the sum of per-seed cross-entropies divided by the step's *global* seed count, so the
per-rank gradients add up to the single-process gradient (docs/architecture.md, "One training step"); strategies therefore sum
gradients across ranks instead of averaging them. Reductions across ranks go through the
strategy's metered ``comm`` (category ``control``), never through Lightning's ``sync_dist``,
so every byte is counted; the epoch's train loss is reduced by ``callbacks.EpochStats``.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from ..graph.batch import Batch
from ..systems.contract import Evaluation, ModuleRuntime, RuntimeAware
from .gnn import LayerHook


class GNNModule(L.LightningModule):
    """Node classification on sampled blocks.

    Args:
        net: a :class:`BlockGNN` or :class:`SubgraphModel`.
        optimizer: ``adam`` | ``adamw`` | ``sgd``.
        lr, weight_decay: optimiser settings.
    """

    def __init__(
        self, net: nn.Module, optimizer: str = "adam", lr: float = 0.01, weight_decay: float = 5e-4
    ):
        super().__init__()
        self.net = net
        self.optimizer_name, self.lr, self.weight_decay = optimizer, lr, weight_decay
        self.epoch_loss = torch.zeros(2, dtype=torch.float64)  # this rank's (loss sum, seeds)
        self.runtime: ModuleRuntime | None = None
        self.save_hyperparameters(ignore=["net"])

    def configure_runtime(self, runtime: ModuleRuntime) -> None:
        """Called once by the strategy before training: keep the runtime, pass it on to a net
        that takes one (SANCUS's layers communicate themselves)."""
        self.runtime = runtime
        if isinstance(self.net, RuntimeAware):
            self.net.configure_runtime(runtime)

    # -------------------------------------------------------------------------- training
    def layer_hook(self, batch: Batch) -> LayerHook | None:
        """The strategy's between-layer hook for this batch (``None`` for plain systems)."""
        make_hook = self.runtime.layer_hook if self.runtime is not None else None
        return make_hook(batch) if make_hook is not None else None

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.net(batch.blocks, batch.x, layer_hook=self.layer_hook(batch))

    def loss_sum(self, batch: Batch) -> torch.Tensor:
        """Sum of per-seed cross-entropies of this rank's seeds (weighted by
        ``batch.seed_weight`` when the batch carries one)."""
        logits = self(batch)
        if batch.seed_weight is None:
            return F.cross_entropy(logits, batch.y, reduction="sum")
        return (F.cross_entropy(logits, batch.y, reduction="none") * batch.seed_weight).sum()

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        loss_sum = self.loss_sum(batch)
        loss = loss_sum / max(batch.global_seed_count, 1)
        self.epoch_loss += torch.tensor(
            [float(loss_sum.detach()), float(batch.num_seeds)], dtype=torch.float64
        )
        self.log(
            "train/step_loss",
            loss_sum.detach() / max(batch.num_seeds, 1),
            prog_bar=True,
            batch_size=max(batch.num_seeds, 1),
            on_step=True,
            on_epoch=False,
        )
        return loss

    def on_train_epoch_start(self) -> None:
        self.epoch_loss.zero_()

    # ------------------------------------------------------------------------ evaluation
    def validation_step(self, batch: Evaluation, batch_idx: int) -> None:
        acc = batch.accuracy(self.net, ("val", "test"))
        self.log("val/acc", acc["val"], prog_bar=True, batch_size=1)
        self.log("test/acc", acc["test"], batch_size=1)

    def test_step(self, batch: Evaluation, batch_idx: int) -> None:
        acc = batch.accuracy(self.net, ("test",))
        self.log("test/acc", acc["test"], batch_size=1)

    # ------------------------------------------------------------------------- optimiser
    def configure_optimizers(self):
        optimizers = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
        if self.optimizer_name not in optimizers:
            raise ValueError(
                f"unknown optimizer {self.optimizer_name!r}; valid: {sorted(optimizers)}"
            )
        return optimizers[self.optimizer_name](
            self.net.parameters(), lr=self.lr, weight_decay=self.weight_decay
        )
