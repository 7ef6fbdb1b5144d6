"""Start the ranks of one run on this machine.

Each rank runs the whole job function (like ``torchrun``), with ``LOCAL_RANK``, ``NODE_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` set so that Lightning finds an externally launched world
and never re-executes the command line. That keeps Hydra multirun sane: a ``-m`` sweep runs
its jobs in one process and each job spawns its own ranks (DESIGN §6). Under ``torchrun`` or
SLURM (``LOCAL_RANK`` set, or ``srun`` with one task per rank) the job function runs directly.

Tensors passed to the ranks (the graph) travel through shared memory, not copies.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
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


def _rank_main(local_rank: int, env: dict[str, str], fn: Callable, args: tuple) -> None:
    os.environ.update(env)
    os.environ["LOCAL_RANK"] = str(local_rank)
    fn(*args)


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
    ctx = mp.start_processes(
        _rank_main, args=(env, fn, args), nprocs=devices, join=False, start_method="spawn"
    )
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1.0):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run did not finish within launcher.timeout_s={timeout_s}s")
    finally:
        for process in ctx.processes:
            if process.is_alive():
                process.kill()
