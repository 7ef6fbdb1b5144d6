"""Shared Strategy and DataModule machinery for every system (docs/architecture.md, "The
system contract").

- :class:`SystemStrategy` (mixed into :class:`MeteredSingleDeviceStrategy` and
  :class:`MeteredDDPStrategy`) owns the run's :class:`CommMeter` and metered ``comm``, binds the
  system's config and hands the LightningModule its :class:`ModuleRuntime`. The DDP one registers
  the metered gradient hook on CPU too (Lightning only does so on CUDA) and routes Lightning's
  own barrier / broadcast / reduce through ``comm`` so that they are counted.
- :class:`GNNDataModule` is the base of every system's DataModule (preprocess once, set up per
  rank, batches, evaluation); :class:`SampledDataModule` is the replicated-graph one of
  ``single`` and ``ddp``.
"""

from __future__ import annotations

import io
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.plugins.precision import DoublePrecision, HalfPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, Strategy
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from typing_extensions import override

from ..checkpoints import SuiteCheckpointIO
from ..comm import (
    REDUCE_OPS,
    Comm,
    CommMeter,
    GradientHookState,
    OwnerRoute,
    Topology,
    register_metered_ddp_hook,
)
from ..contract import (
    PREDICT_OUTPUTS,
    Evaluation,
    ModuleRuntime,
    Prediction,
    RankContext,
    RuntimeAware,
    bind_datamodule,
)
from ..errors import ConfigError
from ..graph.batch import Batch
from ..graph.book import LocalPartition, PartitionedGraph, RangeBook, build_local_partition
from ..graph.cache import tensor_digest
from ..graph.csc import Graph
from ..graph.csc_rows import CSCRows
from ..graph.datasets import load_dataset
from ..graph.order import EpochOrder
from ..graph.sampler import NeighborSampler, build_block_sorted
from ..models.gnn import (
    BlockGNN,
    SubgraphModel,
    build_model,
    inference_builder,
    layer_rows,
    layerwise_inference,
)
from ..schema import (
    DataConfig,
    ModelConfig,
    RunFacts,
    SystemConfig,
    check_depth,
    check_seed,
    partition_dir_unsupported,
)
from ..tasks import DEFAULT_TASK, build_task
from ..tasks.base import NodeTask, split_statistics

DEFAULT_CACHE_DIR = os.path.join(".cache", "lightning_gnnscale")


class SuiteDoublePrecision(DoublePrecision):
    """``precision="64-true"`` under a suite strategy: the DataModule builds its batches in
    float64 already (it follows the Trainer's precision), so the loader items
    (:class:`Batch`, :class:`Evaluation`, :class:`Prediction`) pass through whole; anything
    else is converted as Lightning's ``DoublePrecision`` does."""

    @override
    def convert_input(self, data: Any) -> Any:
        if isinstance(data, Batch | Evaluation | Prediction):
            return data
        return super().convert_input(data)


def suite_checkpoint_io(plugin: CheckpointIO | None) -> SuiteCheckpointIO:
    """The checkpoint I/O a suite strategy runs: ``plugin`` if it is a :class:`SuiteCheckpointIO`
    (or a subclass), a new one for ``None``; any other is refused, since it could load a
    checkpoint in full (running its pickle) or write over the last good one in place."""
    if plugin is None:
        return SuiteCheckpointIO()
    if not isinstance(plugin, SuiteCheckpointIO):
        raise ConfigError(
            f"checkpoint_io={type(plugin).__name__}: a suite strategy saves checkpoints atomically "
            f"and loads them weights-only through lightning_gnnscale.checkpoints."
            f"SuiteCheckpointIO; to store them another way, subclass SuiteCheckpointIO"
        )
    return plugin


