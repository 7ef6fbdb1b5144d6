"""Validation of a run's config, before any process is spawned or any data is loaded."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from .checkpoints import check_resume, read_checkpoint
from .comm.network import NetworkModel
from .errors import ConfigError
from .graph.datasets import check_dataset_options
from .launch import externally_launched
from .models.gnn import MODEL_KINDS

DTYPES = ("float32", "float64")
ACCELERATORS = ("cpu", "gpu", "cuda", "auto")
OPTIMIZERS = ("adam", "adamw", "sgd")
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
# Subtrees whose keys are checked elsewhere: dataset options by the dataset registry, loggers
# and callbacks against their class's signature; custom model kwargs are the user's.
_OPEN_KEYS = ("dataset", "model.kwargs", "logger", "callbacks")


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _int(cfg: DictConfig, key: str, minimum: int | None = None) -> int:
    """``cfg[key]`` as an int (a float, bool or string is an error), at least ``minimum``."""
    value = OmegaConf.select(cfg, key)
    check_type_like_default(key, value, 0)
    if minimum is not None:
        _require(value >= minimum, f"{key}={value} must be >= {minimum}")
    return value


def _number(cfg: DictConfig, key: str) -> float:
    value = OmegaConf.select(cfg, key)
    check_type_like_default(key, value, 0.0)
    return float(value)


def _positive_or_null(cfg: DictConfig, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    if value is not None:
        _require(_number(cfg, key) > 0, f"{key}={value} must be > 0 (or null)")


def _reference_keys(cfg: DictConfig) -> dict:
    """Every key the composed config may hold: the union of the primary config and the files
    of the chosen groups (a key added with ``+`` on the command line is in none of them)."""
    reference = _load_conf(CONF_DIR / "config.yaml", None)
    reference.pop("hydra", None)
    choices = {
        "trainer": "default",
        "model": cfg.model.name,
        "strategy": cfg.strategy.name,
    }
    for group, choice in choices.items():
        path = CONF_DIR / group / f"{choice}.yaml"
        if path.exists():
            reference = _merge(reference, _load_conf(path, group))
    for path in (CONF_DIR / "dataset").glob("*.yaml"):  # recipes set data / model / trainer
        reference = _merge(reference, _load_conf(path, "dataset"))
    return reference


def _load_conf(path: Path, group: str | None) -> dict:
    text = path.read_text()
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    merged: dict = {}
    for entry in data.pop("defaults", []):
        if isinstance(entry, str) and entry != "_self_" and group is not None:
            merged = _merge(merged, _load_conf(path.parent / f"{entry}.yaml", group))
    if group is not None and "@package _global_" not in text:
        data = {group: data}
    return _merge(merged, data)


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _check_known_keys(node, reference, prefix: str = "") -> None:
    """Every key of ``node`` exists in ``reference`` and has its default's type."""
    for key in node:
        path = f"{prefix}{key}"
        if path in _OPEN_KEYS:
            continue
        _require(
            key in reference,
            f"{path} is not a known setting; valid keys"
            f"{' under ' + prefix[:-1] if prefix else ''}: {sorted(reference)}",
        )
        if isinstance(node[key], DictConfig) and isinstance(reference[key], dict):
            _check_known_keys(node[key], reference[key], f"{path}.")
        else:
            check_type_like_default(path, node[key], reference[key])


def check_type_like_default(key: str, value, default) -> None:
    """A setting whose default is a bool / int / float takes a value of that kind (an int
    where a float is expected is fine); ``None`` and string defaults are checked elsewhere."""
    if isinstance(default, bool):
        _require(isinstance(value, bool), f"{key}={value!r} must be true or false")
    elif isinstance(default, int):
        _require(
            isinstance(value, int) and not isinstance(value, bool),
            f"{key}={value!r} must be an integer",
        )
    elif isinstance(default, float):
        _require(
            isinstance(value, (int, float)) and not isinstance(value, bool),
            f"{key}={value!r} must be a number",
        )


