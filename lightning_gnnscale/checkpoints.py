"""What a checkpoint says about the run that wrote it, checked before a resume starts.

Every checkpoint carries a ``lightning_gnnscale`` block: the run's identity (strategy, model,
dataset, dtype, world size) and how many epochs it had completed. ``ckpt_path`` resumes only a
run with the same identity that has epochs left to train; ``weights_from`` takes the weights
alone (any identity with the same parameter shapes) and trains from epoch 0.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import tempfile
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from .config_types import RunConfig
from .errors import ConfigError
from .files import UnsafeFileError, atomic_write, file_digest, load_weights_only, stream_digest
from .tasks import DEFAULT_TASK

# settings added after checkpoints were first written, at the value every earlier run had: a
# checkpoint without them is of the run that has them so (node classification, the task's init)
SETTINGS_ADDED_SINCE = {
    "task.name": DEFAULT_TASK,
    "task.val_fraction": 0.05,
    "task.test_fraction": 0.1,
    "task.undirected": None,
    "task.negatives": "uniform",
    "task.num_negatives": 1,
    "task.filter_negatives": False,
    "task.eval_negatives": 100,
    "task.embedding_dim": 64,
    "model.init": None,
    "data.featureless": "learned",
    "data.embedding_optimizer": "adagrad",
    "data.embedding_lr": 0.05,
}

CHECKPOINT_KEY = "lightning_gnnscale"
# A DataModule state entry that each rank checkpoints in a file of its own (learnable input
# rows and their optimiser state), and the main checkpoint's manifest of those files.
RANK_SHARD = "rank_shard"
SHARDS_KEY = "lightning_gnnscale_rank_shards"
_SHARD_TOKEN = re.compile(r"step\d+-epoch\d+")


class LastCheckpoint(ModelCheckpoint):
    """``last.ckpt``: the last completed epoch, written at every epoch end (the monitored
    ``save_last`` of Lightning would follow the best one).

    A resumed checkpoint's state of this callback is nothing but paths, which are data from
    outside (Lightning would delete the file it names as the previous one if it lies in this
    run's folder): none of it is used.
    """

    def __init__(self, dirpath: str | Path):
        super().__init__(
            dirpath=dirpath,
            filename="last",
            save_top_k=1,
            save_on_train_epoch_end=True,
            enable_version_counter=False,
        )

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        """Nothing is restored: this callback's state holds only paths."""


class BestCheckpoint(ModelCheckpoint):
    """``best.ckpt`` (the monitored best) that survives a resume into a new folder.

    Lightning forgets the best score when the checkpoint folder changes (every run gets its own
    folder), so a resumed run's ``best.ckpt`` would cover only the resumed epochs. This one
    keeps the score and the earlier best file. Paths in the resumed checkpoint (``dirpath``,
    ``best_model_path``...) are data from outside and never used: the earlier best is the file
    of this callback's name beside the given ``ckpt_path``, taken only when it loads
    weights-only, carries the resumed checkpoint's run identity and no more completed epochs.
    Otherwise the run says why and its best covers the resumed epochs only. Global rank 0
    checks and copies it (atomically) into this run's folder; its decision reaches every rank.
    """

    _resumed: tuple[str | None, dict | None] | None = None  # (ckpt_path, its identity block)
    _resumed_score: torch.Tensor | None = None

    @override
    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if trainer.state.fn != TrainerFn.FITTING:  # test/validate/predict: nothing to carry
            return
        block = checkpoint.get(CHECKPOINT_KEY)
        path = trainer.ckpt_path
        self._resumed = (None if path is None else str(path), block)

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        score = state_dict.get("best_model_score")
        valid = isinstance(score, torch.Tensor) and score.numel() == 1 and score.is_floating_point()
        self._resumed_score = score.detach().cpu().reshape(()) if valid else None

    @override
    def on_fit_start(self, trainer, pl_module) -> None:
        if self._resumed is None:
            return
        (ckpt_path, block), score = self._resumed, self._resumed_score
        self._resumed = self._resumed_score = None
        target = Path(self.format_checkpoint_name({}))
        earlier = None
        if trainer.is_global_zero and score is not None:
            earlier = self._earlier_best(ckpt_path, block, target.name)
        if not trainer.strategy.broadcast(earlier is not None):
            return
        if trainer.is_global_zero:
            source, data, shards = earlier
            if source.resolve() != target.resolve():
                copy_rank_shards(source, target, shards)  # before the file that names them
                atomic_write(target, lambda file: file.write(data))
        best = str(target)
        self.best_model_path = self.kth_best_model_path = best
        self.best_model_score = self.kth_value = score
        self.best_k_models = {best: score}

    @staticmethod
    def _earlier_best(
        ckpt_path: str | None, block: dict | None, name: str
    ) -> tuple[Path, bytes, Any] | None:
        """The bytes of ``name`` beside ``ckpt_path`` and its per-rank shards' manifest when it
        is the same run's earlier best; otherwise ``None``, with a warning that says why."""
        local = _local_path(ckpt_path) if ckpt_path is not None else None
        if local is None:
            return _no_best(f"ckpt_path={ckpt_path} is not a local file")
        source = local.parent / name
        if not isinstance(block, dict) or "identity" not in block:
            return _no_best(f"ckpt_path={ckpt_path} carries no run identity to check {source} by")
        if not source.is_file():
            return _no_best(f"{source} (beside ckpt_path) does not exist")
        data = source.read_bytes()
        try:
            theirs = load_weights_only(io.BytesIO(data), name=source, map_location="cpu")
        except Exception as err:  # noqa: BLE001 - torch raises several types for damaged files
            return _no_best(f"{source} cannot be read ({type(err).__name__}: {err})")
        shards = theirs.get(SHARDS_KEY) if isinstance(theirs, dict) else None
        theirs = theirs.get(CHECKPOINT_KEY) if isinstance(theirs, dict) else None
        if not isinstance(theirs, dict) or theirs.get("identity") != block["identity"]:
            return _no_best(f"{source} was written by a different run than ckpt_path={ckpt_path}")
        best_done, resumed_done = theirs.get("epochs_done"), block.get("epochs_done")
        if not (isinstance(best_done, int) and isinstance(resumed_done, int)):
            return _no_best(f"{source} or ckpt_path={ckpt_path} states no completed epochs")
        if best_done > resumed_done:
            return _no_best(
                f"{source} has trained {best_done} epochs, more than ckpt_path={ckpt_path} "
                f"({resumed_done}): it is not that run's best"
            )
        if shards is not None and not shards_intact(source, shards):
            return _no_best(f"the per-rank shards of {source} are missing or damaged")
        return source, data, shards


def _no_best(reason: str) -> None:
    warnings.warn(
        f"the earlier best checkpoint is not carried into this run: {reason}; this run's "
        f"best.ckpt covers the resumed epochs only",
        stacklevel=2,
    )


def _local_path(path: str | os.PathLike) -> Path | None:
    """``path`` as a local file path (a plain path or a ``file://`` URL); ``None`` for a
    remote one (``http(s)://``, ``s3://``...)."""
    fs, inner = url_to_fs(str(path))
    return Path(inner) if isinstance(fs, LocalFileSystem) else None


# Modules whose functions run code or commands: a checkpoint that names one of them is refused
# without advice to allow it.
_RUNS_CODE = frozenset(
    ("builtins", "os", "posix", "nt", "subprocess", "sys", "shutil", "importlib", "runpy",
     "pickle", "marshal", "ctypes", "code", "codeop", "pty", "socket", "webbrowser")
)  # fmt: skip


def _may_be_allowed(needs: str | None) -> bool:
    """Whether the refusal may advise ``add_safe_globals`` for the global ``needs``: a name in
    a module (torch names builtins such as ``exec`` without one) outside :data:`_RUNS_CODE`."""
    module = (needs or "").rpartition(".")[0]
    return bool(module) and module.partition(".")[0] not in _RUNS_CODE


# A checkpoint fetched over http(s): each socket operation waits at most URL_TIMEOUT_S, the whole
# fetch at most URL_DEADLINE_S, and it may not leave less than URL_KEEP_FREE_BYTES free beside it.
URL_TIMEOUT_S = 60.0
URL_DEADLINE_S = 1800.0
URL_KEEP_FREE_BYTES = 1 << 30


def fetch_url(url: str, dest: Path, timeout_s: float = URL_TIMEOUT_S) -> None:
    """Downloads ``url`` to ``dest``, bounded in time (``timeout_s`` per socket operation,
    :data:`URL_DEADLINE_S` in all) and in size (the free space beside ``dest``, less
    :data:`URL_KEEP_FREE_BYTES`); raises an ``OSError`` naming the URL otherwise."""
    room = shutil.disk_usage(dest.parent).free - URL_KEEP_FREE_BYTES
    deadline = time.monotonic() + URL_DEADLINE_S
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer, open(dest, "wb") as out:
            announced = answer.headers.get("Content-Length")
            if announced is not None and announced.isdigit() and int(announced) > room:
                raise OSError(f"it announces {int(announced)} bytes, {room} fit beside {dest}")
            received = 0
            while chunk := answer.read(1 << 20):
                received += len(chunk)
                if received > room:
                    raise OSError(f"it sent more than the {room} bytes that fit beside {dest}")
                if time.monotonic() > deadline:
                    raise OSError(f"it took more than {URL_DEADLINE_S:.0f} s")
                out.write(chunk)
    except OSError as err:  # URLError, socket time-outs and the bounds above
        raise OSError(f"fetching checkpoint {url} failed: {err}") from err


def _keep_storage(storage, location):
    """``map_location`` that leaves every tensor where it was loaded (Lightning's default)."""
    return storage


class SuiteCheckpointIO(CheckpointIO):
    """The checkpoint I/O of every suite strategy (``SystemStrategy.checkpoint_io``).

    - ``save_checkpoint`` on a local path (a plain path or ``file://``) is atomic: a temporary
      file beside it, fsynced, renamed over it, the folder fsynced. A full disk or a crash
      leaves the previous checkpoint whole; a failed save raises an ``OSError`` that names the
      file. Other fsspec paths (``s3://``...) go through Lightning's ``TorchCheckpointIO``
      (object stores replace an object whole).
    - ``load_checkpoint`` is weights-only for every path, local, fsspec or ``http(s)://``
      (which Lightning alone would unpickle in full): tensors and plain data, nothing that runs
      code. A URL is fetched bounded in time and size (:func:`fetch_url`). A checkpoint that needs another class is refused, naming it and how to allow it
      (``torch.serialization.add_safe_globals``); ``weights_only=False`` is refused.
    """

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None
    ) -> None:
        local = _local_path(path)
        if local is None:
            TorchCheckpointIO().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__} takes no storage_options for a local path, got "
                f"{storage_options!r}"
            )
        # Serialised in memory first (as Lightning does): torch's writer turns a failed write
        # into a RuntimeError ("unexpected pos"), a plain file write keeps the OSError (ENOSPC).
        data = io.BytesIO()
        torch.save(checkpoint, data)
        try:
            atomic_write(local, lambda file: file.write(data.getbuffer()))
        except OSError as err:
            raise OSError(
                err.errno,
                f"saving checkpoint {local} failed ({err.strerror or err}); the previous "
                f"{local.name} there, if any, is unchanged",
            ) from err

    @override
    def load_checkpoint(
        self,
        path: str | os.PathLike,
        map_location: Any = _keep_storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        if weights_only is False:
            raise ValueError(
                f"weights_only=False: {type(self).__name__} loads every checkpoint weights-only "
                f"(a checkpoint from anyone runs no code); to load a class of yours, allow it "
                f"with torch.serialization.add_safe_globals([YourClass])"
            )
        name = f"checkpoint {path}"
        try:
            if str(path).startswith(("http://", "https://")):
                with tempfile.TemporaryDirectory(prefix="gnnscale-ckpt-") as folder:
                    fetched = Path(folder, "checkpoint")
                    fetch_url(str(path), fetched)
                    return load_weights_only(fetched, name=name, map_location=map_location)
            fs, inner = url_to_fs(str(path))
            if not fs.exists(inner):
                raise FileNotFoundError(f"Checkpoint file not found: {path}")
            with fs.open(inner, "rb") as file:
                return load_weights_only(file, name=name, map_location=map_location)
        except UnsafeFileError as err:
            if not _may_be_allowed(err.needs):
                raise
            raise UnsafeFileError(
                f"{err}. If you trust the file and {err.needs} is a class of yours, allow it "
                f"before loading: torch.serialization.add_safe_globals([{err.needs}])",
                needs=err.needs,
            ) from None

    @override
    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        fs, inner = url_to_fs(str(path))
        if fs.exists(inner):
            fs.rm(inner, recursive=True)


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


def identity_differences(ours: dict, theirs: dict) -> list[str]:
    """One line per setting where a checkpoint's run identity ``theirs`` differs from the
    run identity ``ours`` (empty: the same run)."""
    theirs = {**SETTINGS_ADDED_SINCE, **theirs}
    return [
        f"{key}: checkpoint {theirs.get(key)!r}, this run {ours.get(key)!r}"
        for key in sorted(set(ours) | set(theirs))
        if theirs.get(key) != ours.get(key)
    ]


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
    differences = identity_differences(cfg.identity, block["identity"])
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
    """Initialise ``module`` from the ``state_dict`` of the checkpoint at ``path``. Learned
    input rows (per-rank shards) are not weights of the module: a warning says they start
    afresh (``ckpt_path`` resumes them)."""
    checkpoint = read_checkpoint(path)
    state = checkpoint["state_dict"]
    if SHARDS_KEY in checkpoint:
        warnings.warn(
            f"weights_from={path}: the checkpoint's learned input rows (per-rank shards) are not "
            "carried by weights_from, which takes the module's weights alone; they start from "
            "their initial rows (ckpt_path resumes them)",
            stacklevel=2,
        )
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ConfigError(f"weights_from={path} does not fit this model: {err}") from None


# ------------------------------------------------------------------ per-rank checkpoint shards
def shard_file(checkpoint_path: str | os.PathLike, token: str, rank: int, world_size: int) -> Path:
    """Where rank ``rank`` of ``world_size`` keeps its shard of the checkpoint at
    ``checkpoint_path``, written at ``token`` (``step<s>-epoch<e>``): a folder beside it."""
    path = _local_path(checkpoint_path)
    if path is None:
        raise ConfigError(
            f"checkpoint {checkpoint_path}: per-rank shards (learnable input rows) are written "
            "to local paths only; use a local checkpoint folder"
        )
    return path.parent / f"{path.name}.shards" / token / f"rank{rank}-of-{world_size}.pt"


def shard_token(checkpoint: dict) -> str:
    """The token of a checkpoint's shards: its global step and epoch."""
    return f"step{int(checkpoint.get('global_step', 0))}-epoch{int(checkpoint.get('epoch', 0))}"


def pop_rank_shards(checkpoint: dict) -> dict:
    """``{state key: shard}``: the ``RANK_SHARD`` entries of the checkpoint's DataModule
    states, removed from the checkpoint (they go to this rank's own file)."""
    return {
        key: value.pop(RANK_SHARD)
        for key, value in checkpoint.items()
        if isinstance(value, dict) and RANK_SHARD in value
    }


def write_rank_shard(path: Path, shards: dict) -> str:
    """Write ``shards`` to ``path`` atomically; return the file's digest (hex)."""
    data = io.BytesIO()
    torch.save(shards, data)
    try:
        atomic_write(path, lambda file: file.write(data.getbuffer()))
    except OSError as err:
        raise OSError(
            err.errno,
            f"saving checkpoint shard {path} failed ({err.strerror or err}); the checkpoint it "
            "belongs to is not written, the previous one is unchanged",
        ) from err
    return stream_digest(io.BytesIO(data.getbuffer()))


def _check_manifest(checkpoint_path: Any, manifest: Any) -> None:
    """A shard manifest (outside input) names a token of the form this suite writes, a world
    size, and one digest per rank; else ``ValueError``."""
    ok = (
        isinstance(manifest, dict)
        and isinstance(manifest.get("token"), str)
        and _SHARD_TOKEN.fullmatch(manifest["token"]) is not None
        and type(manifest.get("world_size")) is int
        and manifest["world_size"] >= 1
        and isinstance(manifest.get("digests"), list)
        and len(manifest["digests"]) == manifest["world_size"]
        and all(isinstance(d, str) for d in manifest["digests"])
    )
    if not ok:
        raise ValueError(f"checkpoint {checkpoint_path}: its shard manifest is damaged")


def read_rank_shard(checkpoint_path: str | os.PathLike, manifest: Any, rank: int, world: int):
    """This rank's shard of the checkpoint whose manifest is ``manifest`` (outside input: its
    form, the world size, and the file's digest are checked), loaded weights-only."""
    _check_manifest(checkpoint_path, manifest)
    if manifest["world_size"] != world:
        raise ConfigError(
            f"checkpoint {checkpoint_path} keeps per-rank shards of {manifest['world_size']} "
            f"ranks (learnable input rows), but this run has {world}: resume with "
            f"{manifest['world_size']} ranks"
        )
    path = shard_file(checkpoint_path, manifest["token"], rank, world)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint_path}: its shard {path} is missing")
    data = path.read_bytes()
    if stream_digest(io.BytesIO(data)) != manifest["digests"][rank]:
        raise ValueError(
            f"checkpoint shard {path} does not match its checkpoint {checkpoint_path} (another "
            "save's, or damaged)"
        )
    return load_weights_only(io.BytesIO(data), name=str(path), map_location="cpu")


