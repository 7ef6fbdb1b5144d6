"""The client side of the warm server (:mod:`lightning_gnnscale.warm`): where its socket is, what
it must match, the wire format, and :func:`hand_off`, which ``train.py`` calls first.

Standard library only, and nothing of the package: ``train.py`` loads this file on its own,
since ``import lightning_gnnscale`` alone costs ~0.7 s (Hydra and the registry).

A run is handed to a server only when one is listening on this checkout's socket (the key is
the interpreter and the package folder) and it imported exactly what this run would import: the
same source (the bytes of ``lightning_gnnscale/**/*.py``, ``train.py``, ``conf/**``, and of the
packages of the systems registered by entry points), the same
interpreter and ``site-packages``, the same interpreter flags, the same environment variables
that are read at import time (:data:`IMPORT_ENV_PREFIXES`), the same Linux namespaces and the
same cgroups (the run executes in the server's, under its limits). Otherwise the run starts
cold, saying why in one line when a server was found but does not match.
``GNNSCALE_WARM=0`` turns the hand-off off.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import stat
import struct
import sys
import tempfile
from pathlib import Path

DISABLE_ENV = "GNNSCALE_WARM"  # "0": never hand a run to a warm server
DIR_ENV = "GNNSCALE_WARM_DIR"  # the socket folder (default: $XDG_RUNTIME_DIR or $TMPDIR, per user)
# Environment variables that the interpreter, torch, Lightning or PyG read while importing: a
# server imported with other values than the run's would not behave as a cold start would.
# OMP_NUM_THREADS is not among them: the run's value is applied with torch.set_num_threads.
# CUDA_/NVIDIA_: which GPUs are visible decides what the server imports (``warm.preload``).
IMPORT_ENV_PREFIXES = (
    "PYTHON",
    "LD_",
    "TORCH",
    "PYTORCH",
    "OMP_",
    "KMP_",
    "MKL_",
    "LC_",
    "LANG",
    "CUDA_",
    "NVIDIA_",
)
THREADS_ENV = "OMP_NUM_THREADS"
GROUP = "lightning_gnnscale.systems"  # the entry points of systems outside the repository
PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
# Set by the process that runs a script as __main__ for a server or a test helper: its
# ``train.py`` must run here, not be handed off again.
_IN_WARM_PROCESS = False


# ------------------------------------------------------------------------------ where
def key() -> str:
    """One server per interpreter and package folder (a checkout, a worktree)."""
    return hashlib.sha256(f"{sys.executable}\0{PACKAGE_DIR}".encode()).hexdigest()[:12]


def socket_dir(create: bool = False) -> Path | None:
    """The per-user folder of the sockets, mode 0700; ``None`` when it does not exist (and
    ``create`` is false). Refuses (``PermissionError``, naming the folder and what is wrong)
    one that another user owns or others can enter, or a symlink or file in its place."""
    base = os.environ.get(DIR_ENV)
    if base:
        folder = Path(base)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        folder = Path(os.environ["XDG_RUNTIME_DIR"], "lightning_gnnscale")
    else:
        folder = Path(tempfile.gettempdir(), f"lightning_gnnscale-{os.getuid()}")
    if create:
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700, parents=bool(base))
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return None
    if problem := _not_private(info):
        raise PermissionError(
            f"the warm server's folder {folder} {problem}: it must be a folder of yours (uid "
            f"{os.getuid()}) with mode 0700; remove it, or set {DIR_ENV} to a folder of yours"
        )
    return folder


def _not_private(info: os.stat_result) -> str | None:
    """What makes the folder with ``info`` (``lstat``) unfit for this user's sockets."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != os.getuid():
        return f"is owned by uid {info.st_uid}, not by you"
    if info.st_mode & 0o077:
        return f"has mode {stat.S_IMODE(info.st_mode):04o} (others can enter it)"
    return None


def socket_path(folder: Path) -> Path:
    return folder / f"warm-{key()}.sock"


# ----------------------------------------------------------------------------- what
def _python_files(folder: Path) -> list[Path]:
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        files += [Path(root, n) for n in sorted(names) if n.endswith(".py")]
    return files


