"""A request/response transport over TCP sockets, for work that cannot run in lockstep.

Collectives need every rank to call them in the same order. ByteGNN's sampling tasks run on
threads, at any time, concurrently with training's gradient all-reduce, so they ask the owner
of a vertex directly: every rank serves requests on a socket (one serving thread per incoming
connection), and any thread sends a request and waits for the answer.

Frames are length-prefixed and carry tensors as raw bytes (dtype code, shape, data); nothing
is pickled. Every byte of tensor payload is counted: the requester counts its request, the
server its answer, each under the category the caller names and the link class of the two
ranks. The counts go to a private :class:`CommMeter` under a lock (threads count at any time);
:meth:`SocketTransport.flush` moves them into the run's meter from the thread that owns it.

Every blocking call has a deadline (the run's collective timeout): a dead peer shows up as a
:class:`TransportError` that names it, never as a hang.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from lightning_gnnscale.comm.audit import declare_transport_bytes
from lightning_gnnscale.comm.collectives import Comm
from lightning_gnnscale.comm.meter import CATEGORIES, CommMeter, check_category
from lightning_gnnscale.comm.topology import LINK_CLASSES, Topology

_DTYPES = (torch.int64, torch.float32, torch.float64, torch.uint8, torch.int32, torch.bool)
_CODE = {dtype: i for i, dtype in enumerate(_DTYPES)}
_HEADER = struct.Struct("!BBHH")  # status/kind, number of tensors, sender rank, category index
_TENSOR = struct.Struct("!BB")  # dtype code, ndim
_DIM = struct.Struct("!Q")
_OK, _ERROR = 0, 1
_POLL_S = 0.2  # how often idle serving threads look at the close flag

Handler = Callable[[int, list[Tensor]], tuple[list[Tensor], str]]


class TransportError(RuntimeError):
    """A request could not be sent, answered or served; the message names both ranks."""


def _send_frame(
    sock: socket.socket, header: tuple, tensors: Sequence[Tensor], timeout_s: float
) -> int:
    """Send one frame within ``timeout_s``; return its tensor payload bytes. (``sendall``'s
    timeout bounds the whole frame, so the idle sockets' short poll would drop any frame that
    the peer does not read within it.)"""
    parts, payload = [_HEADER.pack(*header)], 0
    for tensor in tensors:
        tensor = tensor.detach().contiguous().cpu()
        parts.append(_TENSOR.pack(_CODE[tensor.dtype], tensor.dim()))
        parts.extend(_DIM.pack(size) for size in tensor.shape)
        data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        parts.append(_DIM.pack(len(data)))
        parts.append(data)
        payload += len(data)
    sock.settimeout(timeout_s)
    try:
        sock.sendall(b"".join(parts))
    finally:
        sock.settimeout(_POLL_S)
    return payload


class _Reader:
    """Reads exact byte counts from a socket, polling so that a closing transport is noticed;
    past ``deadline`` (monotonic seconds, ``None``: none) it raises ``TimeoutError``."""

    def __init__(self, sock: socket.socket, closed: threading.Event) -> None:
        self.sock, self.closed = sock, closed

    def exact(self, n: int, deadline: float | None) -> bytearray:
        buf, got = bytearray(n), 0
        view = memoryview(buf)
        while got < n:
            if self.closed.is_set():
                raise ConnectionAbortedError("transport closed")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no data for the deadline ({got} of {n} bytes read)")
            try:
                k = self.sock.recv_into(view[got:], n - got)
            except TimeoutError:
                continue
            if k == 0:
                raise ConnectionResetError("peer closed the connection")
            got += k
        return buf

    def frame(self, first_deadline: float | None, timeout_s: float) -> tuple[tuple, list[Tensor]]:
        """One frame; ``first_deadline`` applies to its first byte, ``timeout_s`` to the rest."""
        header = _HEADER.unpack(self.exact(_HEADER.size, first_deadline))
        deadline = time.monotonic() + timeout_s
        tensors = []
        for _ in range(header[1]):
            code, ndim = _TENSOR.unpack(self.exact(_TENSOR.size, deadline))
            shape = [_DIM.unpack(self.exact(_DIM.size, deadline))[0] for _ in range(ndim)]
            (nbytes,) = _DIM.unpack(self.exact(_DIM.size, deadline))
            data = self.exact(nbytes, deadline)
            dtype = _DTYPES[code]
            flat = torch.frombuffer(data, dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
            tensors.append(flat.reshape(shape))
        return header, tensors


class SocketTransport:
    """Each rank serves ``handler(kind, tensors) -> (answer tensors, answer category)`` on a
    TCP socket; :meth:`request` asks a peer from any thread.

    Args:
        rank, topology: this rank and the ranks' servers (link classes for the meter).
        timeout_s: deadline of every blocking call (connect, send, answer).
        host: the address to listen on and to publish to the peers.
    """

    def __init__(
        self, rank: int, topology: Topology, timeout_s: float, host: str = "127.0.0.1"
    ) -> None:
        self.rank, self.topology, self.timeout_s, self.host = rank, topology, timeout_s, host
        self.pending = CommMeter()  # counted, not yet flushed into the run's meter
        self._meter_lock = threading.Lock()
        self._closed = threading.Event()
        self._listener: socket.socket | None = None
        self._addresses: list[tuple[str, int]] = []
        self._idle: dict[int, list[socket.socket]] = {}
        self._pool_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._connections: list[socket.socket] = []
        self._handler: Handler | None = None

    # ---------------------------------------------------------------------------- set-up
    def start(self, handler: Handler, comm: Comm) -> None:
        """Listen, then learn every peer's address (one all-gather through ``comm``,
        ``control``). Collective: every rank calls it."""
        self._handler = handler
        self._listener = socket.create_server((self.host, 0))
        self._listener.settimeout(_POLL_S)
        port = self._listener.getsockname()[1]
        ip = struct.unpack("!I", socket.inet_aton(self.host))[0]
        mine = torch.tensor([[ip, port]], dtype=torch.int64)
        every = comm.all_gather_tensor(mine, category="control").view(-1, 2)
        self._addresses = [
            (socket.inet_ntoa(struct.pack("!I", int(a))), int(p)) for a, p in every.tolist()
        ]
        self._spawn(self._accept, "bytegnn-transport-accept")

    def _spawn(self, target, name: str, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # ---------------------------------------------------------------------------- serving
    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # listener closed
            conn.settimeout(_POLL_S)
            with self._pool_lock:
                self._connections.append(conn)
            self._spawn(self._serve, "bytegnn-transport-serve", conn)

    def _serve(self, conn: socket.socket) -> None:
        reader = _Reader(conn, self._closed)
        with conn:
            while not self._closed.is_set():
                try:
                    (kind, _, peer, _), tensors = reader.frame(None, self.timeout_s)
                except (OSError, ConnectionError):
                    return  # the requester went away or we are closing
                try:
                    answer, category = self._handler(kind, tensors)
                    header, body = (_OK, len(answer), self.rank, 0), answer
                except Exception as exc:  # the requester raises it, naming this rank
                    message = f"{type(exc).__name__}: {exc}".encode()
                    header = (_ERROR, 1, self.rank, 0)
                    body, category = [torch.frombuffer(bytearray(message), dtype=torch.uint8)], None
                try:
                    sent = _send_frame(conn, header, body, self.timeout_s)
                except OSError:
                    return
                if category is not None:
                    self._count(category, peer, sent)

    # ---------------------------------------------------------------------------- requests
    def request(
        self, peer: int, kind: int, tensors: Sequence[Tensor], category: str
    ) -> list[Tensor]:
        """Send ``tensors`` to ``peer``'s handler as request ``kind`` (counted under
        ``category``) and return its answer. Thread-safe; raises :class:`TransportError`."""
        if peer == self.rank:
            raise ValueError("a rank serves its own requests locally, not through the transport")
        check_category(category)
        if self._closed.is_set():
            raise TransportError(f"rank {self.rank}: the transport is closed")
        sock = None
        try:
            sock = self._connection(peer)
            sent = _send_frame(sock, (kind, len(tensors), self.rank, 0), tensors, self.timeout_s)
            self._count(category, peer, sent)
            deadline = time.monotonic() + self.timeout_s
            (status, _, _, _), answer = _Reader(sock, self._closed).frame(deadline, self.timeout_s)
        except (OSError, ConnectionError) as exc:
            if sock is not None:
                sock.close()
            raise TransportError(
                f"rank {self.rank}: request {kind} to rank {peer} at "
                f"{self._addresses[peer] if self._addresses else '?'} failed "
                f"({type(exc).__name__}: {exc}); the peer may have died or stalled "
                f"(timeout {self.timeout_s:g} s)"
            ) from exc
        with self._pool_lock:
            self._idle.setdefault(peer, []).append(sock)
        if status == _ERROR:
            text = bytes(answer[0].numpy()).decode(errors="replace")
            raise TransportError(
                f"rank {peer} failed to serve request {kind} of rank {self.rank}: {text}"
            )
        return answer

    def _connection(self, peer: int) -> socket.socket:
        with self._pool_lock:
            idle = self._idle.get(peer)
            if idle:
                return idle.pop()
        sock = socket.create_connection(self._addresses[peer], timeout=self.timeout_s)
        sock.settimeout(_POLL_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._pool_lock:
            self._connections.append(sock)
        return sock

    # ---------------------------------------------------------------------------- metering
    def _count(self, category: str, peer: int, nbytes: int) -> None:
        with self._meter_lock:
            self.pending.record(category, self.topology.link_class(self.rank, peer), nbytes)

    def flush(self, meter: CommMeter) -> None:
        """Move the bytes counted since the last flush into ``meter`` (call it from the thread
        that owns ``meter``)."""
        with self._meter_lock:
            vector = self.pending.to_vector()
            self.pending.reset()
        half = len(vector) // 2
        width = len(LINK_CLASSES)
        for i, category in enumerate(CATEGORIES):
            for j, link in enumerate(LINK_CLASSES):
                nbytes, messages = vector[i * width + j], vector[half + i * width + j]
                if nbytes or messages:
                    meter.record(category, link, nbytes, messages)
                    declare_transport_bytes(category, nbytes)

    # ---------------------------------------------------------------------------- closing
    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving, close every socket and join the threads; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._listener is not None:
            self._listener.close()
        with self._pool_lock:
            connections, self._connections, self._idle = self._connections, [], {}
        for sock in connections:
            with contextlib.suppress(OSError):  # already closed by the peer
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        self._threads = []
        if alive:
            raise RuntimeError(f"transport threads did not stop within {timeout_s} s: {alive}")
