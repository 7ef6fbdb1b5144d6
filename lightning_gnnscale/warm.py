"""The warm server: ``python -m lightning_gnnscale.warm start|stop|status`` (opt-in).

A fresh interpreter spends ~9 s here importing torch, Lightning, PyG and the suite before a run
of ~1 s can start. ``start`` leaves a server that has imported all of it once (what a rank
imports, :data:`lightning_gnnscale.launch.RANK_SERVER_PRELOAD`, every system's implementation,
and Hydra; where an NVIDIA GPU is present only Hydra and ``launch.CUDA_SAFE_PRELOAD``, so that
its forks can use CUDA); ``train.py`` then hands its run to it (:func:`lightning_gnnscale.warm_client.hand_off`):
the server forks one process per run, which takes the run's command line, working directory,
environment, umask, CPU affinity, thread count and standard streams, forks its own rank server
from itself, and runs ``train.py`` as ``__main__``, as a cold start would. The server runs no
torch operator, so no thread pool exists when it forks (as for the rank server).

The server listens on a Unix socket in a per-user 0700 folder and serves only its own user
(SO_PEERCRED). It refuses a run whose source, interpreter, flags or import-time environment
differ from what it imported (the run then starts cold and says so), ends after ``--idle-minutes``
without a run (default 30) and on ``stop`` (after the runs in progress). A run dies when the
command that handed it over dies (the server kills its process group; its ranks also die with
it, as after a cold start); every run dies with the server. See docs/architecture.md, "Start-up".
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import os
import runpy
import select
import selectors
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from . import warm_client as client
from .rank_logging import as_before_logging_is_configured

IDLE_MINUTES = 30.0
READY_TIMEOUT_S = 300.0
REQUEST_DEADLINE_S = 10.0  # a connection's request must have arrived whole by then
SEND_TIMEOUT_S = 10.0  # an answer must have left by then (a client that never reads)
MAX_PENDING = 32  # connections whose request is still arriving; past it, the oldest is dropped


def preload() -> tuple[str, ...]:
    """What the server imports: what a rank needs, every system's, and Hydra (``train.py``);
    where an NVIDIA GPU is present, only what leaves CUDA usable after a fork
    (``launch.CUDA_SAFE_PRELOAD``). Not ``rank_server_guard``, which ties a process to its
    parent."""
    from .launch import server_preload
    from .systems.registry import SYSTEMS

    systems = tuple(module for spec in SYSTEMS.values() for module in spec.implementation)
    modules = ("hydra", "hydra.main", *server_preload(systems))
    return tuple(m for m in dict.fromkeys(modules) if not m.endswith("rank_server_guard"))


# ------------------------------------------------------------------ running a script here
def run_script_here(
    main: str,
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    affinity: list[int] | None = None,
    umask: int | None = None,
    path_entry: str = "insert",
) -> None:
    """Run the script ``main`` as ``python`` would run ``argv`` in ``cwd`` with ``env``, in
    this process, which has imported everything and run no torch operator; end the process as
    the interpreter would (exit handlers, then the exit status). Never returns.

    The process forks its own rank server first, so a run that launches ranks forks them
    warm. ``path_entry``: ``"replace"`` the first ``sys.path`` entry by the script's folder
    (as ``python main`` has it) or ``"insert"`` it before the others."""
    import torch

    from . import launch

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # chosen again from this $TMPDIR, as a fresh interpreter chooses it
    if umask is not None:
        os.umask(umask)
    if affinity is not None and set(affinity) != os.sched_getaffinity(0):
        os.sched_setaffinity(0, affinity)
        threads = len(affinity)  # what torch picks for a process pinned this way
    else:
        threads = None
    with contextlib.suppress(ValueError):  # torch read it when the server imported it
        threads = int(env.get(client.THREADS_ENV) or threads or 0)
    if threads and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    launch._RUN_TOKEN = launch._run_token()  # a fresh interpreter's, from this environment
    launch.serve_forks_from_here()
    client._IN_WARM_PROCESS = True
    as_before_logging_is_configured()
    if sys.stdout is not None:  # as Python sets it up for these descriptors and this env
        with contextlib.suppress(Exception):
            sys.stdout.reconfigure(
                line_buffering=os.isatty(1), write_through=bool(env.get("PYTHONUNBUFFERED"))
            )
    sys.argv = list(argv)
    sys.orig_argv = [sys.executable, *argv]
    folder = os.path.dirname(os.path.abspath(main))
    if path_entry == "replace" and sys.path:
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)
    status, interrupted = 0, False
    try:
        runpy.run_path(main, run_name="__main__")
    except SystemExit as exit:
        status = _exit_status(exit.code)
    except KeyboardInterrupt as error:
        _print_uncaught(error, main)
        status, interrupted = 128 + signal.SIGINT, True
    except BaseException as error:
        _print_uncaught(error, main)
        status = 1
    _end(status, interrupted)


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _print_uncaught(error: BaseException, main: str) -> None:
    """The traceback Python prints, from the script's frame on (not this module's)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != main:
        tb = tb.tb_next
    sys.excepthook(type(error), error, tb or error.__traceback__)


