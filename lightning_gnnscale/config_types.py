"""Typed settings: one frozen dataclass per config section, validated once in ``__post_init__``.

Each dataclass is also a Hydra structured-config schema (:func:`schema_node`), so a typo or
a value of the wrong type fails while Hydra composes the config, with the key named. The values
themselves (ranges, choices, rules across sections) are checked when the composed config becomes
a :class:`RunConfig` (:func:`run_config`), in the launching process, before any rank starts.

A system's own settings are its ``SystemConfig`` subclass (``systems/<name>/config.py``); its
Strategy and its DataModule both receive that one object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cached_property
from typing import Any, ClassVar

from omegaconf import MISSING, DictConfig, MissingMandatoryValue, OmegaConf

from .comm.network import NetworkModel  # torch-free, as this module is
from .errors import ConfigError, check_field_types, choice, require
from .graph.dataset_config import DATASETS, DatasetConfig, dataset_content
from .tasks import NODE_TASKS, TRAINED_DECODERS, TaskConfig, task_spec

MODEL_NAMES = ("gcn", "sage", "gat", "rgcn", "rgat", "custom")
EMBEDDING_OPTIMIZERS = ("adagrad", "sgd")  # kit.embeddings.SPARSE_OPTIMIZERS' names
FEATURELESS_INPUTS = ("learned", "zeros")
RELATIONAL_MODELS = ("rgcn", "rgat")  # models that weigh each edge by its relation (typed graphs)
OPTIMIZERS = ("adam", "adamw", "sgd")
MODEL_INITS = ("torch", "glorot")  # BlockGNN's weight initialisation
MAX_BASES = 1024  # RGCN basis matrices (each in x out)
DTYPES = ("float32", "float64")
ACCELERATORS = ("cpu", "gpu", "cuda", "auto")
START_METHODS = ("forkserver", "spawn")  # how local ranks start (launch.py)
# what every consumer of the run's seed accepts: numpy's seeds (Lightning's seed_everything
# refuses others), within torch's manual_seed and the sampler's 64-bit hash keys
SEED_RANGE = (0, 2**32 - 1)


def check_seed(seed: Any, key: str = "seed") -> None:
    """``seed`` is an integer in :data:`SEED_RANGE`; the error names ``key`` and the range."""
    low, high = SEED_RANGE
    require(
        isinstance(seed, int) and not isinstance(seed, bool) and low <= seed <= high,
        f"{key}={seed!r} must be an integer in [{low}, {high}] (= 2**32 - 1, numpy's seeds)",
    )


@dataclass(frozen=True)
class DataConfig:
    """How training steps are cut and sampled.

    Args:
        batch_size: global seeds per step, split across ranks; ``-1`` = all training nodes.
        fanouts: neighbours per hop, from the seeds; ``-1`` = the full neighbourhood. On a
            typed graph, every relation's per hop (DGL's and PyG's per-relation fanouts).
        fanouts_per_relation: a typed graph's relation name -> its own fanouts per hop,
            overriding ``fanouts`` for that relation (``{}``: none).
        num_workers: DataLoader processes sampling ahead (systems that sample with
            collectives need 0).
        eval_chunk_size: destination nodes per chunk in layer-wise inference.
        partition_dir: train from this partition directory (``python -m
            lightning_gnnscale.partition``): the launcher loads no dataset and each rank
            loads only its own part (docs/partitioning.md); ``None``: partition in memory.
        featureless: a typed graph's node types without features: ``learned`` (a learnable
            embedding row per node, the features' width, sharded over the ranks and updated by
            a sparse optimiser; docs/architecture.md, "Learnable inputs") or ``zeros`` (the
            zero rows they load with).
        embedding_optimizer, embedding_lr: the sparse optimiser of learned input rows
            (``adagrad`` | ``sgd``) and its learning rate.
    """

    batch_size: int = 1024
    fanouts: list[int] = field(default_factory=lambda: [10, 10])
    fanouts_per_relation: dict[str, list[int]] = field(default_factory=dict)
    num_workers: int = 0
    eval_chunk_size: int = 65536
    partition_dir: str | None = None
    featureless: str = "learned"
    embedding_optimizer: str = "adagrad"
    embedding_lr: float = 0.05

    def __post_init__(self) -> None:
        check_field_types(self, "data.")
        choice("data.featureless", self.featureless, FEATURELESS_INPUTS)
        choice("data.embedding_optimizer", self.embedding_optimizer, EMBEDDING_OPTIMIZERS)
        require(
            math.isfinite(self.embedding_lr) and self.embedding_lr > 0,
            f"data.embedding_lr={self.embedding_lr} must be > 0 and finite",
        )
        require(
            self.batch_size > 0 or self.batch_size == -1,
            f"data.batch_size={self.batch_size} must be > 0 or -1 (-1 = all train nodes)",
        )
        require(
            len(self.fanouts) >= 1 and all(f > 0 or f == -1 for f in self.fanouts),
            f"data.fanouts={list(self.fanouts)}: each fanout must be > 0 or -1 "
            "(-1 = full neighbourhood)",
        )
        for relation, hops in self.fanouts_per_relation.items():
            require(
                isinstance(hops, list | tuple)
                and len(hops) == len(self.fanouts)
                and all(type(f) is int and (f > 0 or f == -1) for f in hops),
                f"data.fanouts_per_relation.{relation}={list(hops)}: give one fanout per hop "
                f"({len(self.fanouts)}, as data.fanouts), each > 0 or -1",
            )
        require(self.num_workers >= 0, f"data.num_workers={self.num_workers} must be >= 0")
        require(self.eval_chunk_size >= 1, "data.eval_chunk_size must be >= 1")
        require(
            self.partition_dir is None or bool(self.partition_dir),
            "data.partition_dir must be a folder (or null)",
        )


@dataclass(frozen=True)
class ModelConfig:
    """The GNN and its optimiser.

    Args:
        name: ``gcn`` | ``sage`` | ``gat`` | ``rgcn`` | ``rgat`` (relational: one weight per
            relation of a typed graph) | ``custom`` (a PyG model ``target(x, edge_index)``).
        hidden: hidden width (GAT: heads x channels per head).
        num_layers: GNN layers; one fanout per layer.
        dropout: on every layer's input (and GAT's attention), in ``[0, 1)``.
        heads: GAT and RGAT attention heads (other models ignore it).
        num_bases: RGCN's and RGAT's basis decomposition, ``0``: a full weight per relation.
        optimizer: ``adam`` | ``adamw`` | ``sgd``.
        lr, weight_decay: optimiser settings.
        init: ``torch`` (the layers' own initialisation) | ``glorot`` (every 2-D layer
            weight Glorot-uniform, as PyG's ``GCNConv``) | ``None``: the task's
            (``NodeTask.default_init``: ``glorot`` for link prediction, ``torch`` for the node
            tasks and for a custom model, which initialises itself).
        target, kwargs: ``custom`` only: the model class's dotted path and extra arguments.
    """

    name: str = "gcn"
    hidden: int = 64
    num_layers: int = 2
    dropout: float = 0.5
    heads: int = 8
    num_bases: int = 0
    optimizer: str = "adam"
    lr: float = 0.01
    weight_decay: float = 5e-4
    init: str | None = None
    target: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_field_types(self, "model.")
        choice("model", self.name, MODEL_NAMES)
        require(self.hidden >= 1, f"model.hidden={self.hidden} must be >= 1")
        require(self.num_layers >= 1, f"model.num_layers={self.num_layers} must be >= 1")
        require(0.0 <= self.dropout < 1.0, f"model.dropout={self.dropout} must be in [0, 1)")
        choice("model.optimizer", self.optimizer, OPTIMIZERS)
        if self.init is not None:
            choice("model.init", self.init, MODEL_INITS)
        require(
            self.name != "custom" or self.init in (None, "torch"),
            f"model.init={self.init}: a custom model initialises itself; leave model.init unset",
        )
        require(
            math.isfinite(self.lr) and self.lr > 0,
            f"model.lr={self.lr} must be > 0 and finite",
        )
        require(
            math.isfinite(self.weight_decay) and self.weight_decay >= 0,
            f"model.weight_decay={self.weight_decay} must be >= 0 and finite",
        )
        require(
            self.num_bases == 0 or self.name in RELATIONAL_MODELS,
            f"model.num_bases={self.num_bases} is RGCN's basis decomposition; model="
            f"{self.name} has none (leave it 0)",
        )
        require(
            0 <= self.num_bases <= MAX_BASES,
            f"model.num_bases={self.num_bases} must be in [0, {MAX_BASES}]",
        )
        if self.name in ("gat", "rgat"):
            require(self.heads >= 1, f"model.heads={self.heads} must be >= 1")
            require(
                self.hidden % self.heads == 0,
                f"model.hidden={self.hidden} must be divisible by model.heads={self.heads}",
            )
        if self.name == "custom":
            require(
                bool(self.target),
                "model=custom needs model.target (e.g. torch_geometric.nn.models.GraphSAGE)",
            )


@dataclass(frozen=True)
class TrainerConfig:
    """The Lightning Trainer settings a run uses (see ``conf/trainer/default.yaml``)."""

    accelerator: str = "cpu"
    devices: int = 2
    num_nodes: int = 1
    max_epochs: int = 20
    check_val_every_n_epoch: int = 1
    log_every_n_steps: int = 10
    enable_progress_bar: bool | None = None  # None: only when stderr is a terminal
    limit_train_batches: int | float | None = None
    deterministic: bool = False
    process_group_backend: str | None = None  # None = gloo on CPU, nccl on GPU

    def __post_init__(self) -> None:
        choice("trainer.accelerator", self.accelerator, ACCELERATORS)
        for key in ("devices", "num_nodes", "max_epochs", "check_val_every_n_epoch"):
            require(getattr(self, key) >= 1, f"trainer.{key}={getattr(self, key)} must be >= 1")
        require(self.log_every_n_steps >= 1, "trainer.log_every_n_steps must be >= 1")
        limit = self.limit_train_batches
        require(
            limit is None
            or (isinstance(limit, int) and limit >= 1)
            or (isinstance(limit, float) and 0.0 < limit <= 1.0),
            f"trainer.limit_train_batches={limit} must be null, an integer >= 1 (batches) or "
            "a fraction in (0, 1]",
        )

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes


@dataclass(frozen=True)
class PathsConfig:
    """Where a run reads datasets and caches and writes its outputs."""

    root: str = MISSING
    data_dir: str = MISSING
    cache_dir: str = MISSING
    output_dir: str = MISSING


@dataclass(frozen=True)
class TopologyConfig:
    """``servers``: simulate this many servers (ranks split evenly); ``None`` = num_nodes."""

    servers: int | None = None

    def __post_init__(self) -> None:
        require(self.servers is None or self.servers >= 1, "topology.servers must be >= 1")


@dataclass(frozen=True)
class LauncherConfig:
    """``timeout_s``: kill a local multi-process run after this long (``None`` = never);
    ``collective_timeout_s``: a collective stuck this long fails the run; ``start_method``:
    how local ranks start, ``forkserver`` (forked from a process that imported everything
    once) or ``spawn`` (each rank a fresh interpreter that imports everything again);
    ``allow_oversubscribe``: lift the bounds of ranks, loader workers and threads by this
    machine's cores (:mod:`lightning_gnnscale.bounds`), with a warning."""

    timeout_s: float | None = None
    collective_timeout_s: float = 300.0
    start_method: str = "forkserver"
    allow_oversubscribe: bool = False

    def __post_init__(self) -> None:
        check_field_types(self, "launcher.")
        require(
            self.timeout_s is None or self.timeout_s > 0,
            f"launcher.timeout_s={self.timeout_s} must be > 0 (or null)",
        )
        require(
            self.collective_timeout_s > 0,
            f"launcher.collective_timeout_s={self.collective_timeout_s} must be > 0",
        )
        choice("launcher.start_method", self.start_method, START_METHODS)


@dataclass(frozen=True)
class RunFacts:
    """What a system's cross-section rules (:meth:`SystemConfig.check_run`) see of a run.

    ``train.py`` makes it from its :class:`RunConfig` (:meth:`of_run`); a suite strategy makes
    it when the Trainer, the LightningModule and the DataModule meet (in ``setup``, before any
    step), so a plain Lightning script is held to the same rules.

    Attributes:
        world_size, devices, num_nodes: the Trainer's processes.
        data: the DataModule's data settings.
        model: the model's settings; ``None`` for a LightningModule that does not state them.
        ckpt_path: the checkpoint ``train.py`` resumes training from (a plain script's resume
            is refused or accepted when the checkpoint is loaded).
        allow_oversubscribe: ``launcher.allow_oversubscribe`` (a plain script has no launcher:
            ``False``), which lifts the core-based bounds (:mod:`lightning_gnnscale.bounds`).
        task: the run's task name; ``None`` where the caller does not know it (a strategy
            binding a DataModule: the DataModule checked its task when it was built).
        task_config: the run's task settings, where the caller has them (``train.py``).
    """

    world_size: int
    devices: int
    num_nodes: int
    data: DataConfig
    model: ModelConfig | None = None
    ckpt_path: str | None = None
    allow_oversubscribe: bool = False
    task: str | None = None
    task_config: TaskConfig | None = None

    @classmethod
    def of_run(cls, run: RunConfig) -> RunFacts:
        t = run.trainer
        return cls(
            t.world_size,
            t.devices,
            t.num_nodes,
            run.data,
            run.model,
            run.ckpt_path,
            run.launcher.allow_oversubscribe,
            run.task.name,
            run.task,
        )


@dataclass(frozen=True)
class SystemConfig:
    """Base of every system's settings (``strategy:`` in the run config).

    Subclasses add their fields and validate them in ``__post_init__`` (calling
    ``super().__post_init__()``, which checks every field's type); rules that involve other
    sections (the model, the data, the world size) go in :meth:`check_run`, called by
    :class:`RunConfig` and again by the strategy when a plain Lightning script's Trainer,
    module and DataModule meet.

    A preset (``grappa_uw``) is a name plus the settings that define it (``PRESETS``); get one
    with ``Config.preset(name)``. A config carrying a preset's name without its settings is
    refused.

    Args:
        name: the registered strategy name.
    """

    name: str = MISSING

    NAMES: ClassVar[tuple[str, ...]] = ()  # the strategy names this config serves
    PRESETS: ClassVar[dict[str, dict]] = {}  # preset name -> the settings that define it
    # model settings the system trains with by default (its strategy YAML sets them too);
    # applied by :meth:`model_config`
    MODEL_SETTINGS: ClassVar[dict[str, Any]] = {}
    accepts_custom_models: ClassVar[bool] = False  # can train a user model(x, edge_index)
    batches_in_main_process: ClassVar[bool] = True  # batches may run collectives: no workers
    supports_partition_dir: ClassVar[bool] = False  # ranks can load from data.partition_dir
    # the tasks it trains (SystemSpec.tasks): node tasks unless the system lists link prediction
    TASKS: ClassVar[tuple[str, ...]] = NODE_TASKS
    # its training blocks can leave out a step's own target pairs (task.exclude_target_edges)
    EXCLUDES_TARGET_EDGES: ClassVar[bool] = False
    # it trains and syncs a task's own parameters with the net (task.decoder=mlp, distmult)
    TRAINS_TASK_HEAD: ClassVar[bool] = False
    # its link-prediction evaluation ranks against every node (task.evaluation=filtered)
    FILTERED_RANKING: ClassVar[bool] = False
    # it trains typed graphs (relations per edge; model=rgcn): docs/architecture.md
    TYPED_GRAPHS: ClassVar[bool] = False
    # it trains link prediction on typed graphs (each pair with its relation)
    TYPED_LINK_PREDICTION: ClassVar[bool] = False
    # node types without features get learnable input rows (data.featureless=learned)
    LEARNED_INPUTS: ClassVar[bool] = False
    # the rank's threads build blocks the trainer frees: one malloc arena (cpu_memory.py)
    shares_malloc_arenas: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.NAMES and self.name not in self.NAMES:
            raise ConfigError(
                f"strategy.name={self.name!r} is not a name of {type(self).__name__} "
                f"(valid: {list(self.NAMES)}); pick a system with strategy=<name>, one of "
                f"{sorted(registered_systems())}"
            )
        check_field_types(self, "strategy.")
        for key, value in self.PRESETS.get(self.name, {}).items():
            require(
                getattr(self, key) == value,
                f"strategy.{key}={getattr(self, key)!r}: {self.name} is defined by "
                f"{key}={value!r}; build it with {type(self).__name__}.preset({self.name!r}) "
                f"(or pick another name)",
            )

    @classmethod
    def loads_partition_dir(cls, name: str) -> bool:
        """Whether the registered name ``name`` trains from ``data.partition_dir`` (default:
        ``supports_partition_dir``; a system may exclude some of its presets)."""
        return cls.supports_partition_dir

    @classmethod
    def preset(cls, name: str) -> SystemConfig:
        """The settings of strategy name ``name`` (a preset's defining settings applied)."""
        choice("strategy", name, cls.NAMES or (cls.name,))
        return cls(name=name, **cls.PRESETS.get(name, {}))

    def model_config(self, **settings: Any) -> ModelConfig:
        """A :class:`ModelConfig` with this system's model settings (``MODEL_SETTINGS``, e.g.
        SANCUS's dropout 0; the strategy YAML sets the same), then ``settings``."""
        return ModelConfig(**{**self.MODEL_SETTINGS, **settings})

    def check_data(self, data: DataConfig) -> None:
        """Rules between this system and the data settings; checked by :class:`RunConfig` and
        again by the DataModule, which a plain Lightning script builds without one."""
        require(
            not self.batches_in_main_process or data.num_workers == 0,
            f"strategy={self.name} builds its batches in the main process (they may run "
            f"collectives), but data.num_workers={data.num_workers}; set data.num_workers=0",
        )
        require(
            data.partition_dir is None or self.supports_partition_dir,
            partition_dir_unsupported(self.name),
        )

    def check_task(self, task: str | TaskConfig) -> None:
        """The system trains ``task`` (a name of :attr:`TASKS`, or its settings, which it must
        honour); checked by :class:`RunConfig` (:func:`check_run`) and by the DataModule, which
        a plain script builds without one."""
        settings = task if isinstance(task, TaskConfig) else None
        task = task.name if isinstance(task, TaskConfig) else task
        if task in self.TASKS:
            if settings is not None:
                self._check_task_settings(settings)
            return
        able = sorted(n for n, c in registered_systems().items() if task in c.TASKS)
        package = type(self).__module__.rpartition(".")[0]
        page = (
            f"docs/systems/{package.rpartition('.')[2]}.md"
            if package.startswith(f"{__package__}.systems.")
            else "its documentation"
        )
        raise ConfigError(
            f"task={task} is not supported by strategy={self.name} (it trains "
            f"{list(self.TASKS)}; {page} says why); strategies that train it: {able}"
        )

    def _check_task_settings(self, task: TaskConfig) -> None:
        """Refuse the task settings this system cannot honour, naming the systems that can."""
        needs = (
            (
                task.exclude_target_edges,
                "EXCLUDES_TARGET_EDGES",
                "task.exclude_target_edges=true",
                "leave a step's target pairs out of its blocks",
            ),
            (
                task.decoder in TRAINED_DECODERS,
                "TRAINS_TASK_HEAD",
                f"task.decoder={task.decoder}",
                "train and sync a task's own parameters with the net",
            ),
            (
                task.evaluation == "filtered",
                "FILTERED_RANKING",
                "task.evaluation=filtered",
                "rank evaluation pairs against every node",
            ),
        )
        for asked, flag, setting, what in needs:
            if asked and not getattr(self, flag):
                able = sorted(n for n, c in registered_systems().items() if getattr(c, flag))
                raise ConfigError(
                    f"{setting}: strategy={self.name} does not {what}; strategies that do: {able}"
                )

    def check_run(self, run: RunFacts) -> None:
        """Rules between this system and the rest of the run (model, data, world size...)."""


# ${task_monitor:${task.name}} / ${task_mode:${task.name}}: the task's monitored metric and its
# mode where a config names them (conf/callbacks/early_stopping.yaml)
OmegaConf.register_new_resolver("task_monitor", lambda name: task_spec(name).monitor, replace=True)
OmegaConf.register_new_resolver("task_mode", lambda name: task_spec(name).mode, replace=True)


@dataclass(frozen=True)
class RunConfig:
    """One run: every section typed, validated once (the launching process builds it)."""

    strategy: Any = MISSING  # a SystemConfig subclass, chosen by strategy=<name>
    dataset: Any = MISSING  # a DatasetConfig subclass, chosen by dataset=<name>
    task: TaskConfig = field(default_factory=TaskConfig)
    seed: int = 0
    dtype: str = "float32"
    ckpt_path: str | None = None
    weights_from: str | None = None
    callbacks: Any = field(default_factory=dict)  # {name: {_target_: class, ...kwargs}}
    logger: Any = None  # {_target_: class, ...kwargs} or null
    audit: bool = False
    network: str = "10gbe"
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)

    def __post_init__(self) -> None:
        require(isinstance(self.strategy, SystemConfig), "strategy is not a known system")
        check_seed(self.seed)
        choice("dtype", self.dtype, DTYPES)
        try:
            NetworkModel.from_name(self.network)
        except ValueError as err:
            raise ConfigError(f"network={self.network!r}: {err}") from None
        require(isinstance(self.dataset, DatasetConfig), "dataset is not a known dataset")
        world = self.trainer.world_size
        servers = self.topology.servers
        require(
            servers is None or world % servers == 0,
            f"topology.servers={servers} must divide the world size {world}",
        )
        require(
            self.ckpt_path is None or self.weights_from is None,
            "set ckpt_path (resume a run) or weights_from (start from its weights), not both",
        )
        if self.model.name == "custom" and not self.strategy.accepts_custom_models:
            valid = [n for n, c in registered_systems().items() if c.accepts_custom_models]
            raise ConfigError(
                f"strategy={self.strategy.name} cannot run model=custom (a model(x, edge_index) "
                f"cannot take the system's per-layer hooks); strategies that can: {valid}"
            )
        check_run(self.strategy, RunFacts.of_run(self))
        check_typed(self.strategy, self.dataset.is_typed, self.model, self.data, self.task.name)

    @property
    def world_size(self) -> int:
        return self.trainer.world_size

    @cached_property
    def settings(self) -> dict[str, Any]:
        """Every setting as plain dicts and lists (:func:`as_dict`), built once per run and
        travelling with it to the ranks: the config hash, the checkpoint identity and the
        logger's hyperparameters read it; none of them changes it."""
        return as_dict(self)

    @cached_property
    def identity(self) -> dict[str, Any]:
        """The settings a resumed run must share with the run that wrote its checkpoint
        (:func:`run_identity`), built once per run: the resume check and the identity every
        checkpoint carries are this one dict. A dataset whose content its name and options do
        not fix (a folder of the user's data) adds that content's digest: ``dataset.root`` may
        move, the data may not."""
        identity = run_identity(self.settings)
        content = dataset_content(self.dataset.name, self.dataset.root)
        if content is not None:
            identity["dataset.content"] = content
        return identity


