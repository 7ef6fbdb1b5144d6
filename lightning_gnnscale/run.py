"""``train(cfg)``: compose a run from its config, prepare the data once, start the ranks, train,
and summarise.

Every object is built through the public API (``build_datamodule``, ``build_strategy``,
``GNNModule``, the callbacks, ``L.Trainer``); what this adds on top (its own launcher with
shared-memory data, the run folder lock, the summary) is public too, so a plain Lightning
script can do the same. ``train.py`` is a thin Hydra entry point around this.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from .bounds import (
    OMP_THREADS_ENV,
    THREADS_ENV,
    check_port,
    env_count,
    externally_launched,
    usable_cores,
)
from .callbacks import (
    CollectiveAudit,
    CommStats,
    EpochStats,
    RunSummary,
    StepSeed,
    format_table,
)
from .callbacks.summary import record_launcher_memory
from .checkpoints import (
    CHECKPOINT_KEY,
    BestCheckpoint,
    CheckpointIdentity,
    LastCheckpoint,
    load_weights,
    read_checkpoint,
)
from .comm import Topology
from .comm.rendezvous import end_process_group
from .config_types import RunConfig
from .cpu_memory import apply_malloc_settings, malloc_choice
from .graph.constructed import ignored_columns_line
from .graph.datasets import load_dataset
from .graph.node_targets import NodeDataset
from .graph.partition_dir import node_ranks
from .kit.datamodule import GNNDataModule
from .kit.strategies import SystemStrategy
from .launch import LauncherSignal, launch_local
from .loggers import finish_wandb_runs
from .models.module import GNNModule
from .preflight import validate
from .run_folder import FAILED_FILE, check_writable, claimed, job_log_name, settle_failed_run
from .systems.registry import SYSTEMS
from .tasks import task_spec


def config_hash(run: RunConfig) -> str:
    """Hash of what defines a run's result (not where it writes): its settings and, for a
    resumed run, the run it continues (that run's hash and its completed epochs). A resumed
    run can differ from an uninterrupted one (Grappa keeps the checkpoint's super-epoch
    length), so the two never share a hash."""
    settings = run.settings
    data = {
        k: v for k, v in settings.items() if k not in ("paths", "ckpt_path", "launcher", "logger")
    }
    # where the data is read from (partition_dir) gives the same result
    data["data"] = {k: v for k, v in settings["data"].items() if k != "partition_dir"}
    data["trainer"] = {k: v for k, v in settings["trainer"].items() if k != "enable_progress_bar"}
    if "dataset.content" in run.identity:  # the user's data: what it holds, not only its path
        data["dataset_content"] = run.identity["dataset.content"]
    if run.ckpt_path is not None:
        block = read_checkpoint(run.ckpt_path).get(CHECKPOINT_KEY) or {}
        data["resumed_from"] = {
            "config_hash": block.get("config_hash"),
            "identity": block.get("identity"),
            "epochs_done": block.get("epochs_done"),
        }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_node_dataset(run: RunConfig) -> NodeDataset:
    """The dataset of ``run.dataset`` in the run's dtype."""
    return load_dataset(run.dataset).to(getattr(torch, run.dtype))


def build_datamodule(
    run: RunConfig, dataset: NodeDataset | None = None, *, by_name: bool = False
) -> GNNDataModule:
    """The system's DataModule for ``run`` (on ``dataset``, else the run's). On the
    dataset's name, loaded when first used, with ``by_name`` or ``data.partition_dir`` (then
    nothing is loaded: the ranks load their parts)."""
    spec = SYSTEMS[run.strategy.name]
    if (by_name or run.data.partition_dir is not None) and dataset is None:
        source, named = run.dataset, {"dtype": getattr(torch, run.dtype)}
    else:
        source, named = (dataset if dataset is not None else load_node_dataset(run)), {}
    datamodule = spec.datamodule(
        source,
        run.strategy,
        run.data,
        seed=run.seed,
        cache_dir=run.paths.cache_dir,
        checked_run=run,
        task=run.task,
        **named,
    )
    datamodule.launch_topology = Topology.from_launch(
        run.world_size, run.trainer.num_nodes, run.topology.servers
    )
    return datamodule


def build_strategy(run: RunConfig) -> SystemStrategy:
    """The system's Strategy for ``run`` (its ``from_run``), given the same system config as
    its DataModule."""
    return SYSTEMS[run.strategy.name].strategy.from_run(run)


def rank_threads(devices: int) -> int:
    """Torch threads of one of the ``devices`` local ranks.

    ``$GNNSCALE_NUM_THREADS`` when set (``bench e2e`` pins it). Otherwise the usable cores
    (affinity, capped by a cgroup CPU quota: :func:`~.bounds.usable_cores`), shared by the
    ranks, but no more than the cores the 1-minute load average leaves idle (at least 1): on a
    busy machine, intra-op threads that wait for cores other work holds
    make every operator slower than one thread would (issue 16: a 2-core machine at load 2-6
    ran ``single``'s epoch 3x slower with 2 threads, 1.2x slower with 1).
    """
    pinned = env_count(THREADS_ENV)  # bounded by the cores in validate (bounds.py)
    if pinned is not None:
        return pinned
    cores = usable_cores()
    share = max(1, cores // devices)
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this platform
        return share
    return max(1, min(share, int(cores - load + 0.5)))


def use_rank_threads(devices: int) -> None:
    """Set this rank's torch threads to :func:`rank_threads` and keep them through ``fit``.

    Lightning's launchers set ``cores // local ranks`` threads unless ``$OMP_NUM_THREADS`` is
    set, which would override ``$GNNSCALE_NUM_THREADS`` and the load cap (two emulated hosts
    of one rank each then ran two spinning OpenMP threads each on two cores). So this process
    sets it too."""
    threads = rank_threads(devices)
    torch.set_num_threads(threads)
    os.environ[OMP_THREADS_ENV] = str(threads)


def train(cfg: DictConfig | RunConfig, *, checked: bool = False) -> tuple[dict, dict]:
    """Run one training job; return ``(metrics, objects)``. ``checked``: ``cfg`` is the run
    config :func:`~.preflight.check_config` returned (``train.py``), not checked again.

    ``metrics`` is the content of ``summary.json`` (empty on nodes other than node 0 of a
    multi-node launch); ``objects`` holds ``graph`` (``None`` with ``data.partition_dir``:
    no process loads it) and ``output_dir``.
    """
    run = validate(cfg, checked=checked)
    malloc_choice()  # a bad $GNNSCALE_MALLOC fails here, before any rank is spawned
    output_dir = Path(run.paths.output_dir)
    check_writable(output_dir)
    external = externally_launched()  # this process is one rank; the ranks share the folder
    if run.dataset.source.name == "constructed" and os.environ.get("RANK", "0") == "0":
        note = ignored_columns_line(run.dataset.root, run.model.name)
        if note:
            print(note)
    if external:  # every rank loads and prepares: share the cores from the start
        use_rank_threads(run.trainer.devices)
    with contextlib.nullcontext() if external else claimed(output_dir):
        datamodule = build_datamodule(run)
        # once, here; the ranks receive the result (a partition directory: checked, and the
        # parts of this node's ranks verified)
        datamodule.prepare(run.world_size, node_ranks(run.world_size, run.trainer.devices))
        datamodule.check_model(run.model)
        if external:
            metrics = run_rank(run, datamodule, None)
        elif run.world_size == 1:  # in this process: leave it as it was found (Lightning
            # sets MASTER_ADDR/PORT and makes a process group that a later run here would reuse)
            environment = dict(os.environ)
            try:
                metrics = run_rank(run, datamodule, None)
            finally:
                end_process_group()
                os.environ.clear()
                os.environ.update(environment)
        else:
            if run.weights_from is not None:  # weights that do not fit fail before any spawn
                build_module(run, datamodule)
            run_id = uuid.uuid4().hex
            with sweep_rendezvous():
                launch_local(
                    run_rank,
                    (run, datamodule, run_id),
                    run.trainer.devices,
                    run.trainer.num_nodes,
                    run.launcher.timeout_s,
                    run.launcher.start_method,
                )
            node_zero = os.environ.get("NODE_RANK", "0") == "0"  # global rank 0 writes it
            metrics = read_summary(output_dir / "summary.json", run_id) if node_zero else {}
        if metrics and not external:  # the launcher's own peak, now that its ranks have ended
            forked = run.world_size > 1 and run.launcher.start_method == "forkserver"
            metrics = record_launcher_memory(
                output_dir / "summary.json", metrics, rank_server=forked
            )
    if metrics:
        table = format_table(metrics, run.task.name)
        print(f"\n{table}\n\nsummary: {output_dir / 'summary.json'}")
    in_memory = datamodule.partition_dir is None
    graph, targets = (datamodule.graph, datamodule.targets) if in_memory else (None, None)
    return metrics, {"graph": graph, "targets": targets, "output_dir": output_dir}


@contextlib.contextmanager
def sweep_rendezvous() -> Iterator[None]:
    """In job k of a Hydra multirun, the ranks meet at ``MASTER_PORT`` + k (when it is given).
    Every node runs the sweep's jobs in the same order, and a node that starts job k + 1 while
    node 0 still finishes job k must not join job k's rendezvous, still open on node 0."""
    base = os.environ.get("MASTER_PORT")
    if base is None or not _in_sweep():
        yield
        return
    job = HydraConfig.get().job.num
    check_port(offset=job)  # before this job's ranks start
    os.environ["MASTER_PORT"] = str(int(base) + job)
    try:
        yield
    finally:
        os.environ["MASTER_PORT"] = base


def run_from_command_line(cfg: DictConfig, run: RunConfig) -> float | None:
    """``train.py``'s job: :func:`train` of ``run`` (``cfg`` as :func:`~.preflight.check_config`
    typed it), returning the value Hydra sweepers optimise. A run stopped by Ctrl-C, a signal
    or an OS error (disk full, a file that vanished) ends with one line naming what happened
    and where its partial results are (``cfg``'s output folder), not a traceback."""
    try:
        metrics, _ = train(run, checked=True)
    except KeyboardInterrupt:
        _stopped("interrupted (Ctrl-C)", cfg, 130)
    except LauncherSignal as err:
        _stopped(f"stopped: {err}", cfg, 143)
    except OSError as err:
        # In a -m sweep the job fails and the sweep goes on (Hydra records the error).
        _stopped(f"stopped by {type(err).__name__}: {err}", cfg, None if _in_sweep() else 1)
        raise
    return metrics.get(f"best_val_{task_spec(run.task.name).monitor}")


def _in_sweep() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _stopped(what: str, cfg: DictConfig, code: int | None) -> None:
    """Print what stopped the run and where its results are; exit with ``code`` (if any)."""
    try:
        output_dir = Path(str(OmegaConf.select(cfg, "paths.output_dir")))
    except Exception:  # noqa: BLE001 - unresolvable outside Hydra: name what is known
        output_dir = None
    if output_dir is None or not output_dir.is_dir():
        where = "no results were written"
    elif settle_failed_run(output_dir, RuntimeError(what), job_log_name()):
        where = f"no results were written (its empty folder {output_dir} was removed)"
    else:
        last = output_dir / "checkpoints" / "last.ckpt"
        where = f"partial results in {output_dir}, marked {FAILED_FILE}" + (
            f" (last completed epoch: {last}; resume with ckpt_path={last})"
            if last.is_file()
            else ""
        )
    print(f"Run {what}; {where}", file=sys.stderr)
    if code is not None:
        raise SystemExit(code)


def read_summary(path: Path, run_id: str) -> dict:
    """The ranks' ``summary.json``, checked to be this run's (never another run's numbers)."""
    if not path.exists():
        return {}
    metrics = json.loads(path.read_text())
    if metrics.get("run_id") != run_id:
        raise RuntimeError(
            f"{path} was written by another run (run_id {metrics.get('run_id')}, expected "
            f"{run_id}); two runs shared one output folder"
        )
    return metrics


def progress_bar(enabled: bool | None) -> bool:
    """``trainer.enable_progress_bar``; ``None``: a bar only when stderr is a terminal (in a log
    file or a pipe its redraws would bury the epoch lines)."""
    return sys.stderr.isatty() if enabled is None else enabled


def build_logger(run: RunConfig):
    """The configured Lightning logger (``logger._target_``), given the run's config as its
    hyperparameters; ``False`` for ``logger=none``."""
    if run.logger is None:
        return False
    logger = instantiate(run.logger)
    logger.log_hyperparams(copy.deepcopy(run.settings))  # a logger's own copy to keep
    return logger


def build_module(run: RunConfig, datamodule: GNNDataModule) -> GNNModule:
    """The run's LightningModule, started from ``weights_from`` when given (a checkpoint that
    does not fit the model raises :class:`ConfigError`)."""
    net = datamodule.build_model(run.model)
    # The run's dtype is applied here rather than through Lightning's "64-true" precision, whose
    # input conversion cannot walk our frozen Batch/Block dataclasses (features are cast already).
    module = GNNModule(
        net.to(getattr(torch, run.dtype)),
        optimizer=run.model.optimizer,
        lr=run.model.lr,
        weight_decay=run.model.weight_decay,
        model_config=run.model,
        task=datamodule.task,
    )
    if run.weights_from is not None:
        load_weights(module, run.weights_from)
    return module


def run_rank(run: RunConfig, datamodule: GNNDataModule, run_id: str | None) -> dict:
    """One rank's whole job: build the module and the Trainer, fit, and (on rank 0) write
    ``summary.json``."""
    # Epoch values are reduced through the metered comm before logging; Lightning's advice to
    # add sync_dist (an unmetered all-reduce) does not apply.
    warnings.filterwarnings("ignore", message=".*when logging on epoch level in distributed")
    use_rank_threads(run.trainer.devices)
    cpu_allocator = apply_malloc_settings(run.strategy.shares_malloc_arenas)
    L.seed_everything(run.seed, workers=True, verbose=False)
    output_dir = str(run.paths.output_dir)
    module = build_module(run, datamodule)
    epoch_stats, comm_stats = EpochStats(), CommStats(run.network)
    audit = CollectiveAudit() if run.audit else None
    system_callbacks = datamodule.callbacks()
    run_hash = config_hash(run)
    summary = RunSummary(
        run,
        output_dir,
        epoch_stats,
        comm_stats,
        run_hash,
        audit,
        system_callbacks,
        run_id=run_id or uuid.uuid4().hex,
        cpu_allocator=cpu_allocator,
    )
    checkpoint_dir = os.path.join(output_dir, "checkpoints")
    # Both are written at the epoch end (after its validation and its records), so resuming
    # from either continues a completed epoch.
    task = task_spec(run.task.name)
    best = BestCheckpoint(
        dirpath=checkpoint_dir,
        monitor=f"val/{task.monitor}",
        mode=task.mode,
        filename="best",
        save_on_train_epoch_end=True,
    )
    last = LastCheckpoint(checkpoint_dir)
    tr = run.trainer
    trainer = L.Trainer(
        accelerator=tr.accelerator,
        devices=tr.devices,
        num_nodes=tr.num_nodes,
        strategy=build_strategy(run),
        max_epochs=tr.max_epochs,
        logger=build_logger(run),
        callbacks=[
            StepSeed(run.seed),
            epoch_stats,
            comm_stats,
            *system_callbacks,
            CheckpointIdentity(run.identity, run_hash),
            best,
            last,
            *(instantiate(node) for node in (run.callbacks or {}).values()),
            summary,
            *([audit] if audit else []),
        ],
        check_val_every_n_epoch=tr.check_val_every_n_epoch,
        log_every_n_steps=tr.log_every_n_steps,
        enable_progress_bar=progress_bar(tr.enable_progress_bar),
        limit_train_batches=tr.limit_train_batches,
        deterministic=tr.deterministic,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        enable_model_summary=False,
        default_root_dir=output_dir,
    )
    # weights_only: the ranks, too, load the checkpoint as tensors and plain data (no code)
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=run.ckpt_path, weights_only=True)
    except BaseException:
        finish_wandb_runs(trainer.loggers, exit_code=1)
        raise
    finish_wandb_runs(trainer.loggers, exit_code=0)
    return summary.summary or {}
