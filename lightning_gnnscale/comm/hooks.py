"""A metered DDP comm hook, so gradient all-reduce traffic is counted as ``gradient`` bytes.

Lightning registers ``ddp_comm_hook`` only on CUDA; CPU strategies call
``register_metered_ddp_hook`` themselves in ``configure_ddp()``. The hook's all-reduce goes
through ``Comm.all_reduce`` on DDP's own process group, so the audit sees it and the meter
counts it (ring model, per bucket; every parameter is in exactly one bucket per step).
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
from dataclasses import dataclass

from torch import Tensor
from torch.distributed import GradBucket
from torch.futures import Future
from torch.nn.parallel import DistributedDataParallel

from lightning_gnnscale.comm.collectives import Comm


@dataclass
class GradientHookState:
    """What the hook needs: a ``Comm`` on DDP's group and how to scale the summed gradient.

    ``scale=None`` averages (SUM, then divide by world size: DDP's default result). A float
    multiplies each local bucket by ``scale`` before the SUM and does not divide (e.g. a
    Grappa coverage factor ``c / n_active``); strategies may update it every step.
    """

    comm: Comm
    scale: float | None = None


def metered_allreduce_hook(state: GradientHookState, bucket: GradBucket) -> Future[Tensor]:
    """DDP comm hook: asynchronous metered all-reduce of one gradient bucket."""
    buffer = bucket.buffer()
    if state.scale is not None:
        buffer.mul_(state.scale)
    future = state.comm.all_reduce(buffer, "sum", category="gradient", async_op=True)
    if state.scale is not None:
        return future
    world_size = state.comm.world_size
    return future.then(lambda fut: fut.value().div_(world_size))


def register_metered_ddp_hook(
    ddp_model: DistributedDataParallel, comm: Comm | GradientHookState
) -> GradientHookState:
    """Register ``metered_allreduce_hook`` on ``ddp_model``; return its (mutable) state.

    Given a ``Comm``, the hook shares its meter and topology but runs on DDP's process group,
    so gradient buckets never interleave with the data-exchange group's collectives."""
    state = (
        comm
        if isinstance(comm, GradientHookState)
        else GradientHookState(comm.with_group(ddp_model.process_group))
    )
    ddp_model.register_comm_hook(state, metered_allreduce_hook)
    return state
