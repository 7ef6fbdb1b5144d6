"""``GNNModule``: the one LightningModule every strategy trains, for any node task.

Loss is the task's sum of per-seed losses divided by the step's *global* seed count, so the
per-rank gradients add up to the single-process gradient (docs/architecture.md, "One training step"); strategies therefore sum
gradients across ranks instead of averaging them. Reductions across ranks go through the
strategy's metered ``comm`` (category ``control``), never through Lightning's ``sync_dist``,
so every byte is counted; the epoch's train loss is reduced by ``callbacks.EpochStats``.
The metrics it logs (``val/<metric>``, ``test/<metric>``: the task's) are that reduction's
result, the same on every rank, so Lightning's advice to add ``sync_dist=True`` for them is
silenced.
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol

import lightning as L
import torch
from torch import nn

from ..config_types import ModelConfig
from ..contract import Evaluation, LayerHook, ModuleRuntime, Prediction, RuntimeAware
from ..errors import ConfigError
from ..graph.batch import Batch
from ..tasks import build_task
from ..tasks.base import NodeTask
from .gnn import BlockGNN

# val/<metric> and test/<metric> are summed over ranks through the metered comm before logging
warnings.filterwarnings(
    "ignore", message=r"It is recommended to use `self.log\('(val|test)/\w+', \.\.\., sync_dist"
)


class ModelBuilder(Protocol):
    """What :meth:`GNNModule.from_config` needs of a DataModule (every ``GNNDataModule``
    is one): the net for ``model``, sized for its data, with the system's own layers."""

    def build_model(self, model: ModelConfig) -> nn.Module: ...


class GNNModule(L.LightningModule):
    """A node task (:mod:`~lightning_gnnscale.tasks`) on sampled blocks: the task's loss and
    metrics over the net's output rows.

    Build it with :meth:`from_config` (the net and the optimiser from one
    :class:`~lightning_gnnscale.config_types.ModelConfig`, whose settings the strategy then checks
    against the system's rules), or from a net directly.

    ``self.log`` in this module (and subclasses) defaults ``batch_size`` to
    :attr:`batch_size`, the seeds of the step's batch: Lightning's own guess walks the batch's
    fields and finds the input rows (of HopGNN's iteration batch: its roots, the same for
    every time step).

    Args:
        net: a :class:`BlockGNN` or :class:`SubgraphModel`.
        optimizer: ``adam`` | ``adamw`` | ``sgd``.
        lr, weight_decay: optimiser settings.
        model_config: the settings ``net`` was built from (``from_config`` passes them);
            ``None``: the strategy checks what it can without them.
        task: the task's name or object (default ``node_classification``); it must be the
            DataModule's (``from_config`` takes the DataModule's). Its name is a
            hyperparameter, so ``load_from_checkpoint(path, net=...)`` comes back with it.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: str = "adam",
        lr: float = 0.01,
        weight_decay: float = 5e-4,
        model_config: ModelConfig | None = None,
        task: str | NodeTask | None = None,
    ):
        super().__init__()
        if model_config is not None and (optimizer, lr, weight_decay) != (
            model_config.optimizer,
            model_config.lr,
            model_config.weight_decay,
        ):
            raise ValueError(
                "optimizer, lr and weight_decay differ from model_config's; use "
                "GNNModule.from_config(model_config, datamodule)"
            )
        self.net = net
        self.task = build_task(task)
        head = self.task.trained_head()
        if head is not None:  # trained, synced and checkpointed with the net, in its dtype
            first = next(net.parameters(), None)
            self.head = head if first is None else head.to(first.dtype)
        self.optimizer_name, self.lr, self.weight_decay = optimizer, lr, weight_decay
        self.model_config = model_config or described(net, optimizer, lr, weight_decay)
        self.epoch_loss = torch.zeros(2, dtype=torch.float64)  # this rank's (loss sum, seeds)
        self.runtime: ModuleRuntime | None = None
        self.batch_size = 1  # seeds of the current step's batch (self.log's default batch_size)
        self.save_hyperparameters(ignore=["net", "model_config", "task"])  # plain values only
        # the task by name (a plain value, weights-only loadable): load_from_checkpoint
        # rebuilds it when no task is passed
        self.hparams["task"] = self.task.name

    @classmethod
    def from_config(cls, model: ModelConfig, datamodule: ModelBuilder) -> GNNModule:
        """The module ``model`` describes: its net built by ``datamodule`` (sized for its data,
        the system's own layers where it has them) and its optimiser settings. For a system's
        default model settings use ``config.model_config(...)``."""
        net = datamodule.build_model(model)
        return cls(
            net,
            model.optimizer,
            model.lr,
            model.weight_decay,
            model_config=model,
            task=datamodule.task,
        )

    def log(self, name: str, value: Any, *args, batch_size: int | None = None, **kwargs) -> None:
        """Lightning's ``log``, with ``batch_size`` defaulting to :attr:`batch_size`."""
        size = self.batch_size if batch_size is None else batch_size
        super().log(name, value, *args, batch_size=size, **kwargs)

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
        """The task's sum of per-seed losses of this rank's seeds (weighted by
        ``batch.seed_weight`` when the batch carries one)."""
        return self.task.loss_sum(self(batch), batch.y, batch.seed_weight)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if isinstance(batch, Batch):
            self.batch_size = max(batch.num_seeds, 1)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        self.batch_size = max(batch.num_seeds, 1)  # HopGNN runs one step per time step
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
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0):
        self.batch_size = 1  # one Evaluation: the metrics are over the whole graph

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0):
        self.batch_size = 1

    def validation_step(self, batch: Evaluation, batch_idx: int) -> None:
        self.log_metrics(batch.metrics(self.net, ("val", "test")))

    def test_step(self, batch: Evaluation, batch_idx: int) -> None:
        self.log_metrics(batch.metrics(self.net, ("test",)))

    def log_metrics(self, metrics: dict[str, dict[str, float]]) -> None:
        """Log ``{split: {metric: value}}`` as ``<split>/<metric>`` (the monitored validation
        metric in the progress bar)."""
        for split, values in metrics.items():
            for name, value in values.items():
                shown = split == "val" and name == self.task.spec.monitor
                self.log(f"{split}/{name}", value, prog_bar=shown, batch_size=1)

    def predict_step(self, batch: Prediction, batch_idx: int) -> dict[str, torch.Tensor]:
        """This rank's share of the requested nodes: ``{"node_ids": [n], "logits" or
        "embeddings": [n, d]}`` (see ``GNNDataModule.predict_on``)."""
        return batch.rows(self.net)

    # ------------------------------------------------------------------------- optimiser
    def configure_optimizers(self):
        optimizers = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
        if self.optimizer_name not in optimizers:
            raise ValueError(
                f"unknown optimizer {self.optimizer_name!r}; valid: {sorted(optimizers)}"
            )
        return optimizers[self.optimizer_name](
            self.parameters(), lr=self.lr, weight_decay=self.weight_decay
        )


def described(net: nn.Module, optimizer: str, lr: float, weight_decay: float) -> ModelConfig | None:
    """The :class:`ModelConfig` of a suite ``BlockGNN`` built directly (so the strategy can
    check the system's model rules); ``None`` for other nets."""
    if not isinstance(net, BlockGNN):
        return None
    try:
        return ModelConfig(
            net.kind,
            net.hidden,
            net.num_layers,
            net.dropout,
            net.heads,
            optimizer,
            lr,
            weight_decay,
            init=net.init,
        )
    except ConfigError:
        return None
