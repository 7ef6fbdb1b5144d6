"""The collective audit: every ``torch.distributed`` call of an epoch must be metered."""

from __future__ import annotations

import lightning as L

from ..comm import CollectiveRecorder
from ..contract import rank_context


class CollectiveAudit(L.Callback):
    """Records every ``torch.distributed`` call of each training epoch (validation and the
    epoch-end reductions included) and fails the run if one was not metered, or if the metered
    bytes disagree with the meter (config ``audit: true``; every system's audit test uses it).

    Known framework calls the meter cannot see (Lightning's per-step SIGTERM flag broadcast)
    do not fail the run; they are counted apart (``framework_calls``, ``framework_bytes``) and
    reported in ``summary.json``.

    Place it last, so its window closes after the other callbacks' epoch-end reductions.
    """

    def __init__(self):
        self.calls = 0
        self.framework_calls = 0
        self.framework_bytes = 0

    @property
    def epoch_recorder(self) -> CollectiveRecorder:
        """The recorder of the training epoch in progress (opened in
        ``on_train_epoch_start``), for a callback that audits the same window more narrowly
        (recorders do not nest)."""
        return self._recorder

    def on_train_epoch_start(self, trainer, pl_module):
        self._recorder = CollectiveRecorder().__enter__()
        self._start = rank_context(trainer).meter.snapshot()

    def on_train_epoch_end(self, trainer, pl_module):
        if not hasattr(self, "_recorder"):
            return  # re-run epoch end on resume (see EpochStats): nothing was recorded
        self._recorder.__exit__(None, None, None)
        self.calls += len(self._recorder.calls)
        framework = self._recorder.framework_calls()
        self.framework_calls += len(framework)
        self.framework_bytes += sum(call.nbytes for call in framework)
        self._recorder.assert_accounted(rank_context(trainer).meter.delta(self._start))
