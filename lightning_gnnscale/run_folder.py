"""The run folder: claimed for one run before anything is written into it.

Light on purpose (no torch, Lightning or system): Hydra instantiates :class:`ClaimRunFolder`
before ``train.py``'s job starts, and ``train.py`` starts the warm rank server first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError
from .launch import externally_launched


@contextlib.contextmanager
def claimed(output_dir: Path) -> Iterator[None]:
    """Hold ``output_dir`` for one run: a second run started on the same folder while this one
    is alive fails at once instead of overwriting its files. The nodes of one multi-node run
    may share the folder (a shared file system): each node holds its own lock. A folder that
    :class:`ClaimRunFolder` claimed for this process's run (before Hydra wrote into it) is
    already held."""
    if Path(output_dir).resolve() in _CLAIMED_FOR_HYDRA:
        yield
        return
    lock = _lock(Path(output_dir))
    try:
        yield
    finally:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()


def check_writable(folder: Path) -> None:
    """Create ``folder`` and write a file in it, or raise a :class:`ConfigError` naming it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ConfigError(
            f"run folder {folder} cannot be written ({type(err).__name__}: {err.strerror or err}); "
            f"give the run a writable folder (hydra.run.dir=... or paths.output_dir=...)"
        ) from None


def _lock(output_dir: Path) -> IO[str] | None:
    """The open, locked lock file of ``output_dir`` (``None`` where the file system cannot
    lock); :class:`ConfigError` when another live run holds it."""
    lock_path = output_dir / f".run.lock.node{os.environ.get('NODE_RANK', '0')}"
    lock = open(lock_path, "a+")  # noqa: SIM115 - held open for the run, closed by the caller
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP):  # e.g. NFS without a lock daemon
            lock.close()
            warnings.warn(f"cannot lock {lock_path} ({err}); not guarding the folder", stacklevel=4)
            return None
        lock.seek(0)
        holder = lock.read().strip()
        lock.close()
        if not isinstance(err, BlockingIOError):
            raise
        raise ConfigError(
            f"output folder {output_dir} is in use by another run{f' ({holder})' if holder else ''}; "
            f"give this run its own folder (hydra.run.dir=... or paths.output_dir=...)"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}")
    lock.flush()
    return lock


# Folders ClaimRunFolder locked for this process's Hydra run or sweep -> their open lock file.
_CLAIMED_FOR_HYDRA: dict[Path, IO[str]] = {}


class ClaimRunFolder(Callback):
    """Hydra callback (``hydra.callbacks.run_folder`` in conf/config.yaml): before Hydra
    configures its log file and writes ``.hydra/`` into the run folder (or, for ``-m``, the
    sweep folder), check that the folder is writable and claim it. A run refused for a busy
    folder then leaves that folder's record as it was, and an unwritable folder is named
    instead of failing in Hydra's logging set-up."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        self._claim(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self._claim(config, "hydra.sweep.dir")

    def on_run_end(self, config: DictConfig, **kwargs) -> None:
        self._release()

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self._release()

    def _claim(self, config: DictConfig, key: str) -> None:
        HydraConfig.instance().set_config(config)  # what Hydra does next, for ${hydra:...}
        folder = Path(str(OmegaConf.select(config, key))).resolve()
        try:
            check_writable(folder)
            # The ranks of one externally launched run share the folder (train() skips the lock).
            if not externally_launched():
                lock = _lock(folder)
                if lock is not None:
                    _CLAIMED_FOR_HYDRA[folder] = lock
        except ConfigError as err:  # Hydra turns a callback's exception into a warning
            print(f"Error: {err}", file=sys.stderr)
            raise SystemExit(1) from None

    def _release(self) -> None:
        while _CLAIMED_FOR_HYDRA:
            _, lock = _CLAIMED_FOR_HYDRA.popitem()
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
