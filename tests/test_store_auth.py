"""Issue 37 item 3: ByteGNN's graph store serves only the job's ranks. A peer without the
job's secret gets no rows, an announced frame larger than the protocol carries is refused
before anything is allocated, a silent connection stalls nobody, and a run that needs a secret
from the user is refused before any rank starts."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import tracemalloc

import pytest
import torch

from lightning_gnnscale.comm import Topology
from lightning_gnnscale.comm import transport as tr
from lightning_gnnscale.config_types import DataConfig, RunFacts
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.store_secret import (
    SECRET_ENV,
    SECRET_FILE_ENV,
    give_local_ranks_a_secret,
    read_secret,
)
from lightning_gnnscale.systems.bytegnn.config import ByteGNNConfig

SECRET = b"the job's store secret, 32 bytes"
ROWS = torch.arange(40, dtype=torch.float32).view(10, 4)  # rank 0's "feature rows"
DEADLINE_S = 30.0  # generous: the machine is shared


class _Gather:
    """Stands in for ``Comm`` in ``SocketTransport.start``: both ranks get this rank's address."""

    def all_gather_tensor(self, tensor, category):
        return torch.cat([tensor, tensor])


@pytest.fixture
def server():
    """Rank 0 serving ``ROWS[ids]``; ``served`` counts the requests its handler answered."""
    served = []

    def handler(kind, tensors):
        served.append(kind)
        return [ROWS.index_select(0, tensors[0])], "feature"

    transport = tr.SocketTransport(0, Topology(2, 2), timeout_s=DEADLINE_S, secret=SECRET)
    transport.start(handler, _Gather(), lambda kind: 10 * 8 if kind == 2 else None)
    transport.served = served
    yield transport
    transport.close()


def _client(server, secret=SECRET):
    client = tr.SocketTransport(1, Topology(2, 2), timeout_s=DEADLINE_S, secret=secret)
    client._addresses, client._advertised = server._addresses, server._advertised
    return client


def _ask(client, ids=(1, 3)):
    ids = torch.tensor(ids)
    return client.request(0, 2, [ids], "structure", len(ids) * ROWS.shape[1] * 4)


def _recv_all(sock: socket.socket, deadline_s: float = DEADLINE_S) -> bytes:
    """Everything the peer sends until it closes (within ``deadline_s``)."""
    sock.settimeout(deadline_s)
    data = b""
    try:
        while chunk := sock.recv(1 << 16):
            data += chunk
    except ConnectionResetError:  # closed with our bytes unread
        pass
    return data


def _frame(kind: int, ids: torch.Tensor, sender: int = 1) -> bytes:
    """A request frame as the transport writes it."""
    data = ids.numpy().tobytes()
    return (
        tr._HEADER.pack(kind, 1, sender, 0)
        + tr._TENSOR.pack(0, 1)
        + struct.pack("!Q", ids.numel())
        + struct.pack("!Q", len(data))
        + data
    )


def _authenticated_socket(server) -> socket.socket:
    """A raw connection that completed the handshake with the right secret."""
    sock = socket.create_connection(server._addresses[0], timeout=DEADLINE_S)
    hello = tr._hello(1, 2)
    sock.sendall(hello)
    reply = b""
    while len(reply) < tr._HELLO.size + tr._MAC_BYTES:
        reply += sock.recv(tr._HELLO.size + tr._MAC_BYTES - len(reply))
    sock.sendall(tr._proof(SECRET, b"client", hello, reply[: tr._HELLO.size]))
    assert sock.recv(1) == tr._ACCEPTED
    return sock


def test_the_job_s_ranks_exchange_rows_and_count_the_handshake(server):
    client = _client(server)
    try:
        (rows,) = _ask(client)
        assert torch.equal(rows, ROWS[[1, 3]])
        (rows,) = _ask(client, (0,))  # the pooled connection: no second handshake
        assert torch.equal(rows, ROWS[[0]])
        control = [
            t.pending.snapshot()["category_link_bytes"]["control"]["intra_server"]
            for t in (client, server)
        ]
        assert sum(control) == tr.HANDSHAKE_BYTES
    finally:
        client.close()


def test_a_client_that_does_not_authenticate_gets_no_rows(server):
    """The issue's 20-byte request, sent without a handshake: dropped, the handler not run."""
    with socket.create_connection(server._addresses[0], timeout=DEADLINE_S) as sock:
        request = _frame(2, torch.tensor([1, 3]))
        sock.sendall(request + bytes(tr._HELLO.size))  # enough bytes for a hello
        assert _recv_all(sock) == b""  # closed without a byte
    assert server.served == []


def test_a_client_with_a_wrong_secret_gets_no_rows(server):
    client = _client(server, secret=b"some other secret of enough bytes")
    try:
        with pytest.raises(tr.TransportError, match="did not prove it holds"):
            _ask(client)
    finally:
        client.close()
    # a client that ignores the server's proof and guesses its own is dropped
    with socket.create_connection(server._addresses[0], timeout=DEADLINE_S) as sock:
        sock.sendall(tr._hello(1, 2))
        sock.recv(tr._HELLO.size + tr._MAC_BYTES)
        sock.sendall(os.urandom(tr._MAC_BYTES) + _frame(2, torch.tensor([1, 3])))
        assert _recv_all(sock) == b""
    assert server.served == []


