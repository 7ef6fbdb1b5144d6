"""The process group's life: the rendezvous store of a run whose ranks all live on this machine,
and the end of a group a one-process run made in its own process."""

from __future__ import annotations

import socket
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import TCPStore


def loopback_store(timeout_s: float = 300.0) -> tuple[TCPStore, str]:
    """A rendezvous store listening on 127.0.0.1 only, and its port (torch's own store listens on
    every interface). The ranks connect to it as clients (``TORCHELASTIC_USE_AGENT_STORE``); the
    caller keeps the store alive until they are done."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    store = TCPStore(
        "127.0.0.1",
        port,
        None,
        True,
        timedelta(seconds=timeout_s),
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=listener.detach(),
    )
    return store, str(port)


def end_process_group() -> None:
    """Destroy this process's default process group, if any. A one-rank run of a DDP-based
    strategy makes one in the caller's own process (Lightning never destroys it); the next run
    there (a Hydra multirun job, a test) would otherwise find a stale world of 1."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
