"""Per-epoch measurements every run reports (DESIGN §7), and the run summary.

Callbacks keep their epoch figures in ``.epochs`` (a list of dicts) so that
:class:`RunSummary` can read them in the same hook, whatever Lightning's logging order is.
Cross-rank reductions go through the strategy's metered ``comm``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time

import lightning as L
import torch

from ..comm import CollectiveRecorder, NetworkModel, diff_snapshots, sum_snapshots
from ..graph.sampler import splitmix64_int


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


class StepSeed(L.Callback):
    """Seeds torch's RNG (dropout) from ``(seed, epoch, step, rank)`` before every step, so a run
    resumed from a checkpoint continues exactly as the uninterrupted run."""

    def __init__(self, seed: int):
        self.seed = seed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        key = splitmix64_int(
            self.seed
            ^ splitmix64_int((trainer.current_epoch << 40) ^ (batch_idx << 8) ^ trainer.global_rank)
        )
        torch.manual_seed(key & ((1 << 63) - 1))


class CommStats(L.Callback):
    """Training bytes by category and link class per epoch, summed over ranks, plus modelled
    time; evaluation traffic (e.g. halo activations of distributed inference) is measured
    separately (``eval_bytes``) so it never inflates the training figures.

    The meter reduction itself is bookkeeping and is not counted.
    """

    def __init__(self, network: str):
        self.network = NetworkModel.from_name(network)
        self.epochs: list[dict] = []

    def state_dict(self) -> dict:
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epochs = list(state_dict["epochs"])

    def on_train_epoch_start(self, trainer, pl_module):
        self._start = trainer.strategy.meter.snapshot()
        self._eval = trainer.strategy.meter.delta(self._start)  # zeros

    def on_validation_epoch_start(self, trainer, pl_module):
        self._eval_start = trainer.strategy.meter.snapshot()

    def on_validation_epoch_end(self, trainer, pl_module):
        if hasattr(self, "_eval"):  # validation outside fit (trainer.validate) is not tracked
            meter = trainer.strategy.meter
            self._eval = sum_snapshots([self._eval, meter.delta(self._eval_start)])

    def on_train_epoch_end(self, trainer, pl_module):
        if not hasattr(self, "_start"):
            return  # an epoch end Lightning re-runs on resume (see EpochStats)
        comm, meter = trainer.strategy.comm, trainer.strategy.meter
        train_delta = diff_snapshots(meter.delta(self._start), self._eval)
        per_rank = comm.gather_meter(train_delta)
        total = {cat: sum(s["bytes"][cat] for s in per_rank) for cat in per_rank[0]["bytes"]}
        inter = sum(s["link_bytes"]["inter_server"] for s in per_rank)
        modeled = max(self.network.modeled_time(s) for s in per_rank)
        eval_bytes = sum(comm.reduce_meter(self._eval)["bytes"].values())
        record = {
            "bytes": total,
            "inter_server_bytes": inter,
            "modeled_time_s": modeled,
            "eval_bytes": eval_bytes,
        }
        self.epochs.append(record)
        del self._start
        metrics = {f"comm/{cat}_bytes": float(n) for cat, n in total.items()}
        metrics.update(
            {
                "comm/inter_server_bytes": float(inter),
                "comm/modeled_time_s": modeled,
                "comm/eval_bytes": float(eval_bytes),
            }
        )
        pl_module.log_dict(metrics)


class EpochStats(L.Callback):
    """Train loss, input rows loaded, time breakdown (sample, load, compute) and peak memory
    per epoch.

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
        self.epochs: list[dict] = []

    def state_dict(self) -> dict:
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epochs = list(state_dict["epochs"])

    def on_train_epoch_start(self, trainer, pl_module):
        self._epoch_start = time.perf_counter()
        self._times = {"sample_s": 0.0, "load_s": 0.0, "compute_s": 0.0}
        self._input_rows = 0
        self._wait_start = trainer.strategy.meter.wait_s

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
        self._times["comm_s"] = trainer.strategy.meter.wait_s - self._wait_start
        comm = trainer.strategy.comm
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
            **self._times,
            "peak_rss_mb": float(rss[0]),
        }
        self.epochs.append(record)
        pl_module.log_dict(
            {
                "train/loss": record["train_loss"],
                "time/epoch_s": epoch_s,
                **{f"time/{k}": v for k, v in self._times.items()},
                "mem/peak_rss_mb": record["peak_rss_mb"],
                "data/input_rows": float(record["input_rows"]),
            }
        )


