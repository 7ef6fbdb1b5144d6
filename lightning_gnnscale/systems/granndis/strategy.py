"""``GraNNDISStrategy``: DDP for gradients plus the halo exchange of one-hop graphs before every
layer (docs/systems/granndis.md)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor
from typing_extensions import override

from ...comm import Comm, exchange_rows
from ...comm.hierarchical import ServerGroups
from ...contract import LayerHook, ModuleRuntime
from ...errors import ConfigError
from ...graph.batch import Batch
from ...kit.strategies import MeteredDDPStrategy
from .config import GraNNDISConfig


def halo_hook(comm: Comm) -> Callable[[Batch], LayerHook | None]:
    """``make(batch) -> hook(i, h)``: before layer ``i``, append to the owned rows ``h``
    (``[n_owned, d]``) the halo rows their owners send along the layer's plan
    (``batch.plan.layer_input``), giving the layer's source rows ``[n_owned + n_halo, d]``.
    Layer 0 moves input rows (``feature``), later layers hidden rows (``activation``);
    autograd returns their gradients (``activation_grad``). Each exchange's start and end
    times go to ``batch.stats["exchange_marks"]`` (for the modelled epoch time's phases).
    Batches without a plan (``mb_base``) get no hook."""

    def make(batch: Batch) -> LayerHook | None:
        step = getattr(batch, "plan", None)
        if step is None:
            return None

        marks = batch.stats.setdefault("exchange_marks", [])

        def hook(i: int, h: Tensor) -> Tensor:
            plan, h = step.layer_input(i, h)
            category = "feature" if i == 0 else "activation"
            start = time.perf_counter()
            halo = exchange_rows(
                h, plan.send_index, plan.send_splits, plan.recv_splits, comm, category
            )
            marks.append((start, time.perf_counter()))
            return torch.cat([h, halo])

        return hook

    return make


class GraNNDISStrategy(MeteredDDPStrategy):
    """Halo rows move on the dedicated data-exchange group before every layer (server
    layouts only between the ranks of one server, so only gradients cross servers). The
    parameter gradients are summed (the loss is divided by the step's global target count)
    by the metered DDP hook (``grad_sync=ddp``), or, with ``grad_sync=hierarchical``, without
    the DDP wrapper after backward: one flat :meth:`ServerGroups.all_reduce` (``gradient``;
    refuses ``accumulate_grad_batches > 1``, whose accumulated ``.grad`` it would sum again).

    Args: as :class:`~...kit.strategies.MeteredDDPStrategy` (``config``: a :class:`GraNNDISConfig`).
    """

    config_type = GraNNDISConfig
    requires_layer_hook = True

    server_groups: ServerGroups | None = None

    @override
    def module_runtime(self) -> ModuleRuntime:
        return ModuleRuntime(self.context, layer_hook=halo_hook(self.comm))

    @override
    def configure_ddp(self) -> None:
        if self.system_config.grad_sync == "ddp":
            super().configure_ddp()
            return
        accumulate = self.lightning_module.trainer.accumulate_grad_batches
        if accumulate != 1:
            raise ConfigError(
                f"strategy.grad_sync=hierarchical does not support Trainer("
                f"accumulate_grad_batches={accumulate}): the gradients are summed over ranks "
                "after every backward, so an accumulated .grad would be summed again; use "
                "grad_sync=ddp"
            )
        self.broadcast_initial_weights()  # no DDP wrapper: post_backward sums the gradients
        comm = self.comm
        self.server_groups = ServerGroups(comm.meter, comm.topology, comm.rank, comm.timeout)

    @override
    def post_backward(self, closure_loss: Tensor) -> None:
        if self.server_groups is None:
            return
        params = [p for p in self.lightning_module.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.flatten() for g in grads])
        self.server_groups.all_reduce(flat, category="gradient")
        offset = 0
        for param, grad in zip(params, grads, strict=True):
            param.grad = flat[offset : offset + grad.numel()].view_as(param).clone()
            offset += grad.numel()