def _end(status: int, interrupted: bool) -> None:
    """Python's own end: wait for the run's threads, its exit handlers (``train.py``'s ends
    the process there, with its status), flush, exit."""
    with contextlib.suppress(BaseException):
        threading._shutdown()
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


# --------------------------------------------------------------------------- the server
class Server:
    """One thread and one selector: each connection's request is read as it arrives (a client
    that sends nothing, or sends slowly, holds no one up and is dropped at its deadline); a
    whole request is answered at once, a run forked."""

    def __init__(self, folder: Path, idle_s: float, fingerprint: dict, lock_fd: int) -> None:
        self.folder, self.idle_s, self.fingerprint, self.lock_fd = (
            folder,
            idle_s,
            fingerprint,
            lock_fd,
        )
        self.path = client.socket_path(folder)
        self.started = self.last_active = time.time()
        self.selector = selectors.DefaultSelector()
        self.runs: dict[int, tuple[socket.socket, int]] = {}  # pid -> (connection, pidfd)
        # connections whose request is arriving -> (what came, monotonic deadline), oldest first
        self.pending: dict[socket.socket, tuple[client.Incoming, float]] = {}
        self.served = 0
        self.stopping = False
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a dead server's (the lock says none is alive)
        self.listener.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.listener.listen(64)
        self.selector.register(self.listener, selectors.EVENT_READ, ("accept", None))

    def log(self, text: str) -> None:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}", flush=True)

    def status(self) -> dict:
        idle_left = None
        if not self.runs:
            idle_left = max(0.0, self.idle_s - (time.time() - self.last_active))
        return {
            "server": os.getpid(),
            "age_s": round(time.time() - self.started, 1),
            "key": client.key(),
            "socket": str(self.path),
            "package": str(client.PACKAGE_DIR),
            "python": sys.executable,
            "fingerprint": self.current_fingerprint(),
            "idle_left_s": None if idle_left is None else round(idle_left, 1),
            "runs": sorted(self.runs),
            "served": self.served,
        }

    def current_fingerprint(self) -> dict:
        """The fingerprint taken at start, with the cgroups the server is in now (where its
        runs would be)."""
        return {**self.fingerprint, "cgroup": client.cgroups()}

    def serve(self) -> None:
        while True:
            if self.stopping and not self.runs:
                return
            now = time.monotonic()
            self.drop_late(now)
            timeout = None
            if not self.runs:
                timeout = self.idle_s - (time.time() - self.last_active)
                if timeout <= 0:
                    self.log("idle: ending")
                    return
            if self.pending:
                first_deadline = min(deadline for _, deadline in self.pending.values())
                timeout = max(0.0, min(first_deadline - now, timeout or float("inf")))
            for selected, _events in self.selector.select(timeout):
                kind, data = selected.data
                if kind == "accept":
                    self.accept()
                elif kind == "request":
                    if data in self.pending:  # not dropped earlier in this batch
                        self.read_request(data)
                elif data not in self.runs:  # ended earlier in this batch
                    continue
                elif kind == "client":  # the command that handed the run over: only EOF comes
                    self.client_gone(data, selected.fileobj)
                elif kind == "run":
                    self.reap(data)

    def accept(self) -> None:
        try:
            connection, _ = self.listener.accept()
        except OSError:
            return
        if client.peer_uid(connection) != os.getuid():
            return connection.close()
        if len(self.pending) >= MAX_PENDING:
            oldest = next(iter(self.pending))
            self.drop(oldest, f"{MAX_PENDING} requests arriving at once, this the oldest")
        connection.setblocking(False)
        self.pending[connection] = (client.Incoming(), time.monotonic() + REQUEST_DEADLINE_S)
        self.selector.register(connection, selectors.EVENT_READ, ("request", connection))

    def read_request(self, connection: socket.socket) -> None:
        incoming, _deadline = self.pending[connection]
        try:
            if not incoming.feed(connection):
                return
        except BlockingIOError:
            return
        except EOFError as error:
            return self.drop(connection, str(error) if incoming.data else None)
        except (OSError, ValueError) as error:
            return self.drop(connection, f"a bad request: {error!r}")
        self.selector.unregister(connection)
        del self.pending[connection]
        self.handle(connection, incoming.message, incoming.fds)

    def drop_late(self, now: float) -> None:
        for connection, (_incoming, deadline) in list(self.pending.items()):
            if deadline <= now:
                self.drop(connection, f"no whole request within {REQUEST_DEADLINE_S:g} s")

    def drop(self, connection: socket.socket, why: str | None) -> None:
        """Close a connection whose request did not come (``why``: logged, when not ``None``)."""
        incoming, _deadline = self.pending.pop(connection)
        if why is not None:
            with contextlib.suppress(OSError):
                why = f"pid {client.peer_pid(connection)}: {why}"
            self.log(f"request dropped: {why}")
        self.selector.unregister(connection)
        incoming.close_fds()
        connection.close()

    def handle(self, connection: socket.socket, message: dict, fds: list[int]) -> None:
        try:
            connection.settimeout(SEND_TIMEOUT_S)
            op = message.get("op")
            if op == "status":
                client.send(connection, self.status())
            elif op == "stop":
                self.log(f"stop asked by pid {client.peer_pid(connection)}")
                self.stop()
                client.send(connection, self.status())
            elif op == "run":
                return self.start_run(connection, message, fds)
        except (OSError, ValueError) as error:
            self.log(f"request failed: {error!r}")
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        connection.close()

    def stop(self) -> None:
        """No new runs; end once the running ones have ended."""
        if not self.stopping:
            self.stopping = True
            self.selector.unregister(self.listener)
            self.listener.close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.log(f"stop: ending after {len(self.runs)} running run(s)")

    def start_run(self, connection: socket.socket, message: dict, fds: list[int]) -> None:
        """Fork the run, or refuse it (the command then runs cold): while stopping, or when the
        command would not run here as it would cold. Its cgroups are read from the kernel
        (the connection's peer), not taken from the message."""
        _check_run_request(message, fds)
        claimed = message["fingerprint"]
        caller = {**claimed, "cgroup": client.cgroups(client.peer_pid(connection))}
        reason = client.mismatch(caller, self.current_fingerprint())
        if self.stopping:
            reason = "it is stopping"
        if reason is not None:
            client.send(connection, {"refused": reason, "server": os.getpid()})
            self.log(f"refused a run: {reason}")
            return connection.close()
        stdio = dict(zip(message.get("stdio", []), fds))
        server = os.getpid()
        pid = os.fork()
        if pid == 0:  # the run
            try:
                os.setpgid(0, 0)
                from .launch import kill_me_when_my_parent_dies

                kill_me_when_my_parent_dies()
                if os.getppid() != server:
                    os._exit(1)
                self.close_in_child(connection)
                for sig in (signal.SIGTERM, signal.SIGHUP):  # a fresh interpreter's handlers
                    signal.signal(sig, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                null = os.open(os.devnull, os.O_RDWR)
                for target in (0, 1, 2):
                    os.dup2(stdio.get(target, null), target)
                for fd in {*fds, null} - {0, 1, 2}:
                    os.close(fd)
                run_script_here(
                    message["main"],
                    message["argv"],
                    message["cwd"],
                    message["env"],
                    message.get("affinity"),
                    message.get("umask"),
                    path_entry="replace",
                )
            except BaseException:
                with contextlib.suppress(BaseException):
                    traceback.print_exc()
            finally:
                os._exit(1)
        with contextlib.suppress(OSError):  # the run does it too: whichever comes first
            os.setpgid(pid, pid)
        pidfd = os.pidfd_open(pid)
        self.runs[pid] = (connection, pidfd)
        self.served += 1
        self.last_active = time.time()
        self.selector.register(connection, selectors.EVENT_READ, ("client", pid))
        self.selector.register(pidfd, selectors.EVENT_READ, ("run", pid))
        self.log(f"run {pid}: {' '.join(message['argv'])} (in {message['cwd']})")
        with contextlib.suppress(OSError):
            client.send(connection, {"pid": pid})

    def close_in_child(self, connection: socket.socket) -> None:
        """What a run must not hold: the server's socket and lock, the connections."""
        self.selector.close()
        sockets = [connection, *(c for c, _ in self.runs.values()), *self.pending]
        if not self.stopping:
            sockets.append(self.listener)
        fds = [self.lock_fd, *(pidfd for _, pidfd in self.runs.values())]
        for sock in sockets:
            fds.append(sock.detach())
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def client_gone(self, pid: int, connection: socket.socket) -> None:
        """The command that handed the run over ended (or wrote, which it never does): kill
        the run and everything it started (one process group)."""
        with contextlib.suppress(OSError):
            if connection.recv(4096):  # never sent: dropped
                return
        self.selector.unregister(connection)
        self.log(f"run {pid}: its command is gone, killing the run")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def reap(self, pid: int) -> None:
        connection, pidfd = self.runs.pop(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # what the run left (none, normally), before the
            # group's id can be reused: the unreaped run holds it
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(connection)
        with contextlib.suppress(OSError):
            client.send(connection, {"exit": code})
        connection.close()
        self.last_active = time.time()
        self.log(f"run {pid}: exit {code}")


def _check_run_request(message: dict, fds: list[int]) -> None:
    """``ValueError`` naming the field unless ``message`` is a run request as
    :func:`lightning_gnnscale.warm_client.hand_off` sends it (its ``stdio`` naming the
    descriptors that came)."""

    def check(field: str, valid: bool, what: str) -> None:
        if not valid:
            raise ValueError(f"run request: {field!r} must be {what}")

    def strings(value) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)

    def numbers(value) -> bool:
        return isinstance(value, list) and all(type(v) is int for v in value)

    env, stdio = message.get("env"), message.get("stdio")
    check("main", isinstance(message.get("main"), str), "a path")
    check("argv", strings(message.get("argv")), "a list of strings")
    check("cwd", isinstance(message.get("cwd"), str), "a path")
    check("env", isinstance(env, dict) and strings([*env, *env.values()]), "strings to strings")
    check("fingerprint", isinstance(message.get("fingerprint"), dict), "an object")
    check("umask", type(message.get("umask", 0)) is int, "an integer")
    check("affinity", numbers(message.get("affinity", [])), "a list of CPU numbers")
    valid_stdio = numbers(stdio) and set(stdio) <= {0, 1, 2}
    valid_stdio = valid_stdio and len(set(stdio)) == len(stdio) == len(fds)
    check("stdio", valid_stdio, "the 0/1/2 of the descriptors sent")


def _serve(folder: Path, idle_s: float, ready_fd: int) -> None:
    """The daemon's body: take the lock, import, listen, report ready, serve."""
    lock_fd = os.open(folder / f"warm-{client.key()}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.write(ready_fd, b"running")
        return
    fingerprint = client.fingerprint()  # before importing: a change while importing shows
    os.environ.pop(client.THREADS_ENV, None)  # torch's default here, each run sets its own
    started = time.monotonic()
    from importlib import import_module

    for module in preload():
        import_module(module)
    server = Server(folder, idle_s, fingerprint, lock_fd)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the socket goes with the server
    server.log(f"pid {os.getpid()} ready in {time.monotonic() - started:.1f} s: {server.path}")
    os.write(ready_fd, f"ready {os.getpid()}".encode())
    os.close(ready_fd)
    try:
        server.serve()
    finally:
        if not server.stopping:
            with contextlib.suppress(FileNotFoundError):
                server.path.unlink()


def start(idle_minutes: float) -> int:
    folder = client.socket_dir(create=True)
    if (answer := client.request({"op": "status"}, folder=folder)) is not None:
        print(f"a warm server is running already: pid {answer['server']} ({answer['socket']})")
        return 0
    log = folder / f"warm-{client.key()}.log"
    ready_r, ready_w = os.pipe()
    if os.fork() == 0:  # detach: a new session, then a grandchild that init adopts
        try:
            os.close(ready_r)
            os.setsid()
            if os.fork() == 0:
                null = os.open(os.devnull, os.O_RDONLY)
                out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.dup2(null, 0)
                os.dup2(out, 1)
                os.dup2(out, 2)
                os.close(null)
                os.close(out)
                os.chdir("/")
                try:
                    _serve(folder, idle_minutes * 60, ready_w)
                except BaseException:
                    traceback.print_exc()
                    sys.stderr.flush()
                os._exit(0)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.wait()
    said = b""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([ready_r], [], [], left)
        if not readable or not (chunk := os.read(ready_r, 64)):
            break
        said += chunk
    os.close(ready_r)
    if said.startswith(b"ready"):
        print(f"warm server pid {said.split()[1].decode()} ready: {client.socket_path(folder)}")
        print(f"it serves train.py runs of {client.REPO_DIR} with {sys.executable}")
        return 0
    if said == b"running":
        print(
            "another warm server holds this checkout's lock: one starting, or one stopped that "
            "waits for its runs to end; none is listening yet (see `python -m "
            "lightning_gnnscale.warm status`, and start again once its runs have ended)",
            file=sys.stderr,
        )
        return 1
    print(f"the warm server did not start; see {log}", file=sys.stderr)
    return 1


def stop() -> int:
    answer = client.request({"op": "stop"}, folder=client.socket_dir())
    if answer is None:
        print("no warm server is running")
        return 0
    pid = answer["server"]
    if answer["runs"]:
        print(f"warm server pid {pid} stops after its {len(answer['runs'])} running run(s)")
        return 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.05)
    print(f"warm server pid {pid} stopped")
    return 0


def status() -> int:
    answer = client.request({"op": "status"}, folder=client.socket_dir())
    if answer is None:
        print("no warm server is running")
        return 3
    reason = client.mismatch(client.fingerprint(), answer["fingerprint"])
    idle = answer["idle_left_s"]
    parts = answer["fingerprint"].items()
    fingerprint = " ".join(f"{k}={v}" for k, v in parts if k not in ("flags", "cgroup"))
    cgroups = " ".join(answer["fingerprint"].get("cgroup", "?").splitlines())
    print(f"pid:          {answer['server']}")
    print(f"age:          {answer['age_s']:.0f} s")
    print(f"key:          {answer['key']} ({answer['socket']})")
    print(f"serves:       {answer['package']} with {answer['python']}")
    print(f"fingerprint:  {fingerprint}")
    print(f"cgroups:      {cgroups}")
    print(f"matches:      {'yes' if reason is None else 'no: ' + reason}")
    print(
        f"runs:         {len(answer['runs'])} running {answer['runs']}, {answer['served']} served"
    )
    print(f"idle left:    {'(running)' if idle is None else f'{idle:.0f} s'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_gnnscale.warm",
        description="A warm server that train.py hands its runs to (docs/architecture.md, "
        f"'Start-up'). {client.DISABLE_ENV}=0 makes train.py ignore it.",
    )
    parser.add_argument("command", choices=("start", "stop", "status"))
    parser.add_argument(
        "--idle-minutes",
        type=float,
        default=IDLE_MINUTES,
        help=f"start: end after this long without a run (default {IDLE_MINUTES:g})",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            return start(args.idle_minutes)
        return stop() if args.command == "stop" else status()
    except PermissionError as error:  # the socket folder is not this user's alone
        print(f"{parser.prog} {args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
