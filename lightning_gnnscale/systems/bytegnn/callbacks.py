"""ByteGNN's report callback: end-to-end throughput in seeds/s over whole epochs, evaluation
included (the paper's metric), where the time goes (sampling hidden behind training or not)
and the coarse controller's trajectory (launch score, queue length, DAGs in flight, CPU
utilisation, sample vs train time)."""

from __future__ import annotations

import time
from collections.abc import Callable

import lightning as L
import torch
from typing_extensions import override

from ...contract import rank_context
from .sworker import SWorker

_TRAJECTORY_POINTS = 200  # decisions kept in the report (evenly spaced)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class ByteGNNStats(L.Callback):
    """Per-epoch figures, reduced over ranks at the epoch end (one all-gather, ``control``).
    Reports only: nothing here decides a result.

    Args:
        sworker: returns the rank's S-Worker (the DataModule's; ``None`` before set-up).

    Kept in ``summary.json`` under ``system``: ``seeds_per_s`` (training seeds of all ranks
    over the summed wall time of the epochs, each from its start to its end *after
    evaluation*, slowest rank: end to end, as the paper), ``train_seeds_per_s`` (the same over
    the training batches only), ``wait_fraction`` (share of training time the trainer waited
    for batches: sampling not hidden), ``epochs`` (per epoch: both rates, epoch and training
    seconds, wait and DAG times, launches, mean queue length, DAGs in flight, CPU %, launch
    score, ``T_avg_sample`` / ``T_avg_train`` in ms), ``trajectory`` (up to 200 of the run's
    decisions, evenly spaced: ``[t_ms, score, queue, inflight, cpu, launched]``),
    ``prefetch_budget_bytes`` (``scheduler.prefetch_mb``) and ``prefetch_peak_bytes_by_rank``
    (the most each rank's prefetched batches were counted at: queued bytes + reservations).
    """

    def __init__(self, sworker: Callable[[], SWorker | None]) -> None:
        self._sworker = sworker
        self.epochs: list[dict] = []
        self.controller = None
        self.prefetch_peak: list[float] = []  # by rank, over the epochs

    @override
    def on_train_epoch_start(self, trainer, pl_module):
        sworker = self._sworker()
        self.controller = sworker.controller
        self._start = time.perf_counter()
        self._last = self._start
        self._seeds = 0
        self._wait = 0.0
        self._dag = 0.0
        self._trace_from = len(sworker.controller.trace)
        self._launched = sworker.launched

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not hasattr(self, "_start"):
            return
        self._seeds += batch.stats.get("global_seeds", batch.global_seed_count)
        self._wait += batch.stats.get("sample_s", 0.0)
        self._dag += batch.stats.get("dag_s", 0.0)
        self._last = time.perf_counter()

    @override
    def on_train_epoch_end(self, trainer, pl_module):
        if not hasattr(self, "_start"):
            return  # an epoch end Lightning re-runs on resume
        epoch_s = time.perf_counter() - self._start  # Lightning evaluates before this hook
        sworker = self._sworker()
        controller = sworker.controller
        trace = controller.trace[self._trace_from :]
        train_s = self._last - self._start
        del self._start
        mine = torch.tensor(
            [
                epoch_s,
                train_s,
                self._wait,
                self._dag,
                sworker.launched - self._launched,
                _mean([d.queue_len for d in trace]),
                _mean([d.inflight for d in trace]),
                _mean([d.c_util for d in trace]),
                _mean([d.score for d in trace]),
                controller.t_sample_ms or 0.0,
                controller.t_train_ms or 0.0,
                max((d.prefetch_bytes for d in trace), default=0.0),
            ],
            dtype=torch.float64,
        )
        every = rank_context(trainer).comm.all_gather_tensor(mine, category="control")
        every = every.view(-1, mine.numel())
        slowest_epoch, slowest_train = float(every[:, 0].max()), float(every[:, 1].max())
        avg = every.mean(0).tolist()
        peaks = every[:, 11].tolist()
        self.prefetch_peak = [max(a, b) for a, b in zip(self.prefetch_peak, peaks)] or peaks
        record = {
            "epoch": trainer.current_epoch,
            "seeds": self._seeds,
            "seeds_per_s": self._seeds / slowest_epoch if slowest_epoch > 0 else 0.0,
            "train_seeds_per_s": self._seeds / slowest_train if slowest_train > 0 else 0.0,
            "epoch_s": slowest_epoch,
            "train_s": slowest_train,
            "wait_s": avg[2],
            "dag_latency_s": avg[3],
            "launches": avg[4],
            "mean_queue": avg[5],
            "mean_inflight": avg[6],
            "cpu_percent": avg[7],
            "mean_score": avg[8],
            "t_avg_sample_ms": avg[9],
            "t_avg_train_ms": avg[10],
        }
        self.epochs.append(record)
        pl_module.log_dict(
            {f"bytegnn/{k}": float(v) for k, v in record.items() if k != "epoch"}, sync_dist=False
        )

    def summary_stats(self) -> dict:
        if not self.epochs:
            return {}
        trace = self.controller.trace
        seeds = sum(e["seeds"] for e in self.epochs)
        wall = sum(e["epoch_s"] for e in self.epochs)
        train = sum(e["train_s"] for e in self.epochs)
        return {
            "seeds_per_s": seeds / wall if wall else 0.0,
            "train_seeds_per_s": seeds / train if train else 0.0,
            "wait_fraction": sum(e["wait_s"] for e in self.epochs) / train if train else 0.0,
            "prefetch_budget_bytes": self.controller.max_prefetch_bytes,
            "prefetch_peak_bytes_by_rank": self.prefetch_peak,
            "epochs": self.epochs,
            "trajectory": [
                [d.now_ms, d.score, d.queue_len, d.inflight, d.c_util, float(d.launched)]
                for d in trace[:: max(1, len(trace) // _TRAJECTORY_POINTS)]
            ],
        }