class SystemStrategy:
    """Mixin of every suite strategy: owns the run's :class:`CommMeter` and metered ``comm``,
    binds the system's config, checks the config's rules against the run, and hands the
    module its :class:`ModuleRuntime` once.

    What it sets on the Trainer for the user: its loaders' samplers already give each rank its
    share, so Lightning never re-wraps them (``use_distributed_sampler`` needs no setting);
    ``precision="64-true"`` runs on float64 batches (:class:`SuiteDoublePrecision`).

    Args:
        config: the system's settings (an instance of ``config_type``); ``None`` (a strategy
            created by name, ``L.Trainer(strategy="gsplit")``) adopts the DataModule's.
        system_name: the registered name this strategy was created as; the bound config must
            carry it (a ``grappa_uw`` strategy does not run a ``grappa`` config).
    """

    config_type: ClassVar[type[SystemConfig]] = SystemConfig
    requires_layer_hook: ClassVar[bool] = False  # the module must take ModuleRuntime.layer_hook

    def __init__(
        self, config: SystemConfig | None = None, system_name: str | None = None, **kwargs
    ):
        if config is not None and not isinstance(config, self.config_type):
            raise TypeError(
                f"{type(self).__name__} takes a {self.config_type.__name__}, "
                f"got {type(config).__name__}"
            )
        kwargs["checkpoint_io"] = suite_checkpoint_io(kwargs.get("checkpoint_io"))
        super().__init__(**kwargs)
        self.system_config = config
        self.system_name = system_name or (config.name if config is not None else None)
        self.meter = CommMeter()
        self.comm = Comm.local(self.meter)
        self.unchecked_runtime: ModuleRuntime | None = None  # checked at the first step

    @property
    def context(self) -> RankContext:
        """This rank's comm and device (complete once the process group exists)."""
        return RankContext(self.comm, self.root_device)

    @property
    @override
    def checkpoint_io(self) -> CheckpointIO:
        """A :class:`~lightning_gnnscale.checkpoints.SuiteCheckpointIO`: atomic saves,
        weights-only loads for every path."""
        return Strategy.checkpoint_io.fget(self)

    @checkpoint_io.setter
    @override
    def checkpoint_io(self, plugin: CheckpointIO | None) -> None:
        Strategy.checkpoint_io.fset(self, suite_checkpoint_io(plugin))

    @property
    @override
    def precision_plugin(self) -> Precision:
        return Strategy.precision_plugin.fget(self)

    @precision_plugin.setter
    @override
    def precision_plugin(self, plugin: Precision | None) -> None:
        """As Lightning's FSDP strategy does, the strategy decides which precision plugins it
        runs: ``64-true`` becomes :class:`SuiteDoublePrecision`; ``16-true`` / ``bf16-true``
        are refused (the batches carry the graph's float32 rows; use a ``-mixed`` one)."""
        if type(plugin) is DoublePrecision:
            plugin = SuiteDoublePrecision()
        elif isinstance(plugin, HalfPrecision):
            raise ConfigError(
                f"precision={plugin.precision!r} is not supported by {type(self).__name__}; "
                "use '16-mixed' / 'bf16-mixed', '32-true' or '64-true'"
            )
        Strategy.precision_plugin.fset(self, plugin)

    def run_facts(self, data: DataConfig) -> RunFacts:
        """What the config's rules see of this run: the Trainer's processes, the DataModule's
        data settings, the LightningModule's model settings (``model_config``, if it states
        them)."""
        module = self.lightning_module
        model = getattr(module, "model_config", None)
        devices = len(getattr(self, "parallel_devices", None) or [self.root_device])
        num_nodes = getattr(self, "num_nodes", 1)
        return RunFacts(devices * num_nodes, devices, num_nodes, data, model)

    def bind(self, config: SystemConfig, data: DataConfig | None = None) -> RankContext:
        """Accept the DataModule's system config (see :func:`~..contract.bind_datamodule`) and
        check its rules against this run (``config.check_run``) before any step."""
        if not isinstance(config, self.config_type):
            raise TypeError(
                f"{type(self).__name__} runs {self.config_type.__name__} systems, but the "
                f"DataModule was built with a {type(config).__name__}: use the DataModule of "
                f"the strategy's system"
            )
        if self.system_name is not None and config.name != self.system_name:
            raise ConfigError(
                f"the strategy is {self.system_name!r} but the DataModule's config is "
                f"{config.name!r}; build both from the same config"
            )
        if self.system_config is None:
            self.system_config = config
        elif self.system_config != config:
            raise ConfigError(
                f"the strategy and the DataModule were given different configs:\n"
                f"  strategy:   {self.system_config}\n  DataModule: {config}\n"
                "pass the same object to both (or create the strategy by name)"
            )
        if data is not None:
            self.check_rules(config, data)
        return self.context

    def check_rules(self, config: SystemConfig, data: DataConfig) -> None:
        """``config.check_run`` (and the model's depth) against this run's facts."""
        facts = self.run_facts(data)
        if facts.model is not None:
            check_depth(data, facts.model)
        config.check_run(facts)

    def module_runtime(self) -> ModuleRuntime:
        """What the LightningModule receives in :meth:`hand_module_runtime`."""
        return ModuleRuntime(self.context)

    def hand_module_runtime(self) -> None:
        """Give the LightningModule its :class:`ModuleRuntime` (once, before training)."""
        module = self.lightning_module
        if isinstance(module, RuntimeAware):
            runtime = self.module_runtime()
            module.configure_runtime(runtime)
            self.unchecked_runtime = runtime
        elif self.requires_layer_hook:
            raise TypeError(
                f"{type(self).__name__} moves rows between layers through a layer hook, so its "
                f"LightningModule must implement configure_runtime(runtime) and call "
                f"runtime.layer_hook(batch) (as GNNModule does); {type(module).__name__} does not"
            )

    @override
    def training_step(self, *args, **kwargs):
        """The module's step. If the first one fails and the module took a runtime with a
        layer hook but never called ``runtime.layer_hook(batch)``, the error says so: without
        the hook the rows never move and the step fails far from the cause (an index out of
        bounds)."""
        runtime, self.unchecked_runtime = self.unchecked_runtime, None
        if runtime is None:
            return super().training_step(*args, **kwargs)
        try:
            return super().training_step(*args, **kwargs)
        except Exception as err:
            if runtime.layer_hook_unused:
                raise RuntimeError(self.unused_hook_message()) from err
            raise

    def unused_hook_message(self) -> str:
        return (
            f"{type(self).__name__} moves rows between layers through "
            f"ModuleRuntime.layer_hook, but {type(self.lightning_module).__name__} never called "
            "runtime.layer_hook(batch) in its training step; pass its result to the net: "
            "net(batch.blocks, batch.x, layer_hook=runtime.layer_hook(batch))"
        )


class MeteredSingleDeviceStrategy(SystemStrategy, SingleDeviceStrategy):
    """One process; its ``comm`` is local (every collective a no-op that counts nothing).

    Args:
        config: the system's settings; ``None`` adopts the DataModule's.
        device: ``cpu``, ``cuda`` or ``cuda:<i>``; ``None`` (a strategy created by name)
            follows the Trainer's accelerator: the first CUDA device under a GPU accelerator,
            else the CPU.
    """

    def __init__(self, config: SystemConfig | None = None, device: str | None = None, **kwargs):
        root = torch.device(device or "cpu")
        if root.type == "cuda" and root.index is None:  # Lightning needs an index: the first GPU
            root = torch.device("cuda", 0)
        super().__init__(config, device=root, **kwargs)
        self.follows_accelerator = device is None
        # Lightning sets these on a strategy that has them (the Trainer's devices and
        # num_nodes): the config's rules see what the user asked for (devices=2 is refused)
        self.parallel_devices: list[torch.device] | None = None
        self.num_nodes = 1

    @property
    @override
    def root_device(self) -> torch.device:
        if self.follows_accelerator and isinstance(self.accelerator, CUDAAccelerator):
            return torch.device("cuda", 0)
        return super().root_device

    @override
    def setup(self, trainer: L.Trainer) -> None:
        self.hand_module_runtime()
        super().setup(trainer)