def _entry_point_values() -> list[str]:
    """The values (``module:attr``) of the entry points in :data:`GROUP`, read from the
    ``entry_points.txt`` of each distribution folder on ``sys.path`` (a few ms; importing
    ``importlib.metadata`` alone costs more than a hand-off should). A zip on ``sys.path`` is
    read through ``importlib.metadata``."""
    values: list[str] = []
    for entry in sys.path:
        folder = Path(entry or ".")
        if folder.is_file():
            from importlib.metadata import entry_points

            return [point.value for point in entry_points(group=GROUP)]
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if name.endswith((".dist-info", ".egg-info")):
                values += _group_values(folder / name / "entry_points.txt")
    return values


def _group_values(path: Path) -> list[str]:
    """The values of :data:`GROUP`'s section in one ``entry_points.txt`` (INI: ``name =
    value`` lines under ``[group]``)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    values, inside = [], False
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            inside = line == f"[{GROUP}]"
        elif inside and "=" in line and not line.startswith(("#", ";")):
            values.append(line.partition("=")[2].strip())
    return values


def entry_point_sources() -> list[Path]:
    """The source files of the systems registered from outside the repository: each entry
    point's top-level package in group ``lightning_gnnscale.systems`` (its folder's ``.py``
    files; located, not imported), or its module's file; deduplicated."""
    from importlib.util import find_spec

    files: list[Path] = []
    for top in sorted({value.split(":")[0].split(".")[0] for value in _entry_point_values()}):
        try:
            spec = find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is None:  # the registry names what it cannot load
            files.append(Path(f"<entry point package {top} not found>"))
        elif spec.submodule_search_locations:
            for location in sorted(spec.submodule_search_locations):
                files += _python_files(Path(location))
        elif spec.origin:
            files.append(Path(spec.origin))
    return list(dict.fromkeys(files))


def _source_files() -> list[Path]:
    files = [REPO_DIR / "train.py", *_python_files(PACKAGE_DIR)]
    for root, dirs, names in os.walk(REPO_DIR / "conf"):
        dirs.sort()
        files += [Path(root, n) for n in sorted(names)]
    return files + entry_point_sources()


def _stats(paths) -> str:
    digest = hashlib.sha256()
    for path in paths:
        try:
            info = os.stat(path)
            digest.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
        except OSError:
            digest.update(f"{path}\0missing\n".encode())
    return digest.hexdigest()[:16]


