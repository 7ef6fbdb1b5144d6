"""``strategy=sancus`` / ``strategy=cagnet``: SANCUS (staleness-aware communication-avoiding
full-graph training) and its exact broadcast baseline CAGNET-1D, on Lightning.

Row blocks of ``Â`` per rank, one skip-broadcast autograd Function per GCN layer, historical
embedding caches, staleness policies (bound 0, epoch-fixed, adaptive, variation gap, SkipG),
gradients summed by the strategy itself (no DDP wrapper). See docs/systems/sancus.md.
"""

from __future__ import annotations

from ...config import ConfigError
from ...graph.book import PartitionBook, relabel_graph
from ...graph.cache import cached_partition
from ..base import ddp_strategy_kwargs
from .callbacks import CacheMemory, StalenessLog
from .datamodule import SancusDataModule, SancusPrepared
from .layout import check_symmetric
from .policy import INPUT_POLICIES, POLICIES, StalenessPolicy
from .runtime import SancusGCN
from .strategy import SancusStrategy

ROW_ORDERS = ("contiguous", "random", "metis")


def policy_from_cfg(cfg) -> StalenessPolicy:
    s = cfg.strategy
    return StalenessPolicy(
        name=s.policy,
        epoch_bound=int(s.epoch_bound),
        variation_gap=float(s.variation_gap),
        input_policy=s.input_policy,
    )


def validate(cfg) -> None:
    s, name = cfg.strategy, cfg.strategy.name
    checks = [
        (
            s.policy in POLICIES,
            f"strategy.policy={s.policy!r} is unknown; valid: {list(POLICIES)}",
        ),
        (
            name != "cagnet" or s.policy == "none",
            f"strategy=cagnet is SANCUS with policy none (got {s.policy!r}); "
            "use strategy=sancus for a staleness policy",
        ),
        (
            s.input_policy in INPUT_POLICIES,
            f"strategy.input_policy={s.input_policy!r} is unknown; valid: {list(INPUT_POLICIES)}",
        ),
        (
            s.rows in ROW_ORDERS,
            f"strategy.rows={s.rows!r} is unknown; valid: {list(ROW_ORDERS)}",
        ),
        (
            cfg.ckpt_path is None or s.policy == "none",
            f"strategy={name} with policy {s.policy!r} cannot resume from ckpt_path: each "
            f"rank's staleness state (last broadcasts, cached blocks) is not in the "
            f"checkpoint, so the resumed run would diverge from the uninterrupted one; use "
            f"weights_from= to start a new run from its weights, or policy none",
        ),
        (int(s.epoch_bound) >= 0, "strategy.epoch_bound must be >= 0"),
        (float(s.variation_gap) >= 0, "strategy.variation_gap must be >= 0"),
        (
            cfg.model.name == "gcn",
            f"strategy={name} trains GCN only (its backward relies on a symmetric Â; "
            f"SAGE/GAT/custom are not implemented); got model={cfg.model.name}",
        ),
        (
            float(cfg.model.dropout) == 0.0,
            f"strategy={name} trains without dropout (spec §4.2.4); set model.dropout=0",
        ),
        (
            int(cfg.data.num_workers) == 0,
            f"strategy={name} builds its batch in the main process; set data.num_workers=0",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def prepare(cfg, graph) -> SancusPrepared:
    """Order the nodes into row blocks (cached partition for ``random`` / ``metis``)."""
    check_symmetric(graph)
    world = int(cfg.trainer.devices) * int(cfg.trainer.num_nodes)
    if graph.num_nodes < world:
        raise ValueError(f"{graph.num_nodes} nodes cannot fill {world} row blocks")
    parts = cached_partition(graph, cfg.strategy.rows, world, cfg.seed, cfg.paths.cache_dir)
    book = PartitionBook.from_parts(parts, world)
    sizes = (book.node_offsets[1:] - book.node_offsets[:-1]).tolist()
    print(f"[{cfg.strategy.name}] {cfg.strategy.rows} row blocks of {sizes} rows", flush=True)
    report = {"rows": cfg.strategy.rows, "row_block_sizes": sizes}
    return SancusPrepared(relabel_graph(graph, book), book.node_offsets, report)


def build(cfg, prepared: SancusPrepared):
    strategy = SancusStrategy(**ddp_strategy_kwargs(cfg))
    dm = SancusDataModule(prepared, policy_from_cfg(cfg), int(cfg.model.num_layers))
    return strategy, dm, [StalenessLog(), CacheMemory()]


def build_net(cfg, dm: SancusDataModule) -> SancusGCN:
    """The GCN whose layers broadcast through the data module's runtime."""
    m = cfg.model
    return SancusGCN(dm.input_dim, int(m.hidden), dm.num_classes, int(m.num_layers), dm.runtime)
