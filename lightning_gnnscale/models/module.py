"""``GNNModule``: the one LightningModule every strategy trains.

Loss is the sum of per-seed cross-entropies divided by the step's *global* seed count, so the
per-rank gradients add up to the single-process gradient (DESIGN §4); strategies therefore sum
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
        self.save_hyperparameters(ignore=["net"])

    # -------------------------------------------------------------------------- training
    def layer_hook(self, batch: Batch) -> LayerHook | None:
        """The strategy's between-layer hook for this batch (``None`` for plain systems)."""
        make_hook = getattr(self.trainer.strategy, "layer_hook", None) if self._trainer else None
        return make_hook(batch) if make_hook else None

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
    @property
    def comm(self):
        return self.trainer.strategy.comm

    def _evaluate(self, splits: tuple[str, ...]) -> dict[str, float]:
        counts = self.trainer.datamodule.eval_counts(self.net, splits)
        counts = self.comm.all_reduce(counts, category="control")
        return {s: float(c[0] / c[1].clamp(min=1)) for s, c in zip(splits, counts)}

    def validation_step(self, batch, batch_idx: int) -> None:
        acc = self._evaluate(("val", "test"))
        self.log("val/acc", acc["val"], prog_bar=True, batch_size=1)
        self.log("test/acc", acc["test"], batch_size=1)

    def test_step(self, batch, batch_idx: int) -> None:
        acc = self._evaluate(("test",))
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