class MeteredDDPStrategy(SystemStrategy, DDPStrategy):
    """DDP whose gradient all-reduce and bookkeeping collectives go through the metered ``comm``.

    Gradients are summed, not averaged: the loss is already divided by the global seed count.

    Args:
        config: the system's settings; ``None`` adopts the DataModule's.
        servers: simulated servers (``topology.servers``); ``None`` = Lightning's ``num_nodes``.
        timeout_s: a collective that waits longer than this fails instead of hanging.
        process_group_backend: ``None`` = gloo on CPU, nccl on GPU.
    """

    def __init__(
        self,
        config: SystemConfig | None = None,
        servers: int | None = None,
        timeout_s: float = 300.0,
        process_group_backend: str | None = None,
        **kwargs,
    ):
        kwargs.setdefault("find_unused_parameters", False)
        # DDP's own start-up sync (a shape all-gather and a state broadcast) would bypass the
        # meter; ``configure_ddp`` broadcasts the weights through ``comm`` instead.
        kwargs.setdefault("init_sync", False)
        super().__init__(
            config,
            process_group_backend=process_group_backend,
            timeout=timedelta(seconds=timeout_s),
            **kwargs,
        )
        self.servers = servers
        self.timeout_s = timeout_s
        self.requested_backend = process_group_backend
        self.grad_hook_state: GradientHookState | None = None

    @override
    def setup_distributed(self) -> None:
        super().setup_distributed()
        topology = Topology.from_launch(self.world_size, self.num_nodes, self.servers)
        # On GPU the world group is NCCL, but ids, counts and flags stay on the CPU: give the
        # exchange group both backends so every tensor finds its own. A backend the user named
        # (e.g. gloo for several ranks on one GPU, which NCCL refuses) serves both.
        backend = self.requested_backend or (
            "cpu:gloo,cuda:nccl" if self.root_device.type == "cuda" else None
        )
        self.comm = Comm.create(self.meter, topology, backend=backend, timeout_s=self.timeout_s)

    @override
    def setup(self, trainer: L.Trainer) -> None:
        self.hand_module_runtime()
        super().setup(trainer)

    def broadcast_initial_weights(self) -> None:
        """Rank 0's initial parameters and buffers to every rank (``parameter`` bytes)."""
        for tensor in [*self.model.parameters(), *self.model.buffers()]:
            self.comm.broadcast(tensor.data, 0, category="parameter")

    @override
    def configure_ddp(self) -> None:
        self.broadcast_initial_weights()
        super().configure_ddp()
        state = GradientHookState(self.comm.with_group(self.model.process_group), scale=1.0)
        self.grad_hook_state = register_metered_ddp_hook(self.model, state)

    # Lightning's own cross-rank bookkeeping, metered as `control`.
    @override
    def barrier(self, name: str | None = None) -> None:
        self.comm.barrier()

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not self.comm.is_distributed:
            return obj
        payload = pickle.dumps(obj) if self.global_rank == src else b""
        size = self.comm.broadcast(torch.tensor([len(payload)]), src, category="control")
        data = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            if payload
            else (torch.empty(int(size), dtype=torch.uint8))
        )
        data = self.comm.broadcast(data, src, category="control")
        return pickle.load(io.BytesIO(data.numpy().tobytes()))

    @override
    def reduce(self, tensor, group: Any = None, reduce_op: Any = "mean") -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor):
            return tensor
        name = str(getattr(reduce_op, "name", reduce_op)).lower().split(".")[-1]
        average = name in ("mean", "avg")
        op = "sum" if average else name
        if op not in REDUCE_OPS:
            raise ValueError(
                f"reduce_op={reduce_op!r} is not supported; valid: mean, {', '.join(REDUCE_OPS)}"
            )
        out = self.comm.all_reduce(
            tensor.detach().clone().to(torch.float64), op, category="control"
        )
        return (out / self.world_size if average else out).to(tensor.dtype)


