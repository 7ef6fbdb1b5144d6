"""The suite's strategies (docs/architecture.md, "The system contract").

:class:`SystemStrategy` (mixed into :class:`MeteredSingleDeviceStrategy` and
:class:`MeteredDDPStrategy`) owns the run's :class:`CommMeter` and metered ``comm``, binds the
system's config and hands the LightningModule its :class:`ModuleRuntime`. The DDP one registers
the metered gradient hook on CPU too (Lightning only does so on CUDA) and routes Lightning's own
barrier / broadcast / reduce through ``comm`` so that they are counted.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import lightning as L
import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.plugins.precision import DoublePrecision, HalfPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, Strategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from ..checkpoints import (
    RANK_SHARD,
    SHARDS_KEY,
    SuiteCheckpointIO,
    pop_rank_shards,
    read_rank_shard,
    remove_rank_shards,
    shard_file,
    shard_token,
    write_rank_shard,
)
from ..comm import (
    REDUCE_OPS,
    Comm,
    CommMeter,
    GradientHookState,
    Topology,
    ddp_bucket_layout,
    register_metered_ddp_hook,
)
from ..config_types import DataConfig, RunConfig, RunFacts, SystemConfig, check_run
from ..contract import Evaluation, ModuleRuntime, Prediction, RankContext, RuntimeAware
from ..errors import ConfigError
from ..graph.batch import Batch

# the checkpoint's DDP gradient bucket layout (MeteredDDPStrategy.save_checkpoint)
DDP_BUCKETS_KEY = "lightning_gnnscale_ddp_buckets"


def checked_bucket_layout(layout: Any, module: torch.nn.Module) -> list[list[int]]:
    """``layout`` if it is a bucket layout of ``module``: lists of ints that together hold
    each trainable parameter's position in ``module.parameters()`` once; else ConfigError
    (a malformed one would fail inside DDP's backward hook)."""
    trainable = [i for i, p in enumerate(module.parameters()) if p.requires_grad]
    valid = isinstance(layout, list) and all(
        isinstance(bucket, list) and all(type(j) is int for j in bucket) for bucket in layout
    )
    if not valid or sorted(j for bucket in layout for j in bucket) != trainable:
        raise ConfigError(
            f"checkpoint key {DDP_BUCKETS_KEY!r} is not a bucket layout of this model: want "
            f"lists of ints holding each of the {len(trainable)} trainable parameters' "
            f"positions once, got {layout!r:.200}"
        )
    return layout


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
        self.checked_run: RunConfig | None = None  # the typed run of from_run (checked once)
        # the bound DataModule's completion of an older checkpoint (:meth:`bind`)
        self.complete_checkpoint: Callable[[dict], None] | None = None
        self.looked_up: Any = None  # the learnable inputs of the steps since the last update

    @classmethod
    def from_run(cls, run: RunConfig) -> SystemStrategy:
        """The strategy of the typed run ``run`` (``run.strategy`` is its config). Its rules
        were checked once when ``run`` was typed (:func:`~..config_types.check_run`): binding a
        DataModule of that run under the run's processes does not check them again."""
        strategy = cls(run.strategy, **cls.run_options(run))
        strategy.checked_run = run
        return strategy

    @classmethod
    def run_options(cls, run: RunConfig) -> dict[str, Any]:
        """The constructor's arguments other than the config, taken from ``run``."""
        raise NotImplementedError

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

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict:
        """Lightning's, plus the completion of a checkpoint written before the DataModule
        kept its loader's epoch: the callable the bound DataModule handed over
        (:meth:`~.datamodule.GNNDataModule.complete_checkpoint`). Lightning sets the
        DataModule up, binding it, before it restores a checkpoint (``fit``, ``validate``,
        ``test`` and ``predict`` with ``ckpt_path``)."""
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        if self.complete_checkpoint is not None:
            self.complete_checkpoint(checkpoint)
        if SHARDS_KEY in checkpoint:  # this rank's own shard, back into the DataModule state
            manifest = checkpoint.pop(SHARDS_KEY)
            shards = read_rank_shard(
                checkpoint_path, manifest, self.comm.rank, self.comm.world_size
            )
            if not isinstance(shards, dict):
                raise ValueError(f"checkpoint {checkpoint_path}: its shard is not a mapping")
            for key, shard in shards.items():
                if not isinstance(checkpoint.get(key), dict):
                    raise ValueError(
                        f"checkpoint {checkpoint_path}: its shard holds state {key!r} the "
                        "checkpoint does not"
                    )
                checkpoint[key][RANK_SHARD] = shard
        return checkpoint

    def run_facts(self, data: DataConfig) -> RunFacts:
        """What the config's rules see of this run: the Trainer's processes, the DataModule's
        data settings, the LightningModule's model settings (``model_config``, if it states
        them)."""
        module = self.lightning_module
        model = getattr(module, "model_config", None)
        devices = len(getattr(self, "parallel_devices", None) or [self.root_device])
        num_nodes = getattr(self, "num_nodes", 1)
        return RunFacts(devices * num_nodes, devices, num_nodes, data, model)

    def bind(
        self,
        config: SystemConfig,
        data: DataConfig | None = None,
        complete_checkpoint: Callable[[dict], None] | None = None,
    ) -> RankContext:
        """Accept the DataModule's system config (see :func:`~..contract.bind_datamodule`),
        check its rules against this run (``config.check_run``) before any step, and keep
        what the DataModule hands over for the checkpoints this strategy loads
        (``complete_checkpoint``, see :meth:`load_checkpoint`)."""
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
        self.complete_checkpoint = complete_checkpoint
        if data is not None:
            facts = self.run_facts(data)
            if not self.checked_already(config, facts):
                check_run(config, facts)
        return self.context

    def checked_already(self, config: SystemConfig, facts: RunFacts) -> bool:
        """Whether ``facts`` are those of the run this strategy was built from
        (:meth:`from_run`), whose rules were checked when it was typed: the same config,
        data, model (when the module states it) and processes."""
        run = self.checked_run
        return (
            run is not None
            and run.strategy == config
            and run.data == facts.data
            and facts.model in (None, run.model)
            and (facts.world_size, facts.devices, facts.num_nodes)
            == (run.world_size, run.trainer.devices, run.trainer.num_nodes)
        )

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
        """The module's step, on a batch whose learned input rows (``batch.learned_inputs``) are looked
        up first (docs/architecture.md, "Learnable inputs"). If the first step fails and the
        module took a runtime with a layer hook but never called ``runtime.layer_hook(batch)``,
        the error says so: without the hook the rows never move and the step fails far from
        the cause (an index out of bounds)."""
        batch, *rest = args
        if isinstance(batch, Batch) and batch.learned_inputs is not None:
            if getattr(self.precision_plugin, "scaler", None) is not None:
                raise ConfigError(
                    "learned input rows do not take a gradient scaler (precision=16-mixed): "
                    "their sparse step would apply scaled gradients; use bf16-mixed, 32-true "
                    "or 64-true"
                )
            self.looked_up = batch.learned_inputs
            args = (batch.learned_inputs.lookup(batch, self.root_device), *rest)
        runtime, self.unchecked_runtime = self.unchecked_runtime, None
        if runtime is None:
            return super().training_step(*args, **kwargs)
        try:
            return super().training_step(*args, **kwargs)
        except Exception as err:
            if runtime.layer_hook_unused:
                raise RuntimeError(self.unused_hook_message()) from err
            raise

    @override
    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        """The dense step, then the sparse step of the learned input rows looked up since the
        last one (their gradients pushed to the rows' owners, ``gradient`` bytes)."""
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self.looked_up is not None:
            self.looked_up.step()
            self.looked_up = None
        return output

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Lightning's (rank 0 writes the checkpoint), after every rank wrote its own shard
        (the DataModule state's ``RANK_SHARD``: learnable input rows and their optimiser state)
        to a file beside it, whose digests the checkpoint lists (collective). The previous
        shards of ``filepath`` go only once the new checkpoint is written, so a crash or a full
        disk at any point leaves a checkpoint whose shards are all there."""
        shards = pop_rank_shards(checkpoint)
        if shards:
            rank, world = self.comm.rank, self.comm.world_size
            token = shard_token(checkpoint)
            digest = write_rank_shard(shard_file(filepath, token, rank, world), shards)
            mine = torch.tensor(list(bytes.fromhex(digest)), dtype=torch.uint8).unsqueeze(0)
            every = self.comm.all_gather_tensor(mine, category="control")
            digests = [bytes(row.tolist()).hex() for row in every]
            checkpoint[SHARDS_KEY] = {"token": token, "world_size": world, "digests": digests}
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        if shards:
            self.comm.barrier()  # the checkpoint that names the new shards is written
            remove_rank_shards(filepath, self.comm.rank, keep=token)

    @override
    def remove_checkpoint(self, filepath: Any) -> None:
        """Lightning's (rank 0 removes the checkpoint), and every rank its own shards of it."""
        super().remove_checkpoint(filepath)
        remove_rank_shards(filepath, self.comm.rank)

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

    @classmethod
    @override
    def run_options(cls, run: RunConfig) -> dict[str, Any]:
        return {"device": "cpu" if run.trainer.accelerator == "cpu" else "cuda"}

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
    Its checkpoints keep DDP's gradient bucket layout, and a run resumed from one reduces its
    first step's gradients in it, as the uninterrupted run does (docs/architecture.md,
    "Gradient buckets and resume").

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
        self.resume_layout: list[list[int]] | None = None  # of the checkpoint loaded last

    @classmethod
    @override
    def run_options(cls, run: RunConfig) -> dict[str, Any]:
        return {
            "servers": run.topology.servers,
            "timeout_s": run.launcher.collective_timeout_s,
            "process_group_backend": run.trainer.process_group_backend,
        }

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
        state = GradientHookState(
            self.comm.with_group(self.model.process_group),
            scale=1.0,
            resume_layout=self.resume_layout,
        )
        self.resume_layout = None  # handed over: a later fit without a checkpoint starts fresh
        self.grad_hook_state = register_metered_ddp_hook(self.model, state)

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Lightning's, plus DDP's bucket layout (:func:`~..comm.hooks.ddp_bucket_layout`;
        every rank calls this, rank 0 writes). A resumed run that saves before its first
        backward saves the layout it carries, not DDP's initial one."""
        if self.grad_hook_state is not None and isinstance(self.model, DistributedDataParallel):
            carried = self.grad_hook_state.resume_layout
            checkpoint[DDP_BUCKETS_KEY] = (
                carried if carried is not None else ddp_bucket_layout(self.model)
            )
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict:
        """The checkpoint; a fit's takes its (checked) bucket layout to the hook that
        :meth:`configure_ddp` registers next (Lightning restores a fit's checkpoint before it
        sets DDP up; validate, test and predict set up no DDP)."""
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        module = self.lightning_module
        fitting = module is not None and module.trainer.state.fn == TrainerFn.FITTING
        layout = checkpoint.get(DDP_BUCKETS_KEY) if fitting else None
        self.resume_layout = None if layout is None else checked_bucket_layout(layout, module)
        return checkpoint

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
