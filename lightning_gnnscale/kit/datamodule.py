"""The base of every system's DataModule (docs/architecture.md, "The system contract"):
preprocess once, set up per rank, batches, evaluation and predict."""

from __future__ import annotations

import os
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader
from typing_extensions import override

from ..checkpoints import CHECKPOINT_KEY, RANK_SHARD
from ..comm import Topology
from ..config_types import DataConfig, ModelConfig, RunConfig, SystemConfig, check_depth, check_seed
from ..contract import PREDICT_OUTPUTS, Evaluation, Prediction, RankContext, bind_datamodule
from ..errors import ConfigError
from ..graph.batch import Batch
from ..graph.csc import Graph
from ..graph.dataset_config import DatasetConfig, dataset_config
from ..graph.datasets import load_dataset
from ..graph.node_targets import NodeDataset, NodeTargets
from ..graph.order import EpochOrder
from ..graph.sampler import check_relation_fanouts
from ..models.gnn import build_model
from ..models.inference import node_rows
from ..tasks import TaskConfig, build_task
from ..tasks.base import NodeTask
from .loaders import OneItem, collective_train_loader, no_collate
from .partition_io import FEATURELESS_GROUP, PartitionDirIO

PREPROCESSING_CACHE_DIR = os.path.join(".cache", "lightning_gnnscale")


def relation_fanouts(
    data: DataConfig, relations: tuple[str, ...] | list[str], where: str
) -> list[tuple[int, ...]] | None:
    """Per hop, the fanout of each of a typed graph's ``relations`` (``data.fanouts``,
    overridden by ``data.fanouts_per_relation``); ``None`` without relations. Per-relation
    fanouts that name no relation of the graph (``where``, for the message) are refused."""
    given = data.fanouts_per_relation
    if not relations:
        if given:
            raise ConfigError(
                f"data.fanouts_per_relation={dict(given)} names relations, but {where} holds a "
                "homogeneous graph; drop it"
            )
        return None
    unknown = sorted(set(given) - set(relations))
    if unknown:
        raise ConfigError(
            f"data.fanouts_per_relation names {unknown}, which are not relations of {where}; "
            f"its relations: {list(relations)}"
        )
    return check_relation_fanouts(
        [
            tuple(given.get(r, data.fanouts)[hop] for r in relations)
            for hop in range(len(data.fanouts))
        ],
        len(data.fanouts),
        len(relations),
    )


