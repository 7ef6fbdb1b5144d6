"""``strategy=grappa``: Grappa (Xu et al., 2025) on Lightning, gradient-only communication.

The graph is cut once into chunks (``prepare``, written to an on-disk chunk store); each
super-epoch every rank trains in isolation on a partition (a pinned base chunk + a swept
variable chunk + 1-hop halo) read from the store, and the only training traffic is the DDP
gradient all-reduce, scaled per rank by a coverage factor. Presets ``grappa_uw`` (no
correction), ``grappa_fp`` (fixed partitions), ``grappa_naive`` (both) and ``grappa_50s`` (half
of the halo expanded remotely) are the paper's ablations. See docs/systems/grappa.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ConfigError
from ...graph.csc import Graph
from ..base import ddp_strategy_kwargs
from .callbacks import GradientOnlyAudit, SuperEpochController
from .chunking import CHUNKINGS, ChunkStore, write_chunk_store
from .datamodule import EVAL_MODES, GCN_NEEDS_HALO, MODES, GrappaDataModule
from .estimators import ESTIMATORS
from .schedule import SCHEDULES, SWEEP_ORDERS, Schedule, super_epoch_len
from .strategy import SCALING_IMPLS, GrappaStrategy

PRESETS = ("grappa", "grappa_uw", "grappa_fp", "grappa_naive", "grappa_50s")
NEIGHBOR_WEIGHTINGS = ("uniform", "gcn")


@dataclass(frozen=True)
class GrappaPrepared:
    """What ``prepare`` hands the ranks: the chunk store (a folder) and, only for
    ``eval_mode=global_fullgraph``, the whole graph."""

    store: ChunkStore
    graph: Graph | None


def _world(cfg) -> int:
    return int(cfg.trainer.devices) * int(cfg.trainer.num_nodes)


def num_chunks(cfg) -> int:
    """``C``: the configured count, or ``P = k W`` (pinned / fixed), ``2P`` (tournament)."""
    s = cfg.strategy
    if s.num_chunks is not None:
        return int(s.num_chunks)
    parts = int(s.partitions_per_rank) * _world(cfg)
    return 2 * parts if s.schedule == "tournament" else parts


def _choice(value, valid, key: str) -> None:
    if value not in valid:
        raise ConfigError(f"strategy.{key}={value!r} is unknown; valid: {list(valid)}")


def validate(cfg) -> None:
    s = cfg.strategy
    _choice(s.mode, MODES, "mode")
    _choice(s.chunking, CHUNKINGS, "chunking")
    _choice(s.schedule, SCHEDULES, "schedule")
    _choice(s.sweep_order, SWEEP_ORDERS, "sweep_order")
    _choice(s.estimator, ESTIMATORS, "estimator")
    _choice(s.scaling_impl, SCALING_IMPLS, "scaling_impl")
    _choice(s.eval_mode, EVAL_MODES, "eval_mode")
    _choice(s.neighbor_weighting, NEIGHBOR_WEIGHTINGS, "neighbor_weighting")
    _choice(int(s.halo_hops), (0, 1), "halo_hops")
    if s.neighbor_weighting == "gcn" and int(s.halo_hops) == 0:
        raise ConfigError(GCN_NEEDS_HALO)
    k = int(s.partitions_per_rank)
    if k < 1:
        raise ConfigError(f"strategy.partitions_per_rank={k} must be >= 1")
    c, parts = num_chunks(cfg), k * _world(cfg)
    have = Schedule(s.schedule, max(c, 1)).num_partitions if c >= 1 else 0
    if have != parts:
        raise ConfigError(
            f"strategy.num_chunks={c} gives {have} partitions with schedule={s.schedule}, but "
            f"partitions_per_rank x world size = {k} x {_world(cfg)} = {parts}; leave "
            "num_chunks=null to derive it"
        )
    trigger = s.early_trigger
    if int(trigger.window_steps) < 1:
        raise ConfigError(
            f"strategy.early_trigger.window_steps={trigger.window_steps} must be >= 1"
        )
    if not 0.0 <= float(trigger.threshold) < 1.0:
        raise ConfigError(f"strategy.early_trigger.threshold={trigger.threshold} must be in [0, 1)")
    if float(s.degree_smoothing) < 0:
        raise ConfigError("strategy.degree_smoothing must be >= 0")
    length = s.super_epoch_len
    if not (length in (None, "auto") or (isinstance(length, int) and length >= 1)):
        raise ConfigError(f"strategy.super_epoch_len={length!r} must be 'auto' or an int >= 1")
    frac = float(s.remote_sample_frac)
    if not 0.0 <= frac <= 1.0:
        raise ConfigError(f"strategy.remote_sample_frac={frac} must be in [0, 1]")
    if frac > 0 and (k != 1 or s.schedule == "tournament" or s.mode != "minibatch"):
        raise ConfigError(
            "strategy.remote_sample_frac > 0 (Grappa-50S) needs partitions_per_rank=1, a "
            "pinned_sweep or fixed schedule and mode=minibatch (each chunk's owner is then live)"
        )
    if frac > 0 and c != _world(cfg):
        raise ConfigError(
            f"strategy.remote_sample_frac > 0 needs num_chunks = world size ({_world(cfg)}), "
            f"got {c}: the owner of a node is the rank whose base chunk holds it"
        )
    if int(cfg.data.num_workers) != 0:
        raise ConfigError(
            "strategy=grappa builds batches in the main process; set data.num_workers=0"
        )
    if cfg.model.name == "custom":
        raise ConfigError("strategy=grappa cannot run model=custom; use model=gcn|sage|gat")


def prepare(cfg, graph: Graph) -> GrappaPrepared:
    """Chunk once and write the chunk store (content-keyed in ``paths.cache_dir``)."""
    s = cfg.strategy
    c = num_chunks(cfg)
    store = write_chunk_store(graph, c, s.chunking, int(cfg.seed), str(cfg.paths.cache_dir))
    if s.schedule == "pinned_sweep" and c == 2:
        print("[grappa] 2 chunks: repartitioning cannot change the pairs (a no-op)", flush=True)
    keep = s.eval_mode == "global_fullgraph"
    return GrappaPrepared(store, graph if keep else None)


def build(cfg, data: GrappaPrepared):
    s = cfg.strategy
    schedule = Schedule(s.schedule, data.store.num_chunks, s.sweep_order, int(cfg.seed))
    strategy = GrappaStrategy(
        estimator=s.estimator,
        degree_smoothing=float(s.degree_smoothing),
        scaling_impl=s.scaling_impl,
        **ddp_strategy_kwargs(cfg),
    )
    dm = GrappaDataModule(
        data.store,
        schedule,
        list(cfg.data.fanouts),
        int(cfg.data.batch_size),
        seed=int(cfg.seed),
        mode=s.mode,
        partitions_per_rank=int(s.partitions_per_rank),
        halo_hops=int(s.halo_hops),
        count_halo_as_local=bool(s.count_halo_as_local),
        degree_smoothing=float(s.degree_smoothing),
        neighbor_weighting=s.neighbor_weighting,
        estimator=s.estimator,
        eval_mode=s.eval_mode,
        graph=data.graph,
        remote_sample_frac=float(s.remote_sample_frac),
        cache_partitions=bool(s.cache_partitions),
        eval_chunk_size=int(cfg.data.eval_chunk_size),
    )
    trigger = s.early_trigger
    controller = SuperEpochController(
        super_epoch_len(s.super_epoch_len, int(cfg.trainer.max_epochs), schedule.cycle),
        early_trigger=bool(trigger.enabled),
        threshold=float(trigger.threshold),
        window_steps=int(trigger.window_steps),
        min_epochs=int(trigger.min_epochs),
        auto_length=s.super_epoch_len in (None, "auto"),
    )
    callbacks = [controller, *([GradientOnlyAudit()] if s.audit_collectives else [])]
    return strategy, dm, callbacks
