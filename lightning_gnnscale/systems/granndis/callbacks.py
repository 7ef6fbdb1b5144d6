"""GraNNDIS's report callback: training bytes by link class and kind (forward, backward,
gradient, feature), redundancy ``rho``, the layout sizes and the modelled epoch time at the
paper's bandwidths (spec §6.4, §8.3 E1/E2)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import lightning as L
import torch
from typing_extensions import override

from ...comm import CATEGORIES, LINK_CLASSES, diff_snapshots, sum_snapshots
from ...contract import rank_context
from .costmodel import synchronised_epoch_time

# what each meter category is, in the paper's terms
KINDS = {
    "feature": "feature",
    "activation": "forward",
    "activation_grad": "backward",
    "gradient": "gradient",
}


@dataclass(frozen=True)
class LayoutSummary:
    """Sizes of this rank's layouts, for the report callback.

    Attributes:
        server_vertices: ``|V_s|`` summed over this rank's steps (each step's server graph),
            or the owned vertices for FB_base; counted once per server (by the head).
        owned_rows, halo_rows: this rank's rows summed over its steps.
    """

    server_vertices: int
    owned_rows: int
    halo_rows: int


@dataclass(frozen=True)
class LayoutReport:
    """What :class:`GraNNDISStats` reports of this rank's layouts
    (``GraNNDISDataModule.layout_report``, read at each epoch's end).

    Attributes:
        mode: ``config.mode``; ``num_nodes``: ``|V|``; ``steps_per_epoch``: co-batches.
        plan_bytes: bytes of this rank's plans (every step's).
        layout: this rank's :class:`LayoutSummary`; ``None`` without a layout (``mb_base``).
        preload_depth: FLX's ``k`` (``None`` in other modes); ``memory_by_k``:
            ``preload_auto``'s per-``k`` estimates in bytes (``None`` otherwise).
    """

    mode: str
    num_nodes: int
    steps_per_epoch: int
    plan_bytes: int
    layout: LayoutSummary | None
    preload_depth: int | None
    memory_by_k: list[float] | None


class GraNNDISStats(L.Callback):
    """Per-epoch training traffic of every rank (between each batch's start and end, so
    evaluation is excluded), reduced at the epoch end (one all-gather, ``control``). Reports
    only: nothing here decides a result.

    Kept in ``summary.json`` under ``system`` for the last epoch:

    - ``bytes_by_link``: ``{link class: {feature, forward, backward, gradient, other}}``
      bytes per epoch summed over ranks;
    - ``rho``: ``sum_s |V_s| / |V|`` over the steps of an epoch (1 for FB_base, the
      replication of preloading otherwise);
    - ``owned_rows``, ``halo_rows``: summed over ranks and steps; ``cobatches``: steps per epoch;
    - ``preload_depth``: FLX's ``k`` (``None`` in other modes); ``memory_by_k_mb``: the
      worst rank's estimate for every ``k`` when ``preload_auto`` chose it;
    - ``compute_s``: the slowest rank's training time outside blocking collectives;
    - ``plan_mb``: the largest rank's plans (every step's one-hop graphs), in MiB;
    - ``modelled_epoch_time_s``: ``{network: seconds}`` with every layer's exchange and the
      gradient sync as barriers: each step phase ends with its slowest rank's compute, each
      exchange with its slowest rank's sends on the paper's links (NVLink inside a server,
      IB QDR 32 Gb/s, 10 GbE or 1 GbE between servers), at least one latency of the widest
      link it spans (:func:`~.costmodel.synchronised_epoch_time`).

    Args:
        num_layers: the model's layers (a step's phases: one before each exchange, one after).
        layouts: ``() -> LayoutReport``, read at each epoch's end.
    """

    def __init__(self, num_layers: int, layouts: Callable[[], LayoutReport]):
        self.num_layers, self.layouts = num_layers, layouts
        self.last: dict = {}

    @override
    def on_train_epoch_start(self, trainer, pl_module):
        meter = rank_context(trainer).meter
        self._epoch = diff_snapshots(meter.snapshot(), meter.snapshot())  # zeros
        self._compute_s = 0.0
        self._steps: list[list[float]] = []  # per step: exchanges, phase compute, bytes, messages

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        meter = rank_context(trainer).meter
        self._batch = (meter.snapshot(), meter.wait_s, time.perf_counter())

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        meter = rank_context(trainer).meter
        start, waited, started = self._batch
        ended = time.perf_counter()
        step = meter.delta(start)
        self._epoch = sum_snapshots([self._epoch, step])
        compute = ended - started - (meter.wait_s - waited)
        self._compute_s += compute
        # phases: the compute before each forward exchange, then the rest of the step
        marks = batch.stats.get("exchange_marks", [])
        phases = [0.0] * (self.num_layers + 1)
        previous = started
        for i, (begin, end) in enumerate(marks):
            phases[i], previous = begin - previous, end
        phases[-1] = max(0.0, compute - sum(phases[:-1]))
        counts = [
            step[kind][c][k]
            for kind in ("category_link_bytes", "category_link_messages")
            for c in CATEGORIES
            for k in LINK_CLASSES
        ]
        self._steps.append([float(len(marks)), *phases, *counts])

    @override
    def on_train_epoch_end(self, trainer, pl_module):
        if not hasattr(self, "_batch"):
            return  # an epoch end Lightning re-runs on resume
        del self._batch
        context = rank_context(trainer)
        report = self.layouts()
        layout = report.layout
        sizes = (
            [layout.server_vertices, layout.owned_rows, layout.halo_rows]
            if layout is not None
            else [0, 0, 0]
        )
        links = self._epoch["category_link_bytes"]
        byte_matrix = [links[c][k] for c in CATEGORIES for k in LINK_CLASSES]
        local = torch.tensor(
            [self._compute_s, report.plan_bytes, *sizes, *byte_matrix], dtype=torch.float64
        )
        world = context.world_size
        per_rank = context.comm.all_gather_tensor(local, category="control").view(world, -1)
        compute, plan_bytes, totals = per_rank[:, 0], per_rank[:, 1], per_rank[:, 2:5].sum(0)
        matrix = per_rank[:, 5:].view(world, len(CATEGORIES), -1)
        by_link = {}
        for k, link in enumerate(LINK_CLASSES):
            kinds = {name: 0 for name in (*KINDS.values(), "other")}
            for c, category in enumerate(CATEGORIES):
                kinds[KINDS.get(category, "other")] += int(matrix[:, c, k].sum())
            by_link[link] = kinds
        steps = torch.tensor(self._steps, dtype=torch.float64)
        every = context.comm.all_gather_tensor(steps.flatten(), category="control")
        every = every.view(world, *steps.shape)  # [rank, step, values]
        phases = self.num_layers + 1
        counts = every[:, :, 1 + phases :].reshape(world, len(self._steps), 2, len(CATEGORIES), -1)
        modelled = synchronised_epoch_time(
            every[:, :, 1 : 1 + phases],
            {c: counts[:, :, 0, i] for i, c in enumerate(CATEGORIES)},
            {c: counts[:, :, 1, i] for i, c in enumerate(CATEGORIES)},
            every[0, :, 0].long().tolist(),
            spans_servers=context.topology.num_servers > 1,
        )
        self.last = {
            "mode": report.mode,
            "bytes_by_link": by_link,
            "rho": float(totals[0]) / report.num_nodes if layout is not None else None,
            "owned_rows": int(totals[1]),
            "halo_rows": int(totals[2]),
            "cobatches": report.steps_per_epoch,
            "preload_depth": report.preload_depth,
            "memory_by_k_mb": None
            if report.memory_by_k is None
            else [m / 2**20 for m in report.memory_by_k],
            "compute_s": float(compute.max()),
            "plan_mb": float(plan_bytes.max()) / 2**20,
            "modelled_epoch_time_s": modelled,
        }
        scalars = {
            "granndis/inter_server_feature_bytes": by_link["inter_server"]["feature"],
            "granndis/inter_server_forward_bytes": by_link["inter_server"]["forward"],
            "granndis/compute_s": self.last["compute_s"],
        }
        if self.last["rho"] is not None:
            scalars["granndis/rho"] = self.last["rho"]
        pl_module.log_dict({k: float(v) for k, v in scalars.items()})

    def summary_stats(self) -> dict:
        return dict(self.last)