def own_partition(
    prepared: PartitionedGraph, comm: Comm, rank: int, world: int, what: str
) -> tuple[LocalPartition, torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's part of an in-memory partitioned graph (checked the same on every rank):
    ``(local partition, whole-graph in-degrees [N], its core and halo's degrees, its core's
    original ids [n_core])``."""
    graph, book = prepared.graph, prepared.book
    if world != book.num_parts:
        raise ValueError(f"partitioned into {book.num_parts} parts for {world} ranks")
    assert_same_on_all_ranks(comm, book.new2old, what)
    local = build_local_partition(graph, book, rank)
    degree = graph.in_degree()  # replicated metadata
    lo, hi = int(book.node_offsets[rank]), int(book.node_offsets[rank + 1])
    return local, degree, degree[local.local2global], book.new2old[lo:hi]


def core_statistics(
    task: NodeTask, local: LocalPartition, out: torch.Tensor, splits: tuple[str, ...]
) -> torch.Tensor:
    """The task's statistics (:func:`~..tasks.base.split_statistics`) of a local partition's
    core rows, from their output rows ``out [n_core, d]``."""
    masks = {"train": local.train_mask, "val": local.val_mask, "test": local.test_mask}
    return split_statistics(task, out, local.y, masks, splits)


def own_predictions(
    own_ids: torch.Tensor, rows: torch.Tensor, node_ids: torch.Tensor | None, num_nodes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A rank's share of ``trainer.predict`` when it computes the rows of the nodes it owns:
    ``(ids, rows)`` of its own nodes (original ids ``own_ids [n]``, ``rows [n, d]``); with
    ``node_ids`` (1-D, each in ``[0, num_nodes)``) the requested ids it owns, in the requested
    order and with repeats, as the one-process split (:func:`node_rows`) returns them."""
    if node_ids is None:
        return own_ids, rows
    node_ids = node_ids.cpu()
    if node_ids.dim() != 1:
        raise ValueError(f"node ids must be 1-D, got shape {tuple(node_ids.shape)}")
    if node_ids.numel() and (int(node_ids.min()) < 0 or int(node_ids.max()) >= num_nodes):
        raise ValueError(f"node ids must be in [0, {num_nodes})")
    sorted_ids, order = torch.sort(own_ids)
    position = torch.searchsorted(sorted_ids, node_ids).clamp_(max=max(own_ids.numel() - 1, 0))
    mine = sorted_ids[position] == node_ids if own_ids.numel() else node_ids < 0
    return node_ids[mine], rows[order[position[mine]].to(rows.device)]


def assert_same_on_all_ranks(comm: Comm, values: torch.Tensor, what: str) -> None:
    """Fail loudly if ``values`` (e.g. a partition every rank computed or loaded) differs
    between ranks: mismatched split functions would silently corrupt results or hang."""
    digest = torch.tensor([int(tensor_digest(values)[:15], 16)], dtype=torch.int64)
    digests = comm.all_gather_tensor(digest, category="control")
    if bool((digests != digests[0]).any()):
        raise RuntimeError(
            f"{what} differs between ranks (digests {digests.tolist()}); "
            "every rank must use the same dataset, config and code version"
        )


# ------------------------------------------------------------------------------- data


class RankShareSampler(DistributedSampler):
    """Base of the suite loaders' samplers: a rank's loader already yields that rank's share
    (a step's seeds are split across ranks by the batch maker, evaluation by node range).

    It is a ``DistributedSampler`` for that reason: Lightning leaves a loader whose sampler
    is one alone (``Trainer(use_distributed_sampler=True)``, the default, "will not replace
    the existing one"), so a script that omits ``use_distributed_sampler=False`` trains on the
    same steps (issue 23: re-wrapped, each rank ran every other step). The
    ``DistributedSampler`` base is one replica and holds no data.
    """

    def __init__(self) -> None:
        super().__init__(range(0), num_replicas=1, rank=0, shuffle=False)


class OneItem(RankShareSampler):
    """The evaluation and predict loaders' sampler: their one item, on every rank."""

    def __len__(self) -> int:
        return 1

    def __iter__(self):
        return iter([0])


class EpochSteps(RankShareSampler):
    """Yields ``(epoch, step)`` for the epoch about to run (iterated in the main process).

    The epoch is the fit loop's count of processed epochs: ``trainer.current_epoch`` still
    names the checkpoint's epoch when Lightning builds the first iterator of a resumed run, and
    a counter of ``iter`` calls breaks when Lightning probes the loader (it does so with
    DataLoader workers). Covered by the resume and worker tests.
    """

    def __init__(self, dm: GNNDataModule):
        super().__init__()
        self.dm = dm

    def __len__(self) -> int:
        return self.dm.steps_per_epoch

    def __iter__(self):
        trainer = self.dm.trainer
        epoch = trainer.fit_loop.epoch_progress.current.processed if trainer else 0
        return iter([(epoch, step) for step in range(self.dm.steps_per_epoch)])


@dataclass
class StepBatcher(Dataset):
    """Builds one rank's batch of a step; self-contained so DataLoader workers (spawned inside
    spawned ranks) can pickle it without the Trainer. Indexed by ``(epoch, step)``."""

    graph: Graph
    sampler: NeighborSampler
    train_ids: torch.Tensor
    batch_size: int
    seed: int
    rank: int
    world_size: int
    salt_by_rank: bool

    def __len__(self) -> int:
        return -(-self.train_ids.numel() // self.batch_size)

    def __post_init__(self) -> None:
        self.order = EpochOrder(self.train_ids, self.seed)

    @classmethod
    def on_graph(
        cls,
        graph: Graph,
        fanouts: list[int],
        train_ids: torch.Tensor,
        batch_size: int,
        seed: int,
        rank: int,
        world_size: int,
        salt_by_rank: bool,
    ) -> StepBatcher:
        """A batcher sampling ``graph`` whole with the suite's hash-keyed ``fanouts`` sampler."""
        sampler = NeighborSampler(graph.indptr, graph.indices, list(fanouts), seed)
        return cls(graph, sampler, train_ids, batch_size, seed, rank, world_size, salt_by_rank)

    def step_seeds(self, epoch: int, step: int) -> torch.Tensor:
        """All ranks' seeds of one global step."""
        return self.order.step(epoch, step, self.batch_size)

    def __getitem__(self, key: tuple[int, int]) -> Batch:
        """This rank's share of step ``step``: sample, then gather input rows and labels."""
        epoch, step = key
        global_seeds = self.step_seeds(epoch, step)
        seeds = torch.tensor_split(global_seeds, self.world_size)[self.rank]
        start = time.perf_counter()
        salt = self.rank if self.salt_by_rank else 0
        blocks = self.sampler.sample(seeds, epoch=epoch, step=step, salt=salt)
        sampled = time.perf_counter()
        x = self.graph.x.index_select(0, blocks[0].src_ids)
        y = self.graph.y.index_select(0, seeds)
        stats = {
            "sample_s": sampled - start,
            "load_s": time.perf_counter() - sampled,
            "input_nodes": blocks[0].num_src,
        }
        return Batch(blocks, x, y, global_seeds.numel(), epoch, step, stats)


def _no_collate(batch):
    return batch


class _CollectiveSteps(Dataset):
    """Steps of a DataModule whose batches may run collectives: ``training_batch(epoch, step)``."""

    def __init__(self, dm: GNNDataModule):
        self.dm = dm

    def __len__(self) -> int:
        return self.dm.steps_per_epoch

    def __getitem__(self, key: tuple[int, int]) -> Batch:
        return self.dm.training_batch(*key)


def collective_train_loader(dm: GNNDataModule) -> DataLoader:
    """Train loader for batches built with collectives: main process, strict step order."""
    return DataLoader(
        _CollectiveSteps(dm),
        sampler=EpochSteps(dm),
        batch_size=None,
        collate_fn=_no_collate,
        num_workers=0,
    )


class GNNDataModule(L.LightningDataModule):
    """Base of every system's DataModule: one graph, the system's config, the shared data
    settings, and the two-stage set-up Lightning defines.

    - :meth:`prepare` does the one-off preprocessing of a world size (partitioning,
      pre-sampling, chunk stores), cached on disk by content hash; ``prepare_data`` calls it
      once per node and ``setup`` again on every rank, where it loads the cached result. A
      launcher that prepared before starting the ranks hands them the result with the module.
    - ``setup`` binds the system config to the Trainer's strategy
      (:func:`~..contract.bind_datamodule`), then :meth:`setup_rank` builds this rank's share.
    - The validation and test loaders yield one :class:`~..contract.Evaluation` whose task
      statistics come from :meth:`eval_statistics`.
    - The task (:mod:`~..tasks`) owns the targets (``Graph.y``, set by ``task.prepare``), the
      training seeds (:attr:`train_ids`), the head's width (:attr:`out_dim`) and what
      evaluation counts; the system indexes the rows it holds.

    With ``data.partition_dir`` (systems whose config has ``supports_partition_dir``) the
    DataModule never loads the whole graph: :meth:`prepare` opens and checks the partition
    directory (:class:`~..graph.partition_dir.PartitionDir`) and verifies the parts of this
    node's ranks, and each rank's :meth:`setup_rank` loads its own part, memory-mapped
    (docs/partitioning.md).

    Args:
        dataset: a :class:`Graph`, or a dataset name for :func:`load_dataset`; with
            ``data.partition_dir``, a name (checked against the directory, with
            ``dataset_options``) or ``None`` (the directory's dataset).
        config: the system's settings.
        data: batch size, fanouts, loader workers, evaluation chunk size, partition directory.
        seed: base of the epoch permutations and sampling keys.
        cache_dir: where preprocessing results are cached (default ``./.cache/lightning_gnnscale``).
        dtype: features' dtype when loading by name (a given graph is used as it is).
        dataset_options: options for :func:`load_dataset` (``root``, ``num_nodes``...).
        task: the task's name or object (default ``node_classification``).
    """

    def __init__(
        self,
        dataset: Graph | str | None,
        config: SystemConfig,
        data: DataConfig | None = None,
        *,
        seed: int = 0,
        cache_dir: str | os.PathLike | None = None,
        dtype: torch.dtype = torch.float32,
        dataset_options: dict | None = None,
        task: str | NodeTask | None = None,
    ):
        super().__init__()
        self.task = build_task(task)
        if not isinstance(config, SystemConfig):
            raise TypeError(f"config must be a system config, got {type(config).__name__}")
        self.config = config
        self.data = data if data is not None else DataConfig()
        config.check_data(self.data)
        check_seed(seed)
        self.seed = seed
        self.cache_dir = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR)
        self.partition_dir = self.data.partition_dir
        if self.partition_dir is not None and isinstance(dataset, Graph):
            raise ValueError(
                "data.partition_dir: the ranks load their parts from the directory; pass the "
                "dataset's name (or None), not a Graph"
            )
        if dataset is None and self.partition_dir is None:
            raise ValueError("dataset is None: pass a Graph or a dataset name")
        self._graph = self.task.prepare(dataset, seed) if isinstance(dataset, Graph) else None
        self._dataset_name = None if isinstance(dataset, Graph | None) else str(dataset)
        self._dtype, self._dataset_options = dtype, dict(dataset_options or {})
        self._prepared: dict[int, Any] = {}
        self.context: RankContext | None = None
        self._bound_to: Strategy | None = None

    # servers x workers of the run this module was built for (``run.build_datamodule`` sets
    # it, so the launcher and ``python -m lightning_gnnscale.partition`` know it before any
    # rank starts); ``None``: not known before the Trainer's ranks exist
    launch_topology: Topology | None = None

    # ------------------------------------------------------------------------ data, set-up
    @property
    def graph(self) -> Graph:
        """The whole dataset (loaded on first use when the module was given a name)."""
        if self.partition_dir is not None:
            raise RuntimeError(
                f"data.partition_dir={self.partition_dir}: this DataModule holds its rank's "
                "part only, never the whole graph"
            )
        if self._graph is None:
            graph = load_dataset(self._dataset_name, **self._dataset_options)
            self._graph = self.task.prepare(graph, self.seed).to(self._dtype)
        return self._graph

    @property
    def input_dim(self) -> int:
        """Width of ``Batch.x``."""
        if self.partition_dir is not None:
            return int(self.partition_meta()["num_features"])
        return self.graph.num_features

    @property
    def out_dim(self) -> int:
        """Width of the model's output rows (the task's head: classes or target width)."""
        if self.partition_dir is not None:
            return self.task.out_dim_of(self.partition_meta())
        return self.task.out_dim(self.graph)

    def prepare(self, world_size: int, ranks: list[int] | None = None) -> Any:
        """The one-off preprocessing for ``world_size`` ranks (memoised; override
        :meth:`preprocess`). With ``data.partition_dir``: the opened directory, checked
        against this run, with the parts of ``ranks`` verified (default: this node's,
        :func:`~..graph.partition_dir.node_ranks`)."""
        if world_size not in self._prepared:
            if self.partition_dir is None:
                self._prepared[world_size] = self.preprocess(world_size)
            else:
                self._prepared[world_size] = self.open_partition_dir(world_size)
        prepared = self._prepared[world_size]
        if self.partition_dir is not None:
            from ..graph.partition_dir import node_ranks

            self.verify_partition_parts(
                prepared, node_ranks(world_size) if ranks is None else ranks
            )
        return prepared

    # ------------------------------------------------------------- partition directories
    def partition_settings(self) -> dict[str, Any]:
        """What the system's partition depends on besides the dataset, seed and part count
        (``method``, ``partition_options``), recorded in and checked against a partition
        directory."""
        return {}

    def dataset_identity(self) -> dict | None:
        """The dataset's name and content settings (``None``: unknown, a DataModule built on
        a Graph or on ``None``)."""
        from ..graph.partition_dir import dataset_identity

        if self._dataset_name is None:
            return None
        return dataset_identity(self._dataset_name, self._dataset_options)

    def partition_expectation(self, world_size: int) -> dict[str, Any]:
        """The metadata a partition directory must carry to serve this run."""
        return {
            "system": self.config.name,
            "task": self.task.name,
            "num_parts": world_size,
            "seed": self.seed,
            "dataset": self.dataset_identity(),
            **self.partition_settings(),
        }

    def open_partition_dir(self, world_size: int):
        """Open ``data.partition_dir`` and check it was made for this run (dataset, system,
        method and options, seed, part count); raises ``PartitionDirError`` naming the key.
        A directory already opened for its metadata (:meth:`partition_meta`) is reused, with
        the parts it verified."""
        from ..graph.partition_dir import PartitionDir, PartitionDirError

        opened = self._opened_dir or PartitionDir.open(self.partition_dir)
        expected = self.partition_expectation(world_size)
        task = expected.pop("task")
        opened.check(expected)
        # a directory written before tasks existed holds node classification's labels
        written_for = opened.meta.get("task", DEFAULT_TASK)
        if written_for != task:
            raise PartitionDirError(
                f"{opened.path}: it was written for task {written_for!r} but this run has "
                f"task={task!r}; partition for this task: python -m lightning_gnnscale.partition "
                "<overrides> task=<name> out=<dir>"
            )
        self._opened_dir = opened
        return opened

    def verify_partition_parts(self, opened, ranks: list[int]) -> None:
        """The files of the parts of ``ranks`` (and their shared groups) against the metadata
        (``PartitionDir.verify_parts``: inside the directory, sizes, headers, digests, the
        format's counts), then the system's own counts (:meth:`check_partition_part`)."""
        opened.verify_parts(ranks)
        for k in ranks:
            self.check_partition_part(opened, k)

    def check_partition_part(self, opened, k: int) -> None:
        """The system's metadata keys that size an allocation agree with part ``k``'s verified
        files (``opened.expect_shape``); default: nothing beyond the format's."""

    _opened_dir = None  # the directory as opened for the metadata, before any prepare

    def partition_meta(self) -> dict:
        """The metadata of ``data.partition_dir`` (opened once), its counts checked against
        the part files of this node's ranks that are here (a rank's copy may hold its own part
        only) before a model is sized from it."""
        if self._prepared:
            return next(iter(self._prepared.values())).meta
        if self._opened_dir is None:
            from ..graph.partition_dir import PartitionDir, node_ranks, part_folder

            opened = PartitionDir.open(self.partition_dir)
            ranks = node_ranks(opened.num_parts)
            here = [k for k in ranks if (opened.path / part_folder(k)).is_dir()]
            self.verify_partition_parts(opened, here or ranks)
            self._opened_dir = opened
        return self._opened_dir.meta

    def write_partition_dir(self, out, world_size: int, log=print) -> dict:
        """Partition for ``world_size`` ranks (this DataModule's ``preprocess``) and write the
        partition directory ``out``; returns its metadata (``python -m
        lightning_gnnscale.partition``)."""
        from ..graph.cache import graph_fingerprint
        from ..graph.partition_dir import PartitionDirWriter

        if not self.config.supports_partition_dir:
            raise ConfigError(partition_dir_unsupported(self.config.name))
        graph = self.graph
        writer = PartitionDirWriter(out)
        extra = self.write_parts(world_size, writer, log)
        identity = self.dataset_identity() or {"name": graph.name, "options": {}}
        return writer.finish(
            {
                **self.partition_expectation(world_size),
                "dataset": identity,
                "graph": graph_fingerprint(graph),
                "num_nodes": graph.num_nodes,
                "num_edges": graph.num_edges,
                "num_features": graph.num_features,
                "num_classes": graph.num_classes,
                "target_dim": self.task.out_dim(graph),
                "feature_dtype": str(graph.x.dtype).removeprefix("torch."),
                **extra,
            }
        )

    def write_parts(self, world_size: int, writer, log) -> dict:
        """Write every part with ``writer.write_part``; return the system's metadata (at least
        ``node_offsets``). Systems that support partition directories implement it."""
        raise NotImplementedError

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
            self._graph, self._prepared = self.graph.to(torch.float64), {}

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
        strategy = self.trainer.strategy
        if self.context is not None:
            if strategy is not self._bound_to:
                raise RuntimeError(
                    f"this {type(self).__name__} is set up for another Trainer's strategy (its "
                    "stores and samplers use that strategy's comm); build a new DataModule "
                    "for each Trainer"
                )
            return  # set up once per Trainer (fit, then validate or test)
        self.follow_precision()
        self.check_module_task()
        context = bind_datamodule(self.trainer, self.config, self.data)
        self.setup_rank(context, self.prepare(context.world_size, [context.rank]))
        self.context, self._bound_to = context, strategy

    def check_module_task(self) -> None:
        """The LightningModule trains this DataModule's task (when it states one)."""
        module_task = getattr(self.trainer.lightning_module, "task", None)
        if isinstance(module_task, NodeTask) and module_task.name != self.task.name:
            raise ConfigError(
                f"the LightningModule's task is {module_task.name!r} but the DataModule's is "
                f"{self.task.name!r}; build the module with GNNModule.from_config(model, "
                "datamodule) or pass the same task to both"
            )

    def setup_rank(self, context: RankContext, prepared: Any) -> None:
        """Build this rank's share (collectives allowed: every rank calls it)."""

    # -------------------------------------------------------------------------- training
    @cached_property
    def train_ids(self) -> torch.Tensor:
        """The task's training seeds ``[n_train]`` (an error if there are none)."""
        ids = self.task.train_seeds(self.graph)
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

    def build_model(self, model: ModelConfig) -> torch.nn.Module:
        """The net ``model`` describes, sized for this data (systems with their own
        distributed layers override it)."""
        check_depth(self.data, model)
        return build_model(model, self.input_dim, self.out_dim)

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
        return DataLoader([evaluation], sampler=OneItem(), batch_size=None, collate_fn=_no_collate)

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
        return node_rows(self.graph, net, node_ids, output, self.data.eval_chunk_size, comm)

    @override
    def predict_dataloader(self) -> DataLoader:
        if self.context is None:
            raise RuntimeError("the DataModule is not set up (call trainer.predict)")
        item = Prediction(self.predict_rows, self.predict_node_ids, self.predict_output)
        return DataLoader([item], sampler=OneItem(), batch_size=None, collate_fn=_no_collate)

    @override
    def val_dataloader(self) -> DataLoader:
        return self._eval_loader()

    @override
    def test_dataloader(self) -> DataLoader:
        return self._eval_loader()

    @override
    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch.to(device) if isinstance(batch, Batch) else batch


class ReplicatedGraphEvaluation:
    """``eval_statistics`` for a DataModule whose ranks all hold the whole graph
    (``self.graph``): layer-wise inference split across ranks by node range
    (:func:`replicated_eval_statistics`)."""

    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        comm = self.context.comm if self.context is not None else None
        return replicated_eval_statistics(
            self.task,
            self.graph,
            net,
            splits,
            self.rank,
            self.world_size,
            self.data.eval_chunk_size,
            comm,
        )


class SampledDataModule(ReplicatedGraphEvaluation, GNNDataModule):
    """Per-rank sampled mini-batches over a graph that every rank holds whole.

    Every rank draws the same seeded permutation of the training nodes per epoch; a step's
    ``data.batch_size`` seeds are split across ranks and sampled with the hash-keyed sampler
    (rank-salted keys when ``salt_by_rank``: independent micro-batches, as data-parallel systems
    sample; otherwise ranks sample exactly what one process would). Evaluation: full-graph
    layer-wise inference split across ranks, each rank inferring and scoring its node range
    (:func:`replicated_eval_statistics`).

    Args: as :class:`GNNDataModule`, plus ``salt_by_rank`` (rank-salted sampling keys).
    """

    def __init__(self, dataset, config, data=None, *, salt_by_rank: bool, **kwargs):
        super().__init__(dataset, config, data, **kwargs)
        self.salt_by_rank = salt_by_rank
        self.rank, self.world_size = 0, 1

    @override
    def setup_rank(self, context: RankContext, prepared: Any) -> None:
        self.rank, self.world_size = context.rank, context.world_size

    def batcher(self) -> StepBatcher:
        """The batch maker for this rank (rank and world size as set up)."""
        return StepBatcher.on_graph(
            self.graph,
            self.data.fanouts,
            self.train_ids,
            self.batch_size,
            self.seed,
            self.rank,
            self.world_size,
            self.salt_by_rank,
        )

    def make_batch(self, epoch: int, step: int) -> Batch:
        """This rank's share of step ``step``."""
        return self.batcher()[epoch, step]

    @override
    def train_dataloader(self) -> DataLoader:
        workers = self.data.num_workers
        return DataLoader(
            self.batcher(),
            sampler=EpochSteps(self),
            batch_size=None,
            collate_fn=_no_collate,
            num_workers=workers,
            persistent_workers=workers > 0,
        )


def node_range(num_nodes: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, stop)``: rank ``rank``'s contiguous share of ``num_nodes`` node ids (sizes
    differ by at most one, as ``torch.tensor_split``)."""
    base, extra = divmod(num_nodes, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


@torch.no_grad()
def node_rows(
    graph: Graph,
    net: torch.nn.Module,
    node_ids: torch.Tensor | None,
    output: str,
    chunk_size: int,
    comm: Comm | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, rows)``: this rank's share (its :func:`node_range`) of ``node_ids`` (every node
    if ``None``), with their ``logits`` or ``embeddings`` (the last layer's input, i.e. after
    the previous layers and their ReLU) from full-neighbourhood inference split across ranks."""
    if output not in PREDICT_OUTPUTS:
        raise ValueError(f"output={output!r} is unknown; valid: {list(PREDICT_OUTPUTS)}")
    if not isinstance(net, BlockGNN):
        raise TypeError(f"predictions need a BlockGNN net, got {type(net).__name__}")
    world_size = comm.world_size if comm is not None else 1
    start, stop = node_range(graph.num_nodes, comm.rank if comm else 0, world_size)
    layers = net.num_layers - (output == "embeddings")
    if layers == 0:
        rows = graph.x[start:stop]
    else:
        rows = full_logits(graph, net, chunk_size, comm, gather=False, num_layers=layers)
    ids = torch.arange(start, stop) if node_ids is None else node_ids.cpu()
    if node_ids is not None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= graph.num_nodes):
            raise ValueError(f"node ids must be in [0, {graph.num_nodes})")
        ids = ids[(ids >= start) & (ids < stop)]
    return ids, rows[(ids - start).to(rows.device)]


