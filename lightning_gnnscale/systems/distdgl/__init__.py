"""``strategy=distdgl``: DistDGL (Zheng et al., 2020) on Lightning.

Partitioned graph (METIS with balanced training nodes, 1-hop halo, relabelled ids), a KV store
holding each rank's core features, a distributed hash-keyed sampler, DistDGL's even trainer
split, DDP for dense gradients and layer-wise distributed evaluation. See docs/systems/distdgl.md.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from ...config import ConfigError
from ...graph.book import PartitionBook, relabel_graph
from ...graph.cache import cached_partition
from ...graph.partition import PARTITION_METHODS, partition_report
from ..base import ddp_strategy_kwargs
from .datamodule import DistDGLDataModule, PartitionedGraph
from .strategy import SPARSE_OPTIMIZERS, DistDGLStrategy


def validate(cfg) -> None:
    s = cfg.strategy
    if s.partition.method not in PARTITION_METHODS:
        raise ConfigError(
            f"strategy.partition.method={s.partition.method!r} is unknown; "
            f"valid: {list(PARTITION_METHODS)}"
        )
    if int(s.embedding_dim) < 0:
        raise ConfigError(f"strategy.embedding_dim={s.embedding_dim} must be >= 0 (0 = off)")
    if int(s.embedding_dim) and cfg.ckpt_path is not None:
        raise ConfigError(
            "strategy=distdgl cannot resume with strategy.embedding_dim > 0 yet: "
            "the embedding shards are not checkpointed, they would restart"
        )
    if s.sparse_optimizer not in SPARSE_OPTIMIZERS:
        raise ConfigError(
            f"strategy.sparse_optimizer={s.sparse_optimizer!r} is unknown; "
            f"valid: {sorted(SPARSE_OPTIMIZERS)}"
        )
    if int(cfg.data.num_workers) != 0:
        raise ConfigError(
            "strategy=distdgl samples with collectives in the main process; set data.num_workers=0"
        )


def prepare(cfg, graph) -> PartitionedGraph:
    """Partition once (cached on disk by content hash), relabel, report the balance."""
    world = int(cfg.trainer.devices) * int(cfg.trainer.num_nodes)
    options = OmegaConf.to_container(cfg.strategy.partition)
    method = options.pop("method")
    parts = cached_partition(graph, method, world, cfg.seed, cfg.paths.cache_dir, **options)
    report = partition_report(graph, parts, world)
    print(
        f"[distdgl] {method} partition into {world}: edge cut "
        f"{report['edge_cut_fraction']:.1%}, train balance {report['train_balance']:.3f}, "
        f"node balance {report['node_balance']:.3f}",
        flush=True,
    )
    book = PartitionBook.from_parts(parts, world)
    return PartitionedGraph(relabel_graph(graph, book), book, report)


def build(cfg, data: PartitionedGraph):
    s = cfg.strategy
    strategy = DistDGLStrategy(
        sparse_optimizer=s.sparse_optimizer,
        sparse_lr=s.sparse_lr,
        **ddp_strategy_kwargs(cfg),
    )
    dm = DistDGLDataModule(
        data,
        cfg.data.fanouts,
        cfg.data.batch_size,
        seed=cfg.seed,
        embedding_dim=int(s.embedding_dim),
    )
    return strategy, dm, []
