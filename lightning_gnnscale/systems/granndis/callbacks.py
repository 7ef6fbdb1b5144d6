"""GraNNDIS's report callback: training bytes by link class and kind (forward, backward,
gradient, feature), redundancy ``rho``, the layout sizes and the modelled epoch time at the
paper's bandwidths (spec §6.4, §8.3 E1/E2)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import lightning as L
import torch
from typing_extensions import override

from ...comm import CATEGORIES, LINK_CLASSES, diff_snapshots, sum_snapshots
from ..contract import rank_context
from .costmodel import modelled_epoch_time

if TYPE_CHECKING:
    from .datamodule import GraNNDISDataModule

# what each meter category is, in the paper's terms
KINDS = {
    "feature": "feature",
    "activation": "forward",
    "activation_grad": "backward",
    "gradient": "gradient",
}


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
    - ``modelled_epoch_time_s``: ``{network: max over ranks of the rank's compute plus its
      sent bytes and messages on the paper's links}`` (:func:`~.costmodel.modelled_epoch_time`:
      NVLink inside a server, IB QDR 32 Gb/s, 10 GbE or 1 GbE between servers).

    Args:
        datamodule: the run's :class:`~.datamodule.GraNNDISDataModule` (its layout sizes).
    """

    def __init__(self, datamodule: GraNNDISDataModule):
        self.datamodule = datamodule
        self.last: dict = {}

    @override
    def on_train_epoch_start(self, trainer, pl_module):
        meter = rank_context(trainer).meter
        self._epoch = diff_snapshots(meter.snapshot(), meter.snapshot())  # zeros
        self._compute_s = 0.0

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        meter = rank_context(trainer).meter
        self._batch = (meter.snapshot(), meter.wait_s, time.perf_counter())

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        meter = rank_context(trainer).meter
        start, waited, started = self._batch
        self._epoch = sum_snapshots([self._epoch, meter.delta(start)])
        self._compute_s += time.perf_counter() - started - (meter.wait_s - waited)

    @override
    def on_train_epoch_end(self, trainer, pl_module):
        if not hasattr(self, "_batch"):
            return  # an epoch end Lightning re-runs on resume
        del self._batch
        context = rank_context(trainer)
        dm = self.datamodule
        layout = dm.layout
        sizes = (
            [layout.server_vertices, layout.owned_rows, layout.halo_rows]
            if layout is not None
            else [0, 0, 0]
        )
        links = self._epoch["category_link_bytes"]
        byte_matrix = [links[c][k] for c in CATEGORIES for k in LINK_CLASSES]
        messages = [self._epoch["link_messages"][k] for k in LINK_CLASSES]
        local = torch.tensor(
            [self._compute_s, *sizes, *messages, *byte_matrix], dtype=torch.float64
        )
        world = context.world_size
        per_rank = context.comm.all_gather_tensor(local, category="control").view(world, -1)
        compute, totals = per_rank[:, 0], per_rank[:, 1:4].sum(0)
        rank_messages = per_rank[:, 4 : 4 + len(LINK_CLASSES)]
        matrix = per_rank[:, 4 + len(LINK_CLASSES) :].view(world, len(CATEGORIES), -1)
        by_link = {}
        for k, link in enumerate(LINK_CLASSES):
            kinds = {name: 0 for name in (*KINDS.values(), "other")}
            for c, category in enumerate(CATEGORIES):
                kinds[KINDS.get(category, "other")] += int(matrix[:, c, k].sum())
            by_link[link] = kinds
        rank_bytes = matrix.sum(1)  # [rank, link]
        per_rank_times = [
            modelled_epoch_time(
                float(compute[r]),
                dict(zip(LINK_CLASSES, rank_bytes[r].tolist())),
                messages_by_link=dict(zip(LINK_CLASSES, rank_messages[r].tolist())),
            )
            for r in range(world)
        ]
        modelled = {name: max(t[name] for t in per_rank_times) for name in per_rank_times[0]}
        config = dm.config
        self.last = {
            "mode": config.mode,
            "bytes_by_link": by_link,
            "rho": float(totals[0]) / dm.graph.num_nodes if layout is not None else None,
            "owned_rows": int(totals[1]),
            "halo_rows": int(totals[2]),
            "cobatches": dm.steps_per_epoch,
            "preload_depth": dm.preload_depth,
            "memory_by_k_mb": None
            if dm.memory_by_k is None
            else [m / 2**20 for m in dm.memory_by_k],
            "compute_s": float(compute.max()),
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
