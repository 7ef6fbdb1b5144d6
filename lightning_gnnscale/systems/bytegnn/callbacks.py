"""ByteGNN's report callback: end-to-end throughput in seeds/s (the paper's metric), where the
time goes (sampling hidden behind training or not) and the coarse controller's trajectory
(launch score, queue length, DAGs in flight, CPU utilisation, sample vs train time)."""

from __future__ import annotations

import statistics
import time

import lightning as L
import torch
from typing_extensions import override

from ..contract import rank_context

_TRAJECTORY_POINTS = 200  # decisions kept in the report (evenly spaced)


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


class ByteGNNStats(L.Callback):
    """Per-epoch figures, reduced over ranks at the epoch end (one all-gather, ``control``).
    Reports only: nothing here decides a result.

    Kept in ``summary.json`` under ``system``: ``seeds_per_s`` (training seeds of all ranks /
    the slowest rank's training time, median over epochs), ``wait_fraction`` (share of training
    time the trainer waited for batches: sampling not hidden), ``epochs`` (per epoch: seeds/s,
    wait and DAG times, launches, mean queue length, DAGs in flight, CPU %, launch score,
    ``T_avg_sample`` / ``T_avg_train`` in ms) and ``trajectory`` (up to 200 of the run's
    decisions, evenly spaced: ``[t_ms, score, queue, inflight, cpu, launched]``).
    """

    def __init__(self) -> None:
        self.epochs: list[dict] = []
        self.controller = None

    @override
    def on_train_epoch_start(self, trainer, pl_module):
        sworker = trainer.strategy.sworker
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
        self._seeds += batch.global_seed_count
        self._wait += batch.stats.get("sample_s", 0.0)
        self._dag += batch.stats.get("dag_s", 0.0)
        self._last = time.perf_counter()

    @override
    def on_train_epoch_end(self, trainer, pl_module):
        if not hasattr(self, "_start"):
            return  # an epoch end Lightning re-runs on resume
        sworker = trainer.strategy.sworker
        controller = sworker.controller
        trace = controller.trace[self._trace_from :]
        train_s = self._last - self._start
        del self._start
        mine = torch.tensor(
            [
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
            ],
            dtype=torch.float64,
        )
        every = rank_context(trainer).comm.all_gather_tensor(mine, category="control")
        every = every.view(-1, mine.numel())
        slowest = float(every[:, 0].max())
        avg = every.mean(0).tolist()
        record = {
            "epoch": trainer.current_epoch,
            "seeds_per_s": self._seeds / slowest if slowest > 0 else 0.0,
            "train_s": slowest,
            "wait_s": avg[1],
            "dag_latency_s": avg[2],
            "launches": avg[3],
            "mean_queue": avg[4],
            "mean_inflight": avg[5],
            "cpu_percent": avg[6],
            "mean_score": avg[7],
            "t_avg_sample_ms": avg[8],
            "t_avg_train_ms": avg[9],
        }
        self.epochs.append(record)
        pl_module.log_dict(
            {f"bytegnn/{k}": float(v) for k, v in record.items() if k != "epoch"}, sync_dist=False
        )

    def summary_stats(self) -> dict:
        if not self.epochs:
            return {}
        trace = self.controller.trace
        train = sum(e["train_s"] for e in self.epochs)
        return {
            "seeds_per_s": statistics.median(e["seeds_per_s"] for e in self.epochs),
            "wait_fraction": sum(e["wait_s"] for e in self.epochs) / train if train else 0.0,
            "epochs": self.epochs,
            "trajectory": [
                [d.now_ms, d.score, d.queue_len, d.inflight, d.c_util, float(d.launched)]
                for d in trace[:: max(1, len(trace) // _TRAJECTORY_POINTS)]
            ],
        }