@torch.no_grad()
def full_logits(
    graph: Graph,
    net: torch.nn.Module,
    chunk_size: int,
    comm: Comm | None = None,
    *,
    gather: bool = True,
    num_layers: int | None = None,
) -> torch.Tensor:
    """Full-neighbourhood logits ``[N, C]`` of every node (or, with ``gather=False``, of this
    rank's :func:`node_range` only: ``[stop - start, C]``).

    With a distributed ``comm`` the layer-wise inference is split across ranks: each rank
    computes every layer for its node range only, and each hidden layer's rows are all-gathered
    through the metered ``comm`` (``activation``). Without one (or for a user model, which runs
    on the whole graph) every rank computes everything. Rows equal the one-process rows
    (tested in float64). ``num_layers``: stop after that many layers (default: all).
    """
    device = next(net.parameters()).device
    rank, world_size = (comm.rank, comm.world_size) if comm is not None else (0, 1)
    start, stop = node_range(graph.num_nodes, rank, world_size)
    if isinstance(net, SubgraphModel):
        out = net.model(graph.x.to(device), graph.edge_index().to(device))
        return out if gather else out[start:stop]
    assert isinstance(net, BlockGNN)
    layers = net.num_layers if num_layers is None else num_layers
    if world_size == 1:
        x = graph.x.to(device)
        out = layerwise_inference(net, graph.indptr, graph.indices, x, chunk_size, layers=layers)
        return out if gather else out[start:stop]
    builder = inference_builder(graph.indptr)
    h = graph.x.to(device)
    for i in range(layers):
        rows = layer_rows(net, i, builder, graph.indptr, graph.indices, h, start, stop, chunk_size)
        last = i == layers - 1
        h = rows if last and not gather else comm.all_gather_varlen(rows, category="activation")[0]
    return h


