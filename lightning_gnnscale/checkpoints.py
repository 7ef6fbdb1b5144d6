"""What a checkpoint says about the run that wrote it, checked before a resume starts.

Every checkpoint carries a ``lightning_gnnscale`` block: the run's identity (strategy, model,
dataset, dtype, world size) and how many epochs it had completed. ``ckpt_path`` resumes only a
run with the same identity that has epochs left to train; ``weights_from`` takes the weights
alone (any identity with the same parameter shapes) and trains from epoch 0.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError

CHECKPOINT_KEY = "lightning_gnnscale"
# Settings that do not change what is trained (where files live, how the job is launched).
_NOT_IDENTITY = {
    "dataset": ("root", "cache_dir", "download"),
    "strategy": ("process_group_backend",),
}


def run_identity(cfg: DictConfig) -> dict:
    """The settings a resumed run must share with the run that wrote the checkpoint."""
    identity = {}
    for section in ("strategy", "model", "dataset"):
        values = OmegaConf.to_container(cfg[section], resolve=True)
        for key in _NOT_IDENTITY.get(section, ()):
            values.pop(key, None)
        identity[section] = values
    identity["dtype"] = cfg.dtype
    identity["world_size"] = int(cfg.trainer.devices) * int(cfg.trainer.num_nodes)
    return identity


class CheckpointIdentity(L.Callback):
    """Writes the run's identity and completed epochs into every checkpoint it saves."""

    def __init__(self, identity: dict):
        self.identity = identity

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "identity": self.identity,
            "epochs_done": trainer.current_epoch + 1,
        }


def read_checkpoint(path: str | Path) -> dict:
    """``torch.load`` of a checkpoint file; a missing, truncated or foreign file is a
    :class:`ConfigError` that names it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # torch raises several types for damaged files
        raise ConfigError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); the file is "
            f"damaged or not a checkpoint"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ConfigError(f"checkpoint {path} is not a Lightning checkpoint (no state_dict)")
    return checkpoint


def check_resume(cfg: DictConfig) -> None:
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
        f"{key}: checkpoint {theirs.get(key)!r}, this run {ours[key]!r}"
        for key in ours
        if theirs.get(key) != ours[key]
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