def remove_rank_shards(
    checkpoint_path: str | os.PathLike, rank: int, keep: str | None = None
) -> None:
    """Remove rank ``rank``'s shards of ``checkpoint_path`` but those of token ``keep``, and
    the folders that are left empty."""
    path = _local_path(checkpoint_path)
    folder = None if path is None else path.parent / f"{path.name}.shards"
    if folder is None or not folder.is_dir():
        return
    for token in folder.iterdir():
        if token.name == keep or not token.is_dir():
            continue
        for file in token.glob(f"rank{rank}-of-*.pt"):
            file.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            token.rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()


def copy_rank_shards(source: Path, target: Path, manifest: Any) -> None:
    """Copy the shards of checkpoint ``source`` (per ``manifest``, checked) beside ``target``."""
    if manifest is None:
        return
    _check_manifest(source, manifest)
    world = manifest["world_size"]
    for rank in range(world):
        src = shard_file(source, manifest["token"], rank, world)
        data = src.read_bytes()
        atomic_write(shard_file(target, manifest["token"], rank, world), data_writer(data))


def data_writer(data: bytes):
    """``write(file)`` for :func:`~.files.atomic_write` of ``data``."""
    return lambda file: file.write(data)


def shards_intact(checkpoint_path: Path, manifest: Any) -> bool:
    """Whether every shard ``manifest`` names is beside ``checkpoint_path`` with its digest."""
    try:
        _check_manifest(checkpoint_path, manifest)
        world = manifest["world_size"]
        return all(
            file_digest(shard_file(checkpoint_path, manifest["token"], rank, world))
            == manifest["digests"][rank]
            for rank in range(world)
        )
    except (OSError, KeyError, TypeError, IndexError, ValueError):
        return False


def checkpoint_shards(checkpoint_path: str | os.PathLike) -> list[dict]:
    """Every rank's shard of the checkpoint at ``checkpoint_path`` (``[]`` when it has none),
    in rank order, each checked against the checkpoint's digests: ``{state key: shard}``."""
    checkpoint = load_weights_only(checkpoint_path, name=str(checkpoint_path), map_location="cpu")
    manifest = checkpoint.get(SHARDS_KEY) if isinstance(checkpoint, dict) else None
    if manifest is None:
        return []
    _check_manifest(checkpoint_path, manifest)
    world = manifest["world_size"]
    return [read_rank_shard(checkpoint_path, manifest, rank, world) for rank in range(world)]
