"""``strategy=gsplit``: GSplit (split-parallel mini-batch training) on Lightning.

Offline probabilistic partitioning (pre-sampled vertex and edge weights, weighted METIS),
split-parallel sampling with one id all-to-all per hop, a row shuffle before every layer (input
rows before layer 0, metered as ``feature``; hidden rows later, ``activation``), owner-only
feature loading through a partition-aligned cache. See docs/systems/gsplit.md.
"""

from __future__ import annotations

from ...config import ConfigError
from ..base import ddp_strategy_kwargs
from .callbacks import GSplitStats, RedundancyProbe
from .datamodule import GSplitDataModule, GSplitPrepared
from .partition import PARTITION_METHODS, ZERO_EDGE_POLICIES, cached_probabilistic_partition
from .strategy import GSplitStrategy

CACHE_POLICIES = ("presample_freq", "id_order")
PRESAMPLE_SEED_SALT = 0x5EED  # pre-sampling must not replay the training samples themselves


def validate(cfg) -> None:
    s = cfg.strategy
    checks = [
        (
            s.partition.method in PARTITION_METHODS,
            f"strategy.partition.method={s.partition.method!r} is unknown; "
            f"valid: {list(PARTITION_METHODS)}",
        ),
        (
            s.partition.zero_edge_policy in ZERO_EDGE_POLICIES,
            f"strategy.partition.zero_edge_policy={s.partition.zero_edge_policy!r} is unknown; "
            f"valid: {list(ZERO_EDGE_POLICIES)}",
        ),
        (
            int(s.partition.presample_epochs) >= 1,
            "strategy.partition.presample_epochs must be >= 1",
        ),
        (0.0 <= float(s.cache.fraction) <= 1.0, "strategy.cache.fraction must be in [0, 1]"),
        (
            s.cache.policy in CACHE_POLICIES,
            f"strategy.cache.policy={s.cache.policy!r} is unknown; valid: {list(CACHE_POLICIES)}",
        ),
        (int(s.redundancy_probe_steps) >= 0, "strategy.redundancy_probe_steps must be >= 0"),
        (
            int(cfg.data.num_workers) == 0,
            "strategy=gsplit samples with collectives in the main process; set data.num_workers=0",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def prepare(cfg, graph) -> GSplitPrepared:
    """Pre-sample and partition once (cached on disk by content hash)."""
    world = int(cfg.trainer.devices) * int(cfg.trainer.num_nodes)
    p = cfg.strategy.partition
    artifact = cached_probabilistic_partition(
        graph,
        world,
        method=p.method,
        fanouts=list(cfg.data.fanouts),
        batch_size=int(cfg.data.batch_size),
        presample_epochs=int(p.presample_epochs),
        seed=cfg.seed ^ PRESAMPLE_SEED_SALT,
        cache_dir=cfg.paths.cache_dir,
        metis_seed=cfg.seed,
        ufactor=int(p.ufactor),
        zero_edge_policy=p.zero_edge_policy,
    )
    print(
        f"[gsplit] {p.method} split into {world}: predicted cross-split edge share "
        f"{artifact['expected_cross_fraction']:.1%} ({artifact['num_batches']} pre-sampled "
        f"mini-batches)",
        flush=True,
    )
    report = {
        "method": p.method,
        "expected_cross_fraction": artifact["expected_cross_fraction"],
        "presampled_batches": artifact["num_batches"],
    }
    return GSplitPrepared(graph, artifact["parts"], artifact["k0_v"], report)


def build(cfg, data: GSplitPrepared):
    s = cfg.strategy
    strategy = GSplitStrategy(
        **ddp_strategy_kwargs(cfg),
    )
    dm = GSplitDataModule(
        data,
        cfg.data.fanouts,
        cfg.data.batch_size,
        seed=cfg.seed,
        cache_fraction=float(s.cache.fraction),
        cache_policy=s.cache.policy,
        eval_chunk_size=cfg.data.eval_chunk_size,
    )
    callbacks = [GSplitStats()]
    if int(s.redundancy_probe_steps):
        callbacks.append(RedundancyProbe(int(s.redundancy_probe_steps)))
    return strategy, dm, callbacks
