"""``HopGNNStrategy``: the process group without DDP's wrapper; a training step runs the
iteration's time steps, migrating model state between them, and sums the gradients once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from typing_extensions import override

from ...comm import Comm, exchange_rows
from ...graph.batch import Batch
from ...kit.strategies import MeteredDDPStrategy
from .config import HopGNNConfig
from .datamodule import HopGNNBatch, LinkStepBatch


class HopGNNStrategy(MeteredDDPStrategy):
    """Micrograph training with migrating replicas, exactly synchronous data parallelism.

    A :class:`~.datamodule.HopGNNBatch` of ``T`` kept steps runs inside one Lightning training
    step (automatic optimisation, so any module that takes a :class:`Batch` works; see
    :func:`run_iteration`): for ``j < T - 1`` the module's ``training_step`` on micrograph set
    ``j`` (loss = sum of root losses / global seed count) and its gradient, added to the hosted
    replica's accumulator ``[|theta|]``; the step barrier; the migration (``payload``: the
    parameters and/or the accumulator as one flat message to the next server, ``parameter``
    bytes). The last set's loss is returned, Lightning runs its backward, and ``post_backward``
    adds the accumulator and sums the gradients over ranks in one flat all-reduce
    (``gradient``) before the optimiser step. Every root is trained once with weight
    ``1 / global count``, so the update equals ``single`` / ``ddp`` on the same global
    mini-batch.

    Refused (in ``setup_environment``, before the process group starts): Lightning's
    ``accumulate_grad_batches > 1`` (``post_backward`` would all-reduce ``.grad``, which still
    holds the previous micro-batch's summed gradient, plus the accumulator: a wrong sum) and a
    precision plugin with a gradient scaler (``16-mixed``: only the last step's backward is
    scaled, the accumulated steps ``j < T - 1`` are not); see :func:`check_trainer_settings`.
    ``on_after_backward`` sees only the last time step's local gradient (the accumulator and the
    all-reduce come after it).

    Args: as :class:`~...kit.strategies.MeteredDDPStrategy`; ``config`` (a :class:`HopGNNConfig`)
    defaults to the DataModule's.
    """

    config_type = HopGNNConfig

    def __init__(self, config: HopGNNConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        self._accumulator: torch.Tensor | None = None  # the last step's replica's, see below

    @override
    def setup_environment(self) -> None:
        module = self.lightning_module  # None until a Trainer connects one
        if module is not None:
            check_trainer_settings(module.trainer.accumulate_grad_batches, self.precision_plugin)
        super().setup_environment()

    @override
    def configure_ddp(self) -> None:
        self.broadcast_initial_weights()  # no DDP wrapper: no per-backward all-reduce

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.lightning_module.parameters() if p.requires_grad]

    @override
    def training_step(self, *args, **kwargs):
        batch, *rest = args
        if not isinstance(batch, HopGNNBatch):
            return super().training_step(*args, **kwargs)
        parent = super().training_step
        module, comm = self.lightning_module, self.comm

        def step_loss(sub: Batch) -> torch.Tensor:
            if not isinstance(sub, LinkStepBatch):
                return parent(sub, *rest, **kwargs)
            with exchanged_outputs(module, sub, comm):
                return parent(sub, *rest, **kwargs)

        loss, self._accumulator = run_iteration(
            batch, comm, self._params(), step_loss, self.system_config
        )
        return loss

    @override
    def post_backward(self, closure_loss: torch.Tensor) -> None:
        sum_gradients(self.comm, self._params(), self._accumulator)
        self._accumulator = None


def check_trainer_settings(accumulate_grad_batches: int, precision_plugin: object) -> None:
    """Refuse the Trainer settings HopGNN's training step cannot honour (``ValueError``).

    - ``accumulate_grad_batches > 1``: ``post_backward`` sums ``.grad`` + the accumulator over
      ranks after every backward; with accumulation ``.grad`` still holds the previous
      micro-batch's already summed gradient, so it would be summed again (a wrong update).
    - a precision plugin with a gradient scaler (``precision="16-mixed"``): Lightning scales
      only the loss it runs the backward of (the last time step); the gradients of steps
      ``j < T - 1`` (``torch.autograd.grad`` in :func:`run_iteration`) would be unscaled and
      then divided by the scale at the optimiser step.
    """
    if accumulate_grad_batches != 1:
        raise ValueError(
            f"HopGNNStrategy does not support Trainer(accumulate_grad_batches="
            f"{accumulate_grad_batches}): the gradients are summed over ranks after every "
            "backward, so an accumulated .grad would be summed again; use a larger "
            "data.batch_size instead"
        )
    if getattr(precision_plugin, "scaler", None) is not None:
        raise ValueError(
            f"HopGNNStrategy does not support a precision plugin with a gradient scaler "
            f"({type(precision_plugin).__name__}, precision="
            f"{getattr(precision_plugin, 'precision', '?')!r}): only the last time step's "
            "loss would be scaled, the earlier steps' gradients would not; use "
            "precision='bf16-mixed' or full precision"
        )


@contextmanager
def exchanged_outputs(module: torch.nn.Module, sub: LinkStepBatch, comm: Comm) -> Iterator[None]:
    """While the module runs its training step on ``sub`` (link prediction), its output rows
    ``[n, d]`` (``module(sub)``, a forward hook) come back with the rows this rank receives
    appended: the endpoint rows of its pairs that other servers computed, through one
    differentiable :func:`~...comm.exchange_rows` (``activation`` bytes forward,
    ``activation_grad`` back; every rank takes part at every step, also with no rows).
    Raises ``RuntimeError`` unless the module called itself on ``sub`` exactly once: a step
    that computes its rows another way never receives them."""
    calls = []

    def hook(_module, args, output):
        if not args or not isinstance(args[0], LinkStepBatch):  # ``sub``, or a converted copy
            return output
        calls.append(1)
        received = exchange_rows(output, sub.send_index, sub.send_splits, sub.recv_splits, comm)
        return torch.cat([output, received])

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
    if len(calls) != 1:
        raise RuntimeError(
            f"HopGNN under link prediction appends the rows of a pair's far endpoint to the "
            f"module's output rows (a forward hook on {type(module).__name__}), but its "
            f"training step called it {len(calls)} times on the step's batch: compute the "
            "output rows once with self(batch), as GNNModule does"
        )


def flat_numel(params: list[torch.nn.Parameter]) -> int:
    return sum(p.numel() for p in params)


def run_iteration(
    batch: HopGNNBatch,
    comm: Comm,
    params: list[torch.nn.Parameter],
    step_loss: Callable[[Batch], torch.Tensor],
    config: HopGNNConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kept time steps of ``batch`` on this rank; return the last step's loss and the
    gradient accumulator ``[|theta|]`` of the replica this rank hosts at the last step.

    Step ``j < T - 1``: ``step_loss(micrograph set)`` and its gradient, added to the
    accumulator (an empty set computes nothing), the step barrier (``barrier_per_step``), then
    the migration to step ``j + 1`` (:func:`migrate`). The caller runs the last loss's backward
    and :func:`sum_gradients` (which adds the accumulator). The accumulator is kept apart from
    ``.grad`` because Lightning zeroes ``.grad`` between the training step and its backward.
    The last loss is a zero connected to ``params`` when its set is empty. Collective: every
    rank runs the same number of steps and migrations. Under link prediction no set is
    ``None`` (an empty one still runs, so that every rank takes part in each step's row
    exchange, forward and backward).
    """
    last = len(batch.steps) - 1
    accumulator = params[0].new_zeros(flat_numel(params))
    loss = None
    for j, sub in enumerate(batch.steps):
        if j > 0:
            accumulator = migrate(comm, params, accumulator, config.payload, *batch.hops[j - 1])
        loss = step_loss(sub) if sub is not None else sum(p.sum() * 0 for p in params)
        if j < last:
            if sub is not None:
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                accumulator += torch.cat(
                    [
                        (g if g is not None else torch.zeros_like(p)).flatten()
                        for g, p in zip(grads, params)
                    ]
                )
            if config.barrier_per_step:
                comm.barrier()
    assert loss is not None, "an iteration has at least one time step"
    return loss, accumulator


