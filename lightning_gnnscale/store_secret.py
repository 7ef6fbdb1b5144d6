"""The secret with which a job's ranks authenticate each other on ByteGNN's graph-store
sockets (``comm/transport.py``); standard library only, so the launcher can import it.

On one node the launcher makes a fresh one per job and hands it to its ranks with their
environment, through the process start (:func:`give_local_ranks_a_secret`). Ranks started
elsewhere (torchrun, SLURM, several nodes) need the user's: ``GNNSCALE_STORE_SECRET`` (at
least :data:`MIN_SECRET_BYTES` bytes), or ``GNNSCALE_STORE_SECRET_FILE`` naming a file of mode
0600 (or 0400) owned by this user, the same on every node (docs/systems/bytegnn.md).
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping, MutableMapping

from .errors import ConfigError

SECRET_ENV = "GNNSCALE_STORE_SECRET"
SECRET_FILE_ENV = "GNNSCALE_STORE_SECRET_FILE"
MIN_SECRET_BYTES = 16
MAX_SECRET_FILE_BYTES = 4096
HOW_TO = (
    f"set {SECRET_ENV} to the same random string (at least {MIN_SECRET_BYTES} bytes) on every "
    f"node, e.g. export {SECRET_ENV}=$(python -c 'import secrets; print(secrets.token_hex(32))'), "
    f"or {SECRET_FILE_ENV} to a file of mode 0600 that holds it"
)


def new_secret() -> str:
    """A fresh random secret (64 hex digits)."""
    return secrets.token_hex(32)


def give_local_ranks_a_secret(env: MutableMapping[str, str]) -> None:
    """Put a fresh secret in ``env``, the environment a launcher gives its ranks (all on this
    node), replacing any the user gave: every job gets its own."""
    env.pop(SECRET_FILE_ENV, None)
    env[SECRET_ENV] = new_secret()


def _read_file(path: str) -> bytes:
    """The secret in ``path``: a regular file of this user, readable by nobody else."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ConfigError(
            f"{SECRET_FILE_ENV}={path!r} cannot be opened ({exc.strerror or exc}); it must be "
            "a regular file, not a link"
        ) from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())  # of the file opened, not of a name swapped meanwhile
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{SECRET_FILE_ENV}={path!r} is not a regular file")
        if info.st_uid != os.getuid():
            raise ConfigError(
                f"{SECRET_FILE_ENV}={path!r} belongs to uid {info.st_uid}, not to this user "
                f"(uid {os.getuid()})"
            )
        if info.st_mode & 0o077:
            raise ConfigError(
                f"{SECRET_FILE_ENV}={path!r} has mode {stat.S_IMODE(info.st_mode):04o}: others "
                f"can read it; chmod 600 {path}"
            )
        data = file.read(MAX_SECRET_FILE_BYTES + 1)
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise ConfigError(f"{SECRET_FILE_ENV}={path!r} is over {MAX_SECRET_FILE_BYTES} bytes")
    return data.strip()


def read_secret(env: Mapping[str, str] | None = None) -> bytes | None:
    """The store secret ``env`` (default ``os.environ``) gives, ``None`` if none; a
    :class:`ConfigError` for one that is too short, both variables set, or an unsafe file."""
    env = os.environ if env is None else env
    value, path = env.get(SECRET_ENV), env.get(SECRET_FILE_ENV)
    if value is None and path is None:
        return None
    if value is not None and path is not None:
        raise ConfigError(f"both {SECRET_ENV} and {SECRET_FILE_ENV} are set: give one")
    secret = value.encode() if value is not None else _read_file(path)
    if len(secret) < MIN_SECRET_BYTES:
        name = SECRET_ENV if value is not None else f"the file {SECRET_FILE_ENV}={path!r}"
        raise ConfigError(
            f"{name} holds {len(secret)} bytes; the store secret needs at least "
            f"{MIN_SECRET_BYTES} (e.g. python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return secret


def require_secret(why: str, env: Mapping[str, str] | None = None) -> bytes:
    """:func:`read_secret`, or a :class:`ConfigError` that says ``why`` one is needed and how
    to give it."""
    secret = read_secret(env)
    if secret is None:
        raise ConfigError(f"{why}, so the ranks need a store secret from you: {HOW_TO}")
    return secret
