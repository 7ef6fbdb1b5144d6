"""The run summary: one line per epoch, a table at the end, ``summary.json`` on rank 0."""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time

import lightning as L
import torch

from ..files import write_json_atomic
from ..proc_memory import peak_rss_mb_of, rank_server_pid
from ..tasks import DEFAULT_TASK, TaskSpec, task_spec
from .audit import CollectiveAudit
from .comm_stats import CommStats
from .epoch_stats import EpochStats, peak_rss_mb

EPOCH_LOG = logging.getLogger("lightning_gnnscale.epochs")
EPOCH_LOG.setLevel(logging.INFO)  # as Lightning's own lines: shown unless a handler filters


def report_epoch(line: str) -> None:
    """One epoch line, to the run's logging (``train.py``: the console and ``train.log``), or
    to stderr where nothing configured logging (a plain Lightning script)."""
    if EPOCH_LOG.hasHandlers():
        EPOCH_LOG.info(line)
    else:
        print(line, file=sys.stderr, flush=True)


class RunSummary(L.Callback):
    """Reports one line per epoch (:func:`report_epoch`) and, at the end, a table; rank 0 writes ``summary.json``.

    The metrics are the task's (``cfg.task``; node classification: ``acc``, regression:
    ``rmse`` and ``mae``): per evaluated epoch ``val_<metric>`` and ``test_<metric>``;
    ``best_val_<monitor>`` is the best of the monitored one (max or min, as the task says),
    ``test_<metric>`` the test metrics at that epoch, ``val_<metric>`` / ``final_test_<metric>``
    the last epoch's.
    ``epoch_time_s`` is the median epoch wall time with its validation (as before);
    ``train_epoch_time_s`` the median of its training part and ``eval_time_s`` the median
    validation time of the epochs that validated (``None`` when none did). The epoch
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
        cpu_allocator: str = "system",
    ):
        self.cfg = cfg
        self.cpu_allocator = cpu_allocator
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
        self.task = task_spec(cfg.task.name)

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
        # after Lightning's launcher chose its threads: what the fit really runs with
        self._threads = torch.get_num_threads()
        self._cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        m = trainer.callback_metrics
        self.evals.append(
            {
                "epoch": trainer.current_epoch,
                **{
                    f"{split}_{name}": float(m[f"{split}/{name}"])
                    for split in ("val", "test")
                    for name in self.task.metrics
                },
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
        metrics = self.task.metrics
        accs = (
            "".join(
                f" {split} {' '.join(format(last[f'{split}_{m}'], '.4f') for m in metrics)}"
                for split in ("val", "test")
            )
            if last
            else ""
        )
        split = (
            f" (train {e['train_epoch_s']:.2f}s eval {e['eval_s']:.2f}s)" if "eval_s" in e else ""
        )
        report_epoch(
            f"[epoch {trainer.current_epoch + 1}/{trainer.max_epochs}] loss "
            f"{e['train_loss']:.4f}{accs} time {e['epoch_s']:.2f}s{split} comm "
            f"{sum(c['bytes'].values()) / 1e6:.2f} MB"
        )

    def on_fit_end(self, trainer, pl_module):
        epochs, comms = self.epoch_stats.epochs, self.comm_stats.epochs
        monitored = f"val_{self.task.monitor}"
        pick = max if self.task.mode == "max" else min
        best = pick(self.evals, key=lambda r: r[monitored]) if self.evals else None
        last = self.evals[-1] if self.evals else None
        metrics = self.task.metrics
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
            "cpu_allocator": self.cpu_allocator,
            "torch_threads": self._threads,
            "rank_cpus": self._cpus,
            "epochs": len(epochs),
            **{f"val_{m}": last[f"val_{m}"] if last else None for m in metrics},
            **{f"test_{m}": best[f"test_{m}"] if best else None for m in metrics},
            f"best_{monitored}": best[monitored] if best else None,
            "best_epoch": best["epoch"] if best else None,
            **{f"final_test_{m}": last[f"test_{m}"] if last else None for m in metrics},
            "train_loss": epochs[-1]["train_loss"] if epochs else None,
            "input_rows_per_epoch": statistics.mean(e["input_rows"] for e in epochs)
            if epochs
            else None,
            "epoch_time_s": statistics.median(e["epoch_s"] for e in epochs) if epochs else None,
            "train_epoch_time_s": _median(e.get("train_epoch_s") for e in epochs),
            "eval_time_s": _median(e.get("eval_s") for e in epochs if e.get("eval_s")),
            "train_time_s": self._earlier_train_s + time.perf_counter() - self._fit_start,
            "time_breakdown_s": {
                k: statistics.median(e[k] for e in epochs)
                for k in ("sample_s", "load_s", "compute_s", "comm_s")
            }
            if epochs
            else {},
            "comm_bytes_per_epoch": per_epoch,
            "inter_server_bytes_per_epoch": sum(c["inter_server_bytes"] for c in comms) / n,
            "inter_server_comm_bytes_per_epoch": inter_server_by_category(comms),
            "eval_comm_bytes_per_epoch": sum(c["eval_bytes"] for c in comms) / n,
            "modeled_comm_time_s": sum(c["modeled_time_s"] for c in comms) / n,
            "network": self.cfg.network,
            "peak_rss_mb": max((e["peak_rss_mb"] for e in epochs), default=peak_rss_mb()),
            # the launcher's own numbers: it fills them in once its ranks have ended
            # (record_launcher_memory); None where no launcher of ours ran (torchrun, srun)
            "launcher_peak_rss_mb": None,
            "rank_server_peak_rss_mb": None,
            "config_hash": self.config_hash,
            "run_id": self.run_id,
            "audited_collectives": self.audit.calls if self.audit else None,
            "unmetered_framework_calls": {
                "calls": self.audit.framework_calls,
                "bytes": self.audit.framework_bytes,
                "what": "Lightning's per-step SIGTERM flag broadcast (not in comm bytes)",
            }
            if self.audit
            else None,
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
                    **{
                        f"{split}_{m}": ev.get(f"{split}_{m}")
                        for split in ("val", "test")
                        for m in self.task.metrics
                    },
                    "epoch_s": e["epoch_s"],
                    "train_epoch_s": e.get("train_epoch_s"),
                    "eval_s": e.get("eval_s"),
                    "elapsed_s": elapsed,
                    "comm_bytes": c["bytes"],
                }
            )
        return rows


def format_table(summary: dict, task: str = DEFAULT_TASK) -> str:
    """The short human table printed at the end of a run of ``task``."""
    rows = [
        (
            "strategy / model / dataset",
            f"{summary['strategy']} / {summary['model']} / {summary['dataset']}",
        ),
        ("world size", summary["world_size"]),
        ("epochs", summary["epochs"]),
        *_metric_rows(summary, task_spec(task)),
        ("epoch time, median (s)", _fmt(summary["epoch_time_s"])),
        ("  training part, median (s)", _fmt(summary.get("train_epoch_time_s"))),
        ("  evaluation, median of evaluated epochs (s)", _fmt(summary.get("eval_time_s"))),
        ("train time (s)", _fmt(summary["train_time_s"])),
        ("comm MB / epoch (measured)", _fmt(sum(summary["comm_bytes_per_epoch"].values()) / 1e6)),
        *_inter_server_rows(summary.get("inter_server_comm_bytes_per_epoch")),
        (
            f"comm time / epoch, modelled {summary['network']} (s)",
            _fmt(summary["modeled_comm_time_s"]),
        ),
        ("peak RSS per process (MB)", _fmt(summary["peak_rss_mb"])),
        ("  launcher's own peak RSS (MB)", _fmt(summary.get("launcher_peak_rss_mb"))),
        *(
            [("  rank server's peak RSS (MB)", _fmt(summary["rank_server_peak_rss_mb"]))]
            if summary.get("rank_server_peak_rss_mb") is not None
            else []
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def _metric_rows(summary: dict, task: TaskSpec) -> list[tuple[str, str]]:
    """The best validation value of the task's monitored metric and the test metrics then."""
    return [
        (f"best val {task.monitor}", _fmt(summary[f"best_val_{task.monitor}"])),
        *((f"test {m} (at best val)", _fmt(summary[f"test_{m}"])) for m in task.metrics),
    ]


