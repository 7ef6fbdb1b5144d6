"""The collective audit: every ``torch.distributed`` call of an epoch must be metered."""

from __future__ import annotations

import lightning as L

from ..comm import CollectiveRecorder


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
