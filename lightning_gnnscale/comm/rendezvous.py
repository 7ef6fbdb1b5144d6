"""The rendezvous store of a run whose ranks all live on this machine."""

from __future__ import annotations

import socket
from datetime import timedelta

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
