"""``ByteGNNConfig``: the settings of ``strategy=bytegnn`` (docs/systems/bytegnn.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ...bounds import check_threads_per_rank, externally_launched
from ...config_types import DataConfig, SystemConfig, choice, require
from ...errors import ConfigError
from ...graph.partition_config import METHOD_OPTIONS, PARTITION_METHODS, check_partition_options
from ...store_secret import require_secret
from ...tasks import NODE_TASKS
from .address import check_host
from .scheduler import default_sigma

if TYPE_CHECKING:
    from ...config_types import RunFacts

DAG_MODES = ("supervised",)
MAX_SLEEP_MS = 1000.0  # a poll interval longer than this starves the trainer
MAX_TASKS_PER_HOP = 4096  # most NSC / FF tasks per hop, whatever the batch size
SECRET_REASON = (
    "strategy=bytegnn: the ranks serve each other's graph stores on sockets and authenticate "
    "with a shared secret; these ranks are not all started by one train.py launcher on this "
    "node (several nodes, torchrun or SLURM)"
)


@dataclass(frozen=True)
class ByteGNNPartitionConfig:
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
        sleep_ms: the poll interval when not launching (at most 1000 ms).
        q_floor: lower bound of the supply (queued + in-flight DAGs) in the balance term.
        ema_alpha: weight of a new sample in the sample / train time averages.
        max_inflight: most DAGs in flight at once; ``None``: no limit (the paper's).
        prefetch_mb: most memory the prefetched batches may take, the queued ones at their
            bytes and each DAG in flight at the largest batch seen (before any, an a-priori
            bound); the paper's memory-footprint bound.
        cpu_window_ms: the CPU meter's window (utilisation of this rank over at least that
            long; kernel accounting cannot resolve a 5 ms poll).
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
    prefetch_mb: float = 256.0
    cpu_window_ms: float = 100.0
    prefetch_next_epoch: bool = True

    def __post_init__(self) -> None:
        require(
            self.sigma is None or self.sigma >= 0,
            f"strategy.scheduler.sigma={self.sigma} must be >= 0 (or null)",
        )
        require(self.gap_ref_ms > 0, "strategy.scheduler.gap_ref_ms must be > 0")
        require(0 <= self.cpu_ref <= 100, "strategy.scheduler.cpu_ref must be in [0, 100]")
        require(self.balance_ref > 0, "strategy.scheduler.balance_ref must be > 0")
        require(
            0 < self.sleep_ms <= MAX_SLEEP_MS,
            f"strategy.scheduler.sleep_ms={self.sleep_ms} must be in (0, {MAX_SLEEP_MS:g}] ms "
            "(the paper polls every 5 ms)",
        )
        require(self.q_floor > 0, f"strategy.scheduler.q_floor={self.q_floor} must be > 0")
        require(0 < self.ema_alpha <= 1, "strategy.scheduler.ema_alpha must be in (0, 1]")
        require(
            self.max_inflight is None or self.max_inflight >= 1,
            f"strategy.scheduler.max_inflight={self.max_inflight} must be >= 1 (or null)",
        )
        require(
            self.prefetch_mb > 0, f"strategy.scheduler.prefetch_mb={self.prefetch_mb} must be > 0"
        )
        require(
            50 <= self.cpu_window_ms <= MAX_SLEEP_MS,
            f"strategy.scheduler.cpu_window_ms={self.cpu_window_ms} must be in [50, "
            f"{MAX_SLEEP_MS:g}] ms (shorter windows are below the kernel's CPU accounting)",
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
        nsc_tasks: one-hop neighbourhood tasks per hop (the frontier cut into this many chunks);
            at most the seeds a rank takes per step.
        ff_tasks: feature-fetch tasks per hop (the hop's new vertices cut into this many
            chunks); at most the seeds a rank takes per step.
    """

    mode: str = "supervised"
    nsc_tasks: int = 2
    ff_tasks: int = 2

    def __post_init__(self) -> None:
        choice("strategy.dag.mode", self.mode, DAG_MODES)
        require(self.nsc_tasks >= 1, f"strategy.dag.nsc_tasks={self.nsc_tasks} must be >= 1")
        require(self.ff_tasks >= 1, f"strategy.dag.ff_tasks={self.ff_tasks} must be >= 1")
        for key in ("nsc_tasks", "ff_tasks"):
            value = getattr(self, key)
            require(
                value <= MAX_TASKS_PER_HOP,
                f"strategy.dag.{key}={value} must be <= {MAX_TASKS_PER_HOP} (and <= the seeds "
                "per step)",
            )

    def check_seeds_per_step(self, seeds: int, where: str) -> None:
        """Tasks per hop cannot exceed the seeds of a step (``where`` says which seeds)."""
        for key in ("nsc_tasks", "ff_tasks"):
            value = getattr(self, key)
            require(
                value <= seeds,
                f"strategy.dag.{key}={value} must be <= the seeds per step ({seeds}, {where}): "
                "a chunk smaller than one vertex is an empty task",
            )


