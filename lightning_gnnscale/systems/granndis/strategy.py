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

        endpoints = getattr(batch, "endpoints", None)
        if endpoints is not None:  # link prediction: the step's endpoint rows, after the net

            def finish(h: Tensor) -> Tensor:
                start = time.perf_counter()
                rows = endpoints.rows(h, comm)
                marks.append((start, time.perf_counter()))
                return rows

            hook.finish = finish
        return hook

    return make


def finish_rows(module: torch.nn.Module, args, kwargs, output: Tensor) -> Tensor:
    """Forward hook on the net: a layer hook with a ``finish`` (link prediction's
    :class:`~.link.EndpointRows`) turns the last layer's rows into the step's endpoint rows
    (which ``Batch.y`` indexes); any other call returns the output as it is."""
    hook = kwargs.get("layer_hook", args[2] if len(args) > 2 else None)
    finish = getattr(hook, "finish", None)
    return output if finish is None else finish(output)


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

    _finish_handle = None

    @override
    def module_runtime(self) -> ModuleRuntime:
        """The halo hook; and on the module's net (once) the forward hook that gives link
        prediction's steps their endpoint rows (:func:`finish_rows`)."""
        net = getattr(self.lightning_module, "net", None)
        if not isinstance(net, torch.nn.Module):
            trainer = getattr(self.lightning_module, "_trainer", None)
            if getattr(getattr(trainer, "datamodule", None), "is_link", False):
                raise ConfigError(
                    "GraNNDIS's link prediction turns the net's last rows into the step's "
                    "endpoint rows through a hook on the LightningModule's `net`; this "
                    f"{type(self.lightning_module).__name__} has none: use gs.GNNModule"
                )
        elif self._finish_handle is None:
            self._finish_handle = net.register_forward_hook(finish_rows, with_kwargs=True)
        return ModuleRuntime(self.context, layer_hook=halo_hook(self.comm))

    @override
    def teardown(self) -> None:
        if self._finish_handle is not None:
            self._finish_handle.remove()
            self._finish_handle = None
        super().teardown()

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
