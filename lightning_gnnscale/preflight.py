"""A run's config: typed and validated in the launching process, before any rank starts.

Keys and types are checked by Hydra while it composes (the structured-config schemas of
:mod:`lightning_gnnscale.config_types`, registered when the package is imported); then, in two steps:

- :func:`check_config`, which imports no torch, Lightning or PyG (``train.py`` calls it first,
  so a bad value is reported in about a second): values and rules between sections (the
  dataclasses' ``__post_init__``, :func:`~.config_types.run_config`), the launcher's environment and
  the bounds on what the run starts here (:mod:`.bounds`);
- :func:`validate`: that (unless it is given the run config :func:`check_config` last
  returned, unchanged: ``train.py``'s order, whose warnings then print once), and what needs torch or files (a GPU, checkpoints, the classes named by
  ``_target_``).
"""

from __future__ import annotations

import inspect
import os

from hydra.utils import get_class
from omegaconf import DictConfig

from .bounds import check_run_bounds, externally_launched
from .config_types import RunConfig, require, run_config
from .errors import ConfigError


def check_target(node, key: str) -> None:
    """``node`` builds an object with ``hydra.utils.instantiate``: its ``_target_`` imports and
    its other keys are arguments that class accepts."""
    target = node.get("_target_") if isinstance(node, dict | DictConfig) else None
    require(
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
        require(
            not unknown,
            f"{key}: {target} takes no argument {unknown}; valid: {sorted(params)}",
        )


def check_config(cfg: DictConfig | RunConfig) -> RunConfig:
    """The typed run config of ``cfg``: every value and rule that needs no torch, Lightning
    or PyG (nor imports them), the launcher's environment included; raises
    :class:`ConfigError` on the first problem."""
    run = run_config(cfg)
    tr, world = run.trainer, run.world_size
    # processes, workers, threads and ports this machine can take (the ranks' count only where
    # this process starts them: torchrun and srun have started them already)
    check_run_bounds(run, spawns_ranks=not externally_launched())
    if "SLURM_NTASKS" in os.environ and not externally_launched() and world > 1:
        raise ConfigError(
            f"inside a SLURM job with one task, but {world} ranks are requested: "
            f"launch with srun --ntasks-per-node={tr.devices} (one task per rank)"
        )
    if tr.num_nodes > 1 and not externally_launched():
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK") if v not in os.environ]
        require(
            not missing,
            f"trainer.num_nodes={tr.num_nodes}: set {', '.join(missing)} on "
            f"every node (the same MASTER_ADDR/MASTER_PORT everywhere), or launch with "
            f"torchrun / srun",
        )
    return run


# The run config check_config last passed (weakly) and its settings then.
def validate(cfg: DictConfig | RunConfig, *, checked: bool = False) -> RunConfig:
    """:func:`check_config` (unless ``checked``: ``cfg`` is the run config it returned, so its
    warnings print once), then the checks that need torch or files: the classes named by
    ``_target_``, a GPU, checkpoints; raises :class:`ConfigError` on the first problem."""
    import torch  # here: check_config runs before torch is imported

    from .checkpoints import check_resume, read_checkpoint  # imports Lightning

    if checked and not isinstance(cfg, RunConfig):
        raise TypeError(f"checked=True takes the RunConfig check_config returned, got {cfg!r}")
    run = cfg if checked else check_config(cfg)
    if run.logger is not None:
        check_target(run.logger, "logger")
    for name, node in (run.callbacks or {}).items():
        check_target(node, f"callbacks.{name}")
    tr = run.trainer
    if tr.accelerator in ("gpu", "cuda"):
        require(
            torch.cuda.is_available(),
            f"trainer.accelerator={tr.accelerator} but torch {torch.__version__} sees no CUDA "
            f"GPU here; use trainer.accelerator=cpu (or install a CUDA build of torch)",
        )
    if run.ckpt_path is not None:
        check_resume(run)
    if run.weights_from is not None:
        read_checkpoint(run.weights_from)
    return run