@dataclass(frozen=True)
class ByteGNNConfig(SystemConfig):
    """``strategy=bytegnn``.

    Args:
        partition: the partitioner (default ``bytegnn``, the K-hop block partitioner, when the
            suite has it; else ``metis_balanced``).
        dag: the sampling DAG.
        scheduler: the coarse controller.
        sampling_threads: S-Worker threads per rank that run sampling tasks (at most 4 per
            usable core of this machine, ``bounds.check_threads_per_rank``; checked with the
            run, so ``launcher.allow_oversubscribe`` lifts it).
        host: the IPv4 address each rank's graph-store service listens on and publishes;
            ``None``: each rank chooses its own (``address.service_address``). Single node only.
    """

    name: str = "bytegnn"
    partition: ByteGNNPartitionConfig = field(default_factory=ByteGNNPartitionConfig)
    dag: DagConfig = field(default_factory=DagConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    sampling_threads: int = 2
    host: str | None = None

    NAMES: ClassVar[tuple[str, ...]] = ("bytegnn",)
    # link prediction last: CI's conformance suite runs a preset's first two tasks
    TASKS: ClassVar[tuple[str, ...]] = (*NODE_TASKS, "link_prediction")
    supports_partition_dir: ClassVar[bool] = True
    TYPED_GRAPHS: ClassVar[bool] = True
    TYPED_LINK_PREDICTION: ClassVar[bool] = True  # docs/systems/bytegnn.md, "Typed graphs"
    # a task head (task.decoder=mlp / distmult) is a module parameter: DDP syncs it as the net
    TRAINS_TASK_HEAD: ClassVar[bool] = True
    shares_malloc_arenas: ClassVar[bool] = True  # the S-Worker's batches (docs/systems/bytegnn.md)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.sampling_threads >= 1,
            f"strategy.sampling_threads={self.sampling_threads} must be >= 1",
        )
        if self.host is not None:
            check_host(self.host)

    def check_data(self, data: DataConfig) -> None:
        super().check_data(data)
        if data.batch_size != -1:
            self.dag.check_seeds_per_step(data.batch_size, "data.batch_size")

    def check_run(self, run: RunFacts) -> None:
        check_threads_per_rank(
            "strategy.sampling_threads", self.sampling_threads, run.allow_oversubscribe
        )
        world = run.world_size
        if run.data.batch_size != -1:
            self.dag.check_seeds_per_step(
                max(1, run.data.batch_size // world), f"data.batch_size / {world} ranks"
            )
        require(
            self.host is None or run.num_nodes == 1,
            f"strategy.host={self.host} is one address for ranks on {run.num_nodes} "
            "nodes: leave it null, and every rank publishes the address its peers reach it by "
            "(GLOO_SOCKET_IFNAME, else the route to MASTER_ADDR)",
        )
        if world > 1 and (run.num_nodes > 1 or externally_launched()):
            require_secret(SECRET_REASON)  # refused before any rank starts
