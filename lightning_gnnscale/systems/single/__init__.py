"""``strategy=single``: one process, sampled or full-neighbourhood mini-batches; the oracle."""

from __future__ import annotations

from ...config import ConfigError
from ..base import MeteredSingleDeviceStrategy, SampledDataModule


def validate(cfg) -> None:
    if int(cfg.trainer.devices) != 1 or int(cfg.trainer.num_nodes) != 1:
        raise ConfigError(
            f"strategy=single runs one process, but trainer.devices={cfg.trainer.devices} and "
            f"trainer.num_nodes={cfg.trainer.num_nodes}; set both to 1 or use strategy=ddp"
        )


def build(cfg, graph):
    strategy = MeteredSingleDeviceStrategy(
        device="cpu" if cfg.trainer.accelerator == "cpu" else "cuda"
    )
    dm = SampledDataModule(
        graph,
        cfg.data.fanouts,
        cfg.data.batch_size,
        seed=cfg.seed,
        salt_by_rank=False,
        num_workers=cfg.data.num_workers,
        eval_chunk_size=cfg.data.eval_chunk_size,
    )
    return strategy, dm, []