# Settings a resumed run may change: where files live, how the job is launched and watched,
# how long it trains. Everything else decides what is trained and must match.
RESUME_MAY_CHANGE = (
    "paths",
    "ckpt_path",
    "weights_from",
    "launcher",
    "logger",
    "callbacks",
    "audit",
    "dataset.root",
    "dataset.cache_dir",
    "dataset.download",
    "data.num_workers",
    "data.partition_dir",
    "data.eval_chunk_size",
    "trainer.max_epochs",
    "trainer.enable_progress_bar",
    "trainer.log_every_n_steps",
    "trainer.check_val_every_n_epoch",
    "trainer.process_group_backend",
    "strategy.audit_collectives",
    "strategy.cache_partitions",
    "strategy.redundancy_probe_steps",
)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    out = {}
    for key, value in node.items():
        out.update(_flatten(value, f"{prefix}{key}."))
    return out


def run_identity(settings: dict[str, Any]) -> dict[str, Any]:
    """The identity of a run of ``settings`` (a run's :attr:`RunConfig.settings`, or a composed
    config as a container): every setting (dotted key -> value) but those in
    :data:`RESUME_MAY_CHANGE`, which a checkpoint carries and a resume must match."""
    return {
        key: value
        for key, value in _flatten(settings).items()
        if not any(key == skip or key.startswith(f"{skip}.") for skip in RESUME_MAY_CHANGE)
    }


