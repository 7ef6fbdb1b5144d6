"""``ByteGNNConfig``: the settings of ``strategy=bytegnn`` (``conf/strategy/bytegnn.yaml``;
docs/systems/bytegnn.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...errors import ConfigError
from ...graph.partition import METHOD_OPTIONS, PARTITION_METHODS, check_partition_options
from ...schema import SystemConfig, choice, require
from .scheduler import default_sigma

DAG_MODES = ("supervised",)


@dataclass(frozen=True)
class PartitionConfig:
    """How the graph is cut into one part per rank (``graph/partition.py``; cached by hash).

    Args:
        method: any name of ``graph.partition.PARTITION_METHODS``.
        options: that method's options (``METHOD_OPTIONS[method]``); unset ones keep the
            partitioner's defaults.
    """

    method: str = "bytegnn"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        choice("strategy.partition.method", self.method, PARTITION_METHODS)
        unknown = sorted(set(self.options) - set(METHOD_OPTIONS[self.method]))
        require(
            not unknown,
            f"strategy.partition.options {unknown} are not options of {self.method!r}; "
            f"valid: {list(METHOD_OPTIONS[self.method])}",
        )
        try:  # bad values (e.g. bytegnn weights that do not sum to 1) fail here, not in fit
            check_partition_options(self.method, dict(self.options))
        except ValueError as error:
            raise ConfigError(f"strategy.partition.options: {error}") from error


@dataclass(frozen=True)
class SchedulerConfig:
    """The coarse controller (spec §3.2.3).

    Args:
        sigma: launch threshold; ``None``: ``gap_ref_ms * f(cpu_ref) * balance_ref``.
        gap_ref_ms, cpu_ref, balance_ref: the reference point of the default ``sigma``.
        sleep_ms: the poll interval when not launching.
        q_floor: lower bound of the queue length in the balance term.
        ema_alpha: weight of a new sample in the sample / train time averages.
        max_inflight: most DAGs in flight at once; ``None``: no limit (the paper's).
        prefetch_next_epoch: launch the next epoch's DAGs once this epoch's are all launched;
            ``false``: only once the trainer has taken this epoch's last batch.
    """

    sigma: float | None = None
    gap_ref_ms: float = 5.0
    cpu_ref: float = 80.0
    balance_ref: float = 1.0
    sleep_ms: float = 5.0
    q_floor: float = 0.5
    ema_alpha: float = 0.1
    max_inflight: int | None = None
    prefetch_next_epoch: bool = True

    def __post_init__(self) -> None:
        require(
            self.sigma is None or self.sigma >= 0,
            f"strategy.scheduler.sigma={self.sigma} must be >= 0 (or null)",
        )
        require(self.gap_ref_ms > 0, "strategy.scheduler.gap_ref_ms must be > 0")
        require(0 <= self.cpu_ref <= 100, "strategy.scheduler.cpu_ref must be in [0, 100]")
        require(self.balance_ref > 0, "strategy.scheduler.balance_ref must be > 0")
        require(self.sleep_ms > 0, f"strategy.scheduler.sleep_ms={self.sleep_ms} must be > 0")
        require(self.q_floor > 0, f"strategy.scheduler.q_floor={self.q_floor} must be > 0")
        require(0 < self.ema_alpha <= 1, "strategy.scheduler.ema_alpha must be in (0, 1]")
        require(
            self.max_inflight is None or self.max_inflight >= 1,
            f"strategy.scheduler.max_inflight={self.max_inflight} must be >= 1 (or null)",
        )

    @property
    def threshold(self) -> float:
        """The ``sigma`` in use."""
        if self.sigma is not None:
            return self.sigma
        return default_sigma(self.gap_ref_ms, self.cpu_ref, self.balance_ref)


@dataclass(frozen=True)
class DagConfig:
    """The sampling DAG of one mini-batch (spec §3.2.2).

    Args:
        mode: ``supervised`` (seed -> NSC / FF per hop -> end); unsupervised training with
            positive / negative samplers is not built (docs/systems/bytegnn.md).
        nsc_tasks: one-hop neighbourhood tasks per hop (the frontier cut into this many chunks).
        ff_tasks: feature-fetch tasks per hop (the hop's new vertices cut into this many chunks).
    """

    mode: str = "supervised"
    nsc_tasks: int = 2
    ff_tasks: int = 2

    def __post_init__(self) -> None:
        choice("strategy.dag.mode", self.mode, DAG_MODES)
        require(self.nsc_tasks >= 1, f"strategy.dag.nsc_tasks={self.nsc_tasks} must be >= 1")
        require(self.ff_tasks >= 1, f"strategy.dag.ff_tasks={self.ff_tasks} must be >= 1")


@dataclass(frozen=True)
class ByteGNNConfig(SystemConfig):
    """``strategy=bytegnn``.

    Args:
        partition: the partitioner (default ``bytegnn``, the K-hop block partitioner, when the
            suite has it; else ``metis_balanced``).
        dag: the sampling DAG.
        scheduler: the coarse controller.
        sampling_threads: S-Worker threads per rank that run sampling tasks.
        host: the address each rank's graph-store service listens on and publishes.
    """

    name: str = "bytegnn"
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    dag: DagConfig = field(default_factory=DagConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    sampling_threads: int = 2
    host: str = "127.0.0.1"

    NAMES: ClassVar[tuple[str, ...]] = ("bytegnn",)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.sampling_threads >= 1,
            f"strategy.sampling_threads={self.sampling_threads} must be >= 1",
        )
        require(bool(self.host), "strategy.host must name an address (e.g. 127.0.0.1)")