def check_target(node: DictConfig, key: str) -> None:
    """``node`` builds an object with ``hydra.utils.instantiate``: its ``_target_`` imports and
    its other keys are arguments that class accepts."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    _require(
        isinstance(target, str),
        f"{key} needs a _target_ naming the class to build (e.g. "
        f"lightning.pytorch.callbacks.EarlyStopping), got {node!r}",
    )
    try:
        cls = get_class(target)
    except Exception as err:  # hydra wraps import errors in several types
        raise ConfigError(f"{key}._target_={target!r} cannot be imported: {err}") from None
    params = inspect.signature(cls).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(k for k in node if not str(k).startswith("_") and k not in params)
        _require(
            not unknown,
            f"{key}: {target} takes no argument {unknown}; valid: {sorted(params)}",
        )


def validate(cfg: DictConfig) -> None:
    """Check every key a run depends on; raise :class:`ConfigError` on the first problem."""
    from .systems import STRATEGIES  # late: systems import this module's ConfigError

    name = cfg.strategy.name
    _require(name in STRATEGIES, f"strategy={name!r} is unknown; valid: {sorted(STRATEGIES)}")
    model = cfg.model
    kinds = (*MODEL_KINDS, "custom")
    _require(model.name in kinds, f"model={model.name!r} is unknown; valid: {list(kinds)}")
    _check_known_keys(cfg, _reference_keys(cfg))
    if cfg.logger is not None:
        check_target(cfg.logger, "logger")
    for callback, node in (cfg.callbacks or {}).items():
        check_target(node, f"callbacks.{callback}")
    _int(cfg, "seed")
    _int(cfg, "model.num_layers", 1)
    _int(cfg, "model.hidden", 1)
    _require(
        0.0 <= (_number(cfg, "model.dropout") if "dropout" in model else 0.0) < 1.0,
        "model.dropout must be in [0, 1)",
    )
    _require(_number(cfg, "model.lr") > 0, f"model.lr={model.lr} must be > 0")
    _require(
        _number(cfg, "model.weight_decay") >= 0,
        f"model.weight_decay={model.weight_decay} must be >= 0",
    )
    _require(
        model.optimizer in OPTIMIZERS,
        f"model.optimizer={model.optimizer!r} is unknown; valid: {list(OPTIMIZERS)}",
    )
    if model.name == "gat":
        _int(cfg, "model.heads", 1)
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
        all(isinstance(f, int) and (f > 0 or f == -1) for f in fanouts),
        f"data.fanouts={fanouts}: each fanout must be > 0 or -1 (integers; -1 = full neighbourhood)",
    )
    bs = cfg.data.batch_size
    _require(
        isinstance(bs, int) and (bs > 0 or bs == -1),
        f"data.batch_size={bs} must be > 0 or -1 (an integer; -1 = all train nodes)",
    )
    _int(cfg, "data.num_workers", 0)
    _int(cfg, "data.eval_chunk_size", 1)

    tr = cfg.trainer
    _int(cfg, "trainer.devices", 1)
    _int(cfg, "trainer.num_nodes", 1)
    _int(cfg, "trainer.max_epochs", 1)
    _int(cfg, "trainer.check_val_every_n_epoch", 1)
    _int(cfg, "trainer.log_every_n_steps", 1)
    limit = tr.limit_train_batches
    if limit is not None:
        _require(
            (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1)
            or (isinstance(limit, float) and 0.0 < limit <= 1.0),
            f"trainer.limit_train_batches={limit} must be null, an integer >= 1 (batches) or "
            f"a fraction in (0, 1]",
        )
    _require(
        tr.accelerator in ACCELERATORS,
        f"trainer.accelerator={tr.accelerator!r} is unknown; valid: {list(ACCELERATORS)}",
    )
    if tr.accelerator in ("gpu", "cuda"):
        _require(
            torch.cuda.is_available(),
            f"trainer.accelerator={tr.accelerator} but torch {torch.__version__} sees no CUDA "
            f"GPU here; use trainer.accelerator=cpu (or install a CUDA build of torch)",
        )
    _require(cfg.dtype in DTYPES, f"dtype={cfg.dtype!r} is unknown; valid: {list(DTYPES)}")
    _positive_or_null(cfg, "launcher.timeout_s")
    _require(
        _number(cfg, "launcher.collective_timeout_s") > 0,
        f"launcher.collective_timeout_s={cfg.launcher.collective_timeout_s} must be > 0",
    )
    try:
        NetworkModel.from_name(cfg.network)
    except ValueError as err:
        raise ConfigError(f"network={cfg.network!r}: {err}") from None

    world = int(tr.devices) * int(tr.num_nodes)
    servers = cfg.topology.servers
    if servers is not None:
        _int(cfg, "topology.servers", 1)
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
        _require(
            cfg.weights_from is None,
            "set ckpt_path (resume a run) or weights_from (start from its weights), not both",
        )
        check_resume(cfg)
    if cfg.weights_from is not None:
        read_checkpoint(cfg.weights_from)
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