def partition_dir_unsupported(name: str) -> str:
    """The error for ``data.partition_dir`` under a system that cannot load from one."""
    valid = [n for n, c in registered_systems().items() if c.loads_partition_dir(n)]
    return (
        f"data.partition_dir is not supported by strategy={name} yet (its ranks start from "
        f"the whole graph); strategies that load from a partition directory: {valid}"
    )


def check_run(config: SystemConfig, facts: RunFacts) -> None:
    """Every rule between a system and the rest of its run, checked once per run: one fanout
    per layer (when the model is known), the task (when known, ``config.check_task``), the
    system's data rules (``config.check_data``) and
    its own run rules (``config.check_run``). :class:`RunConfig` runs it before any rank
    starts; a strategy binding a DataModule runs it for a plain Lightning script (one built
    from a typed run, ``Strategy.from_run``, knows the run was checked)."""
    if facts.model is not None:
        check_depth(facts.data, facts.model)
    if facts.task is not None:
        config.check_task(facts.task_config or facts.task)
    config.check_data(facts.data)
    config.check_run(facts)


def check_typed(
    config: SystemConfig,
    typed: bool,
    model: ModelConfig | None,
    data: DataConfig,
    task: str | None = None,
) -> None:
    """A typed graph or a relational model needs a system that trains typed graphs
    (``TYPED_GRAPHS``), link prediction on a typed graph one that trains it there
    (``TYPED_LINK_PREDICTION``); per-relation fanouts need a typed graph."""
    relational = model is not None and model.name in RELATIONAL_MODELS
    if (typed or relational) and not config.TYPED_GRAPHS:
        able = sorted(n for n, c in registered_systems().items() if c.TYPED_GRAPHS)
        what = "the dataset is a typed graph" if typed else f"model={model.name} is relational"
        raise ConfigError(
            f"{what}, but strategy={config.name} does not train typed graphs yet "
            f'(docs/architecture.md, "Typed graphs"); strategies that do: {able}'
        )
    edges = typed and task is not None and task_spec(task).seeds == "edges"
    if edges and not config.TYPED_LINK_PREDICTION:
        able = sorted(n for n, c in registered_systems().items() if c.TYPED_LINK_PREDICTION)
        raise ConfigError(
            f"task={task}: link prediction on a typed graph (each pair with its relation) is "
            f"not built for strategy={config.name} yet; strategies that train it: {able}"
        )
    require(
        typed or not data.fanouts_per_relation,
        f"data.fanouts_per_relation={dict(data.fanouts_per_relation)} names relations, but the "
        "dataset is not a typed graph; drop it",
    )


