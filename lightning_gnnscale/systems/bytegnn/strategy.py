"""``ByteGNNStrategy``: synchronous data parallel over the S-Worker's batches, and the
S-Worker's lifetime (started in ``setup``, stopped in ``teardown`` whatever the outcome)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from ..base import MeteredDDPStrategy
from .config import ByteGNNConfig
from .datamodule import ByteGNNDataModule
from .sworker import SWorker


class ByteGNNStrategy(MeteredDDPStrategy):
    """DDP (a metered all-reduce of summed gradients) in place of ByteGNN's parameter server:
    the same synchronous SGD. In ``setup`` it starts the DataModule's S-Worker (sampling
    threads and coarse scheduler) and exposes it as ``strategy.sworker``; ``teardown`` stops it
    and closes the graph-store service, on success and on failure alike.

    Args: as :class:`~..base.MeteredDDPStrategy`; ``config`` (a :class:`ByteGNNConfig`)
    defaults to the DataModule's.
    """

    config_type = ByteGNNConfig

    def __init__(self, config: ByteGNNConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        self.sworker: SWorker | None = None
        self._datamodule: ByteGNNDataModule | None = None

    @override
    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        datamodule = trainer.datamodule
        if not isinstance(datamodule, ByteGNNDataModule):
            raise TypeError(
                f"strategy=bytegnn trains on a ByteGNNDataModule's batches, got "
                f"{type(datamodule).__name__}"
            )
        if trainer.state.fn == TrainerFn.FITTING and self.sworker is None:
            self._datamodule, self.sworker = datamodule, datamodule.sworker
            self.sworker.last_epoch = trainer.max_epochs - 1 if trainer.max_epochs >= 0 else None
            self.sworker.start()

    @override
    def teardown(self) -> None:
        datamodule, self._datamodule, self.sworker = self._datamodule, None, None
        try:
            if datamodule is not None:
                datamodule.stop_service()
        finally:
            super().teardown()
