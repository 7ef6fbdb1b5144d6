"""Loss, input rows, time breakdown and peak memory per epoch."""

from __future__ import annotations

import resource
import time

import torch

from ..contract import rank_context
from .records import EpochRecords


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB.

    Linux's ``VmHWM`` belongs to the process's own address space; ``ru_maxrss`` (the fallback
    where ``/proc`` is missing) survives ``exec``, so a spawned rank would start at its
    launcher's peak (e.g. the launcher that loaded the whole graph).
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class EpochStats(EpochRecords):
    """Train loss, input rows loaded, time breakdown (sample, load, compute) and peak memory
    per epoch.

    ``epoch_s`` is the wall time from the epoch's start to its end, validation included (as
    Lightning runs it, inside the epoch); ``eval_s`` is the validation part of it (0 in an epoch
    without validation) and ``train_epoch_s = epoch_s - eval_s`` the training part.

    ``compute`` is forward + backward + optimiser step (with DDP, the overlapped gradient
    all-reduce is inside it). ``comm`` is the wall time spent waiting in blocking collectives
    during the epoch (sampling exchanges, shuffles, KV pulls; part of ``sample``, ``load`` and
    ``compute``, not on top of them). Times are rank 0's; input rows are summed over ranks (every
    strategy's batches report ``input_nodes``); memory is the max over ranks.

    Resuming from a checkpoint saved inside an epoch's last validation (when validation is not
    every epoch) makes Lightning run that epoch's ``on_train_epoch_end`` again without its
    ``on_train_epoch_start``; such an epoch end records nothing.
    """

    def __init__(self):
        super().__init__()

    def on_train_epoch_start(self, trainer, pl_module):
        self._epoch_start = time.perf_counter()
        self._times = {"sample_s": 0.0, "load_s": 0.0, "compute_s": 0.0}
        self._input_rows = 0
        self._wait_start = rank_context(trainer).meter.wait_s
        self._eval_s = 0.0

    def on_validation_epoch_start(self, trainer, pl_module):
        self._eval_start = time.perf_counter()

    def on_validation_epoch_end(self, trainer, pl_module):
        if hasattr(self, "_epoch_start") and not trainer.sanity_checking:
            self._eval_s += time.perf_counter() - self._eval_start

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._input_rows += batch.stats.get("input_nodes", 0)
        self._times["sample_s"] += batch.stats.get("sample_s", 0.0)
        self._times["load_s"] += batch.stats.get("load_s", 0.0)
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._times["compute_s"] += time.perf_counter() - self._batch_start

    def on_train_epoch_end(self, trainer, pl_module):
        if not hasattr(self, "_epoch_start"):
            return  # re-run epoch end on resume: this epoch was measured by the first run
        epoch_s = time.perf_counter() - self._epoch_start
        del self._epoch_start
        self._times["comm_s"] = rank_context(trainer).meter.wait_s - self._wait_start
        comm = rank_context(trainer).comm
        sums = torch.cat(
            [pl_module.epoch_loss, torch.tensor([float(self._input_rows)], dtype=torch.float64)]
        )
        loss = comm.all_reduce(sums, category="control")
        rss = comm.all_reduce(
            torch.tensor([peak_rss_mb()], dtype=torch.float64), "max", category="control"
        )
        record = {
            "epoch": trainer.current_epoch,
            "train_loss": float(loss[0] / loss[1].clamp(min=1)),
            "input_rows": int(loss[2]),
            "epoch_s": epoch_s,
            "train_epoch_s": epoch_s - self._eval_s,
            "eval_s": self._eval_s,
            **self._times,
            "peak_rss_mb": float(rss[0]),
        }
        self.epochs.append(record)
        pl_module.log_dict(
            {
                "train/loss": record["train_loss"],
                "time/epoch_s": epoch_s,
                "time/train_epoch_s": record["train_epoch_s"],
                "time/eval_s": record["eval_s"],
                **{f"time/{k}": v for k, v in self._times.items()},
                "mem/peak_rss_mb": record["peak_rss_mb"],
                "data/input_rows": float(record["input_rows"]),
            }
        )
