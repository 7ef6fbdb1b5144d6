"""Start the ranks of one run on this machine.

Each rank runs the whole job function (like ``torchrun``), with ``LOCAL_RANK``, ``NODE_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` set so that Lightning finds an externally launched world
and never re-executes the command line. That keeps Hydra multirun sane: a ``-m`` sweep runs
its jobs in one process and each job spawns its own ranks (docs/architecture.md, "Launching"). Under ``torchrun`` or
SLURM (``LOCAL_RANK`` set, or ``srun`` with one task per rank) the job function runs directly.

Ranks start warm: they are forked from a *rank server* (multiprocessing's ``forkserver``), a
process that imported torch, Lightning, PyG and the suite once (torch and Lightning alone where
an NVIDIA GPU is present: :data:`CUDA_SAFE_PRELOAD`), while the launcher was still composing
the config and preparing the data (:func:`start_rank_server`). The server runs no torch
operator, so no thread pool exists when it forks. ``launcher.start_method=spawn`` starts each rank
as a fresh interpreter instead (every rank imports everything again). Either way a rank gets the
launcher's environment, working directory, stdout and stderr as they are at launch, and its
logging (:mod:`.rank_logging`).

Tensors passed to the ranks (the graph) travel through shared memory, not copies. With every
rank on this node the environment they get holds a fresh store secret for the job
(``store_secret.py``), passed in the process start's pipe, never through ``exec``.

No rank outlives its launcher: the launcher kills its ranks on every way out (return, error,
time-out, SIGINT, SIGTERM, SIGHUP), and on Linux the kernel kills the rank server when the
launcher dies (even by SIGKILL), and each rank when its parent (the server, or the launcher under
``spawn``) dies, so a hung or stopped rank is never orphaned. The server must be started from a
thread that lives as long as the launcher (the main thread: ``train.py`` and the tests do).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import os
import pickle
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from .bounds import externally_launched
from .config_types import START_METHODS
from .rank_logging import adopt_launcher_logging, launcher_logging
from .store_secret import give_local_ranks_a_secret
from .systems.registry import SYSTEMS

# A process forked from one whose CUDA driver is initialised cannot use CUDA ("initialization
# error" at its first CUDA call, even Lightning's RNG snapshot in a CPU run). Measured on an
# H100 (torch 2.11+cu130, PyG 2.8): a child forked after importing torch and Lightning can,
# after importing PyG it cannot (likely a native extension's driver call). On a machine with an
# NVIDIA GPU the server imports only these, and each rank the rest.
# The guard comes first (after the package's own imports, which it needs), so the server dies
# with its launcher while it imports the rest.
CUDA_SAFE_PRELOAD = ("lightning_gnnscale.rank_server_guard", "torch", "lightning")
# What the rank server imports before its first fork elsewhere: everything a rank of
# ``train()`` uses except the chosen system, which the launcher adds
# (``start_rank_server(extra_modules)``).
RANK_SERVER_PRELOAD = (*CUDA_SAFE_PRELOAD, "torch_geometric", "lightning_gnnscale.run")


def _run_token() -> str:
    """``${run_token:}`` in hydra.run.dir / hydra.sweep.dir: two runs started in the same second
    get different folders (the pid part differs between live processes on one machine). The
    processes of one externally launched run (torchrun, srun, a manual multi-node launch) share
    a token derived from what their launcher gave all of them, so they share one folder."""
    shared = [
        os.environ.get(var, "")
        for var in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "MASTER_ADDR")
    ]
    if "MASTER_PORT" in os.environ or os.environ.get("SLURM_JOB_ID"):
        shared.append(os.environ.get("MASTER_PORT", ""))
        return hashlib.sha256("|".join(shared).encode()).hexdigest()[:8]
    return f"{secrets.token_hex(2)}{os.getpid() % 0x10000:04x}"


_RUN_TOKEN = _run_token()  # once per process: Hydra resolves the folder more than once
OmegaConf.register_new_resolver("run_token", lambda: _RUN_TOKEN, replace=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PR_SET_PDEATHSIG = 1
# Once a rank has failed, the others get this long to exit, then SIGTERM, then as long again
# before SIGKILL. torch's default (SIGTERM at once, SIGKILL 30 s later) kept a job with a
# stopped rank alive 30 s past its collective timeout: a stopped process ignores SIGTERM.
RANK_EXIT_GRACE_S = 5.0


# Where an NVIDIA driver shows itself: Linux (module loaded, device nodes) and WSL2.
NVIDIA_DRIVER_PATHS = (
    "/proc/driver/nvidia/version",
    "/sys/module/nvidia",
    "/dev/nvidiactl",
    "/dev/nvidia0",
    "/dev/dxg",
)


def nvidia_gpu_present() -> bool:
    """Whether this machine has an NVIDIA GPU that CUDA may use: a driver shows
    (:data:`NVIDIA_DRIVER_PATHS`) and ``CUDA_VISIBLE_DEVICES`` does not hide every device
    (empty, or ``-1`` first); standard library only."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0")
    if visible.split(",")[0].strip() in ("", "-1"):
        return False
    return any(os.path.exists(path) for path in NVIDIA_DRIVER_PATHS)


