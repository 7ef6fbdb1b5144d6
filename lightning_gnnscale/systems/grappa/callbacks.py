"""Grappa's callbacks: the super-epoch controller and the gradient-only audit."""

from __future__ import annotations

import lightning as L
import torch

from ...callbacks import CollectiveAudit
from ...comm import CollectiveRecorder


class SuperEpochController(L.Callback):
    """Advances the DataModule's super-epoch ``t`` every ``length`` epochs, or earlier when the
    optional trigger fires (spec §2.5, A6): the mean coverage deficit ``1 - c_uniform`` over a
    rank's last ``window_steps`` steps is above ``threshold`` and the super-epoch has lasted
    ``min_epochs``; the ranks' flags are combined by one int all-reduce (MAX, ``control``) at
    epoch end, outside training steps, and all ranks switch together.

    Each epoch end is counted once: a checkpoint written inside an epoch's last validation
    (validation not every epoch) holds the state before that epoch's end, and Lightning runs
    that epoch end again on resume, which makes the advance then; an epoch end already counted
    (``last_epoch``, saved with the state) is skipped.

    The super-epoch length is saved with the state. ``auto_length`` (``super_epoch_len: auto``,
    derived from ``max_epochs``): a resumed run keeps the checkpoint's length, so a new
    ``max_epochs`` does not change the schedule half-way. An explicit length that differs from
    the checkpoint's is refused.

    Also logs this rank's epoch means of ``c`` and ``Δ`` (``grappa/c``, ``grappa/delta``) and
    collects coverage statistics for ``summary.json``.
    """

    def __init__(
        self,
        length: int,
        early_trigger: bool = False,
        threshold: float = 0.9,
        window_steps: int = 20,
        min_epochs: int = 1,
        auto_length: bool = False,
    ):
        self.length, self.early_trigger, self.auto_length = length, early_trigger, auto_length
        self.threshold, self.window_steps, self.min_epochs = threshold, window_steps, min_epochs
        self.window: list[float] = []
        self.switches: list[int] = []  # epochs after which t advanced
        self.early_switches = 0
        self.last_epoch = -1  # the last epoch whose end was counted
        self._c_sum, self._steps = 0.0, 0
        self._epoch_sums = [0.0, 0.0, 0]  # this epoch's sum of c, sum of delta, steps
        self._dm = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        strategy = trainer.strategy
        self.window = [*self.window, strategy.last_delta][-self.window_steps :]
        self._c_sum += strategy.last_c
        self._steps += 1
        c, delta, steps = self._epoch_sums
        self._epoch_sums = [c + strategy.last_c, delta + strategy.last_delta, steps + 1]

    def trigger_flag(self, epochs_in: int) -> int:
        """This rank's early-trigger vote (before the all-reduce)."""
        full = len(self.window) >= self.window_steps
        mean = sum(self.window) / max(len(self.window), 1)
        return int(full and mean > self.threshold and epochs_in >= self.min_epochs)

    def on_train_epoch_end(self, trainer, pl_module):
        dm = self._dm = trainer.datamodule
        if trainer.current_epoch <= self.last_epoch:
            return
        self.last_epoch = trainer.current_epoch
        c, delta, steps = self._epoch_sums
        if steps:
            pl_module.log_dict({"grappa/c": c / steps, "grappa/delta": delta / steps})
        self._epoch_sums = [0.0, 0.0, 0]
        dm.e_in += 1
        early = False
        if self.early_trigger:
            flag = torch.tensor([self.trigger_flag(dm.e_in)], dtype=torch.int64)
            early = bool(trainer.strategy.comm.all_reduce(flag, "max", category="control")[0])
        if dm.e_in >= self.length or early:
            self.early_switches += int(early and dm.e_in < self.length)
            dm.t, dm.e_in = dm.t + 1, 0
            self.window = []
            self.switches.append(trainer.current_epoch)

    def state_dict(self) -> dict:
        return {
            "length": self.length,
            "window": list(self.window),
            "switches": list(self.switches),
            "early_switches": self.early_switches,
            "last_epoch": self.last_epoch,
        }

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("length")  # absent in checkpoints written before it was saved
        if saved is not None and int(saved) != self.length:
            if not self.auto_length:
                raise ValueError(
                    f"strategy.super_epoch_len={self.length} differs from the checkpoint's "
                    f"super-epoch length {saved}: resuming would change the schedule half-way; "
                    f"set strategy.super_epoch_len={saved} (or auto) to continue it"
                )
            print(
                f"[grappa] resuming with the checkpoint's super-epoch length {saved} "
                f"(super_epoch_len=auto would give {self.length} for this max_epochs)",
                flush=True,
            )
            self.length = int(saved)
        self.window = list(state["window"])
        self.switches = list(state["switches"])
        self.early_switches = int(state["early_switches"])
        self.last_epoch = int(state["last_epoch"])

    def summary_stats(self) -> dict:
        return {
            "grappa_super_epoch_switches": len(self.switches),
            "grappa_early_switches": self.early_switches,
            "grappa_mean_c_rank0": self._c_sum / max(self._steps, 1),
            "grappa_partition_builds_rank0": self._dm.builds if self._dm else 0,
            "grappa_repartition_io_bytes_rank0": self._dm.io_bytes if self._dm else 0,
            "grappa_largest_partition_rank0": self._dm.largest_partition if self._dm else {},
        }


