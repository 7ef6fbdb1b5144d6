"""``strategy=single``: one process, sampled or full-neighbourhood mini-batches; the oracle."""

from __future__ import annotations

from dataclasses import dataclass

from ...schema import RunFacts, SystemConfig, require
from ..base import MeteredSingleDeviceStrategy, SampledDataModule


@dataclass(frozen=True)
class SingleConfig(SystemConfig):
    """``strategy=single``: no settings of its own; one process."""

    name: str = "single"

    NAMES = ("single",)
    accepts_custom_models = True
    batches_in_main_process = False  # sampled in DataLoader workers if asked

    def check_run(self, run: RunFacts) -> None:
        require(
            run.devices == 1 and run.num_nodes == 1,
            f"strategy=single runs one process, but trainer.devices={run.devices} and "
            f"trainer.num_nodes={run.num_nodes}; set both to 1 or use strategy=ddp",
        )


class SingleStrategy(MeteredSingleDeviceStrategy):
    """One process, metered like the others (every collective a no-op that counts nothing)."""

    config_type = SingleConfig


class SingleDataModule(SampledDataModule):
    """Every training node's sampled blocks in one process: exactly the global mini-batch.

    Args: as :class:`~..base.GNNDataModule`; ``config`` defaults to ``SingleConfig()``.
    """

    def __init__(self, dataset, config: SingleConfig | None = None, data=None, **kwargs):
        super().__init__(dataset, config or SingleConfig(), data, salt_by_rank=False, **kwargs)
