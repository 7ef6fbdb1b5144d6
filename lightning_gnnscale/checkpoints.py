"""What a checkpoint says about the run that wrote it, checked before a resume starts.

Every checkpoint carries a ``lightning_gnnscale`` block: the run's identity (strategy, model,
dataset, dtype, world size) and how many epochs it had completed. ``ckpt_path`` resumes only a
run with the same identity that has epochs left to train; ``weights_from`` takes the weights
alone (any identity with the same parameter shapes) and trains from epoch 0.
"""

from __future__ import annotations

from dataclasses import is_dataclass
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf
from typing_extensions import override

from .errors import ConfigError
from .files import UnsafeFileError, atomic_write, load_weights_only
from .schema import RunConfig, as_dict

CHECKPOINT_KEY = "lightning_gnnscale"
# Settings a resumed run may change: where files live, how the job is launched and watched,
# how long it trains. Everything else decides what is trained and must match.
_MAY_CHANGE = (
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


def _flatten(node, prefix: str = "") -> dict:
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    out = {}
    for key, value in node.items():
        out.update(_flatten(value, f"{prefix}{key}."))
    return out


def run_identity(cfg: RunConfig | DictConfig) -> dict:
    """The settings (dotted key -> value) a resumed run must share with the run that wrote the
    checkpoint: every setting but those in :data:`_MAY_CHANGE`."""
    data = as_dict(cfg) if is_dataclass(cfg) else OmegaConf.to_container(cfg, resolve=True)
    flat = _flatten(data)
    return {
        key: value
        for key, value in flat.items()
        if not any(key == skip or key.startswith(f"{skip}.") for skip in _MAY_CHANGE)
    }


class BestCheckpoint(ModelCheckpoint):
    """``best.ckpt`` (the monitored best) that survives a resume into a new folder.

    Lightning forgets the best score when the checkpoint folder changes (every run gets its own
    folder), so a resumed run's ``best.ckpt`` would cover only the resumed epochs. This one
    keeps the score and copies the earlier best file into the new folder (global rank 0).
    """

    _carry_from: str | None = None

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        old_dir = state_dict.get("dirpath")
        if old_dir and self.dirpath and Path(old_dir) != Path(self.dirpath):
            old_best = state_dict.get("best_model_path") or ""
            self._carry_from = old_best if Path(old_best).is_file() else None
            moved = str(Path(self.dirpath) / Path(old_best).name) if old_best else ""
            state_dict = {
                **state_dict,
                "dirpath": self.dirpath,
                "best_model_path": moved,
                "kth_best_model_path": moved,
                "best_k_models": {moved: state_dict["best_model_score"]} if moved else {},
            }
        super().load_state_dict(state_dict)

    @override
    def on_fit_start(self, trainer, pl_module) -> None:
        if self._carry_from and trainer.is_global_zero:
            source = self._carry_from
            atomic_write(self.best_model_path, lambda f: f.write(Path(source).read_bytes()))
        self._carry_from = None


class CheckpointIdentity(L.Callback):
    """Writes the run's identity, its config hash and its completed epochs into every
    checkpoint it saves (a run resumed from it hashes them into its own config hash)."""

    def __init__(self, identity: dict, config_hash: str | None = None):
        self.identity = identity
        self.config_hash = config_hash

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "identity": self.identity,
            "config_hash": self.config_hash,
            "epochs_done": trainer.current_epoch + 1,
        }


def read_checkpoint(path: str | Path) -> dict:
    """``torch.load(weights_only=True)`` of a checkpoint file: tensors and plain data only, so
    a file from anyone runs no code. A missing, truncated, foreign or unsafe file is a
    :class:`ConfigError` that names it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path} does not exist")
    try:
        checkpoint = load_weights_only(
            path, name=f"checkpoint {path}", map_location="cpu", mmap=True
        )
    except UnsafeFileError as err:
        raise ConfigError(str(err)) from None
    except Exception as err:  # torch raises several types for damaged files
        raise ConfigError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); the file is "
            f"damaged or not a checkpoint"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ConfigError(f"checkpoint {path} is not a Lightning checkpoint (no state_dict)")
    return checkpoint


def check_resume(cfg: RunConfig) -> None:
    """Refuse ``ckpt_path`` from another run (strategy, model, dataset, dtype, world size) or
    from a run that already reached ``trainer.max_epochs``."""
    path = cfg.ckpt_path
    block = read_checkpoint(path).get(CHECKPOINT_KEY)
    if block is None:
        raise ConfigError(
            f"ckpt_path={path} carries no run identity (written by another program or an older "
            f"version); to start from its weights alone use weights_from={path}"
        )
    ours = run_identity(cfg)
    theirs = block["identity"]
    differences = [
        f"{key}: checkpoint {theirs.get(key)!r}, this run {ours.get(key)!r}"
        for key in sorted(set(ours) | set(theirs))
        if theirs.get(key) != ours.get(key)
    ]
    if differences:
        raise ConfigError(
            f"ckpt_path={path} was written by a different run; resuming it would label one run "
            f"as another. Differences: {'; '.join(differences)}. To start from its weights "
            f"alone, use weights_from={path} instead of ckpt_path"
        )
    done, wanted = int(block["epochs_done"]), int(cfg.trainer.max_epochs)
    if done >= wanted:
        raise ConfigError(
            f"ckpt_path={path} has already trained {done} epochs and trainer.max_epochs="
            f"{wanted}: nothing is left to run; raise trainer.max_epochs above {done}"
        )


def load_weights(module: torch.nn.Module, path: str | Path) -> None:
    """Initialise ``module`` from the ``state_dict`` of the checkpoint at ``path``."""
    state = read_checkpoint(path)["state_dict"]
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ConfigError(f"weights_from={path} does not fit this model: {err}") from None
