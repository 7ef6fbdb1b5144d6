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

Nobody is served before they prove they hold the job's secret (``store_secret.py``): at connect
both sides send a fresh nonce and prove, by an HMAC-SHA256 of both nonces and both ranks under
the secret, that they know it (the requester only after the server has); a peer that fails, or
says nothing for :data:`HANDSHAKE_TIMEOUT_S`, is dropped with a logged reason. Past
:data:`MAX_PENDING_HANDSHAKES` connections authenticating at once, the oldest is dropped for the
newest, and a requester whose handshake is cut off tries again until its deadline: silent
connections can neither hold a rank's serving threads nor keep its peers out. Every frame is
checked against what the protocol can carry before anything is allocated: at most
:data:`MAX_TENSORS` tensors of at most :data:`MAX_NDIM` dimensions, a byte count that matches
the shape, and in all at most the caller's bound (a request: what the handler's
``request_bytes(kind)`` allows; an answer: what the requester said it can be). A frame past them
closes its connection (docs/systems/bytegnn.md, "Who may connect").
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import secrets
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
MAX_TENSORS = 8  # most tensors in one frame (ByteGNN's largest: 3)
MAX_NDIM = 4  # most dimensions of one tensor (ByteGNN's: 2)
MAX_ERROR_BYTES = 4096  # longest error message an answer carries
HANDSHAKE_TIMEOUT_S = 10.0  # a connection that has not authenticated by then is dropped
MAX_PENDING_HANDSHAKES = 64  # connections authenticating at once; past it the oldest is dropped
RETRY_FIRST_S, RETRY_MAX_S = 0.01, 0.5  # pauses between a requester's handshake attempts
DROP_LOG_INTERVAL_S = 1.0  # at most one warning a second about dropped connections
_MAGIC, _VERSION = b"GNST", 1
_HELLO = struct.Struct("!4sBHH32s")  # magic, version, rank, world size, nonce
_MAC_BYTES = hashlib.sha256().digest_size
_ACCEPTED = b"\x01"
HANDSHAKE_BYTES = 2 * _HELLO.size + 2 * _MAC_BYTES + len(_ACCEPTED)  # both ways, per connection

Handler = Callable[[int, list[Tensor]], tuple[list[Tensor], str]]
RequestBound = Callable[[int], "int | None"]  # request kind -> most payload bytes; None: unknown

log = logging.getLogger(__name__)


class TransportError(RuntimeError):
    """A request could not be sent, answered or served; the message names both ranks."""


class FrameRefused(ValueError):
    """A frame, or a handshake, that the protocol cannot legitimately carry."""


def _proof(secret: bytes, role: bytes, client_hello: bytes, server_hello: bytes) -> bytes:
    """HMAC-SHA256 under ``secret`` of ``role`` and both hellos (both nonces, both ranks)."""
    return hmac.new(secret, role + client_hello + server_hello, hashlib.sha256).digest()


def _hello(rank: int, world: int) -> bytes:
    return _HELLO.pack(_MAGIC, _VERSION, rank, world, secrets.token_bytes(32))


