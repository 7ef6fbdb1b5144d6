"""Run a function on N spawned gloo ranks with a hard deadline, so a deadlock fails fast."""

from __future__ import annotations

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

_ERROR_GRACE_S = 2.0  # after a rank fails, how long to wait for the others' own errors


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank, world_size, port, backend, timeout_s, fn, args, results) -> None:
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


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 60,
    backend: str = "gloo",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; return the results
    in rank order.

    ``fn`` must be a module-level (picklable) function and its results picklable. Each rank
    uses one thread and a process group with ``timeout_s``. A rank's exception is re-raised
    here as RuntimeError with its traceback; if the ranks do not all finish within
    ``timeout_s`` (start-up included) every process is killed and TimeoutError is raised.
    """
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [
        context.Process(
            target=_worker,
            args=(rank, world_size, port, backend, timeout_s, fn, args, results),
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
        raise RuntimeError(f"{len(errors)} of {world_size} ranks failed:\n{details}")
    return [outputs[rank] for rank in range(world_size)]