def check_depth(data: DataConfig, model: ModelConfig) -> None:
    """One fanout per GNN layer (checked for a run and when a DataModule builds its model)."""
    require(
        len(data.fanouts) == model.num_layers,
        f"data.fanouts={list(data.fanouts)} has {len(data.fanouts)} hops but "
        f"model.num_layers={model.num_layers}; give one fanout per layer",
    )


def _writable(node: DictConfig) -> DictConfig:
    """A frozen dataclass's schema node made mergeable (Hydra merges YAML values into it)."""
    OmegaConf.set_readonly(node, None)
    for key in node:
        child = None if OmegaConf.is_missing(node, key) else node[key]
        if isinstance(child, DictConfig):
            _writable(child)
    return node


def schema_node(config: Any) -> DictConfig:
    """The structured-config node of a settings dataclass (its defaults) or of one of its
    objects (its values), typed by the class, as Hydra's ConfigStore takes it."""
    return _writable(OmegaConf.structured(config))


def register_run_schema() -> None:
    """Register the run schema (``run_schema``), which ``conf/config.yaml`` names first in its
    defaults list, and each dataset's (group ``schema/dataset``, named as :data:`DATASETS`
    names it), which its ``conf/dataset/<name>.yaml`` names first; each strategy name's node
    (group ``strategy``) is the registry's."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="run_schema", node=schema_node(RunConfig))
    for name, source in DATASETS.items():
        store.store(group="schema/dataset", name=name, node=schema_node(source.default_config()))


def registered_systems() -> dict[str, type[SystemConfig]]:
    """Every strategy name Hydra can compose (ConfigStore group ``strategy``, which the registry
    fills; this module never imports the systems, which import it) and its config class."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    found = {}
    for file in store.list("strategy") if "strategy" in store.repo else ():
        node = store.load(f"strategy/{file}").node
        found[file.removesuffix(".yaml")] = OmegaConf.get_type(node.strategy)
    return dict(sorted(found.items()))


