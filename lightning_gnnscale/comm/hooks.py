"""A metered DDP comm hook, so gradient all-reduce traffic is counted as ``gradient`` bytes.

Lightning registers ``ddp_comm_hook`` only on CUDA; CPU strategies call
``register_metered_ddp_hook`` themselves in ``configure_ddp()``. The hook's all-reduce goes
through ``Comm.all_reduce`` on DDP's own process group, so the audit sees it and the meter
counts it (ring model, per bucket; every parameter is in exactly one bucket per step).

A bucket's sum depends on where each gradient sits in it (gloo's and NCCL's all-reduce add a
buffer's chunks in different rank orders), and DDP rebuilds its buckets once, after its first
backward. A resumed run's DDP starts over from its initial buckets: :func:`ddp_bucket_layout`
is the layout to checkpoint, and ``GradientHookState.resume_layout`` makes the first
reduction sum in it (docs/architecture.md, "Gradient buckets and resume").
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
import warnings
from dataclasses import dataclass, field

import torch
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
    ``resume_layout`` (buckets as parameter positions, :func:`ddp_bucket_layout` of the run a
    checkpoint came from): the first reduction sums in it instead of DDP's initial bucket.
    ``positions``: ``id(parameter) -> position`` in ``ddp.parameters()`` (set on registration).
    """

    comm: Comm
    scale: float | None = None
    resume_layout: list[list[int]] | None = None
    positions: dict[int, int] = field(default_factory=dict)


def _reduce(state: GradientHookState, buffer: Tensor) -> Future[Tensor]:
    """The metered SUM of ``buffer`` over ranks (scaled, or averaged for ``scale=None``)."""
    if state.scale is not None:
        buffer.mul_(state.scale)
    future = state.comm.all_reduce(buffer, "sum", category="gradient", async_op=True)
    if state.scale is not None:
        return future
    world_size = state.comm.world_size
    return future.then(lambda fut: fut.value().div_(world_size))


def _reduce_in_layout(
    state: GradientHookState, bucket: GradBucket, positions: list[int], layout: list[list[int]]
) -> Future[Tensor]:
    """``bucket`` (holding the parameters at ``positions``) reduced as the buckets of
    ``layout`` would be: one flat buffer per layout bucket, in its order; the sums go back
    into ``bucket``'s buffer."""
    grads = dict(zip(positions, bucket.gradients(), strict=True))  # views of the buffer
    flats = [torch.cat([grads[j].flatten() for j in members]) for members in layout]
    futures = [_reduce(state, flat) for flat in flats]
    buffer = bucket.buffer()

    def write_back(_: Future) -> Tensor:
        for members, future in zip(layout, futures, strict=True):
            reduced = future.value()
            offset = 0
            for j in members:
                grad = grads[j]
                grad.copy_(reduced[offset : offset + grad.numel()].view_as(grad))
                offset += grad.numel()
        return buffer

    return torch.futures.collect_all(futures).then(write_back)


def metered_allreduce_hook(state: GradientHookState, bucket: GradBucket) -> Future[Tensor]:
    """DDP comm hook: asynchronous metered all-reduce of one gradient bucket."""
    layout, state.resume_layout = state.resume_layout, None
    if layout is not None:
        positions = [state.positions[id(p)] for p in bucket.parameters()]
        regrouped = sorted(j for members in layout for j in members)
        # DDP's initial bucket holds every parameter; the checkpointed run's are a regrouping
        if sorted(positions) != regrouped:
            warnings.warn(
                "DDP starts with several gradient buckets: the checkpoint's bucket layout is "
                "not used, so the resumed run's first step may differ in the last bits",
                stacklevel=1,
            )
        elif layout != [positions]:
            return _reduce_in_layout(state, bucket, positions, layout)
    return _reduce(state, bucket.buffer())


def ddp_bucket_layout(ddp_model: DistributedDataParallel) -> list[list[int]]:
    """``ddp_model``'s gradient buckets, each as its parameters' positions in
    ``ddp_model.parameters()``, in bucket order: the layout its next backward reduces in.
    After the first backward DDP rebuilds its buckets now (its next forward would, the same
    way; every rank must call this, as the rebuild syncs rank 0's layout)."""
    ddp_model.reducer._rebuild_buckets()
    positions = {id(p): i for i, p in enumerate(ddp_model.parameters())}
    return [
        [positions[id(p)] for p in bucket.parameters()]
        for bucket in ddp_model.reducer._get_zeros_like_grad_buckets()
    ]


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
    state.positions = {id(p): i for i, p in enumerate(ddp_model.parameters())}
    ddp_model.register_comm_hook(state, metered_allreduce_hook)
    return state
