"""Atomic file writes: a reader never sees half a file, a crash never leaves one behind."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it over ``path``.

    The rename is atomic, so two processes writing the same content at once both succeed (the
    last rename wins) and a crash mid-write leaves the old file (or none), never a torn one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """``data`` as indented, key-sorted JSON at ``path``, written atomically."""
    text = json.dumps(data, indent=2, sort_keys=True)
    atomic_write(path, lambda file: file.write(text.encode()))