class CollectiveAudit(L.Callback):
    """Records every ``torch.distributed`` call of each training epoch (validation and the
    epoch-end reductions included) and fails the run if one was not metered, or if the metered
    bytes disagree with the meter (config ``audit: true``; every system's audit test uses it).

    Place it last, so its window closes after the other callbacks' epoch-end reductions.
    """

    def __init__(self):
        self.calls = 0

    def on_train_epoch_start(self, trainer, pl_module):
        self._recorder = CollectiveRecorder().__enter__()
        self._start = trainer.strategy.meter.snapshot()

    def on_train_epoch_end(self, trainer, pl_module):
        if not hasattr(self, "_recorder"):
            return  # re-run epoch end on resume (see EpochStats): nothing was recorded
        self._recorder.__exit__(None, None, None)
        self.calls += len(self._recorder.calls)
        self._recorder.assert_accounted(trainer.strategy.meter.delta(self._start))


class RunSummary(L.Callback):
    """Prints one line per epoch and, at the end, a table; rank 0 writes ``summary.json``.

    ``test_acc`` is the test accuracy at the epoch of best validation accuracy. The epoch
    records (here and in the stats callbacks it reads) travel in checkpoints, so a resumed
    run's summary covers the whole run, as the uninterrupted run's does. ``run_id`` marks the
    file as this run's.
    """

    def __init__(
        self,
        cfg,
        output_dir: str,
        epoch_stats: EpochStats,
        comm_stats: CommStats,
        config_hash: str,
        audit: CollectiveAudit | None = None,
        system_callbacks: list | None = None,
        *,
        run_id: str,
    ):
        self.cfg = cfg
        self.output_dir = output_dir
        self.epoch_stats, self.comm_stats = epoch_stats, comm_stats
        self.config_hash = config_hash
        self.audit = audit
        self.system_callbacks = system_callbacks or []
        self.run_id = run_id
        self.evals: list[dict] = []
        self._fit_start = 0.0
        self._earlier_train_s = 0.0  # training time of the runs this one resumes
        self.summary: dict | None = None

    def state_dict(self) -> dict:
        return {
            "evals": self.evals,
            "train_s": self._earlier_train_s + time.perf_counter() - self._fit_start,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.evals = list(state_dict["evals"])
        self._earlier_train_s = float(state_dict["train_s"])

    def on_fit_start(self, trainer, pl_module):
        self._fit_start = time.perf_counter()

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        m = trainer.callback_metrics
        self.evals.append(
            {
                "epoch": trainer.current_epoch,
                "val_acc": float(m["val/acc"]),
                "test_acc": float(m["test/acc"]),
            }
        )

    def on_train_epoch_end(self, trainer, pl_module):
        epochs = self.epoch_stats.epochs
        if trainer.global_rank != 0 or not epochs or epochs[-1]["epoch"] != trainer.current_epoch:
            return
        e = epochs[-1]
        c = self.comm_stats.epochs[-1]
        last = (
            self.evals[-1]
            if self.evals and self.evals[-1]["epoch"] == trainer.current_epoch
            else None
        )
        accs = f" val {last['val_acc']:.4f} test {last['test_acc']:.4f}" if last else ""
        print(
            f"[epoch {trainer.current_epoch + 1}/{trainer.max_epochs}] loss "
            f"{e['train_loss']:.4f}{accs} time {e['epoch_s']:.2f}s comm "
            f"{sum(c['bytes'].values()) / 1e6:.2f} MB",
            file=sys.stderr,
            flush=True,
        )

    def on_fit_end(self, trainer, pl_module):
        epochs, comms = self.epoch_stats.epochs, self.comm_stats.epochs
        best = max(self.evals, key=lambda r: r["val_acc"]) if self.evals else None
        n = max(len(comms), 1)
        per_epoch = {
            cat: sum(c["bytes"][cat] for c in comms) / n
            for cat in (comms[0]["bytes"] if comms else {})
        }
        self.summary = {
            "strategy": self.cfg.strategy.name,
            "model": self.cfg.model.name,
            "dataset": self.cfg.dataset.name,
            "world_size": trainer.world_size,
            "epochs": len(epochs),
            "val_acc": self.evals[-1]["val_acc"] if self.evals else None,
            "test_acc": best["test_acc"] if best else None,
            "best_val_acc": best["val_acc"] if best else None,
            "best_epoch": best["epoch"] if best else None,
            "final_test_acc": self.evals[-1]["test_acc"] if self.evals else None,
            "train_loss": epochs[-1]["train_loss"] if epochs else None,
            "input_rows_per_epoch": statistics.mean(e["input_rows"] for e in epochs)
            if epochs
            else None,
            "epoch_time_s": statistics.median(e["epoch_s"] for e in epochs) if epochs else None,
            "train_time_s": self._earlier_train_s + time.perf_counter() - self._fit_start,
            "time_breakdown_s": {
                k: statistics.median(e[k] for e in epochs)
                for k in ("sample_s", "load_s", "compute_s", "comm_s")
            }
            if epochs
            else {},
            "comm_bytes_per_epoch": per_epoch,
            "inter_server_bytes_per_epoch": sum(c["inter_server_bytes"] for c in comms) / n,
            "eval_comm_bytes_per_epoch": sum(c["eval_bytes"] for c in comms) / n,
            "modeled_comm_time_s": sum(c["modeled_time_s"] for c in comms) / n,
            "network": self.cfg.network,
            "peak_rss_mb": max((e["peak_rss_mb"] for e in epochs), default=peak_rss_mb()),
            "config_hash": self.config_hash,
            "run_id": self.run_id,
            "audited_collectives": self.audit.calls if self.audit else None,
            "output_dir": self.output_dir,
            "history": self._history(),
            "system": {
                k: v
                for cb in self.system_callbacks
                if hasattr(cb, "summary_stats")
                for k, v in cb.summary_stats().items()
            },
        }
        if trainer.global_rank == 0:
            write_json_atomic(os.path.join(self.output_dir, "summary.json"), self.summary)

    def _history(self) -> list[dict]:
        """One row per epoch: loss, accuracies (if evaluated), time, cumulative time, bytes."""
        evals = {r["epoch"]: r for r in self.evals}
        rows, elapsed = [], 0.0
        for e, c in zip(self.epoch_stats.epochs, self.comm_stats.epochs):
            elapsed += e["epoch_s"]
            ev = evals.get(e["epoch"], {})
            rows.append(
                {
                    "epoch": e["epoch"],
                    "train_loss": e["train_loss"],
                    "val_acc": ev.get("val_acc"),
                    "test_acc": ev.get("test_acc"),
                    "epoch_s": e["epoch_s"],
                    "elapsed_s": elapsed,
                    "comm_bytes": c["bytes"],
                }
            )
        return rows


def write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def format_table(summary: dict) -> str:
    """The short human table printed at the end of a run."""
    rows = [
        (
            "strategy / model / dataset",
            f"{summary['strategy']} / {summary['model']} / {summary['dataset']}",
        ),
        ("world size", summary["world_size"]),
        ("epochs", summary["epochs"]),
        ("best val acc", _fmt(summary["best_val_acc"])),
        ("test acc (at best val)", _fmt(summary["test_acc"])),
        ("epoch time, median (s)", _fmt(summary["epoch_time_s"])),
        ("train time (s)", _fmt(summary["train_time_s"])),
        ("comm MB / epoch (measured)", _fmt(sum(summary["comm_bytes_per_epoch"].values()) / 1e6)),
        (
            f"comm time / epoch, modelled {summary['network']} (s)",
            _fmt(summary["modeled_comm_time_s"]),
        ),
        ("peak RSS per process (MB)", _fmt(summary["peak_rss_mb"])),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