def _contents(paths) -> str:
    """A hash of the files' bytes (and names): an edit that keeps a file's size and
    modification time still shows. ~10 ms for the ~190 files (1.2 MB) of this checkout."""
    digest = hashlib.sha256()
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except OSError:
            digest.update(f"{path}\0missing\n".encode())
            continue
        digest.update(f"{path}\0{len(data)}\n".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _namespaces() -> str:
    """The Linux namespaces this process runs in (network, mount, ...): a run handed to a
    server runs in the server's, so they must be the command's (an emulated cluster host runs
    in a network namespace of its own)."""
    names = ("net", "mnt", "pid", "ipc", "uts", "user", "cgroup")
    links = []
    for name in names:
        try:
            links.append(os.readlink(f"/proc/self/ns/{name}"))
        except OSError:
            links.append(f"{name}:?")
    return _hash(repr(links))


def cgroups(pid: int | str = "self") -> str:
    """The cgroups process ``pid`` is a member of (``/proc/<pid>/cgroup``: one
    ``id:controllers:path`` line per hierarchy, ``0::path`` for cgroup v2): a run handed to a
    server runs in the server's, under its memory, CPU and pids limits, not the command's."""
    try:
        return Path(f"/proc/{pid}/cgroup").read_text().strip()
    except OSError as error:
        return f"(unreadable: {error.strerror})"


def fingerprint(env: dict[str, str] | None = None) -> dict[str, str]:
    """What a server must share with a run, part by part (the part's name says what differs)."""
    env = os.environ if env is None else env
    site = [p for p in sys.path if p.endswith("-packages") and os.path.isdir(p)]
    imported_env = sorted(
        (k, v) for k, v in env.items() if k.startswith(IMPORT_ENV_PREFIXES) and k != THREADS_ENV
    )
    return {
        "source": _contents(_source_files()),
        "python": _stats([os.path.realpath(sys.executable), *site]) + _hash(sys.version),
        "flags": repr((tuple(sys.flags), sys.warnoptions, sys._xoptions)),
        "environment": _hash(repr(imported_env)),
        "namespaces": _namespaces(),
        "cgroup": cgroups(),
    }


MISMATCH = {
    "source": "the package's (or an entry-point system's) source changed since it started",
    "python": "the interpreter or its site-packages changed since it started",
    "flags": "it runs with other interpreter flags (-O, -W, -X)",
    "environment": "it was started with other import-time environment variables "
    f"({', '.join(p + '*' for p in IMPORT_ENV_PREFIXES)})",
    "namespaces": "it runs in other Linux namespaces (network, mount, ...) than this command",
}


def mismatch(mine: dict[str, str], theirs: dict[str, str]) -> str | None:
    """Why a server with fingerprint ``theirs`` cannot run this run; ``None`` when it can."""
    for part, reason in MISMATCH.items():
        if mine.get(part) != theirs.get(part):
            return reason
    if mine.get("cgroup") != theirs.get("cgroup"):
        return _cgroup_mismatch(str(mine.get("cgroup")), str(theirs.get("cgroup")))
    return None


def _cgroup_mismatch(mine: str, theirs: str) -> str:
    """Which of this command's cgroups (:func:`cgroups`' text) differ from the server's."""
    own, server = _by_hierarchy(mine), _by_hierarchy(theirs)
    differ = [
        f"{hierarchy} {own.get(hierarchy, '(none)')} (the server's: "
        f"{server.get(hierarchy, '(none)')})"
        for hierarchy in dict.fromkeys([*own, *server])
        if own.get(hierarchy) != server.get(hierarchy)
    ]
    return (
        f"this command's cgroups differ from the server's, {'; '.join(differ)}: the run would "
        "escape this command's limits (start the server from this cgroup)"
    )


def _by_hierarchy(text: str) -> dict[str, str]:
    """``{hierarchy: path}`` of :func:`cgroups`' text; a hierarchy is named by its controllers
    (``memory``, ``cpu,cpuacct``), ``v2`` for cgroup v2's."""
    paths = {}
    for line in text.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        hierarchy = controllers or ("v2" if number == "0" else f"hierarchy {number}")
        paths[hierarchy] = path
    return paths


# ------------------------------------------------------------------------------ wire
_HEADER = struct.Struct("!I")
MAX_FDS = 3
MAX_MESSAGE = 16 << 20  # bytes: a command line and an environment are far less


def send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    """One length-prefixed JSON message, with ``fds`` (SCM_RIGHTS) on its first byte."""
    data = json.dumps(message).encode()
    data = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


class Incoming:
    """One message arriving in pieces: :meth:`feed` after each read a socket allows (a
    non-blocking one never blocks), then :attr:`message` and :attr:`fds`. Refuses
    (``ValueError``) a message over :data:`MAX_MESSAGE` bytes or one that is not a JSON object."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.fds: list[int] = []
        self.message: dict | None = None

    def feed(self, sock: socket.socket) -> bool:
        """Read what has arrived; ``True`` once the message is whole. ``EOFError`` when the
        stream ends before (``data`` says whether any of it came)."""
        data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, MAX_FDS)
        self.fds += fds
        if len(self.fds) > MAX_FDS:
            raise ValueError(f"more than {MAX_FDS} file descriptors")
        if not data:
            raise EOFError("the message ended early" if self.data else "no message")
        self.data += data
        if len(self.data) < _HEADER.size:
            return False
        size = _HEADER.unpack_from(self.data)[0]
        if size > MAX_MESSAGE:
            raise ValueError(f"a message of {size} bytes (at most {MAX_MESSAGE})")
        if len(self.data) < _HEADER.size + size:
            return False
        message = json.loads(self.data[_HEADER.size : _HEADER.size + size])
        if not isinstance(message, dict):
            raise ValueError(f"a message that is a {type(message).__name__}, not an object")
        self.message = message
        return True

    def close_fds(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []


def receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and the descriptors that came with it; ``(None, [])`` at end of stream."""
    incoming = Incoming()
    try:
        while not incoming.feed(sock):
            pass
    except EOFError:
        incoming.close_fds()
        if incoming.data:
            raise ConnectionError("the message ended early") from None
        return None, []
    except BaseException:
        incoming.close_fds()
        raise
    return incoming.message, incoming.fds


def _peer(sock: socket.socket) -> tuple[int, int, int]:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


def peer_uid(sock: socket.socket) -> int:
    return _peer(sock)[1]


def peer_pid(sock: socket.socket) -> int:
    return _peer(sock)[0]


def connect(timeout: float | None = 5.0, folder: Path | None = None) -> socket.socket | None:
    """A connection to this checkout's server (its socket in ``folder``, default
    :func:`socket_dir`), ``None`` when none listens."""
    try:
        folder = folder or socket_dir()
    except PermissionError as error:
        print(f"lightning_gnnscale warm server: not used: {error}", file=sys.stderr)
        return None
    if folder is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(socket_path(folder)))
        if peer_uid(sock) != os.getuid():
            raise ConnectionRefusedError
    except OSError:
        sock.close()
        return None
    return sock