def run_config(cfg: DictConfig | RunConfig) -> RunConfig:
    """The typed, validated run config of a composed Hydra config (raises ConfigError)."""
    if isinstance(cfg, RunConfig):
        return cfg
    strategy = cfg.get("strategy")
    typed = OmegaConf.get_type(strategy) if isinstance(strategy, DictConfig) else None
    if typed is None or not (is_dataclass(typed) and issubclass(typed, SystemConfig)):
        name = strategy.get("name") if isinstance(strategy, DictConfig) else strategy
        raise ConfigError(f"strategy={name!r} is unknown; valid: {list(registered_systems())}")
    _check_known_keys(cfg)
    try:
        run = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        raise ConfigError(
            f"{err.full_key} has no value and is required: set {err.full_key}=<value>"
        ) from None
    assert isinstance(run, RunConfig), type(run)
    return run


def _check_known_keys(node: DictConfig, prefix: str = "") -> None:
    """Keys forced in with ``+key=value`` (Hydra lets them past the schema) must be settings."""
    cls = OmegaConf.get_type(node)
    known = {f.name for f in fields(cls)} if is_dataclass(cls) else None
    for key in node:
        path = f"{prefix}{key}"
        if known is not None and key not in known:
            where = f" under {prefix[:-1]}" if prefix else ""
            raise ConfigError(f"{path} is not a known setting; valid keys{where}: {sorted(known)}")
        child = None if OmegaConf.is_missing(node, key) else node[key]
        if isinstance(child, DictConfig) and is_dataclass(OmegaConf.get_type(child)):
            _check_known_keys(child, f"{path}.")


def as_dict(config: Any) -> Any:
    """A settings dataclass (or a tree of them) as plain dicts and lists."""
    if is_dataclass(config):
        return {f.name: as_dict(getattr(config, f.name)) for f in fields(config)}
    if isinstance(config, dict):
        return {k: as_dict(v) for k, v in config.items()}
    if isinstance(config, list | tuple):
        return [as_dict(v) for v in config]
    return config
