"""``GSplitStrategy``: DDP for gradients plus the split-parallel row shuffle before each layer."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import Tensor
from typing_extensions import override

from ...comm import Comm
from ...contract import LayerHook, ModuleRuntime
from ...kit.strategies import MeteredDDPStrategy
from .config import GSplitConfig
from .datamodule import SplitBatch
from .sampler import shuffle


def shuffle_hook(comm: Comm) -> Callable[[SplitBatch], LayerHook]:
    """``make(batch) -> hook(i, h)``: before layer ``i``, move the owners' rows ``h``
    (``[|D|, d]``) to the ranks that consume them (``[|M|, d]``) along ``batch.plans[i]``, and
    record the rows and bytes this rank receives in ``batch.traffic``. After the last layer
    (``i == num_layers``, :class:`~.datamodule.EndpointShuffleGNN`) link prediction's plan
    moves the output rows to the ranks whose pairs score them; a batch without that plan (node
    tasks) keeps its rows."""

    def make(batch: SplitBatch) -> LayerHook:
        def hook(i: int, h: Tensor) -> Tensor:
            if i == len(batch.plans):
                return h
            plan = batch.plans[i]
            row_bytes = math.prod(h.shape[1:]) * h.element_size()  # also when h has no rows
            batch.traffic.record(i, plan.rows_from_others(comm.rank), row_bytes)
            return shuffle(h, plan, comm, layer=i)

        return hook

    return make


class GSplitStrategy(MeteredDDPStrategy):
    """Before every layer, rows move from their owners to the ranks that consume them.

    Input features before layer 0 are metered as ``feature``, hidden rows later as
    ``activation``; they move on the dedicated data-exchange group (never interleaved with
    DDP's gradient buckets), and autograd returns the gradient rows (``activation_grad``).
    Gradients are summed by the metered DDP hook, the loss being the sum over each rank's
    targets divided by the global mini-batch size: exact. The module must apply the layer hook
    (:class:`~lightning_gnnscale.models.module.GNNModule` does).

    Args: as :class:`~...kit.strategies.MeteredDDPStrategy` (``config``: a :class:`GSplitConfig`).
    """

    config_type = GSplitConfig
    requires_layer_hook = True

    @override
    def module_runtime(self) -> ModuleRuntime:
        return ModuleRuntime(self.context, layer_hook=shuffle_hook(self.comm))

    @override
    def training_step(self, *args, **kwargs):
        """The module's step; a link-prediction batch whose output rows never moved (a net
        that does not call the hook after its last layer) is refused: its pairs would score
        other nodes' rows."""
        loss = super().training_step(*args, **kwargs)
        batch = args[0] if args else kwargs.get("batch")
        if isinstance(batch, SplitBatch) and not all(batch.traffic.recorded):
            raise RuntimeError(
                "strategy=gsplit: the net did not run the layer hook before every layer and, "
                "for link prediction, after its last one (layer_hook(num_layers, out)); build "
                "it with GNNModule.from_config(model, datamodule) (GSplitDataModule.build_model "
                "gives an EndpointShuffleGNN)"
            )
        return loss