def record_launcher_memory(path: str | os.PathLike, summary: dict, *, rank_server: bool) -> dict:
    """``summary`` with the launching process's own peak RSS (``launcher_peak_rss_mb``) and,
    when its ranks were forked from a ``rank_server``, the server's (``rank_server_peak_rss_mb``;
    otherwise ``None``: one process, or ``launcher.start_method=spawn``), written back to
    ``path`` atomically.

    Called by the launcher (:func:`lightning_gnnscale.run.train`) after its ranks have ended, so
    its peak covers the whole job; with one process the launcher is the rank, and the two
    numbers are one process's. The rank server is shared by the runs of one launching process
    (a sweep, a bench): its peak is since it started."""
    launcher = peak_rss_mb()
    server = rank_server_pid() if rank_server else None
    updated = {
        **summary,
        "launcher_peak_rss_mb": launcher,
        "rank_server_peak_rss_mb": None if server is None else peak_rss_mb_of(server),
    }
    write_json_atomic(path, updated)
    return updated


def _inter_server_rows(by_category: dict | None) -> list[tuple[str, str]]:
    """The inter-server share of the comm line, by kind, when any byte crossed servers."""
    if not by_category or not any(by_category.values()):
        return []
    rows_moved = sum(by_category.get(c, 0) for c in ("feature", "activation", "activation_grad"))
    gradients = sum(by_category.get(c, 0) for c in ("gradient", "parameter"))
    other = sum(by_category.values()) - rows_moved - gradients
    return [
        (
            "  between servers: rows / gradients / other (MB)",
            f"{_fmt(rows_moved / 1e6)} / {_fmt(gradients / 1e6)} / {_fmt(other / 1e6)}",
        )
    ]


def inter_server_by_category(comm_records: list[dict]) -> dict | None:
    """Mean inter-server bytes per epoch by category (summed over ranks) from the
    :class:`CommStats` records; ``None`` if a record lacks the split (one written before it
    existed, restored from an older checkpoint)."""
    if any("inter_server_category_bytes" not in c for c in comm_records):
        return None
    n = max(len(comm_records), 1)
    categories = comm_records[0]["inter_server_category_bytes"] if comm_records else {}
    return {
        cat: sum(c["inter_server_category_bytes"][cat] for c in comm_records) / n
        for cat in categories
    }


def _median(values) -> float | None:
    """Median of the values that are not ``None`` (records of older checkpoints lack the
    newer keys); ``None`` when there are none."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
