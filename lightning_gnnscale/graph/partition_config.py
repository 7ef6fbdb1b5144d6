"""``PartitionConfig``: how the graph is cut into one part per rank, shared by the systems that
partition by ``graph/partition.py`` (``strategy.partition`` of distdgl and hopgnn)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, choice, require

PARTITION_METHODS = ("random", "contiguous", "metis", "metis_balanced", "bytegnn")
BALANCE_SCHEMES = ("train", "split", "none")
CENTER_ORDERS = ("random", "gid")  # ByteGNN's block-center priority
BLOCK_BFS = ("level_sync", "sequential")  # ByteGNN's block growth
METHOD_OPTIONS = {
    "random": (),
    "contiguous": ("permute",),
    "metis": ("ufactor", "niter"),
    "metis_balanced": ("ufactor", "niter", "overpartition", "balance", "balance_edges"),
    "bytegnn": ("hops", "weights", "smoothing", "order", "imbalance", "block_bfs"),
}


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


def check_partition_options(method: str, options: dict) -> None:
    """Raise ValueError for an unknown method, an option it does not take, or a bad value of
    one (``metis_balanced``, ``bytegnn``); cheap, so configs call it before any work."""
    if method not in PARTITION_METHODS:
        raise ValueError(f"unknown partition method {method!r}; valid: {list(PARTITION_METHODS)}")
    unknown = sorted(set(options) - set(METHOD_OPTIONS[method]))
    if unknown:
        raise ValueError(
            f"partition method {method!r} got unknown options {unknown}; "
            f"valid: {list(METHOD_OPTIONS[method])}"
        )
    if method == "metis_balanced":
        metis_balanced_options(**options)
    elif method == "bytegnn":
        bytegnn_partition_options(**options)


def metis_balanced_options(
    overpartition: int = 8, balance: str = "train", balance_edges: bool = True, **_metis_options
) -> tuple[int, str, bool]:
    """``metis_balanced``'s own options with defaults, checked before any work."""
    if isinstance(overpartition, bool) or not isinstance(overpartition, int) or overpartition < 1:
        raise ValueError(f"overpartition must be an integer >= 1, got {overpartition!r}")
    if balance not in BALANCE_SCHEMES:
        raise ValueError(f"unknown balance {balance!r}; valid: {list(BALANCE_SCHEMES)}")
    if not isinstance(balance_edges, bool):
        raise ValueError(f"balance_edges must be a bool, got {balance_edges!r}")
    return overpartition, balance, balance_edges


def bytegnn_partition_options(
    hops: int = 2,
    weights=None,
    smoothing: float = 1.0,
    order: str = "random",
    imbalance: float | None = 0.05,
    block_bfs: str = "level_sync",
) -> dict:
    """``bytegnn``'s options with defaults, checked before any work."""

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 1:
        raise ValueError(f"bytegnn hops must be an integer >= 1, got {hops!r}")
    if weights is not None:
        if (
            isinstance(weights, (str, bytes))
            or len(weights) != 3
            or not all(number(w) and w >= 0 for w in weights)
            or abs(sum(weights) - 1.0) > 1e-6
        ):
            raise ValueError(
                "bytegnn weights must be None or three numbers >= 0 (train, val, test) summing "
                f"to 1, got {weights!r}"
            )
        weights = tuple(float(w) for w in weights)
    if not number(smoothing) or smoothing < 0:
        raise ValueError(f"bytegnn smoothing must be a number >= 0, got {smoothing!r}")
    if order not in CENTER_ORDERS:
        raise ValueError(f"unknown bytegnn order {order!r}; valid: {list(CENTER_ORDERS)}")
    if imbalance is not None and (not number(imbalance) or imbalance < 0):
        raise ValueError(f"bytegnn imbalance must be None or a number >= 0, got {imbalance!r}")
    if block_bfs not in BLOCK_BFS:
        raise ValueError(f"unknown bytegnn block_bfs {block_bfs!r}; valid: {list(BLOCK_BFS)}")
    return {
        "hops": hops,
        "weights": weights,
        "smoothing": float(smoothing),
        "order": order,
        "imbalance": imbalance,
        "block_bfs": block_bfs,
    }