def test_a_server_without_the_secret_is_refused_by_the_client(monkeypatch):
    """A rank never sends its request (ids) to a server that cannot prove the secret."""
    impostor = tr.SocketTransport(0, Topology(2, 2), timeout_s=DEADLINE_S, secret=b"x" * 32)
    impostor.start(lambda kind, tensors: ([ROWS], "feature"), _Gather(), lambda kind: 80)
    client = _client(impostor)
    opened, create_connection = [], socket.create_connection

    def connect(*args, **kwargs):
        opened.append(create_connection(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(tr.socket, "create_connection", connect)
    try:
        with pytest.raises(tr.TransportError, match="did not prove it holds"):
            _ask(client)
        # review bug 2: the failed handshake's socket is closed and forgotten, not leaked
        assert len(opened) == 1 and opened[0].fileno() == -1 and client._connections == []
    finally:
        client.close()
        impostor.close()


def test_an_oversized_frame_is_refused_before_anything_is_allocated():
    """The issue's 30-byte frame announcing 3.5e9 bytes: refused from its sizes alone."""
    left, right = socket.socketpair()
    announced = 3_500_000_000
    left.sendall(
        tr._HEADER.pack(2, 1, 1, 0)
        + tr._TENSOR.pack(3, 1)  # uint8
        + struct.pack("!Q", announced)
        + struct.pack("!Q", announced)
    )
    right.settimeout(tr._POLL_S)
    tracemalloc.start()
    try:
        with pytest.raises(tr.FrameRefused, match="3500000000 bytes announced; .* carry 80"):
            tr._Reader(right, threading.Event()).frame(None, DEADLINE_S, lambda header: 80)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        left.close()
        right.close()
    assert peak < 1 << 20
    for code, shape, nbytes, match in (
        (9, [1], 1, "unknown dtype"),
        (0, [2], 8, "does not take 8 bytes"),  # two int64 are 16 bytes
    ):
        with pytest.raises(tr.FrameRefused, match=match):
            tr.check_tensor_meta(code, shape, nbytes, 1 << 20)


def test_a_peer_s_oversized_frame_closes_its_connection_not_the_rank(server):
    """An authenticated peer announcing more ids than rank 0 owns is dropped; others are
    still served. A requester refuses an answer larger than it asked for."""
    with _authenticated_socket(server) as sock:
        sock.sendall(_frame(2, torch.arange(11)))  # 11 ids: rank 0 serves at most 10
        assert _recv_all(sock) == b""
    assert server.served == []
    client = _client(server)
    try:
        assert torch.equal(_ask(client)[0], ROWS[[1, 3]])
        with pytest.raises(tr.TransportError, match="this frame may carry 16"):
            client.request(0, 2, [torch.tensor([1, 3])], "structure", 16)
    finally:
        client.close()


def test_a_silent_client_stalls_nobody_and_is_dropped(server, monkeypatch):
    monkeypatch.setattr(tr, "HANDSHAKE_TIMEOUT_S", 0.5)
    silent = [socket.create_connection(server._addresses[0], timeout=DEADLINE_S) for _ in range(3)]
    client = _client(server)
    try:
        started = time.monotonic()
        assert torch.equal(_ask(client)[0], ROWS[[1, 3]])  # while the silent ones wait
        for sock in silent:
            assert _recv_all(sock) == b""  # the server gave up on them
        assert time.monotonic() - started < DEADLINE_S
        assert torch.equal(_ask(client, (2,))[0], ROWS[[2]])
    finally:
        client.close()
        for sock in silent:
            sock.close()


def test_silent_connections_past_the_handshake_limit_keep_no_rank_out(server, monkeypatch):
    """Review bug 1: silent connections filling MAX_PENDING_HANDSHAKES once made every new
    connection be closed at accept, so a rank's request failed (a crash, not a stall). Now the
    oldest silent one is dropped for the newest, and the job's rank is served."""
    monkeypatch.setattr(tr, "MAX_PENDING_HANDSHAKES", 2)
    monkeypatch.setattr(tr, "HANDSHAKE_TIMEOUT_S", 3 * DEADLINE_S)  # the server's: DEADLINE_S
    silent = [socket.create_connection(server._addresses[0], timeout=DEADLINE_S) for _ in range(2)]
    client = _client(server)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(server._handshaking) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert torch.equal(_ask(client)[0], ROWS[[1, 3]])
        assert _recv_all(silent[0], DEADLINE_S / 3) == b""  # the oldest made room
    finally:
        client.close()
        for sock in silent:
            sock.close()


def test_a_handshake_the_server_cuts_off_is_tried_again(server, monkeypatch):
    """The requester's side of bug 1: a handshake reset by the peer (it dropped this one for
    a newer connection) is retried within the deadline instead of failing the rank."""
    handshake, cut = server._server_handshake, []

    def first_one_cut_off(reader, conn):
        if not cut:
            cut.append(conn)
            raise ConnectionAbortedError("dropped for a newer connection")
        return handshake(reader, conn)

    monkeypatch.setattr(server, "_server_handshake", first_one_cut_off)
    client = _client(server)
    try:
        assert torch.equal(_ask(client)[0], ROWS[[1, 3]])
        assert len(cut) == 1
    finally:
        client.close()


# ------------------------------------------------------------------ where the secret comes from

MULTI_NODE = RunFacts(world_size=4, devices=2, num_nodes=2, data=DataConfig(batch_size=64))


def _no_secret(monkeypatch):
    for name in (SECRET_ENV, SECRET_FILE_ENV):
        monkeypatch.delenv(name, raising=False)


def test_a_multi_node_run_without_a_secret_is_refused_saying_how_to_set_one(monkeypatch):
    _no_secret(monkeypatch)
    with pytest.raises(ConfigError, match=f"store secret from you: set {SECRET_ENV}"):
        ByteGNNConfig().check_run(MULTI_NODE)
    monkeypatch.setenv(SECRET_ENV, "short")
    with pytest.raises(ConfigError, match="holds 5 bytes; .* at least 16"):
        ByteGNNConfig().check_run(MULTI_NODE)
    monkeypatch.setenv(SECRET_ENV, "s" * 16)
    ByteGNNConfig().check_run(MULTI_NODE)
    monkeypatch.setenv("LOCAL_RANK", "0")  # torchrun on one node: the user's secret too
    _no_secret(monkeypatch)
    with pytest.raises(ConfigError, match=SECRET_ENV):
        ByteGNNConfig().check_run(RunFacts(2, 2, 1, DataConfig(batch_size=64)))


def test_a_secret_file_must_be_private_to_this_user(monkeypatch, tmp_path):
    _no_secret(monkeypatch)
    path = tmp_path / "secret"
    path.write_bytes(b"0123456789abcdef0123\n")
    monkeypatch.setenv(SECRET_FILE_ENV, str(path))
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="mode 0644: others can read it; chmod 600"):
        read_secret()
    path.chmod(0o600)
    assert read_secret() == b"0123456789abcdef0123"
    link = tmp_path / "link"
    link.symlink_to(path)
    monkeypatch.setenv(SECRET_FILE_ENV, str(link))
    with pytest.raises(ConfigError, match="not a link"):
        read_secret()
    monkeypatch.setenv(SECRET_ENV, "s" * 16)
    with pytest.raises(ConfigError, match="give one"):
        read_secret()


def test_local_ranks_get_a_fresh_secret_per_job_and_plain_scripts_one_to_pass_on(monkeypatch):
    from lightning_gnnscale.systems.bytegnn.strategy import ByteGNNStrategy

    env = {SECRET_ENV: "the user's, for every job", SECRET_FILE_ENV: "/some/file"}
    give_local_ranks_a_secret(env)
    first = env[SECRET_ENV]
    give_local_ranks_a_secret(env)
    assert SECRET_FILE_ENV not in env and first != env[SECRET_ENV] and len(first) == 64
    for name in (SECRET_ENV, SECRET_FILE_ENV, "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    strategy = ByteGNNStrategy()
    strategy.num_nodes = 1  # what the Trainer does before it starts the other ranks
    assert len(read_secret()) == 64  # they start with this environment
    # review risk 6: Trainer(num_nodes=2) with neither NODE_RANK nor MASTER_ADDR set made a
    # secret per node (the ranks then failed mid-run); now it is withdrawn, and the run is
    # refused saying how to set one
    strategy.num_nodes = 2
    assert read_secret() is None
    ByteGNNStrategy().num_nodes = 2
    assert read_secret() is None
    monkeypatch.setenv(SECRET_ENV, "the user's secret, every node")
    ByteGNNStrategy().num_nodes = 2  # the user's is the user's: never withdrawn
    assert read_secret() == b"the user's secret, every node"


def test_the_cluster_gives_every_host_the_job_s_secret(monkeypatch, tmp_path):
    from lightning_gnnscale.cluster import ClusterJob, EmulatedCluster
    from lightning_gnnscale.cluster.job import check_overrides

    _no_secret(monkeypatch)
    job = ClusterJob(2, None, ["strategy=bytegnn"], run_dir=tmp_path)
    check_overrides(job)  # validated as the hosts will run it: with the job's secret
    assert SECRET_ENV not in os.environ
    cluster = EmulatedCluster(2, prefix="tsec")
    secrets = {job.host_env(cluster, host, 1)[SECRET_ENV] for host in (0, 1)}
    assert secrets == {job.store_secret} and len(job.store_secret) == 64
    assert job.store_secret != ClusterJob(2, None, [], run_dir=tmp_path).store_secret
