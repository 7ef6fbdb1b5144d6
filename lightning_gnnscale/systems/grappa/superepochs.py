"""``SuperEpochClock``: where a run is in the chunk schedule, and when it moves on.

The DataModule owns one and saves it in its ``state_dict``; it advances the clock itself while
it builds training batches (:meth:`~.datamodule.GrappaDataModule.training_batch`), so no
callback is needed for a correct schedule. Rationale: docs/systems/grappa.md, "Super-epochs".
"""

from __future__ import annotations

import torch

from ...comm import Comm
from .config import EarlyTriggerConfig


class SuperEpochClock:
    """Super-epoch ``t`` and the epochs ``e_in`` spent in it; advances every ``length`` epochs,
    or earlier when the early trigger fires.

    Each epoch end is counted once (:meth:`end_epoch` skips an epoch already counted, e.g. one
    that Lightning runs again on resume). A resumed clock keeps the checkpoint's ``length``
    when ``auto_length`` (``super_epoch_len: auto``, derived from ``max_epochs``), so a new
    ``max_epochs`` does not change the schedule half-way; an explicit length that differs from
    the checkpoint's is refused.

    Args:
        length: epochs per super-epoch (>= 1).
        trigger: the early-trigger settings (default: disabled).
        auto_length: ``length`` was derived from ``max_epochs``.

    Attributes:
        t, e_in: the super-epoch the next epoch trains in, and the epochs already spent in it.
        window: the deficits ``1 - c_uniform`` of this rank's last ``window_steps`` steps.
        switches: the epochs after which ``t`` advanced; ``early_switches``: how many of those
            the trigger caused before ``length`` was reached.
        last_epoch: the last epoch whose end was counted (``-1``: none).
    """

    def __init__(
        self,
        length: int,
        trigger: EarlyTriggerConfig | None = None,
        auto_length: bool = False,
    ):
        self.length, self.auto_length = length, auto_length
        self.trigger = trigger if trigger is not None else EarlyTriggerConfig()
        self.t, self.e_in = 0, 0
        self.window: list[float] = []
        self.switches: list[int] = []
        self.early_switches = 0
        self.last_epoch = -1

    def record(self, deficit: float) -> None:
        """One training step's coverage deficit ``1 - c_uniform``."""
        self.window = [*self.window, deficit][-self.trigger.window_steps :]

    def vote(self) -> int:
        """This rank's early-trigger vote (before the MAX all-reduce)."""
        full = len(self.window) >= self.trigger.window_steps
        mean = sum(self.window) / max(len(self.window), 1)
        return int(full and mean > self.trigger.threshold and self.e_in >= self.trigger.min_epochs)

    def end_epoch(self, epoch: int, comm: Comm) -> None:
        """Count the end of ``epoch`` (once) and advance ``t`` when the super-epoch is over.

        With the trigger enabled every rank must call it for the same epochs: the votes are
        combined by one int64 all-reduce (MAX, ``control``) and all ranks switch together.
        """
        if epoch <= self.last_epoch:
            return
        self.last_epoch = epoch
        self.e_in += 1
        early = False
        if self.trigger.enabled:
            flag = torch.tensor([self.vote()], dtype=torch.int64)
            early = bool(comm.all_reduce(flag, "max", category="control")[0])
        if self.e_in >= self.length or early:
            self.early_switches += int(early and self.e_in < self.length)
            self.t, self.e_in = self.t + 1, 0
            self.window = []
            self.switches.append(epoch)

    def state_dict(self) -> dict:
        return {
            "t": self.t,
            "e_in": self.e_in,
            "length": self.length,
            "window": list(self.window),
            "switches": list(self.switches),
            "early_switches": self.early_switches,
            "last_epoch": self.last_epoch,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the clock; an explicit ``length`` must be the checkpoint's (see above)."""
        saved = state.get("length")  # absent in checkpoints written before it was saved
        if saved is not None and saved != self.length:
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
            self.length = saved
        self.t, self.e_in = state["t"], state["e_in"]
        self.window = list(state["window"])
        self.switches = list(state["switches"])
        self.early_switches = state["early_switches"]
        self.last_epoch = state["last_epoch"]