def request(message: dict, folder: Path | None = None) -> dict | None:
    """``message`` to the server and its answer; ``None`` when no server answers."""
    sock = connect(folder=folder)
    if sock is None:
        return None
    with sock:
        try:
            send(sock, message)
            answer, _fds = receive(sock)
        except OSError:
            return None
    return answer


# ----------------------------------------------------------------------------- hand-off
ANSWER_TIMEOUT_S = 30.0
RESTART = "python -m lightning_gnnscale.warm stop && python -m lightning_gnnscale.warm start"


def _externally_launched() -> bool:
    return "LOCAL_RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1


def hand_off(main_file: str) -> None:
    """Run this command (``sys.argv``, the script ``main_file``) in a fork of the warm server
    when one matches, and end this process with that run's exit status; return when there is
    none (the caller runs cold). While the run lasts this process forwards SIGINT, SIGTERM and
    SIGHUP to it; when this process dies, the server kills the run and its ranks."""
    if _IN_WARM_PROCESS or os.environ.get(DISABLE_ENV) == "0" or _externally_launched():
        return
    sock = connect()
    if sock is None:
        return
    try:
        message = {
            "op": "run",
            "main": os.path.abspath(main_file),
            "argv": sys.argv,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "fingerprint": fingerprint(),
            "umask": _umask(),
            "affinity": sorted(os.sched_getaffinity(0)),
        }
        fds = [fd for fd in (0, 1, 2) if _is_open(fd)]
        message["stdio"] = fds
        send(sock, message, fds)
        sock.settimeout(ANSWER_TIMEOUT_S)  # a stopped or hung server: run cold
        answer, _fds = receive(sock)
        sock.settimeout(None)
    except TimeoutError:
        print(
            f"lightning_gnnscale warm server: no answer in {ANSWER_TIMEOUT_S:g} s; running cold",
            file=sys.stderr,
            flush=True,
        )
        sock.close()  # a run it started after all ends with this connection
        return
    except OSError:
        sock.close()
        return
    if answer is None or "pid" not in answer:
        if answer and answer.get("refused"):
            print(
                f"lightning_gnnscale warm server (pid {answer.get('server')}) not used: "
                f"{answer['refused']}; running cold. Restart it: {RESTART}",
                file=sys.stderr,
                flush=True,
            )
        sock.close()
        return
    _wait_for(sock, answer["pid"])


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _wait_for(sock: socket.socket, pid: int) -> None:
    """Forward signals to the run ``pid`` until the server reports its end; exit with it."""

    def forward(signum, _frame):
        # A terminal sends SIGINT and SIGHUP to the whole foreground process group (a cold
        # run's launcher, rank server and ranks alike): so does this, to the run's group.
        with contextlib.suppress(ProcessLookupError):
            if signum == signal.SIGTERM:
                os.kill(pid, signum)
            else:
                os.killpg(pid, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        answer, _fds = receive(sock)
    except OSError:
        answer = None
    if answer is None or "exit" not in answer:
        print("lightning_gnnscale warm server: the server ended during the run", file=sys.stderr)
        os._exit(1)
    code = answer["exit"]
    if code < 0:  # killed by a signal: end the same way, as the shell expects
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)
