"""HopGNN's report callback: remote rows and bytes, miss rate, migration vs feature bytes, α,
the time-step trajectory and the per-step load matrix (paper Figs. 5, 14, 17, 18)."""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
from typing_extensions import override

from ...contract import rank_context

_COLUMNS = ("remote_rows", "input_nodes", "local_rows", "time_steps")


class HopGNNStats(L.Callback):
    """Per-iteration fetch statistics and per-epoch byte shares, reduced over ranks at the
    epoch end (one all-gather, ``control``). Reports only: nothing here decides a result.

    Kept in ``summary.json`` under ``system`` (scalars are also logged), for the last epoch:
    ``remote_rows_per_iteration`` (rows fetched, all ranks), ``miss_rate`` (input rows read
    that another rank owns / all input rows read), ``feature_bytes_per_iteration`` and
    ``migration_bytes_per_iteration`` (all ranks, from the meter), ``alpha`` (a rank's feature
    bytes per iteration / the model's bytes), ``load_matrix`` ``[T][N]`` (mean roots per kept
    step and server), ``load_imbalance`` (mean over steps of max / mean roots per server), and
    ``time_step_trajectory`` (``T`` of every epoch, resumed runs included).

    Args:
        trajectory: returns ``T`` of every epoch begun (the DataModule's, checkpointed).
    """

    def __init__(self, trajectory: Callable[[], list[int]]):
        self.trajectory = trajectory
        self.last: dict = {}

    @override
    def on_train_epoch_start(self, trainer, pl_module):
        self._rows: list[list[float]] = []
        self._loads: list[list[int]] = []
        self._start = rank_context(trainer).meter.snapshot()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        stats = getattr(batch, "stats", {})
        if "remote_rows" not in stats:
            return
        self._rows.append([float(stats[c]) for c in _COLUMNS])
        self._loads.append(list(stats["load"]))

    @override
    def on_train_epoch_end(self, trainer, pl_module):
        if not hasattr(self, "_rows"):
            return  # an epoch end Lightning re-runs on resume
        rows, loads = self._rows, self._loads
        del self._rows, self._loads
        context = rank_context(trainer)
        comm, n = context.comm, context.world_size
        delta = context.meter.delta(self._start)["bytes"]
        steps = len(rows)
        width = max((len(x) for x in loads), default=0)
        local = torch.tensor(
            [r + x + [0] * (width - len(x)) for r, x in zip(rows, loads)], dtype=torch.float64
        ).reshape(steps, len(_COLUMNS) + width)
        mine = torch.tensor([delta["feature"], delta["parameter"]], dtype=torch.float64)
        payload = torch.cat([mine, local.flatten()])
        gathered = comm.all_gather_tensor(payload, category="control").view(n, -1)
        per_rank = gathered[:, 2:].view(n, steps, len(_COLUMNS) + width)
        iterations = max(steps, 1)
        totals = per_rank[..., : len(_COLUMNS)].sum((0, 1))
        load = per_rank[..., len(_COLUMNS) :].mean(1).T  # [T, N]
        model_bytes = sum(p.numel() * p.element_size() for p in pl_module.parameters())
        feature = float(gathered[:, 0].sum()) / iterations
        t = int(rows[0][3]) if rows else 0
        imbalance = (load.max(1).values / load.mean(1).clamp(min=1e-12)).mean() if width else 0
        self.last = {
            "remote_rows_per_iteration": float(totals[0] / iterations),
            "miss_rate": float((totals[1] - totals[2]) / totals[1].clamp(min=1)),
            "feature_bytes_per_iteration": feature,
            "migration_bytes_per_iteration": float(gathered[:, 1].sum()) / iterations,
            "alpha": feature / n / max(model_bytes, 1),
            "load_matrix": load.tolist(),
            "load_imbalance": float(imbalance),
            "time_steps": t,
        }
        pl_module.log_dict(
            {f"hopgnn/{k}": v for k, v in self.last.items() if not isinstance(v, list)}
        )

    def summary_stats(self) -> dict:
        return {**self.last, "time_step_trajectory": self.trajectory()}
