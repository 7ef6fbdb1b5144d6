"""``PartitionConfig``: how the graph is cut into one part per rank, shared by the systems that
partition by ``graph/partition.py`` (``strategy.partition`` of distdgl and hopgnn)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..schema import choice, require
from .partition import (
    BALANCE_SCHEMES,
    METHOD_OPTIONS,
    PARTITION_METHODS,
    check_partition_options,
)


@dataclass(frozen=True)
class PartitionConfig:
    """How the graph is cut into one part per rank (``graph/partition.py``); computed once and
    cached by content hash (docs/systems/distdgl.md#partitioning).

    Args:
        method: ``metis_balanced`` (min cut, training nodes balanced) | ``metis`` | ``random``
            (the ablation) | ``contiguous``.
        ufactor: METIS imbalance in 1/1000 (``metis``, ``metis_balanced``).
        niter: METIS refinement iterations (``metis``, ``metis_balanced``).
        overpartition: METIS clusters per part before bin-packing (``metis_balanced``).
        balance: per-node columns balanced across parts: ``train`` | ``split`` | ``none``
            (``metis_balanced``).
        balance_edges: also balance in-degrees (``metis_balanced``).
        permute: shuffle node ids before cutting ranges (``contiguous``).
        hops: K of ByteGNN's K-hop blocks, usually the model's layer count (``bytegnn``).
        weights: (alpha, beta, gamma) for train / val / test balance, summing to 1; null: the
            split sizes' shares (``bytegnn``).
        smoothing: lambda of the cross-edge score (``bytegnn``).
        order: block-center priority, ``random`` (seeded) | ``gid`` (``bytegnn``).
        imbalance: cap on every split per part, ``ceil((1 + imbalance) * mean)``; null: no
            cap (``bytegnn``).
        block_bfs: ``level_sync`` (nearest center wins) | ``sequential`` (first center in
            priority order within ``hops`` wins) (``bytegnn``).
    """

    method: str = "metis_balanced"
    ufactor: int = 30
    niter: int = 10
    overpartition: int = 8
    balance: str = "train"
    balance_edges: bool = True
    permute: bool = False
    hops: int = 2
    weights: list[float] | None = None
    smoothing: float = 1.0
    order: str = "random"
    imbalance: float | None = 0.05
    block_bfs: str = "level_sync"

    def __post_init__(self) -> None:
        choice("strategy.partition.method", self.method, PARTITION_METHODS)
        require(self.ufactor >= 1, f"strategy.partition.ufactor={self.ufactor} must be >= 1")
        require(self.niter >= 1, f"strategy.partition.niter={self.niter} must be >= 1")
        require(
            self.overpartition >= 1,
            f"strategy.partition.overpartition={self.overpartition} must be >= 1",
        )
        choice("strategy.partition.balance", self.balance, BALANCE_SCHEMES)
        try:
            check_partition_options(self.method, self.options())
        except ValueError as error:
            raise ConfigError(f"strategy.partition: {error}") from error

    def options(self) -> dict[str, Any]:
        """The options ``method`` takes, for the partitioner (and its cache key)."""
        return {key: getattr(self, key) for key in METHOD_OPTIONS[self.method]}