def import_pandas_without_pyarrow() -> None:
    """Import pandas (PyG imports it) with pyarrow blocked, then lift the block (a pyarrow
    imported earlier is put back). Where pyarrow is installed (the tables reader's dependency,
    docs/datasets.md) pandas would import it: 48 MB of RSS in every process that imports PyG
    (measured: 492 against 444 MB after torch, Lightning and PyG) and a jemalloc and a pool
    thread, which ranks must not fork from. Training uses no pandas; this process's pandas then
    runs without pyarrow (``pandas.compat.HAS_PYARROW`` is False), while ``construct`` imports
    pyarrow itself. Called by the rank server and by ``train.py``, never on import of the
    package (a user's own process keeps its pandas as it is)."""
    if "pandas" in sys.modules:
        return
    missing = object()
    earlier = sys.modules.get("pyarrow", missing)
    sys.modules["pyarrow"] = None  # type: ignore[assignment]
    try:
        import pandas  # noqa: F401
    finally:
        if earlier is missing:
            del sys.modules["pyarrow"]
        else:
            sys.modules["pyarrow"] = earlier


def server_preload(extra_modules: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What a process that ranks fork from may import: :data:`RANK_SERVER_PRELOAD` and
    ``extra_modules``, or :data:`CUDA_SAFE_PRELOAD` alone where an NVIDIA GPU is present."""
    if nvidia_gpu_present():
        return CUDA_SAFE_PRELOAD
    return tuple(dict.fromkeys((*RANK_SERVER_PRELOAD, *extra_modules)))


def start_rank_server(extra_modules: tuple[str, ...] = ()) -> None:
    """Start the warm process that ranks fork from, importing :func:`server_preload`'s modules
    in the background; idempotent (a running server keeps its modules).

    Call it as early as possible (``train.py`` does, before its own heavy imports) so that the
    server's imports overlap the launcher's work. Uses only the standard library."""
    import multiprocessing
    from multiprocessing import forkserver

    preload = list(server_preload(extra_modules))
    multiprocessing.get_context("forkserver").set_forkserver_preload(preload)
    forkserver.ensure_running()


def serve_forks_from_here() -> int:
    """Fork this process as its own rank server (what :func:`start_rank_server` then finds
    running, so it starts no cold one); return the server's pid. For a process that has already
    imported everything (a run of the warm server, :mod:`lightning_gnnscale.warm`, or of the
    tests' script helper) and has run no torch operator yet, so no thread pool is forked. The
    server dies with this process (Linux), as ``rank_server_guard`` makes the cold one do."""
    from multiprocessing import connection, forkserver

    listener = socket.socket(socket.AF_UNIX)
    address = connection.arbitrary_address("AF_UNIX")
    listener.bind(address)
    os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            kill_me_when_my_parent_dies()
            if os.getppid() == launcher:
                os.close(alive_w)
                forkserver.main(listener.fileno(), alive_r, [])
        finally:
            os._exit(0)
    os.close(alive_r)
    listener.close()
    server = forkserver._forkserver
    server._forkserver_address, server._forkserver_alive_fd = address, alive_w
    server._forkserver_pid = pid
    return pid


def warm_start(cfg: Any) -> bool:
    """Start the rank server (with the chosen system's implementation) when the composed run
    config ``cfg`` will launch local ranks from it; return whether it did. ``train.py`` calls
    this before its heavy imports; it reads the raw config, whose values are validated later
    (a value it cannot read here starts nothing and fails validation with its key named)."""
    try:
        ranks = int(cfg.trainer.devices) * int(cfg.trainer.num_nodes)
        method, spec = cfg.launcher.start_method, SYSTEMS.get(cfg.strategy.name)
    except Exception:  # validation reports it, before any rank starts
        return False
    if ranks < 2 or method != "forkserver" or spec is None or externally_launched():
        return False
    start_rank_server(spec.implementation)
    return True


def exit_without_teardown(main: Callable[[], Any]) -> None:
    """Run a command's ``main()``, then end the process without Python's interpreter teardown.

    After the run has ended and its results are written, tearing down an interpreter that
    imported torch, Lightning and PyG frees its objects one by one: 2-3 s here, a fifth of a
    short run's wall time. An exit handler registered now, before the run's own (they run last
    in, first out), runs after all of them: it flushes logging and the standard streams and
    ends the process with the status ``main`` chose (0, a ``SystemExit`` code, or 1 for an
    error, whose traceback Python has printed by then)."""
    import atexit
    import logging

    status = [1]

    def end_now() -> None:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status[0])

    atexit.register(end_now)
    try:
        main()
        status[0] = 0
    except SystemExit as exit:
        code = exit.code
        status[0] = 0 if code is None else code if isinstance(code, int) else 1
        raise
    except KeyboardInterrupt:
        status[0] = 128 + signal.SIGINT
        raise


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def kill_me_when_my_parent_dies() -> None:
    """Ask Linux to SIGKILL this process when its parent dies, even by SIGKILL (a no-op
    elsewhere). The request is tied to the parent's thread that started this process."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _die_with_parent(launcher_pid: int) -> None:
    """:func:`kill_me_when_my_parent_dies` in a rank, whose parent is the launcher (spawn) or
    the rank server, which Linux kills when the launcher dies (``rank_server_guard``)."""
    if not sys.platform.startswith("linux"):
        return
    kill_me_when_my_parent_dies()
    parent = os.getppid()
    if launcher_pid not in (parent, _parent_of(parent)):  # died before the request took effect
        os._exit(1)


class InheritedFd:
    """One of the launcher's file descriptors, duplicated into a rank when the rank starts (a
    forked rank would otherwise write to the rank server's stdout, not the launcher's)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        from multiprocessing.reduction import DupFd

        return (_detached, (DupFd(self.fd),))


def _detached(duplicate) -> int:
    return duplicate.detach()


def _inherited_types() -> tuple[type, ...]:
    """multiprocessing objects that only travel with the process start (locks, barriers...)."""
    from multiprocessing import queues, sharedctypes, synchronize

    return (
        synchronize.SemLock,
        synchronize.Condition,
        synchronize.Event,
        synchronize.Barrier,
        queues.Queue,
        queues.SimpleQueue,
        sharedctypes.SynchronizedBase,
    )


def rank_payloads(obj: Any, count: int) -> tuple[list[bytes], list]:
    """``obj`` pickled once per rank, its tensors as shared-memory handles each rank claims,
    and the multiprocessing objects in it (a barrier, a queue), which must go with the process
    start: ``(payloads, inherited)``; a rank rebuilds ``obj`` with :func:`load_payload`.

    Pickled here rather than by the process start so that a forkserver start, which passes at
    most ~250 file descriptors to a new process, never limits how many tensors a rank gets."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the shared-memory tensor reducers)

    inherited: list = []
    kinds = _inherited_types()

    class RankPickler(ForkingPickler):
        def persistent_id(self, value):
            if isinstance(value, kinds):
                inherited.append(value)
                return len(inherited) - 1
            return None

    payloads = []
    for _ in range(count):
        buffer = io.BytesIO()
        RankPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(obj)
        payloads.append(buffer.getvalue())
    return payloads, inherited


def load_payload(payload: bytes, inherited: list) -> Any:
    """The object of one of :func:`rank_payloads`' payloads, in the rank."""
    unpickler = pickle.Unpickler(io.BytesIO(payload))
    unpickler.persistent_load = inherited.__getitem__
    return unpickler.load()


def adopt_launcher_state(env: dict[str, str], stdio: tuple[int, int]) -> None:
    """Make a started rank see the launcher's environment and stdout/stderr as they are now
    (a spawned rank inherits them; a forked one would see the rank server's)."""
    os.environ.clear()
    os.environ.update(env)
    for fd, target in zip(stdio, (1, 2)):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)


def _rank_main(
    local_rank: int,
    state: dict[str, Any],
    launcher_pid: int,
    payloads: list[bytes],
    inherited: list,
) -> None:
    _die_with_parent(launcher_pid)
    adopt_launcher_state(state["env"], state["stdio"])
    os.environ["LOCAL_RANK"] = str(local_rank)
    node_rank = int(state["env"]["NODE_RANK"])
    adopt_launcher_logging(state["logging"], node_rank * len(payloads) + local_rank)
    if state["forked"]:  # before the payload, whose unpickling imports PyG
        check_cuda_after_fork()
    fn, args = load_payload(payloads[local_rank], inherited)
    fn(*args)


def check_cuda_after_fork() -> None:
    """Raise a clear error when this forked rank cannot use the machine's CUDA GPU because its
    parent had initialised the driver, rather than Lightning's "initialization error" later on.
    Any other CUDA failure (driver too old, say) is left to Lightning, as in a spawned rank."""
    import torch

    if torch.cuda.device_count() == 0:  # NVML where it can: initialises nothing
        return
    try:
        torch.cuda.init()
    except Exception as error:
        if "initialization error" not in str(error):
            return
        raise RuntimeError(
            f"this rank, forked from the rank server, cannot use CUDA ({error}): something the "
            f"server imported had initialised the CUDA driver. Start ranks as fresh "
            f"interpreters with launcher.start_method=spawn"
        ) from error


class RankStopped(RuntimeError):
    """A rank stopped answering (stopped by a signal: SIGSTOP, Ctrl-Z) and the job failed; the
    message names the stopped rank, not the rank whose collective with it then timed out."""


class LauncherSignal(RuntimeError):
    """The launcher was asked to stop (SIGTERM / SIGHUP); its ranks have been killed."""


@contextlib.contextmanager
def signals_raise(error: type[Exception] = LauncherSignal) -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into ``error`` so the cleanup below always runs."""

    def handler(signum, _frame):
        raise error(f"received {signal.Signals(signum).name}")

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread: leave the handlers alone
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def launch_local(
    fn: Callable[..., Any],
    args: tuple,
    devices: int,
    num_nodes: int,
    timeout_s: float | None = None,
    start_method: str = "forkserver",
) -> None:
    """Run ``fn(*args)`` once per local rank (``devices`` processes, forked from the warm rank
    server, or fresh interpreters with ``start_method="spawn"``).

    Raises the first failing rank's error, or :class:`RankStopped` (caused by it) when a rank
    was stopped by a signal as the job failed: the stopped rank is the cause, the failing one
    only timed out waiting for it. With ``timeout_s`` kills every rank and raises
    ``TimeoutError`` when the run takes longer (a deadlock fails instead of hanging).
    """
    if start_method not in START_METHODS:
        raise ValueError(f"start_method={start_method!r} is unknown; valid: {list(START_METHODS)}")
    import torch.multiprocessing as mp

    env = {
        **os.environ,
        "NODE_RANK": os.environ.get("NODE_RANK", "0"),
        "MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1"),
        "MASTER_PORT": os.environ.get("MASTER_PORT", str(free_port())),
        "WORLD_SIZE": str(devices * num_nodes),
    }
    if num_nodes == 1:  # every rank is ours: a fresh store secret per job, in the process start
        give_local_ranks_a_secret(env)
    # Every rank local: the launcher hosts the rendezvous store on loopback only (torch's own
    # listens on every interface); held in this frame until the ranks are reaped.
    store = None
    if num_nodes == 1 and "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ:
        from .comm.rendezvous import loopback_store

        store, env["MASTER_PORT"] = loopback_store()
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # ranks connect to it as clients
    if start_method == "forkserver":
        start_rank_server()
    state = {
        "env": env,
        "stdio": (InheritedFd(1), InheritedFd(2)),
        "forked": start_method == "forkserver",
        "logging": launcher_logging(),  # the run's train.log and console, rebuilt in each rank
    }
    ctx = None
    node = env["NODE_RANK"]  # checked by torch in the ranks: only names ranks here
    first_rank = int(node) * devices if node.isdigit() else 0
    stopped: dict[int, int] = {}  # local rank -> pid of each rank last seen stopped
    with signals_raise():
        try:
            ctx = mp.start_processes(
                _rank_main,
                args=(state, os.getpid(), *rank_payloads((fn, args), devices)),
                nprocs=devices,
                join=False,
                start_method=start_method,
            )
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            try:
                while not _join(ctx, stopped):
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(
                            f"run did not finish within launcher.timeout_s={timeout_s}s"
                            + "".join(f"; {line}" for line in _stopped_lines(stopped, first_rank))
                        )
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
                if not stopped:
                    raise
                failed = first_rank + error.error_index
                what = str(error).strip().splitlines()[-1] if str(error).strip() else "no message"
                raise RankStopped(
                    "; ".join(_stopped_lines(stopped, first_rank))
                    + f"; rank {failed} failed meanwhile: {what}"
                ) from error
        finally:
            for sig in (signal.SIGTERM, signal.SIGHUP):  # a second signal must not cut cleanup
                with contextlib.suppress(ValueError):
                    signal.signal(sig, signal.SIG_IGN)
            if ctx is not None:
                _reap(ctx)
            del store


def _join(ctx, stopped: dict[int, int]) -> bool:
    """``ctx.join`` with the grace (``RANK_EXIT_GRACE_S``), except that once a rank has failed
    a stopped rank (SIGSTOP) is killed at once: it can neither exit within the grace nor handle
    SIGTERM. It leaves torch's sentinels first, so the error ``ctx.join`` raises is still the
    failed rank's.

    ``stopped`` (local rank -> pid) is kept up to date with the ranks stopped now, before
    ``ctx.join`` looks for a failure: a rank that fails between the two checks is still seen
    with the stopped rank that made it fail (``ctx.join`` then kills it itself)."""
    import multiprocessing.connection

    multiprocessing.connection.wait(list(ctx.sentinels), timeout=1.0)
    for index in list(ctx.sentinels.values()):
        process = ctx.processes[index]
        if process.exitcode is None and _stopped(process.pid):
            stopped[index] = process.pid
        else:
            stopped.pop(index, None)  # continued (SIGCONT), or exited
    if any(process.exitcode not in (None, 0) for process in ctx.processes):
        for sentinel, index in list(ctx.sentinels.items()):
            if index in stopped:
                ctx.processes[index].kill()
                ctx.processes[index].join()
                del ctx.sentinels[sentinel]
    return ctx.join(timeout=0, grace_period=RANK_EXIT_GRACE_S)


def _stopped_lines(stopped: dict[int, int], first_rank: int) -> list[str]:
    """One line per stopped rank (``stopped``: local rank -> pid; ``first_rank``: the global
    rank of local rank 0), naming it by its global rank."""
    return [
        f"rank {first_rank + index} (pid {pid}) stopped answering: it was stopped by a signal "
        f"(SIGSTOP, or Ctrl-Z) and has been killed"
        for index, pid in sorted(stopped.items())
    ]


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (state ``T`` in ``/proc``; False elsewhere)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def _reap(ctx) -> None:
    """Kill and join every rank still alive; remove the error files torch leaves in /tmp."""
    for process in ctx.processes:
        if process.is_alive():
            process.kill()
    for process in ctx.processes:
        process.join(timeout=10)
    for error_file in ctx.error_files:
        if error_file:
            Path(error_file).unlink(missing_ok=True)