def replicated_eval_statistics(
    task: NodeTask,
    graph: Graph,
    net: torch.nn.Module,
    splits: tuple[str, ...],
    rank: int,
    world_size: int,
    chunk_size: int,
    comm: Comm | None = None,
) -> torch.Tensor:
    """``[len(splits), k]`` float64 task statistics over this rank's share of each split.

    For systems whose ranks hold the whole graph; the caller sums the statistics over ranks.

    - With a distributed ``comm`` (rank and world size must be its own): the inference is split
      across ranks (:func:`full_logits`; the hidden layers' rows are all-gathered as
      ``activation``) and each rank scores the nodes of its own :func:`node_range`.
    - Without one: each rank runs the whole inference and scores every ``world_size``-th node.

    Either way the sums over ranks are the one-process statistics.
    """
    if comm is not None and comm.world_size > 1:
        if (comm.rank, comm.world_size) != (rank, world_size):
            raise ValueError(
                f"rank {rank} / world size {world_size} differ from the comm's "
                f"{comm.rank} / {comm.world_size}"
            )
        start, stop = node_range(graph.num_nodes, rank, world_size)
        out = full_logits(graph, net, chunk_size, comm, gather=False)
        rows = {}
        for split in splits:
            ids = graph.split_ids(split)
            rows[split] = ids[(ids >= start) & (ids < stop)]
        positions = {split: ids - start for split, ids in rows.items()}
        return split_statistics(task, out, graph.y[start:stop], positions, splits)
    out = full_logits(graph, net, chunk_size)
    rows = {split: graph.split_ids(split)[rank::world_size] for split in splits}
    return split_statistics(task, out, graph.y, rows, splits)