class GNNDataModule(PartitionDirIO, L.LightningDataModule):
    """Base of every system's DataModule: one graph, the system's config, the shared data
    settings, and the two-stage set-up Lightning defines.

    - :meth:`prepare` does the one-off preprocessing of a world size (partitioning,
      pre-sampling, chunk stores), cached on disk by content hash; ``prepare_data`` calls it
      once per node and ``setup`` again on every rank, where it loads the cached result. A
      launcher that prepared before starting the ranks hands them the result with the module.
    - ``setup`` binds the system config to the Trainer's strategy
      (:func:`~..contract.bind_datamodule`), then :meth:`setup_rank` builds this rank's share.
    - The validation and test loaders yield one :class:`~..contract.Evaluation` whose counts
      task statistics come from :meth:`eval_statistics`.
    - The task (:mod:`~..tasks`) owns the targets (:attr:`targets`, one row per node, from
      ``task.prepare``), the training seeds (:attr:`train_ids`), the head's width
      (:attr:`out_dim`) and what evaluation counts; the system selects the rows it holds.

    With ``data.partition_dir`` (systems whose config has ``supports_partition_dir``) the
    DataModule never loads the whole graph: :meth:`prepare` opens and checks the partition
    directory (:class:`~..graph.partition_dir.PartitionDir`) and verifies the parts of this
    node's ranks, and each rank's :meth:`setup_rank` loads its own part, memory-mapped
    (docs/partitioning.md).

    Args:
        dataset: a :class:`~..graph.node_targets.NodeDataset`, or a dataset to load (:func:`load_dataset`: a run's
            :class:`DatasetConfig`, or a name with ``dataset_options``); with
            ``data.partition_dir``, a dataset's name or config (checked against the directory)
            or ``None`` (the directory's dataset).
        config: the system's settings.
        data: batch size, fanouts, loader workers, evaluation chunk size, partition directory.
        seed: base of the epoch permutations and sampling keys.
        cache_dir: where preprocessing results are cached (default ``./.cache/lightning_gnnscale``).
        dtype: features' dtype when loading by name (a given dataset is used as it is).
        dataset_options: a dataset name's settings (``root``, ``num_nodes``...), typed here.
        checked_run: the typed run this module is built for (``run.build_datamodule``), which
            holds ``config`` and ``data``: its rules were checked once when it was typed
            (:func:`~..config_types.check_run`), so the module does not check them again; ``None``
            (a plain script): the task and data rules are checked here, the depth in
            :meth:`build_model`.
    """

    def __init__(
        self,
        dataset: NodeDataset | DatasetConfig | str | None,
        config: SystemConfig,
        data: DataConfig | None = None,
        *,
        seed: int = 0,
        cache_dir: str | os.PathLike | None = None,
        dtype: torch.dtype = torch.float32,
        dataset_options: dict | None = None,
        checked_run: RunConfig | None = None,
        task: str | NodeTask | None = None,
    ):
        super().__init__()
        self.task = build_task(task)
        if not isinstance(config, SystemConfig):
            raise TypeError(f"config must be a system config, got {type(config).__name__}")
        self.config = config
        self.data = data if data is not None else DataConfig()
        if checked_run is None:
            config.check_task(self.task.config or self.task.name)
            config.check_data(self.data)
        elif (checked_run.strategy, checked_run.data) != (config, self.data):
            raise ValueError("checked_run is another run than the config and data given")
        self.checked_run = checked_run
        check_seed(seed)
        self.seed = seed
        self.cache_dir = Path(cache_dir if cache_dir is not None else PREPROCESSING_CACHE_DIR)
        self.partition_dir = self.data.partition_dir
        if isinstance(dataset, Graph):
            raise TypeError(
                "dataset is a Graph, which holds structure and features only: pass "
                "NodeDataset(graph, NodeTargets(labels, train, val, test, num_classes)) "
                "(lightning_gnnscale.graph.node_targets), or a dataset name"
            )
        if self.partition_dir is not None and isinstance(dataset, NodeDataset):
            raise ValueError(
                "data.partition_dir: the ranks load their parts from the directory; pass the "
                "dataset's name (or None), not a NodeDataset"
            )
        if dataset is None and self.partition_dir is None:
            raise ValueError("dataset is None: pass a NodeDataset or a dataset name")
        self._dataset = dataset if isinstance(dataset, NodeDataset) else None
        self._targets: NodeTargets | None = None
        self.dataset_config = (
            None
            if isinstance(dataset, NodeDataset | None)
            else dataset_config(dataset, **(dataset_options or {}))
        )
        self._dtype = dtype
        self._prepared: dict[int, Any] = {}
        self.context: RankContext | None = None
        # learnable input rows (kit.embeddings.LearnableInputs), set up by the system
        self.learned_inputs: Any = None
        self._bound_to: L.Trainer | None = None
        self.stage: str | None = None  # the Trainer's latest run (``setup``'s stage)
        # the epoch the train loader last started, and a resumed fit's first one (the
        # checkpoint's, :meth:`load_state_dict`; cleared as each fit starts)
        self.loader_epoch = 0
        self.resumed_epoch = 0

    # servers x workers of the run this module was built for (``run.build_datamodule`` sets
    # it, so the launcher and ``python -m lightning_gnnscale.partition`` know it before any
    # rank starts); ``None``: not known before the Trainer's ranks exist
    launch_topology: Topology | None = None

    # ------------------------------------------------------------------------ data, set-up
    @property
    def dtype(self) -> torch.dtype:
        """The features' dtype of a dataset loaded by name or of a rank's part (the
        constructor's ``dtype``; float64 under ``Trainer(precision="64-true")``). A given
        :class:`NodeDataset` keeps its own."""
        return self._dtype

    @property
    def node_dataset(self) -> NodeDataset:
        """The whole dataset (loaded on first use when the module was given a name)."""
        if self.partition_dir is not None:
            raise RuntimeError(
                f"data.partition_dir={self.partition_dir}: this DataModule holds its rank's "
                "part only, never the whole graph"
            )
        if self._dataset is None:
            self._dataset = load_dataset(self.dataset_config).to(self._dtype)
        return self._dataset

    @property
    def graph(self) -> Graph:
        """The whole graph: structure and features (:attr:`node_dataset`'s)."""
        return self.node_dataset.graph

    @property
    def targets(self) -> NodeTargets:
        """The task's rows of every node (``task.prepare`` of :attr:`node_dataset`): what a
        system selects, per node it holds, beside the graph's rows."""
        self.prepare_targets()
        return self._targets

    def prepare_targets(self) -> None:
        """Have the task prepare its rows of the whole dataset, once (a task refuses a
        dataset it cannot train on here: :meth:`prepare` calls it first, before any rank)."""
        if self._targets is None:
            self._targets = self.task.prepare(self.node_dataset, self.seed).to(self._dtype)

    @property
    def input_dim(self) -> int:
        """Width of ``Batch.x``."""
        if self.partition_dir is not None:
            return int(self.partition_meta()["num_features"])
        return self.graph.num_features

    def check_typed_graph(self) -> None:
        """A typed graph needs a system that trains typed graphs, and its per-relation fanouts
        name its relations (a plain script meets these rules here, before any step)."""
        from ..config_types import check_typed

        check_typed(self.config, self.graph.is_typed, None, self.data, self.task.name)
        self.relation_fanouts  # noqa: B018 (names the unknown relations now)
        self.check_learned_inputs(self.graph.meta.get("featureless_node_types"), self.graph.name)

    def check_learned_inputs(self, featureless_types, where: str) -> None:
        """Featureless node types (``featureless_types``, of the graph or directory ``where``)
        whose rows ``data.featureless=learned`` learns need a system that learns input rows
        (``LEARNED_INPUTS``); else ``ConfigError`` naming the systems that do."""
        if not featureless_types or self.data.featureless != "learned":
            return
        if not self.config.LEARNED_INPUTS:
            from ..config_types import registered_systems

            able = sorted(n for n, c in registered_systems().items() if c.LEARNED_INPUTS)
            raise ConfigError(
                f"{where} has node types without features ({list(featureless_types)}), whose "
                f"input rows data.featureless=learned learns, but strategy={self.config.name} "
                f"does not learn input rows yet; strategies that do: {able}; or set "
                "data.featureless=zeros (their rows stay zero)"
            )

    def directory_featureless_types(self) -> list[str]:
        """The featureless node types ``data.partition_dir``'s metadata names; a typed
        directory written before directories said so is refused (``ConfigError``: partition
        again), so that its zero rows are never taken for features."""
        meta = self.partition_meta()
        if meta.get("node_types") and "featureless_node_types" not in meta:
            raise ConfigError(
                f"the partition directory {self.partition_dir} holds a typed graph but does not "
                "say which node types are featureless (written before directories did); "
                "partition again: python -m lightning_gnnscale.partition <overrides> out=<dir>"
            )
        return list(meta.get("featureless_node_types") or [])

    def featureless_nodes(self, rank: int = 0) -> torch.Tensor | None:
        """bool ``[N]`` by original id: the nodes of the graph's featureless types
        (``graph.meta["featureless_node_types"]``) whose input rows are learned
        (``data.featureless=learned``); ``None`` when there are none or they stay zero. From a
        partition directory, its flags (a shared group every part lists, checked: ``N``
        bytes), as part ``rank`` maps them."""
        if self.partition_dir is not None:
            meta = self.partition_meta()
            if self.data.featureless != "learned" or not self.directory_featureless_types():
                return None
            opened = self.open_partition_dir(int(meta["num_parts"]))
            flags = opened.load_shared(FEATURELESS_GROUP, rank)["learned"]
            if flags.shape != (int(meta["num_nodes"]),) or flags.dtype != torch.uint8:
                raise ValueError(
                    f"the partition directory {self.partition_dir}: its learned-input flags "
                    f"must be uint8 [{meta['num_nodes']}], got {flags.dtype} {tuple(flags.shape)}"
                )
            return flags.bool()
        names = self.graph.meta.get("featureless_node_types") or ()
        if self.data.featureless != "learned" or not names or self.graph.node_type is None:
            return None
        unknown = sorted(set(names) - set(self.graph.node_types))
        if unknown:
            raise ValueError(
                f"{self.graph.name}: featureless node types {unknown} are not among its node "
                f"types {list(self.graph.node_types)}"
            )
        kinds = torch.tensor([self.graph.node_types.index(t) for t in names])
        return torch.isin(self.graph.node_type, kinds)

    def input_graph(self, graph: Graph | None = None) -> Graph:
        """``graph`` (default: :attr:`graph`) with the learned input rows' current values in
        place of its featureless rows (collective when rows are learned: a pull of every
        learned row, ``feature`` bytes), for layer-wise inference over the whole graph."""
        graph = self.graph if graph is None else graph
        if self.learned_inputs is None:
            return graph
        return replace(
            graph, x=self.learned_inputs.input_rows(torch.arange(graph.num_nodes), graph.x)
        )

    @cached_property
    def relation_fanouts(self) -> list[tuple[int, ...]] | None:
        """A typed graph's fanout of every relation per hop (:func:`relation_fanouts`) over the
        task's message relations (link prediction adds ``<r>_inverse``); from a partition
        directory, of the relations its metadata names; ``None`` for a homogeneous graph."""
        if self.partition_dir is not None:
            relations = self.partition_meta().get("relations") or ()
            return relation_fanouts(
                self.data, relations, f"the partition directory {self.partition_dir}"
            )
        relations = self.task.message_relations(self.graph) if self.graph.is_typed else ()
        return relation_fanouts(self.data, relations, self.graph.name)

    @property
    def is_typed(self) -> bool:
        """The graph (or, from a partition directory, the directory's) carries relations."""
        if self.partition_dir is not None:
            return bool(self.partition_meta().get("relations"))
        return self.graph.is_typed

    @property
    def num_relations(self) -> int:
        """Relations messages pass over (the task's: link prediction adds inverses; 1 for a
        homogeneous graph): an RGCN layer's weights."""
        if self.partition_dir is not None:
            return len(self.partition_meta().get("relations", ())) or 1
        return len(self.task.message_relations(self.graph)) or 1

    @property
    def out_dim(self) -> int:
        """Width of the model's output rows (the task's head: classes or target width)."""
        if self.partition_dir is not None:
            return self.task.out_dim_of(self.partition_meta())
        return self.targets.out_dim

    def prepare(self, world_size: int, ranks: list[int] | None = None) -> Any:
        """The one-off preprocessing for ``world_size`` ranks (memoised; override
        :meth:`preprocess`). With ``data.partition_dir``: the opened directory, checked
        against this run, with the parts of ``ranks`` verified (default: this node's,
        :func:`~..graph.partition_dir.node_ranks`)."""
        if world_size not in self._prepared:
            if self.partition_dir is None:
                self.check_typed_graph()
                self.prepare_targets()
                self.task.check_step(self.batch_size)
                self._prepared[world_size] = self.preprocess(world_size)
            else:
                self._prepared[world_size] = self.open_partition_dir(world_size)
                self.check_learned_inputs(
                    self.directory_featureless_types(),
                    f"the partition directory {self.partition_dir}",
                )
        prepared = self._prepared[world_size]
        if self.partition_dir is not None:
            from ..graph.partition_dir import node_ranks

            self.verify_partition_parts(
                prepared, node_ranks(world_size) if ranks is None else ranks
            )
        return prepared

    def preprocess(self, world_size: int) -> Any:
        """Compute or load (disk cache) what every rank needs; default: nothing."""
        return None

    def follow_precision(self) -> None:
        """Under ``Trainer(precision="64-true")`` the graph's features become float64 before
        any preprocessing, so every batch and evaluation runs in the model's dtype (from a
        partition directory: when a rank loads its part)."""
        trainer = self.trainer
        if trainer is None or trainer.precision != "64-true":
            return
        if self.partition_dir is not None:
            self._dtype = torch.float64
        elif self.graph.x.dtype != torch.float64:
            self._dataset, self._prepared = self.node_dataset.to(torch.float64), {}
            self._targets = None

    @override
    def prepare_data(self) -> None:
        self.follow_precision()
        trainer = self.trainer
        if trainer is None:
            self.prepare(1)
            return
        devices = trainer.num_devices
        first = trainer.node_rank * devices
        self.prepare(trainer.world_size, list(range(first, first + devices)))

    @override
    def setup(self, stage: str) -> None:
        """Lightning calls it at the start of every ``fit`` / ``validate`` / ``test`` /
        ``predict``, before it restores a checkpoint: a fit starts from epoch 0 unless its
        checkpoint says otherwise (an evaluation's checkpoint does not carry over), and the
        first call binds (:func:`~..contract.bind_datamodule`) and builds this rank's share."""
        self.stage = stage
        if stage == "fit":
            self.resumed_epoch = 0
        if self.context is not None:
            if self.trainer is not self._bound_to:
                raise RuntimeError(
                    f"this {type(self).__name__} is set up for another Trainer's strategy (its "
                    "stores and samplers use that strategy's comm); build a new DataModule "
                    "for each Trainer"
                )
            return  # set up once per Trainer (fit, then validate or test)
        self.follow_precision()
        self.check_module_task()
        context = bind_datamodule(
            self.trainer, self.config, self.data, complete_checkpoint=self.complete_checkpoint
        )
        self.setup_rank(context, self.rank_part(context))
        self.context, self._bound_to = context, self.trainer

    def check_module_task(self) -> None:
        """The LightningModule trains this DataModule's task (when it states one), with its
        settings; a task with parameters of its own (``task.decoder=mlp``) must be the
        DataModule's object itself, which evaluation scores with."""
        module_task = getattr(self.trainer.lightning_module, "task", None)
        if not isinstance(module_task, NodeTask):
            return
        advice = "build the module with GNNModule.from_config(model, datamodule)"
        settings = [t.config or TaskConfig(t.name) for t in (module_task, self.task)]
        if module_task.name != self.task.name or settings[0] != settings[1]:
            same_name = module_task.name == self.task.name
            mine, theirs = settings if same_name else (module_task.name, self.task.name)
            raise ConfigError(
                f"the LightningModule's task is {mine!r} but the DataModule's is {theirs!r}; "
                f"{advice} or pass the same task settings to both"
            )
        head = getattr(self.trainer.lightning_module, "head", None)
        if head is not None and head is not getattr(self.task, "decoder", None):
            raise ConfigError(
                f"task.decoder={settings[0].decoder} has weights of its own (the module's "
                f"head), but the DataModule's task scores with other ones: {advice}, once per "
                "DataModule"
            )

    def rank_part(self, context: RankContext) -> Any:
        """This rank's part, the same object wherever it comes from: :meth:`part_of` the
        preprocessing result in memory, or, with ``data.partition_dir``, :meth:`load_part` of
        the opened directory once :meth:`check_rank_part` has checked its part count and that
        every rank opened the same directory. A system never branches on the source."""
        prepared = self.prepare(context.world_size, [context.rank])
        if self.partition_dir is None:
            return self.part_of(prepared, context.rank)
        self.check_rank_part(context, prepared)
        return self.load_part(prepared, context.rank)

    def part_of(self, prepared: Any, rank: int) -> Any:
        """Rank ``rank``'s part of :meth:`preprocess`'s result (default: all of it, for systems
        whose ranks all hold it); what :meth:`write_parts` saves as part ``rank``."""
        return prepared

    def load_part(self, opened: Any, rank: int) -> Any:
        """Rank ``rank``'s part from the opened partition directory
        (:class:`~..graph.partition_dir.PartitionDir`): the object :meth:`part_of` returns in
        memory, read from the files :meth:`write_parts` wrote (systems whose config supports
        partition directories override it)."""
        raise NotImplementedError(
            f"{type(self).__name__} loads no part from a partition directory (override load_part)"
        )

    def setup_rank(self, context: RankContext, part: Any) -> None:
        """Build this rank's share from its part (:meth:`rank_part`; collectives allowed:
        every rank calls it)."""

    # ------------------------------------------------------------------------ checkpoints
    def next_loader_epoch(self) -> int:
        """The epoch the train loader's new iterator runs (and remembers): the Trainer's
        ``current_epoch``, or, while it still names the checkpoint's epoch (a resumed fit's
        first iterator, built before that epoch starts), the epoch the checkpoint says comes
        next (:meth:`load_state_dict`). Read when the loader starts an epoch, so it holds for
        any loader around it (workers, a wrapper Lightning cannot ``set_epoch``)."""
        current = self.trainer.current_epoch if self.trainer is not None else 0
        self.loader_epoch = max(current, self.resumed_epoch)
        return self.loader_epoch

    @override
    def state_dict(self) -> dict[str, Any]:
        """``train_epoch``: the epoch a resumed fit's loader starts at, the next one once this
        epoch's last step has run (a checkpoint at the epoch end, ``Trainer.is_last_batch``),
        else this one (mid-epoch). A subclass adds its own keys to this dict."""
        finished = self.trainer is not None and self.trainer.is_last_batch
        state = {"train_epoch": self.loader_epoch + int(finished)}
        if (
            self.learned_inputs is not None
        ):  # this rank's rows, to a shard of its own (the strategy)
            state[RANK_SHARD] = self.learned_inputs.shard_state()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the checkpoint's ``train_epoch`` (a non-negative int, checked: the file is
        data from outside). An older checkpoint's state lacks it: a resume got it from
        :meth:`complete_checkpoint`, an evaluation needs none. With learnable inputs, this
        rank's rows come from its own shard (``RANK_SHARD``, which the strategy loaded). A
        subclass calls this before restoring its own keys."""
        if self.learned_inputs is not None:
            if RANK_SHARD not in state_dict:
                raise ValueError(
                    "the checkpoint holds no shard of learned input rows for this rank, but "
                    "this run learns them (data.featureless=learned, or DistDGL's "
                    "strategy.embedding_dim)"
                )
            self.learned_inputs.load_shard_state(state_dict[RANK_SHARD])
        elif RANK_SHARD in state_dict:
            raise ValueError(
                "the checkpoint carries learned input rows for this rank, but this run learns "
                "none (data.featureless=zeros, or no strategy.embedding_dim): evaluating it so "
                "would drop them; use the settings it was trained with"
            )
        if "train_epoch" not in state_dict:
            return
        epoch = state_dict["train_epoch"]
        if type(epoch) is not int or epoch < 0:
            raise ConfigError(
                f"the checkpoint's {type(self).__name__} state has train_epoch={epoch!r}: "
                "expected a non-negative int; the file is damaged or not this suite's"
            )
        self.resumed_epoch = epoch

    def complete_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Give a checkpoint written before the DataModule kept its loader's epoch (no
        ``train_epoch`` in its state, which Lightning keeps under the class name) the epoch a
        resume from it starts at: the epochs it completed, which the suite records in every
        checkpoint it writes (``epochs_done``; it writes them at epoch ends), so it resumes
        as before. A resume (the strategy loads it during ``fit``, :attr:`stage`) from a
        checkpoint with neither is refused (``ConfigError``); evaluating one needs neither.
        The strategy calls it on each checkpoint it loads (handed over at binding)."""
        state = checkpoint.get(type(self).__qualname__) or {}
        if "train_epoch" in state or self.stage != "fit":
            return
        record = checkpoint.get(CHECKPOINT_KEY)
        if record is None:
            raise ConfigError(
                f"the checkpoint has no {type(self).__name__} train_epoch and no "
                f"{CHECKPOINT_KEY!r} record (written by an older version outside train.py, or "
                "not by this suite), so a resume would not know which epoch's samples come "
                "next; start from its weights alone (GNNModule.load_from_checkpoint, or "
                "weights_from=<path> in train.py)"
            )
        checkpoint[type(self).__qualname__] = {**state, "train_epoch": int(record["epochs_done"])}

    # -------------------------------------------------------------------------- training
    @cached_property
    def train_ids(self) -> torch.Tensor:
        """The task's training seeds ``[n_train]`` (an error if there are none)."""
        ids = self.task.train_seeds(self.targets)
        if ids.numel() == 0:
            raise ValueError(f"dataset {self.graph.name!r} has no training nodes")
        return ids

    @cached_property
    def order(self) -> EpochOrder:
        """The epoch permutation of the training nodes every rank shares (``single``'s)."""
        return EpochOrder(self.train_ids, self.seed)

    @property
    def batch_size(self) -> int:
        """Global seeds per step (``data.batch_size``; ``-1``: every training node)."""
        size = self.data.batch_size
        return self.train_ids.numel() if size == -1 else size

    @property
    def steps_per_epoch(self) -> int:
        """Global steps of one epoch: ``ceil(n_train / batch_size)`` (systems with their own
        split of the training nodes override it)."""
        return -(-self.train_ids.numel() // self.batch_size)

    def make_batch(self, epoch: int, step: int) -> Batch:
        """This rank's batch of one step."""
        raise NotImplementedError

    def training_batch(self, epoch: int, step: int) -> Batch:
        """The batch the train loader yields: :meth:`make_batch`, plus whatever the system
        advances as training goes (Grappa's super-epoch clock)."""
        return self.make_batch(epoch, step)

    def train_dataloader(self) -> DataLoader:
        return collective_train_loader(self)

    def relation_names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(message, pairs)``: a typed graph's relations messages pass over (link
        prediction's: a directed split's inverses too) and those of link prediction's pairs
        (``()`` for node tasks and homogeneous graphs); from a partition directory, its
        metadata's ``relations`` and ``pair_relations``."""
        link = self.task.spec.seeds == "edges"
        if self.partition_dir is not None:
            meta = self.partition_meta()
            pairs = tuple(meta.get("pair_relations") or ()) if link else ()
            return tuple(meta.get("relations") or ()), pairs
        if not self.graph.is_typed:
            return (), ()
        message = tuple(self.task.message_relations(self.graph))
        return message, tuple(self.graph.relations) if link else ()

    def learn_pair_relations(self) -> None:
        """Link prediction's task learns the relations of its triples (what a decoder per
        relation, DistMult, is sized by and what evaluation checks pairs against): a rank
        that loads a partition directory has no graph for the task to have seen."""
        if self.task.spec.seeds == "edges" and hasattr(self.task, "relations"):
            self.task.relations = self.relation_names()[1]

    def build_model(self, model: ModelConfig) -> torch.nn.Module:
        """The net ``model`` describes, sized for this data (systems with their own
        distributed layers override it); link prediction's task first learns its triples'
        relations (:meth:`learn_pair_relations`), for the head built next."""
        self.learn_pair_relations()
        if self.checked_run is None or model != self.checked_run.model:
            check_depth(self.data, model)
        self.check_model(model)
        if model.init is None and model.name != "custom":
            model = replace(model, init=self.task.default_init)
        return build_model(model, self.input_dim, self.out_dim, self.num_relations)

    def check_model(self, model: ModelConfig) -> None:
        """Rules between the model and this graph: a basis decomposition has at most as many
        bases as the graph has relations (``train.py`` checks it once the launcher has
        prepared the data, before any rank starts; a plain script when the net is built)."""
        if model.num_bases > self.num_relations:
            raise ConfigError(
                f"model.num_bases={model.num_bases} exceeds the graph's {self.num_relations} "
                "relation(s); use at most that many bases (0: a full weight per relation)"
            )

    def callbacks(self) -> list[L.Callback]:
        """The system's report callbacks (statistics for ``summary.json``); optional."""
        return []

    # ------------------------------------------------------------------------ evaluation
    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """``[len(splits), k]`` float64 task statistics of this rank's rows
        (:func:`~..tasks.base.split_statistics`); the caller sums ranks."""
        raise NotImplementedError

    def _eval_loader(self) -> DataLoader:
        if self.context is None:
            raise RuntimeError("the DataModule is not set up (call trainer.fit / validate)")
        evaluation = Evaluation(self.eval_statistics, self.context.comm, self.task)
        return DataLoader([evaluation], sampler=OneItem(), batch_size=None, collate_fn=no_collate)

    # ------------------------------------------------------------------------ prediction
    predict_node_ids: torch.Tensor | None = None
    predict_output: str = "logits"

    def predict_on(self, node_ids: torch.Tensor | None = None, output: str = "logits"):
        """What ``trainer.predict`` computes: ``output`` (``logits`` or ``embeddings``, the
        input of the last layer) of ``node_ids`` (default: every node). Returns ``self``.

        Each rank's ``predict_step`` returns its share ``{"node_ids", output}``; the shares
        of all ranks partition the requested nodes."""
        if output not in PREDICT_OUTPUTS:
            raise ValueError(f"output={output!r} is unknown; valid: {list(PREDICT_OUTPUTS)}")
        self.predict_node_ids = None if node_ids is None else torch.as_tensor(node_ids).long()
        self.predict_output = output
        return self

    def predict_rows(
        self, net: torch.nn.Module, node_ids: torch.Tensor | None, output: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids, rows)``: this rank's share of ``node_ids`` (every node if ``None``) and
        their full-neighbourhood ``output`` rows. Default: layer-wise inference over the whole
        graph, split across ranks by node range (:func:`node_rows`); systems whose net runs
        on their own layout override it."""
        comm = self.context.comm if self.context is not None else None
        graph = self.input_graph()
        return node_rows(graph, net, node_ids, output, self.data.eval_chunk_size, comm)

    @override
    def predict_dataloader(self) -> DataLoader:
        if self.context is None:
            raise RuntimeError("the DataModule is not set up (call trainer.predict)")
        item = Prediction(self.predict_rows, self.predict_node_ids, self.predict_output)
        return DataLoader([item], sampler=OneItem(), batch_size=None, collate_fn=no_collate)

    @override
    def val_dataloader(self) -> DataLoader:
        return self._eval_loader()

    @override
    def test_dataloader(self) -> DataLoader:
        return self._eval_loader()

    @override
    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        """``batch`` on ``device``, referencing this DataModule's learnable inputs (attached
        here, in the main process, so that a batch built in a loader worker reaches the live
        table, not a copy of it)."""
        if not isinstance(batch, Batch):
            return batch
        if self.learned_inputs is not None:
            batch = replace(batch, learned_inputs=self.learned_inputs)
        return batch.to(device)
