"""Atomic file writes (a reader never sees half a file, a crash never leaves one behind) and
loads of files that may come from anyone (they run no code: weights only)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import stat
import tempfile
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, rename it over
    ``path``, then fsync the folder (so the rename itself survives a power cut).

    The rename is atomic, so two processes writing the same content at once both succeed (the
    last rename wins), and a crash or a full disk mid-write leaves the old file (or none), never
    a torn one: the old file is never opened for writing. The file gets the mode ``open()``
    would leave it with (:func:`replacement_mode`), not ``mkstemp``'s 0600.
    """
    with atomic_path(path) as tmp_name, open(tmp_name, "r+b") as file:
        write(file)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """The name of an empty temporary file beside ``path``, for a writer that takes a file
    name; when the block ends without an error the file (written and closed by then) is
    fsynced and renamed over ``path`` and the folder fsynced, as :func:`atomic_write` does;
    on an error it is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            os.fchmod(fd, replacement_mode(path))
        finally:
            os.close(fd)
        yield tmp_name
        with open(tmp_name, "rb") as file:  # fsync is the file's, whichever descriptor
            os.fsync(file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def fsync_folder(folder: str | os.PathLike) -> None:
    """Make a rename into ``folder`` durable (fsync of the folder itself)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replacement_mode(path: str | os.PathLike) -> int:
    """The permission bits a file written at ``path`` gets, as ``open(path, "w")`` would
    leave them: those of the file it replaces, else ``0o666`` less the process's umask (so
    the folders a team shares stay readable to it)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode) & 0o777
    except FileNotFoundError:
        return 0o666 & ~current_umask()


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it
    (``/proc/self/status``); elsewhere set and restored at once, under a lock."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """``data`` as indented, key-sorted JSON at ``path``, written atomically."""
    text = json.dumps(data, indent=2, sort_keys=True)
    atomic_write(path, lambda file: file.write(text.encode()))


def file_digest(path: str | os.PathLike) -> str:
    """blake2b (32 bytes) of a file's bytes, read in 4 MiB chunks."""
    with open(path, "rb") as file:
        return stream_digest(file)


def stream_digest(file: IO[bytes]) -> str:
    """blake2b (32 bytes) of the rest of an open file, read in 4 MiB chunks."""
    digest = hashlib.blake2b(digest_size=32)
    while chunk := file.read(1 << 22):
        digest.update(chunk)
    return digest.hexdigest()


# ------------------------------------------------------------------------ untrusted files
class UnsafeFileError(ValueError):
    """A file whose loading would need more than tensors, plain containers and the allow-listed
    types: its pickle names a class or function that could run code. Refused, naming the file,
    before any of it runs. ``needs``: the global it named (``"module.qualname"``), when known."""

    def __init__(self, message: str, needs: str | None = None):
        super().__init__(message)
        self.needs = needs


_WEIGHTS_ONLY_FAILED = "Weights only load failed"


def _refusal(err: BaseException) -> str | None:
    """What torch's weights-only unpickler refused (``None`` when ``err`` is another failure)."""
    text = str(err)
    if _WEIGHTS_ONLY_FAILED not in text:
        return None
    reason = text.partition("WeightsUnpickler error: ")[2] or text
    return reason.split(" Please use", 1)[0].splitlines()[0].strip().rstrip(".")


def load_weights_only(
    file: str | os.PathLike | IO[bytes],
    *,
    name: str | os.PathLike | None = None,
    allowed: Iterable[Any] = (),
    **kwargs: Any,
) -> Any:
    """``torch.load(file, weights_only=True)`` with the classes / functions of ``allowed`` added
    to torch's allow-list for this call. A file that needs anything else raises
    :class:`UnsafeFileError` naming it (``name``, else ``file``); nothing of it has run."""
    import torch  # torch is heavy; files.py is imported by light modules too

    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(file, weights_only=True, **kwargs)
    except pickle.UnpicklingError as err:
        raise _unsafe(name if name is not None else file, err) from None


def _unsafe(name: Any, err: BaseException) -> BaseException:
    reason = _refusal(err)
    if reason is None:
        return err
    needs = re.search(r"GLOBAL ([\w.]+)", reason)
    return UnsafeFileError(
        f"{name} was refused: loading it would need more than tensors and plain data "
        f"({reason}), which could run code hidden in the file; nothing of it ran. Use only files "
        f"this suite wrote, or rebuild the file",
        needs=needs.group(1) if needs else None,
    )


@contextlib.contextmanager
def weights_only_loads(allowed: Iterable[Any] = ()) -> Iterator[None]:
    """Every ``torch.load`` in the block loads with ``weights_only=True`` and the extra
    ``allowed`` globals, including third-party loaders that ask for ``weights_only=False`` or
    fall back to it (PyG, ogb): a file that needs anything else raises before any of it runs.
    (torch reads ``$TORCH_FORCE_WEIGHTS_ONLY_LOAD`` at every call; the block sets it.)"""
    import torch

    saved = {var: os.environ.pop(var, None) for var in _FORCE_VARS}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        with torch.serialization.safe_globals(list(allowed)):
            yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


_FORCE_VARS = ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")


def load_restricted(
    path: str | os.PathLike, allowed: Iterable[str], *, name: str | None = None
) -> Any:
    """``torch.load`` of a pickle that may name only the globals in ``allowed``
    (``"module.qualname"``), for third-party files in a pickle protocol that torch's weights-only
    unpickler cannot read (ogb writes protocol 4). Python's restricted-unpickler pattern: every
    global the file names passes :meth:`find_class`, so one outside ``allowed`` raises
    :class:`UnsafeFileError` naming the file before anything of it runs."""
    import torch

    names = frozenset(allowed)
    label = name or str(path)

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, qualname: str) -> Any:
            if f"{module}.{qualname}" not in names:
                raise UnsafeFileError(
                    f"{label} was refused: loading it would need {module}.{qualname}, which "
                    f"could run code hidden in the file; nothing of it ran. Use only files this "
                    f"suite or the dataset's own tool wrote, or rebuild the file",
                    needs=f"{module}.{qualname}",
                )
            return super().find_class(module, qualname)

    module = types.ModuleType("restricted_pickle")
    module.Unpickler = Unpickler
    module.load = lambda file, **kwargs: Unpickler(file, **kwargs).load()
    saved = {var: os.environ.pop(var, None) for var in _FORCE_VARS}  # they refuse pickle_module
    try:
        return torch.load(path, weights_only=False, pickle_module=module)
    finally:
        os.environ.update({var: value for var, value in saved.items() if value is not None})