def _check_hello(data: bytes, world: int) -> int:
    """The rank a peer's hello claims; :class:`FrameRefused` if it is not one of this job's."""
    magic, version, rank, peer_world, _ = _HELLO.unpack(data)
    if magic != _MAGIC or version != _VERSION:
        raise FrameRefused(f"not a graph-store hello (magic {magic!r}, version {version})")
    if peer_world != world or rank >= world:
        raise FrameRefused(f"hello from rank {rank} of {peer_world}, but this job has {world}")
    return rank


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

    def frame(
        self, first_deadline: float | None, timeout_s: float, bound: Callable[[tuple], int]
    ) -> tuple[tuple, list[Tensor]]:
        """One frame; ``first_deadline`` applies to its first byte, ``timeout_s`` to the rest.
        ``bound(header)`` is the most payload bytes it may carry: every size is checked
        against it (and :func:`check_tensor_meta`) before its bytes are allocated."""
        header = _HEADER.unpack(self.exact(_HEADER.size, first_deadline))
        if header[1] > MAX_TENSORS:
            raise FrameRefused(f"a frame of {header[1]} tensors (at most {MAX_TENSORS})")
        budget = bound(header)
        deadline = time.monotonic() + timeout_s
        tensors = []
        for _ in range(header[1]):
            code, ndim = _TENSOR.unpack(self.exact(_TENSOR.size, deadline))
            if ndim > MAX_NDIM:
                raise FrameRefused(f"a tensor of {ndim} dimensions (at most {MAX_NDIM})")
            shape = [_DIM.unpack(self.exact(_DIM.size, deadline))[0] for _ in range(ndim)]
            (nbytes,) = _DIM.unpack(self.exact(_DIM.size, deadline))
            dtype = check_tensor_meta(code, shape, nbytes, budget)
            budget -= nbytes
            data = self.exact(nbytes, deadline)
            flat = torch.frombuffer(data, dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
            tensors.append(flat.reshape(shape))
        return header, tensors


def check_tensor_meta(code: int, shape: list[int], nbytes: int, budget: int) -> torch.dtype:
    """The dtype of an announced tensor whose ``nbytes`` match its ``shape`` and fit in
    ``budget`` bytes; :class:`FrameRefused` otherwise (nothing is allocated before this)."""
    if code >= len(_DTYPES):
        raise FrameRefused(f"unknown dtype code {code}")
    dtype = _DTYPES[code]
    if nbytes > budget:
        raise FrameRefused(f"a tensor of {nbytes} bytes announced; this frame may carry {budget}")
    count = 1
    for size in shape:
        count *= size
    if count * dtype.itemsize != nbytes:
        raise FrameRefused(f"shape {shape} of {dtype} does not take {nbytes} bytes")
    return dtype


class SocketTransport:
    """Each rank serves ``handler(kind, tensors) -> (answer tensors, answer category)`` on a
    TCP socket to the peers that prove they hold ``secret``; :meth:`request` asks a peer from
    any thread.

    Args:
        rank, topology: this rank and the ranks' servers (link classes for the meter).
        timeout_s: deadline of every blocking call (connect, send, answer).
        secret: the job's store secret (``store_secret.py``), the same on every rank.
        host: the address to listen on and to publish to the peers.
    """

    def __init__(
        self,
        rank: int,
        topology: Topology,
        timeout_s: float,
        secret: bytes,
        host: str = "127.0.0.1",
    ) -> None:
        if not isinstance(secret, bytes) or not secret:
            raise ValueError("the transport needs the job's store secret (non-empty bytes)")
        self.rank, self.topology, self.timeout_s, self.host = rank, topology, timeout_s, host
        self._secret = secret
        self.pending = CommMeter()  # counted, not yet flushed into the run's meter
        self._meter_lock = threading.Lock()
        self._closed = threading.Event()
        self._listener: socket.socket | None = None
        self._addresses: list[tuple[str, int]] = []
        self._advertised: list[int] = []
        self._idle: dict[int, list[socket.socket]] = {}
        self._pool_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._connections: list[socket.socket] = []
        self._handler: Handler | None = None
        self._request_bytes: RequestBound | None = None
        # connections accepted and not yet authenticated -> their address, oldest first (pool lock)
        self._handshaking: dict[socket.socket, object] = {}
        self._last_drop_log, self._drops_unlogged = -DROP_LOG_INTERVAL_S, 0

    # ---------------------------------------------------------------------------- set-up
    def start(
        self, handler: Handler, comm: Comm, request_bytes: RequestBound, advertise: int = 0
    ) -> None:
        """Listen, then learn every peer's address and advertised number (one all-gather
        through ``comm``, ``control``). ``request_bytes(kind)`` bounds the payload of a
        request of ``kind`` that this rank serves (``None``: no such kind); ``advertise`` is a
        number the peers read with :meth:`advertised` (ByteGNN: the rank's largest in-degree,
        which bounds its sampling answers). Collective: every rank calls it."""
        self._handler, self._request_bytes = handler, request_bytes
        self._listener = socket.create_server((self.host, 0))
        self._listener.settimeout(_POLL_S)
        port = self._listener.getsockname()[1]
        ip = struct.unpack("!I", socket.inet_aton(self.host))[0]
        mine = torch.tensor([[ip, port, advertise]], dtype=torch.int64)
        every = comm.all_gather_tensor(mine, category="control").view(-1, 3)
        self._addresses = [
            (socket.inet_ntoa(struct.pack("!I", int(a))), int(p)) for a, p, _ in every.tolist()
        ]
        self._advertised = [int(n) for _, _, n in every.tolist()]
        self._spawn(self._accept, "bytegnn-transport-accept")

    def advertised(self, peer: int) -> int:
        """The number ``peer`` advertised in :meth:`start`."""
        return self._advertised[peer]

    def _spawn(self, target, name: str, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        with self._pool_lock:  # finished threads go: many short connections leave no trail
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)

    # ---------------------------------------------------------------------------- serving
    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # listener closed
            with self._pool_lock:
                oldest = None
                if len(self._handshaking) >= MAX_PENDING_HANDSHAKES:
                    oldest = next(iter(self._handshaking))
                    oldest_address = self._handshaking.pop(oldest)
                self._handshaking[conn] = address
                self._connections.append(conn)
            if oldest is not None:  # its serving thread sees the shutdown and closes it
                self._log_drop(
                    oldest_address,
                    f"{MAX_PENDING_HANDSHAKES} connections authenticating, this the oldest",
                )
                with contextlib.suppress(OSError):
                    oldest.shutdown(socket.SHUT_RDWR)
            conn.settimeout(_POLL_S)
            try:
                self._spawn(self._serve, "bytegnn-transport-serve", conn, address)
            except RuntimeError as exc:  # no thread to be had: refuse this one, keep serving
                self._end_handshake(conn)
                self._drop(conn, address, f"no serving thread ({exc})")

    def _drop(self, conn: socket.socket, address, reason: str) -> None:
        """Close ``conn`` and log why (:meth:`_log_drop`)."""
        self._log_drop(address, reason)
        self._forget(conn)

    def _forget(self, conn: socket.socket) -> None:
        """Close ``conn`` and stop tracking it."""
        with self._pool_lock, contextlib.suppress(ValueError):
            self._connections.remove(conn)
        conn.close()

    def _log_drop(self, address, reason: str) -> None:
        """Log a dropped connection (at most one line per :data:`DROP_LOG_INTERVAL_S`, with
        the count of drops not logged since: a flood of connections floods no log)."""
        now = time.monotonic()
        with self._pool_lock:
            quiet = now - self._last_drop_log < DROP_LOG_INTERVAL_S
            if quiet:
                self._drops_unlogged += 1
            else:
                unlogged, self._drops_unlogged, self._last_drop_log = self._drops_unlogged, 0, now
        if not quiet:
            more = f" ({unlogged} more dropped since the last line)" if unlogged else ""
            log.warning(
                "rank %d: graph-store connection from %s dropped: %s%s",
                self.rank,
                address,
                reason,
                more,
            )

    def _end_handshake(self, conn: socket.socket) -> bool:
        """Take ``conn`` off the connections authenticating; ``False`` if it was not on them
        (dropped for a newer one, or already taken off)."""
        with self._pool_lock:
            return self._handshaking.pop(conn, None) is not None

    def _server_handshake(self, reader: _Reader, conn: socket.socket) -> int:
        """The rank the peer on ``conn`` proves to be; raises ``FrameRefused``, ``OSError``
        or ``ConnectionError`` otherwise, all within :data:`HANDSHAKE_TIMEOUT_S`."""
        deadline = time.monotonic() + min(HANDSHAKE_TIMEOUT_S, self.timeout_s)
        client_hello = bytes(reader.exact(_HELLO.size, deadline))
        peer = _check_hello(client_hello, self.topology.world_size)
        server_hello = _hello(self.rank, self.topology.world_size)
        mine = _proof(self._secret, b"server", client_hello, server_hello)
        conn.settimeout(max(0.0, deadline - time.monotonic()))
        conn.sendall(server_hello + mine)
        conn.settimeout(_POLL_S)
        theirs = bytes(reader.exact(_MAC_BYTES, deadline))
        if not hmac.compare_digest(
            theirs, _proof(self._secret, b"client", client_hello, server_hello)
        ):
            raise FrameRefused(f"a wrong proof from a peer claiming rank {peer} (another secret)")
        if not self._end_handshake(conn):  # dropped for a newer one: the requester retries
            raise ConnectionAbortedError("dropped for a newer connection")
        conn.sendall(_ACCEPTED)
        return peer

    def _serve(self, conn: socket.socket, address) -> None:
        reader = _Reader(conn, self._closed)
        try:
            peer = self._server_handshake(reader, conn)
        except (FrameRefused, OSError, ConnectionError) as exc:
            pending = self._end_handshake(conn)  # False: dropped for a newer one, logged then
            if pending and not self._closed.is_set():
                self._log_drop(address, f"not authenticated ({type(exc).__name__}: {exc})")
            self._forget(conn)
            return
        self._count("control", peer, _HELLO.size + _MAC_BYTES + len(_ACCEPTED))
        with conn:
            while not self._closed.is_set():
                try:
                    (kind, _, sender, _), tensors = reader.frame(
                        None, self.timeout_s, self._request_bound
                    )
                    if sender != peer:
                        raise FrameRefused(
                            f"a frame from rank {sender} on rank {peer}'s connection"
                        )
                except FrameRefused as exc:
                    self._drop(conn, address, f"rank {peer} sent a bad frame: {exc}")
                    return
                except (OSError, ConnectionError):
                    return  # the requester went away or we are closing
                try:
                    answer, category = self._handler(kind, tensors)
                    header, body = (_OK, len(answer), self.rank, 0), answer
                except Exception as exc:  # the requester raises it, naming this rank
                    message = f"{type(exc).__name__}: {exc}".encode()[:MAX_ERROR_BYTES]
                    header = (_ERROR, 1, self.rank, 0)
                    body, category = [torch.frombuffer(bytearray(message), dtype=torch.uint8)], None
                try:
                    sent = _send_frame(conn, header, body, self.timeout_s)
                except OSError:
                    return
                if category is not None:
                    self._count(category, peer, sent)

    def _request_bound(self, header: tuple) -> int:
        bound = self._request_bytes(header[0])
        if bound is None:
            raise FrameRefused(f"unknown request kind {header[0]}")
        return bound

    # ---------------------------------------------------------------------------- requests
    def request(
        self,
        peer: int,
        kind: int,
        tensors: Sequence[Tensor],
        category: str,
        answer_bytes: int,
    ) -> list[Tensor]:
        """Send ``tensors`` to ``peer``'s handler as request ``kind`` (counted under
        ``category``) and return its answer, whose payload may be at most ``answer_bytes``
        (a larger one is refused before it is read). Thread-safe; raises
        :class:`TransportError`."""
        if peer == self.rank:
            raise ValueError("a rank serves its own requests locally, not through the transport")
        check_category(category)
        if self._closed.is_set():
            raise TransportError(f"rank {self.rank}: the transport is closed")

        def bound(header: tuple) -> int:
            return MAX_ERROR_BYTES if header[0] == _ERROR else answer_bytes

        sock = None
        try:
            sock = self._connection(peer)
            sent = _send_frame(sock, (kind, len(tensors), self.rank, 0), tensors, self.timeout_s)
            self._count(category, peer, sent)
            deadline = time.monotonic() + self.timeout_s
            reader = _Reader(sock, self._closed)
            (status, _, _, _), answer = reader.frame(deadline, self.timeout_s, bound)
        except (OSError, ConnectionError, FrameRefused) as exc:
            if sock is not None:
                self._forget(sock)
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
        """A pooled connection to ``peer``, else a new, authenticated one. A handshake that
        the peer cuts off (it drops the oldest of too many authenticating: someone may be
        flooding it) is tried again, with growing pauses, until the deadline; a refused
        connect (nobody listening: the peer is gone) fails at once."""
        with self._pool_lock:
            idle = self._idle.get(peer)
            if idle:
                return idle.pop()
        deadline = time.monotonic() + self.timeout_s
        pause = RETRY_FIRST_S
        while True:
            sock = socket.create_connection(
                self._addresses[peer], timeout=max(0.0, deadline - time.monotonic())
            )
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._pool_lock:
                self._connections.append(sock)
            sock.settimeout(_POLL_S)
            try:
                self._client_handshake(sock, peer, deadline)
                return sock
            except BaseException as exc:
                self._forget(sock)
                cut_off = isinstance(exc, ConnectionError) and not self._closed.is_set()
                if not cut_off or time.monotonic() + pause > deadline:
                    raise
            self._closed.wait(pause)
            pause = min(2 * pause, RETRY_MAX_S)

    def _client_handshake(self, sock: socket.socket, peer: int, deadline: float) -> None:
        """Prove this rank holds the secret to ``peer``, after ``peer`` has proved it, by
        ``deadline`` (monotonic seconds)."""
        reader = _Reader(sock, self._closed)
        client_hello = _hello(self.rank, self.topology.world_size)
        sock.settimeout(self.timeout_s)
        sock.sendall(client_hello)
        sock.settimeout(_POLL_S)
        server_hello = bytes(reader.exact(_HELLO.size + _MAC_BYTES, deadline))
        server_hello, theirs = server_hello[: _HELLO.size], server_hello[_HELLO.size :]
        if _check_hello(server_hello, self.topology.world_size) != peer:
            raise FrameRefused(f"the server at rank {peer}'s address says it is another rank")
        if not hmac.compare_digest(
            theirs, _proof(self._secret, b"server", client_hello, server_hello)
        ):
            raise FrameRefused(
                f"rank {peer}'s server did not prove it holds this job's store secret"
            )
        sock.settimeout(self.timeout_s)
        sock.sendall(_proof(self._secret, b"client", client_hello, server_hello))
        sock.settimeout(_POLL_S)
        accepted = bytes(reader.exact(len(_ACCEPTED), deadline))
        if accepted != _ACCEPTED:
            raise FrameRefused(f"rank {peer} answered the handshake with {accepted!r}")
        self._count("control", peer, _HELLO.size + _MAC_BYTES)

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