def gradient_only_problems(calls, meter_delta: dict, between_steps: bool = False) -> list[str]:
    """Why recorded collectives are not gradient-only.

    Inside a training step: any call that is not a metered ``gradient`` all-reduce, and any
    non-gradient bytes. Between steps (batch building, Lightning's per-step stop flag): any call
    or bytes outside ``control``.
    """
    allowed = ("control",) if between_steps else ("gradient",)
    where = "between training steps" if between_steps else "in a training step"
    found = [
        f"{call.op} ({call.category}) {where}: {call}"
        for call in calls
        if call.category not in allowed or (not between_steps and call.op != "all_reduce")
    ]
    found += [
        f"{category}: {n} bytes {where}"
        for category, n in meter_delta["bytes"].items()
        if category not in allowed and n
    ]
    return found


class GradientOnlyAudit(L.Callback):
    """Gradient-only audit of every training epoch (``strategy.audit_collectives``).

    Each training step (``on_train_batch_start`` to ``on_train_batch_end``) may issue only
    metered gradient all-reduces; the time between steps, where batches are built, only
    ``control`` calls (Lightning's stop flag). The run fails otherwise. Uses the run-wide
    ``CollectiveAudit``'s recorder when ``audit=true`` (recorders do not nest), else its own,
    open for the whole training epoch.
    """

    def __init__(self):
        self.steps, self.calls, self.gradient_numel = 0, 0, []
        self._own: CollectiveRecorder | None = None

    def _recorder(self, trainer) -> CollectiveRecorder:
        if self._own is not None:
            return self._own
        return next(cb._recorder for cb in trainer.callbacks if isinstance(cb, CollectiveAudit))

    def on_train_epoch_start(self, trainer, pl_module):
        if not any(isinstance(cb, CollectiveAudit) for cb in trainer.callbacks):
            self._own = CollectiveRecorder().__enter__()
        self._mark, self._snapshot = 0, trainer.strategy.meter.snapshot()

    def on_train_epoch_end(self, trainer, pl_module):
        if self._own is not None:
            self._own.__exit__(None, None, None)
            self._own = None

    def _check(self, trainer, between_steps: bool) -> list:
        calls = self._recorder(trainer).calls[self._mark :]
        delta = trainer.strategy.meter.delta(self._snapshot)
        problems = gradient_only_problems(calls, delta, between_steps)
        if problems:
            raise AssertionError("gradient-only audit failed:\n" + "\n".join(problems))
        self._mark += len(calls)
        self._snapshot = trainer.strategy.meter.snapshot()
        return calls

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._check(trainer, between_steps=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        calls = self._check(trainer, between_steps=False)
        self.steps += 1
        self.calls += len(calls)
        self.gradient_numel.append(sum(call.numel for call in calls))

    def summary_stats(self) -> dict:
        return {
            "grappa_audited_steps": self.steps,
            "grappa_audited_calls": self.calls,
            "grappa_allreduced_numel_per_step": sorted(set(self.gradient_numel)),
        }
