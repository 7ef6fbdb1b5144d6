"""Validation of a run's config, before any process is spawned or any data is loaded."""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from .comm.network import NetworkModel
from .graph.datasets import check_dataset_options
from .launch import externally_launched
from .models.gnn import MODEL_KINDS

LOGGERS = ("csv", "wandb", "none")
DTYPES = ("float32", "float64")
ACCELERATORS = ("cpu", "gpu", "cuda", "auto")


class ConfigError(ValueError):
    """A bad config value; the message names the key and the valid choices."""


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate(cfg: DictConfig) -> None:
    """Check every key a run depends on; raise :class:`ConfigError` on the first problem."""
    from .systems import STRATEGIES  # late: systems import this module's ConfigError

    name = cfg.strategy.name
    _require(name in STRATEGIES, f"strategy={name!r} is unknown; valid: {sorted(STRATEGIES)}")
    model = cfg.model
    kinds = (*MODEL_KINDS, "custom")
    _require(model.name in kinds, f"model={model.name!r} is unknown; valid: {list(kinds)}")
    _require(int(model.num_layers) >= 1, "model.num_layers must be >= 1")
    _require(int(model.hidden) >= 1, "model.hidden must be >= 1")
    _require(0.0 <= float(model.get("dropout", 0.0)) < 1.0, "model.dropout must be in [0, 1)")
    _require(float(model.lr) > 0, "model.lr must be > 0")
    if model.name == "gat":
        _require(
            int(model.hidden) % int(model.heads) == 0,
            f"model.hidden={model.hidden} must be divisible by model.heads={model.heads}",
        )
    options = {k: v for k, v in cfg.dataset.items() if k not in ("name", "root")}
    try:
        check_dataset_options(cfg.dataset.name, options)
    except ValueError as err:
        raise ConfigError(f"dataset: {err}") from None

    fanouts = list(cfg.data.fanouts)
    _require(
        len(fanouts) == int(model.num_layers),
        f"data.fanouts={fanouts} has {len(fanouts)} hops but model.num_layers="
        f"{model.num_layers}; give one fanout per layer",
    )
    _require(
        all(int(f) > 0 or int(f) == -1 for f in fanouts),
        f"data.fanouts={fanouts}: each fanout must be > 0 or -1 (full neighbourhood)",
    )
    bs = int(cfg.data.batch_size)
    _require(bs > 0 or bs == -1, f"data.batch_size={bs} must be > 0 or -1 (all train nodes)")
    _require(int(cfg.data.num_workers) >= 0, "data.num_workers must be >= 0")
    _require(int(cfg.data.eval_chunk_size) > 0, "data.eval_chunk_size must be > 0")

    tr = cfg.trainer
    _require(int(tr.devices) >= 1, f"trainer.devices={tr.devices} must be >= 1")
    _require(int(tr.num_nodes) >= 1, f"trainer.num_nodes={tr.num_nodes} must be >= 1")
    _require(int(tr.max_epochs) >= 1, f"trainer.max_epochs={tr.max_epochs} must be >= 1")
    _require(
        tr.accelerator in ACCELERATORS,
        f"trainer.accelerator={tr.accelerator!r} is unknown; valid: {list(ACCELERATORS)}",
    )
    _require(cfg.dtype in DTYPES, f"dtype={cfg.dtype!r} is unknown; valid: {list(DTYPES)}")
    _require(
        cfg.logger.name in LOGGERS, f"logger={cfg.logger.name!r} is unknown; valid: {list(LOGGERS)}"
    )
    try:
        NetworkModel.from_name(cfg.network)
    except ValueError as err:
        raise ConfigError(f"network={cfg.network!r}: {err}") from None

    world = int(tr.devices) * int(tr.num_nodes)
    servers = cfg.topology.servers
    if servers is not None:
        _require(
            int(servers) >= 1 and world % int(servers) == 0,
            f"topology.servers={servers} must divide the world size {world}",
        )
    if "SLURM_NTASKS" in os.environ and not externally_launched() and world > 1:
        raise ConfigError(
            f"inside a SLURM job with one task, but {world} ranks are requested: "
            f"launch with srun --ntasks-per-node={tr.devices} (one task per rank)"
        )
    if int(tr.num_nodes) > 1 and not externally_launched():
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK") if v not in os.environ]
        _require(
            not missing,
            f"trainer.num_nodes={tr.num_nodes}: set {', '.join(missing)} on "
            f"every node (the same MASTER_ADDR/MASTER_PORT everywhere), or launch with "
            f"torchrun / srun",
        )
    if cfg.ckpt_path is not None:
        _require(os.path.isfile(str(cfg.ckpt_path)), f"ckpt_path={cfg.ckpt_path} does not exist")
    if model.name == "custom" and not STRATEGIES[name].accepts_custom_models:
        valid = sorted(n for n, system in STRATEGIES.items() if system.accepts_custom_models)
        raise ConfigError(
            f"strategy={name} cannot run model=custom (a model(x, edge_index) "
            f"cannot take the layer hook); strategies that can: {valid}"
        )
    STRATEGIES[name].validate(cfg)


def resolved(cfg: DictConfig) -> DictConfig:
    """A plain, fully resolved copy (no Hydra interpolations), safe to send to other processes."""
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