def owned_range_rows(
    net: torch.nn.Module,
    comm: Comm,
    book: RangeBook,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    x: torch.Tensor,
    layers: int,
    chunk_size: int,
) -> torch.Tensor:
    """:func:`owned_rows` for a rank whose own vertices are the contiguous range ``book``
    gives it, from the whole CSC (``indptr``, ``indices``, a topology every rank holds) and its
    own input rows ``x`` (``[n_own, F]``): what a rank that loaded its part of a partition
    directory evaluates and predicts with, no rank holding another's rows. Collective."""
    first, stop = int(book.node_offsets[comm.rank]), int(book.node_offsets[comm.rank + 1])
    whole = CSCRows.whole(indptr, indices)
    own = CSCRows(indptr[first : stop + 1], indices, whole.degree, torch.arange(first, stop))
    return owned_rows(net, comm, book.nid2part, own, x, layers, chunk_size)


@torch.no_grad()
def owned_rows(
    net: torch.nn.Module,
    comm: Comm,
    owner: Callable[[torch.Tensor], torch.Tensor],
    topology: CSCRows,
    x: torch.Tensor,
    layers: int,
    chunk_size: int,
) -> torch.Tensor:
    """Full-neighbourhood output rows ``[n_own, d]`` of the first ``layers`` layers for this
    rank's own vertices ``topology.ids`` (sorted; ``owner`` maps ids to ranks), from their CSC
    rows (all the topology it needs) and their input rows ``x`` (``[n_own, F]``, in
    ``topology.ids`` order).

    Before each layer the rows of the in-neighbours owned elsewhere come from their owners in
    one exchange (``feature`` before layer 0, ``activation`` after; the route is built once,
    ``structure``); each layer runs over ``chunk_size`` vertices at a time. A row depends only
    on its own and its in-neighbours' rows and the segment order of its in-edges, so rows equal
    the whole-graph inference's (to the rounding of matrix products over other row sets).
    Collective."""
    if not isinstance(net, BlockGNN):
        raise TypeError(f"inference over owned rows needs a BlockGNN net, got {type(net).__name__}")
    own_ids = topology.ids
    num_own = own_ids.numel()
    neighbours = topology.indices[topology.indptr[0] : topology.indptr[-1]]
    halo = torch.unique(neighbours[owner(neighbours) != comm.rank])
    route = OwnerRoute.build(comm, halo, owner(halo), category="structure")
    served_rows = topology.rows(route.served)
    device = next(net.parameters()).device
    h = x.to(device)
    for i in range(layers):
        served = h.index_select(0, served_rows.to(device)).cpu()
        category = "feature" if i == 0 else "activation"
        table = torch.cat([h, route.reply(comm, served, category=category).to(device)])
        outs = []
        for lo in range(0, num_own, chunk_size) or [0]:
            dst = own_ids[lo : lo + chunk_size]
            src, dst_pos = topology.sample(dst, -1, 0)
            block = build_block_sorted(dst, src, dst_pos, topology.degree)
            ids = block.src_ids
            own = owner(ids) == comm.rank
            rows = num_own + torch.searchsorted(halo, ids)
            rows[own] = topology.rows(ids[own])
            outs.append(net.layer_output(i, block.to(device), table[rows.to(device)]))
        h = torch.cat(outs)
    return h
