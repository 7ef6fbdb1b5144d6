"""Grappa's callbacks (``GrappaDataModule.callbacks()``): reports and the gradient-only audit.

Neither is needed for correct training: the DataModule owns and advances the schedule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import lightning as L
from typing_extensions import override

from ...callbacks import CollectiveAudit
from ...comm import CollectiveRecorder
from ...contract import rank_context


@dataclass(frozen=True)
class ScheduleReport:
    """What :class:`GrappaStats` reports of this rank's schedule and partitions
    (``GrappaDataModule.schedule_report``).

    Attributes:
        super_epoch_switches: how many times ``t`` advanced; ``early_switches``: how many of
            those the early trigger made.
        partition_builds: partitions built from the chunk store; ``repartition_io_bytes``:
            the chunk bytes they read.
        largest_partition: ``{"nodes", "edges", "io_bytes"}`` of the largest one.
        excluded_pair_fraction: link prediction: the mean over the super-epochs trained of
            the fraction of training pairs no partition trained (``None``: a node task).
    """

    super_epoch_switches: int
    early_switches: int
    partition_builds: int
    repartition_io_bytes: int
    largest_partition: dict[str, int]
    excluded_pair_fraction: float | None = None


class GrappaStats(L.Callback):
    """Reports the coverage and the schedule: logs this rank's epoch means of ``c`` and ``Δ``
    (``grappa/c``, ``grappa/delta``, from each batch's ``coverage`` and ``deficit``) and
    gives ``summary.json`` the super-epoch switches, the mean ``c`` and the partition I/O.

    Args:
        schedule: ``() -> ScheduleReport``, read when the summary is written.
    """

    def __init__(self, schedule: Callable[[], ScheduleReport]):
        self.schedule = schedule
        self._c_sum, self._steps = 0.0, 0
        self._epoch_sums = [0.0, 0.0, 0]  # this epoch's sum of c, sum of delta, steps

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._c_sum += batch.coverage
        self._steps += 1
        c, delta, steps = self._epoch_sums
        self._epoch_sums = [c + batch.coverage, delta + batch.deficit, steps + 1]

    @override
    def on_train_epoch_end(self, trainer, pl_module):
        c, delta, steps = self._epoch_sums
        if steps:  # none in an epoch end that Lightning runs again on resume
            logged = {"grappa/c": c / steps, "grappa/delta": delta / steps}
            excluded = self.schedule().excluded_pair_fraction
            if excluded is not None:
                logged["grappa/excluded_pair_fraction"] = excluded
            pl_module.log_dict(logged)
        self._epoch_sums = [0.0, 0.0, 0]

    def summary_stats(self) -> dict:
        schedule = self.schedule()
        return {
            "grappa_super_epoch_switches": schedule.super_epoch_switches,
            "grappa_early_switches": schedule.early_switches,
            "grappa_mean_c_rank0": self._c_sum / max(self._steps, 1),
            "grappa_partition_builds_rank0": schedule.partition_builds,
            "grappa_repartition_io_bytes_rank0": schedule.repartition_io_bytes,
            "grappa_largest_partition_rank0": schedule.largest_partition,
            **(
                {"grappa_excluded_pair_fraction": schedule.excluded_pair_fraction}
                if schedule.excluded_pair_fraction is not None
                else {}
            ),
        }


def gradient_only_problems(calls, meter_delta: dict, between_steps: bool = False) -> list[str]:
    """Why recorded collectives are not gradient-only.

    Inside a training step: any call that is not a metered ``gradient`` all-reduce, and any
    non-gradient bytes. Between steps (batch building): any call outside ``control`` that is
    not a known framework call (Lightning's per-step SIGTERM flag, see
    :mod:`lightning_gnnscale.comm.audit`), and any bytes outside ``control``.
    """
    allowed = ("control",) if between_steps else ("gradient",)
    where = "between training steps" if between_steps else "in a training step"
    found = [
        f"{call.op} ({call.category}) {where}: {call}"
        for call in calls
        if not (between_steps and call.framework is not None)
        and (
            call.category not in allowed or (not between_steps and call.logical_op != "all_reduce")
        )
    ]
    found += [
        f"{category}: {n} bytes {where}"
        for category, n in meter_delta["bytes"].items()
        if category not in allowed and n
    ]
    return found


class EpochRecorderSource(Protocol):
    """What :class:`GradientOnlyAudit` reads from a run-wide audit: the recorder open for the
    training epoch in progress (:class:`~...callbacks.CollectiveAudit` is one)."""

    @property
    def epoch_recorder(self) -> CollectiveRecorder: ...


def run_audit(trainer: L.Trainer) -> EpochRecorderSource | None:
    """The Trainer's run-wide :class:`~...callbacks.CollectiveAudit` (``audit=true``), if any."""
    return next((cb for cb in trainer.callbacks if isinstance(cb, CollectiveAudit)), None)


class GradientOnlyAudit(L.Callback):
    """Gradient-only audit of every training epoch (``strategy.audit_collectives``).

    Each training step (``on_train_batch_start`` to ``on_train_batch_end``) may issue only
    metered gradient all-reduces; the time between steps, where batches are built, only
    ``control`` calls (the early trigger's vote) and known framework calls (Lightning's
    per-step SIGTERM flag, counted in ``grappa_audited_framework_calls``). The run fails
    otherwise. Reads the recorder of the run-wide audit when there is one (recorders do not
    nest), else records with its own, open for the whole training epoch.

    Args:
        shared: finds the run-wide audit of a Trainer (``None``: there is none); default
            :func:`run_audit`. Called at each epoch start; the audit's recorder is read at
            each step (it opens its epoch after this callback, being placed last).
    """

    def __init__(
        self, shared: Callable[[L.Trainer], EpochRecorderSource | None] = run_audit
    ) -> None:
        self.steps, self.calls, self.framework_calls, self.gradient_numel = 0, 0, 0, []
        self.shared = shared
        self._source: EpochRecorderSource | None = None
        self._own: CollectiveRecorder | None = None

    def _recorder(self) -> CollectiveRecorder:
        return self._own if self._own is not None else self._source.epoch_recorder

    @override
    def on_train_epoch_start(self, trainer, pl_module):
        self._source = self.shared(trainer)
        if self._source is None:
            self._own = CollectiveRecorder().__enter__()
        self._mark, self._snapshot = 0, rank_context(trainer).meter.snapshot()

    @override
    def on_train_epoch_end(self, trainer, pl_module):
        if self._own is not None:
            self._own.__exit__(None, None, None)
            self._own = None

    def _check(self, trainer, between_steps: bool) -> list:
        meter = rank_context(trainer).meter
        calls = self._recorder().calls[self._mark :]
        problems = gradient_only_problems(calls, meter.delta(self._snapshot), between_steps)
        if problems:
            raise AssertionError("gradient-only audit failed:\n" + "\n".join(problems))
        self._mark += len(calls)
        self._snapshot = meter.snapshot()
        return calls

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        calls = self._check(trainer, between_steps=True)
        self.framework_calls += sum(call.framework is not None for call in calls)

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        calls = self._check(trainer, between_steps=False)
        self.steps += 1
        self.calls += len(calls)
        self.gradient_numel.append(sum(call.numel for call in calls))

    def summary_stats(self) -> dict:
        return {
            "grappa_audited_steps": self.steps,
            "grappa_audited_calls": self.calls,
            "grappa_audited_framework_calls": self.framework_calls,
            "grappa_allreduced_numel_per_step": sorted(set(self.gradient_numel)),
        }
