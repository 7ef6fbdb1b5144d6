"""``strategy=ddp``: every rank holds the whole graph and samples its share of each step.

This is what a PyG user does today; every system in the suite is compared with it.
"""

from __future__ import annotations

from ..base import MeteredDDPStrategy, SampledDataModule, ddp_strategy_kwargs


def validate(cfg) -> None:
    """Nothing beyond the common checks: ddp runs on any world size, one rank included."""


def build(cfg, graph):
    strategy = MeteredDDPStrategy(
        **ddp_strategy_kwargs(cfg),
    )
    dm = SampledDataModule(
        graph,
        cfg.data.fanouts,
        cfg.data.batch_size,
        seed=cfg.seed,
        salt_by_rank=cfg.strategy.salt_by_rank,
        num_workers=cfg.data.num_workers,
        eval_chunk_size=cfg.data.eval_chunk_size,
    )
    return strategy, dm, []
