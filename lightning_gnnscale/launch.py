"""Start the ranks of one run on this machine.

Each rank runs the whole job function (like ``torchrun``), with ``LOCAL_RANK``, ``NODE_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` set so that Lightning finds an externally launched world
and never re-executes the command line. That keeps Hydra multirun sane: a ``-m`` sweep runs
its jobs in one process and each job spawns its own ranks (docs/architecture.md, "Launching"). Under ``torchrun`` or
SLURM (``LOCAL_RANK`` set, or ``srun`` with one task per rank) the job function runs directly.

Tensors passed to the ranks (the graph) travel through shared memory, not copies.

No rank outlives its launcher: the launcher kills its ranks on every way out (return, error,
time-out, SIGINT, SIGTERM, SIGHUP), and on Linux each rank asks the kernel to kill it when the
launcher dies (even by SIGKILL), so a hung or stopped rank is never orphaned.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp


def externally_launched() -> bool:
    """True when the ranks already exist: torchrun or a manual launch (``LOCAL_RANK`` set), or
    an ``srun`` with several tasks (each task is one rank; Lightning reads ``SLURM_PROCID``)."""
    return "LOCAL_RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) > 1


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PR_SET_PDEATHSIG = 1
# Once a rank has failed, the others get this long to exit, then SIGTERM, then as long again
# before SIGKILL. torch's default (SIGTERM at once, SIGKILL 30 s later) kept a job with a
# stopped rank alive 30 s past its collective timeout: a stopped process ignores SIGTERM.
RANK_EXIT_GRACE_S = 5.0


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when the launcher dies (a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the launcher died before the request took effect
        os._exit(1)


def _rank_main(
    local_rank: int, env: dict[str, str], parent_pid: int, fn: Callable, args: tuple
) -> None:
    _die_with_parent(parent_pid)
    os.environ.update(env)
    os.environ["LOCAL_RANK"] = str(local_rank)
    fn(*args)


class LauncherSignal(RuntimeError):
    """The launcher was asked to stop (SIGTERM / SIGHUP); its ranks have been killed."""


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into an exception so the cleanup below always runs."""

    def handler(signum, _frame):
        raise LauncherSignal(f"launcher received {signal.Signals(signum).name}")

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
) -> None:
    """Run ``fn(*args)`` once per local rank (``devices`` processes, spawn start method).

    Raises the first failing rank's error; with ``timeout_s`` kills every rank and raises
    ``TimeoutError`` when the run takes longer (a deadlock fails instead of hanging).
    """
    env = {
        "NODE_RANK": os.environ.get("NODE_RANK", "0"),
        "MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1"),
        "MASTER_PORT": os.environ.get("MASTER_PORT", str(free_port())),
        "WORLD_SIZE": str(devices * num_nodes),
    }
    store = None  # every rank local: the launcher hosts the rendezvous store on loopback only
    if num_nodes == 1 and "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ:
        store, env["MASTER_PORT"] = _loopback_store()
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # ranks connect to it as clients
    ctx = None
    with _signals_raise():
        try:
            ctx = mp.start_processes(
                _rank_main,
                args=(env, os.getpid(), fn, args),
                nprocs=devices,
                join=False,
                start_method="spawn",
            )
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while not ctx.join(timeout=1.0, grace_period=RANK_EXIT_GRACE_S):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"run did not finish within launcher.timeout_s={timeout_s}s")
        finally:
            for sig in (signal.SIGTERM, signal.SIGHUP):  # a second signal must not cut cleanup
                with contextlib.suppress(ValueError):
                    signal.signal(sig, signal.SIG_IGN)
            if ctx is not None:
                _reap(ctx)


def _loopback_store():
    """A rendezvous store listening on 127.0.0.1 only (torch's own listens on every interface)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    store = TCPStore(
        "127.0.0.1",
        port,
        None,
        True,
        timedelta(seconds=300),
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=listener.detach(),
    )
    return store, str(port)


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
