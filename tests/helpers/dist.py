"""Run a function on N gloo ranks with a hard deadline, so a deadlock fails fast.

Ranks fork from the run's one warm rank server (``launch.start_rank_server``, started when the
session starts, see ``tests/conftest.py``): a rank starts in milliseconds instead of importing
torch, Lightning and PyG again. Like the launcher's ranks they see the test's environment, cwd
and stdout/stderr as they are when the ranks start."""

from __future__ import annotations

import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_gnnscale.launch import (
    InheritedFd,
    adopt_launcher_state,
    load_payload,
    rank_payloads,
    start_rank_server,
)
from lightning_gnnscale.store_secret import give_local_ranks_a_secret
from lightning_gnnscale.systems.registry import SYSTEMS

# What the tests' rank server preloads on top of the launcher's list: every system.
TEST_PRELOAD = tuple(module for spec in SYSTEMS.values() for module in spec.implementation)

_ERROR_GRACE_S = 2.0  # after a rank fails, how long to wait for the others' own errors


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def warm_context():
    """The multiprocessing context whose processes fork from the warm rank server."""
    start_rank_server(TEST_PRELOAD)
    return mp.get_context("forkserver")


def launcher_state() -> dict:
    """What a started process adopts (:func:`~lightning_gnnscale.launch.adopt_launcher_state`)."""
    return {"env": dict(os.environ), "stdio": (InheritedFd(1), InheritedFd(2))}


def _adopt(state, payload, inherited):
    adopt_launcher_state(state["env"], state["stdio"])
    return load_payload(payload, inherited)


def _call(state, fn, args) -> None:
    adopt_launcher_state(state["env"], state["stdio"])
    fn(*args)


def start_process(fn: Callable[..., Any], *args: Any):
    """``fn(*args)`` in one started (not joined) process of :func:`warm_context`; ``args``
    may hold that context's queues (pickled by the process start, not by :func:`rank_payloads`)."""
    process = warm_context().Process(target=_call, args=(launcher_state(), fn, args))
    process.start()
    return process


def _worker(rank, world_size, port, backend, timeout_s, state, payload, inherited, results) -> None:
    fn, args = _adopt(state, payload, inherited)
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        # Pickled here, so tensors travel by value rather than as shared-memory handles.
        results.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _stop(processes: list) -> None:
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=5)


# The rendezvous port is picked free, then bound by rank 0: another process (a test on the
# other xdist worker) can take it in between. Such a run never reached ``fn``: start it again.
_PORT_TAKEN = "EADDRINUSE"
_PORT_TRIES = 3


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 60,
    backend: str = "gloo",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return the results
    in rank order.

    ``fn`` must be a module-level (picklable) function and its results picklable. Each rank
    uses one thread and a process group with ``timeout_s``. A rank's exception is re-raised
    here as RuntimeError with its traceback; if the ranks do not all finish within
    ``timeout_s`` (start-up included) every process is killed and TimeoutError is raised.
    A run whose rendezvous port was taken before rank 0 bound it is started again (at most
    ``_PORT_TRIES`` times in all).
    """
    for attempt in range(1, _PORT_TRIES + 1):
        try:
            return _run_distributed_once(fn, world_size, args, timeout_s, backend)
        except _RendezvousPortTaken:
            if attempt == _PORT_TRIES:
                raise


class _RendezvousPortTaken(RuntimeError):
    """Rank 0 could not listen on the rendezvous port: no rank ran ``fn``."""


def _run_distributed_once(
    fn: Callable[..., Any], world_size: int, args: tuple, timeout_s: float, backend: str
) -> list[Any]:
    context = warm_context()
    results = context.Queue()
    port = free_port()
    state = launcher_state()
    give_local_ranks_a_secret(state["env"])  # as the launcher does: one per run
    payloads, inherited = rank_payloads((fn, args), world_size)
    processes = [
        context.Process(
            target=_worker,
            args=(
                rank,
                world_size,
                port,
                backend,
                timeout_s,
                state,
                payloads[rank],
                inherited,
                results,
            ),
        )
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout_s
    outputs: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        while len(outputs) + len(errors) < world_size:
            if errors:  # the rest get a short grace to report their own errors, then go
                deadline = min(deadline, time.monotonic() + _ERROR_GRACE_S)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if errors:
                    break
                raise TimeoutError(
                    f"{world_size} ranks did not finish within {timeout_s} s "
                    f"(finished: {sorted(outputs)}); killed them all"
                )
            try:
                rank, ok, payload = results.get(timeout=min(0.2, remaining))
            except queue.Empty:
                for rank, process in enumerate(processes):
                    crashed = process.exitcode not in (None, 0)
                    if crashed and rank not in outputs and rank not in errors:
                        errors[rank] = f"process exited with code {process.exitcode}"
                continue
            if ok:
                outputs[rank] = pickle.loads(payload)
            else:
                errors[rank] = payload
    finally:
        _stop(processes)
    if errors:
        details = "\n".join(f"--- rank {rank} ---\n{text}" for rank, text in sorted(errors.items()))
        error = f"{len(errors)} of {world_size} ranks failed:\n{details}"
        if _PORT_TAKEN in errors.get(0, "") and "init_process_group" in errors[0]:
            raise _RendezvousPortTaken(error)
        raise RuntimeError(error)
    return [outputs[rank] for rank in range(world_size)]