def migrate(
    comm: Comm,
    params: list[torch.nn.Parameter],
    accumulator: torch.Tensor,
    payload: str,
    send_to: int,
    recv_from: int,
) -> torch.Tensor:
    """Send the hosted replica's state to ``send_to`` and take ``recv_from``'s: one flat message
    each way (``all_to_all_single`` with one non-empty chunk, ``parameter`` bytes); return the
    accumulator this rank continues with.

    ``payload``: ``params+grads`` | ``params`` | ``grads`` | ``none`` (nothing moves). A
    received gradient accumulator replaces the local one (it travels with its replica);
    received parameters are the same values as the local ones (replicas are identical within
    an iteration) and are copied in.
    """
    if payload == "none" or not comm.is_distributed:
        return accumulator
    with_params = payload in ("params+grads", "params")
    with_grads = payload in ("params+grads", "grads")
    parts = [p.detach().flatten() for p in params] if with_params else []
    if with_grads:
        parts.append(accumulator)
    flat = torch.cat(parts)
    send, recv = [0] * comm.world_size, [0] * comm.world_size
    send[send_to], recv[recv_from] = flat.numel(), flat.numel()
    got = comm.all_to_all_single(flat, send, recv, category="parameter")
    offset = 0
    if with_params:
        with torch.no_grad():
            for p in params:
                p.copy_(got[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
    return got[offset:].clone() if with_grads else accumulator


def sum_gradients(
    comm: Comm, params: list[torch.nn.Parameter], accumulator: torch.Tensor | None = None
) -> None:
    """Replace every gradient by its sum over ranks (plus this rank's ``accumulator``
    ``[|theta|]``, if given): one flat ``all_reduce`` (``gradient``)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.flatten() for g in grads])
    if accumulator is not None:
        flat = flat + accumulator
    flat = comm.all_reduce(flat, category="gradient")
    offset = 0
    for param, grad in zip(params, grads):
        param.grad = flat[offset : offset + grad.numel()].view_as(param).clone()
        offset += grad.numel()
