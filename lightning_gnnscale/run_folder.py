"""The run folder: claimed for one run before anything is written into it.

Light on purpose (no torch, Lightning or system): Hydra instantiates :class:`ClaimRunFolder`
before ``train.py``'s job starts, and ``train.py`` starts the warm rank server first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .bounds import externally_launched
from .errors import ConfigError


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
            _release(lock)


def check_writable(
    folder: Path,
    what: str | None = None,
    hint: str = "; give the run a writable folder (hydra.run.dir=... or paths.output_dir=...)",
) -> None:
    """Create ``folder`` and write a file in it, or raise a :class:`ConfigError` naming it
    (``what``; default ``run folder <folder>``) and saying what to do (``hint``)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ConfigError(
            f"{what or f'run folder {folder}'} cannot be written ({type(err).__name__}: "
            f"{err.strerror or err}){hint}"
        ) from None


def _lock_name() -> str:
    return f".run.lock.node{os.environ.get('NODE_RANK', '0')}"


def _lock(output_dir: Path) -> IO[str] | None:
    """The open, locked lock file of ``output_dir`` (``None`` where the file system cannot
    lock); :class:`ConfigError` when another live run holds it. The file is removed when the
    run ends (:func:`_release`), so a lock taken on a file that was removed meanwhile is
    retried on a fresh file."""
    while True:
        lock = _try_lock(output_dir / _lock_name())
        if lock is None or _still_linked(lock):
            return lock
        lock.close()  # a run that just ended removed it after we opened it: lock a new one


def _still_linked(lock: IO[str]) -> bool:
    """Whether ``lock``'s path still names the open file."""
    try:
        on_disk = os.stat(lock.name)
    except FileNotFoundError:
        return False
    held = os.fstat(lock.fileno())
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def _release(lock: IO[str]) -> None:
    """Remove the lock file, then unlock and close it (removed while held: a run that opened
    it meanwhile finds it held, or unlinked, and takes a fresh one)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock.name)
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()


def _try_lock(lock_path: Path) -> IO[str] | None:
    # absolute: released by name, whatever the working directory is by then
    lock = open(os.path.abspath(lock_path), "a+")  # noqa: SIM115 - closed by _release
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP):  # e.g. NFS without a lock daemon
            lock.close()
            warnings.warn(f"cannot lock {lock_path} ({err}); not guarding the folder", stacklevel=5)
            return None
        lock.seek(0)
        holder = lock.read().strip()
        lock.close()
        if not isinstance(err, BlockingIOError):
            raise
        raise ConfigError(
            f"output folder {lock_path.parent} is in use by another run{f' ({holder})' if holder else ''}; "
            f"give this run its own folder (hydra.run.dir=... or paths.output_dir=...)"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}")
    lock.flush()
    return lock


FAILED_FILE = "FAILED"
# What Hydra writes into a job's folder before the job runs (besides the job's log file).
HYDRA_RECORD = {".hydra": {"config.yaml", "hydra.yaml", "overrides.yaml"}}


def settle_failed_run(folder: Path, error: BaseException, log_name: str | None) -> bool:
    """After a failed run, leave no folder that looks like a run's: remove ``folder`` when it
    holds nothing but Hydra's record of the run (:data:`HYDRA_RECORD`), this node's lock file
    and the job's log file ``log_name`` with nothing in it but the error (:func:`_log_is_empty`:
    a log that says what the run did is kept); otherwise write :data:`FAILED_FILE` into it (what
    failed), once. Returns whether this call removed the folder. Only the files named here are
    deleted, and the folder only once empty, so anything else written meanwhile stays; a folder
    another live run holds is left alone."""
    folder = Path(folder)
    if not folder.is_dir():
        return False
    if folder.resolve() in _CLAIMED_FOR_HYDRA:  # this process's run holds it
        return _settle(folder, error, log_name)
    try:
        lock = _lock(folder)
    except ConfigError:  # another live run holds it: its folder, left alone
        return False
    try:
        return _settle(folder, error, log_name)
    finally:
        if lock is not None:
            _release(lock)


def _settle(folder: Path, error: BaseException, log_name: str | None) -> bool:
    if _only_the_record(folder, log_name, error):
        with contextlib.suppress(OSError):  # something appeared meanwhile: it is kept, marked
            for sub, names in HYDRA_RECORD.items():
                for name in names:
                    (folder / sub / name).unlink(missing_ok=True)
                if (folder / sub).is_dir():
                    (folder / sub).rmdir()
            for name in (log_name, _lock_name()):
                if name:
                    (folder / name).unlink(missing_ok=True)
            folder.rmdir()
            return True
    marker = folder / FAILED_FILE
    if not marker.exists():
        with contextlib.suppress(OSError):  # a full disk: the printed error still says it
            marker.write_text(f"{type(error).__name__}: {error}\n")
    return False


def _only_the_record(folder: Path, log_name: str | None, error: BaseException) -> bool:
    for entry in folder.iterdir():
        if entry.name in HYDRA_RECORD and entry.is_dir() and not entry.is_symlink():
            if not {e.name for e in entry.iterdir()} <= HYDRA_RECORD[entry.name]:
                return False
        elif entry.name == log_name and entry.is_file() and not entry.is_symlink():
            if not _log_is_empty(entry, error):
                return False
        elif entry.name != _lock_name() or not entry.is_file():
            return False
    return True


# A log longer than this says more than one error.
_ERROR_LOG_BYTES = 64 * 1024


def _log_is_empty(log: Path, error: BaseException) -> bool:
    """Whether the job's ``log`` records nothing of the run: every non-blank line of it holds a
    line of ``error``'s message (the error logged, with or without a logging prefix). A
    partitioning line, an epoch line or Lightning's start-up lines make it a record to keep."""
    try:
        if log.stat().st_size > _ERROR_LOG_BYTES:
            return False
        lines = log.read_text(errors="replace").splitlines()
    except OSError:  # unreadable: kept, marked
        return False
    message = {line.strip() for line in str(error).splitlines()} - {""}
    return all(any(m in line for m in message) for line in lines if line.strip())


def job_log_name() -> str | None:
    """The file name of Hydra's log of this job (``train.log``), when Hydra runs it."""
    if not HydraConfig.initialized():
        return None
    return f"{HydraConfig.get().job.name}.log"


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

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        """A failed job's folder is removed when it holds nothing, else marked failed
        (:func:`settle_failed_run`); a completed one loses a stale mark."""
        folder = Path(HydraConfig.get().runtime.output_dir)
        if job_return.status == JobStatus.FAILED:
            try:  # the getter raises the job's error, after a line Hydra prints again itself
                with contextlib.redirect_stderr(io.StringIO()):
                    job_return.return_value  # noqa: B018
            except Exception as error:  # noqa: BLE001 - recorded here; Hydra reports it
                settle_failed_run(folder, error, job_log_name())
        elif job_return.status == JobStatus.COMPLETED:
            (folder / FAILED_FILE).unlink(missing_ok=True)

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
            _release(lock)
