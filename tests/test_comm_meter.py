"""CommMeter, Topology, NetworkModel and the byte counts of every metered collective."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lightning_gnnscale.comm import (
    CATEGORIES,
    INTER_SERVER,
    INTRA_SERVER,
    PROFILES,
    CollectiveRecorder,
    Comm,
    CommMeter,
    NetworkModel,
    Topology,
    diff_snapshots,
    ring_allreduce_bytes,
    sum_snapshots,
)
from tests.helpers.dist import run_distributed

# ---------------------------------------------------------------- single process


def test_categories_are_the_documented_set():
    assert CATEGORIES == (
        "feature",
        "activation",
        "activation_grad",
        "gradient",
        "parameter",
        "structure",
        "control",
    )


def test_unknown_category_lists_the_valid_ones():
    meter = CommMeter()
    with pytest.raises(ValueError, match="activation_grad"):
        meter.record("weights", INTRA_SERVER, 10)
    with pytest.raises(ValueError, match="unknown comm category 'x'"):
        Comm.local().all_reduce(torch.ones(2), category="x")


def test_meter_counts_per_peer_without_self_and_empty_sends():
    meter = CommMeter()
    links = Topology(4, 2).peer_link_classes(1)  # (intra, None, inter, inter)
    meter.record_per_peer("activation", [5, 100, 0, 7], links)
    meter.record("gradient", INTER_SERVER, 40, messages=2)
    snap = meter.snapshot()
    assert snap["bytes"]["activation"] == 12 and snap["messages"]["activation"] == 2
    assert snap["category_link_bytes"]["activation"] == {INTRA_SERVER: 5, INTER_SERVER: 7}
    assert snap["link_bytes"] == {INTRA_SERVER: 5, INTER_SERVER: 47}
    assert snap["link_messages"] == {INTRA_SERVER: 1, INTER_SERVER: 3}
    assert json.loads(json.dumps(snap)) == snap


def test_snapshot_delta_sum_and_reset():
    meter = CommMeter()
    meter.record("feature", INTRA_SERVER, 10)
    before = meter.snapshot()
    meter.record("feature", INTRA_SERVER, 5)
    meter.record("control", INTER_SERVER, 8)
    delta = meter.delta(before)
    assert delta["bytes"]["feature"] == 5 and delta["bytes"]["control"] == 8
    assert delta["messages"]["feature"] == 1
    total = sum_snapshots([before, delta])
    assert total == meter.snapshot()
    assert diff_snapshots(total, delta) == before
    meter.reset()
    assert sum(meter.snapshot()["bytes"].values()) == 0


def test_topology_validation_and_link_classes():
    topology = Topology(4, 2)
    assert topology.num_servers == 2
    assert [topology.server_of(r) for r in range(4)] == [0, 0, 1, 1]
    assert topology.link_class(0, 1) == INTRA_SERVER
    assert topology.link_class(1, 2) == INTER_SERVER
    assert topology.peer_link_classes(2) == (INTER_SERVER, INTER_SERVER, None, INTRA_SERVER)
    with pytest.raises(ValueError):
        Topology(4, 3)
    with pytest.raises(ValueError):
        Topology(0, 1)
    with pytest.raises(ValueError):
        topology.link_class(3, 3)
    assert Topology.from_launch(4, num_nodes=2) == Topology(4, 2)
    assert Topology.from_launch(4, num_nodes=1, servers=4) == Topology(4, 1)
    with pytest.raises(ValueError):
        Topology.from_launch(4, servers=3)


def test_ring_model():
    assert ring_allreduce_bytes(1000, 2) == 1000
    assert ring_allreduce_bytes(900, 3) == 1200
    assert ring_allreduce_bytes(1000, 1) == 0


def test_network_model_arithmetic():
    model = NetworkModel("test", 1e3, 0.5, 1e2, 2.0)
    meter = CommMeter()
    meter.record("feature", INTRA_SERVER, 2000, messages=3)
    meter.record("gradient", INTER_SERVER, 300, messages=1)
    # 2000/1e3 + 3*0.5 + 300/1e2 + 1*2.0
    assert model.modeled_time(meter.snapshot()) == pytest.approx(2 + 1.5 + 3 + 2)
    assert set(PROFILES) == {"10gbe", "25gbe", "100gbe", "nvlink", "100mbe", "1gbe"}
    assert NetworkModel.from_name("100mbe").inter_bandwidth == pytest.approx(100e6 / 8)
    assert NetworkModel.from_name("10gbe").inter_bandwidth == pytest.approx(1.25e9)
    nvlink = NetworkModel.from_name("nvlink")
    assert nvlink.intra_bandwidth > 10 * nvlink.inter_bandwidth
    with pytest.raises(ValueError, match="'10gbe', '25gbe', '100gbe', 'nvlink'"):
        NetworkModel.from_name("infiniband")


class _GatherWork:
    """A finished work handle, as ``_all_gather_into`` returns with ``async_op``."""

    def __init__(self, error: Exception | None = None):
        self.future = torch.futures.Future()
        if error is None:
            self.future.set_result(None)
        else:
            self.future.set_exception(error)

    def get_future(self):
        return self.future


def _two_rank_comm(monkeypatch, gather) -> Comm:
    """Rank 0 of two on one process; the all-gather of the gather path replaced by ``gather``."""
    from lightning_gnnscale.comm import collectives

    monkeypatch.setattr(collectives, "_all_gather_into", gather)
    return Comm(CommMeter(), Topology(2, 2), rank=0)


def test_gathered_all_reduce_raises_when_its_all_gather_fails(monkeypatch):
    comm = _two_rank_comm(monkeypatch, lambda *args: _GatherWork(RuntimeError("peer lost")))
    future = comm.all_reduce(torch.ones(100), category="gradient", async_op=True)
    with pytest.raises(RuntimeError, match="peer lost"):
        future.wait()


def test_gathered_all_reduce_updates_inference_tensors_and_leaves_in_place(monkeypatch):
    def gather_two_copies(output, tensor, group, async_op=False):
        output.copy_(tensor.repeat(2))  # both ranks hold the same tensor
        return _GatherWork() if async_op else None

    comm = _two_rank_comm(monkeypatch, gather_two_copies)
    with torch.inference_mode():
        frozen = torch.ones(100)
    leaf = torch.ones(100, requires_grad=True)
    assert torch.equal(comm.all_reduce(frozen, category="gradient"), torch.full((100,), 2.0))
    comm.all_reduce(leaf, category="gradient", async_op=True).wait()
    assert torch.equal(leaf.detach(), torch.full((100,), 2.0))


def test_local_comm_is_a_counting_free_no_op():
    comm = Comm.local()
    x = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(comm.all_to_all_single(x, [3], category="activation"), x)
    assert torch.equal(comm.all_gather_tensor(x, category="feature"), x)
    gathered, sizes = comm.all_gather_varlen(x, category="feature")
    assert torch.equal(gathered, x) and sizes == [3]
    assert torch.equal(comm.gather_varlen(x, category="parameter"), x)
    assert torch.equal(comm.all_reduce(x.clone(), "max", category="gradient"), x)
    assert torch.equal(comm.all_reduce(x, category="gradient", async_op=True).wait(), x)
    assert torch.equal(comm.broadcast(x, 0, category="parameter"), x)
    comm.barrier()
    assert comm.meter.to_vector() == [0] * len(comm.meter.to_vector())
    assert comm.reduce_meter() == comm.meter.snapshot()
    with pytest.raises(ValueError, match="send_splits"):
        comm.all_to_all_single(x, [2], category="activation")
    with pytest.raises(ValueError, match="dst=1 outside"):
        comm.gather_varlen(x, 1, category="parameter")
    assert Comm.create().world_size == 1  # torch.distributed not initialised here


# ---------------------------------------------------------------- several ranks

WIDTH = 3  # float64 columns of the all-to-all payload


def _rows(src: int, dst: int) -> int:
    """Rows rank ``src`` sends to ``dst``: uneven, some zero, the self chunk non-empty."""
    return (src + 2 * dst + 1) % 3


def _collectives_case(rank: int, world_size: int, workers_per_server: int) -> dict:
    """Issue every metered collective once; return this rank's meter delta after each."""
    comm = Comm.create(CommMeter(), Topology(world_size, workers_per_server), timeout_s=30)
    deltas = {}

    def step(name, action):
        before = comm.meter.snapshot()
        result = action()
        deltas[name] = comm.meter.delta(before)
        return result

    send = [_rows(rank, q) for q in range(world_size)]
    recv = [_rows(q, rank) for q in range(world_size)]
    x = torch.arange(sum(send) * WIDTH, dtype=torch.float64).reshape(-1, WIDTH) + 1000 * rank
    received = step("a2a", lambda: comm.all_to_all_single(x, send, recv, category="activation"))
    auto = step("a2a_auto", lambda: comm.all_to_all_single(x, send, category="feature"))
    expected_rows = []
    for q in range(world_size):
        sent_by_q = sum(_rows(q, d) for d in range(world_size))
        start = sum(_rows(q, d) for d in range(rank))
        rows = torch.arange(sent_by_q * WIDTH, dtype=torch.float64).reshape(-1, WIDTH) + 1000 * q
        expected_rows.append(rows[start : start + _rows(q, rank)])
    assert torch.equal(received, torch.cat(expected_rows))
    assert torch.equal(auto, received)

    chunk = torch.full((2, 2), rank)
    gathered = step("gather", lambda: comm.all_gather_tensor(chunk, category="structure"))
    assert gathered[::2, 0].tolist() == list(range(world_size))
    varlen = torch.full((rank, 4), float(rank))  # rank 0 contributes no rows
    gathered, sizes = step("varlen", lambda: comm.all_gather_varlen(varlen, category="feature"))
    assert sizes == list(range(world_size))
    assert gathered[:, 0].tolist() == [float(q) for q in range(world_size) for _ in range(q)]
    summed = torch.full((10,), rank + 1.0, dtype=torch.float64)
    step("all_reduce", lambda: comm.all_reduce(summed, category="gradient"))
    assert summed.tolist() == [world_size * (world_size + 1) / 2] * 10
    # 100 elements: two ranks reduce them by an all-gather (GATHER_REDUCE_ELEMENTS).
    mid = torch.arange(100, dtype=torch.float64) * (rank + 1)
    step("all_reduce_mid", lambda: comm.all_reduce(mid, category="gradient"))
    assert torch.equal(mid, torch.arange(100, dtype=torch.float64) * sum(range(1, world_size + 1)))
    # Integers, product, a non-contiguous view (every other element of 256).
    strided = torch.full((256,), rank + 2, dtype=torch.int64)[::2]
    step("all_reduce_int", lambda: comm.all_reduce(strided, "product", category="gradient"))
    assert strided.tolist() == [math.prod(range(2, world_size + 2))] * 128
    peaks = torch.arange(100, dtype=torch.float64) * (-1) ** rank
    step(
        "all_reduce_max",
        lambda: comm.all_reduce(peaks, "max", category="gradient", async_op=True).wait(),
    )
    assert torch.equal(peaks, torch.arange(100, dtype=torch.float64))
    source = torch.full((5,), float(rank))
    step("broadcast", lambda: comm.broadcast(source, world_size - 1, category="parameter"))
    assert source.tolist() == [world_size - 1.0] * 5
    step("barrier", comm.barrier)
    before_reduce = comm.meter.snapshot()
    total = comm.reduce_meter()
    assert comm.meter.snapshot() == before_reduce  # reducing the meter is not counted
    return {"deltas": deltas, "total": total, "own": before_reduce}


def _expected(rank: int, world_size: int, workers_per_server: int) -> dict:
    """Hand count of ``_collectives_case`` for one rank: name -> {(category, link): (bytes, msgs)}."""
    topology = Topology(world_size, workers_per_server)
    peers = [q for q in range(world_size) if q != rank]

    def to_peers(category, bytes_of_peer):
        counts = {}
        for q in peers:
            if bytes_of_peer(q):
                key = (category, topology.link_class(rank, q))
                nbytes, messages = counts.get(key, (0, 0))
                counts[key] = (nbytes + bytes_of_peer(q), messages + 1)
        return counts

    def a2a_bytes(q):
        return _rows(rank, q) * WIDTH * 8

    successor = topology.link_class(rank, (rank + 1) % world_size)
    mid_reduce = (
        to_peers("gradient", lambda q: 100 * 8)  # all-gather: the tensor to the peer, once
        if world_size == 2
        else {
            ("gradient", successor): (ring_allreduce_bytes(800, world_size), 2 * (world_size - 1))
        }
    )
    return {
        "a2a": to_peers("activation", a2a_bytes),
        "a2a_auto": {**to_peers("control", lambda q: 8), **to_peers("feature", a2a_bytes)},
        "gather": to_peers("structure", lambda q: 2 * 2 * 8),
        "varlen": {
            **to_peers("control", lambda q: 8),
            **to_peers("feature", lambda q: rank * 4 * 4),
        },
        "all_reduce": {
            ("gradient", successor): (ring_allreduce_bytes(80, world_size), 2 * (world_size - 1))
        },
        "all_reduce_mid": mid_reduce,
        "all_reduce_max": mid_reduce,
        "all_reduce_int": (
            to_peers("gradient", lambda q: 128 * 8)
            if world_size == 2
            else {
                ("gradient", successor): (
                    ring_allreduce_bytes(1024, world_size),
                    2 * (world_size - 1),
                )
            }
        ),
        "broadcast": to_peers("parameter", lambda q: 5 * 4 if rank == world_size - 1 else 0),
        "barrier": {},
    }


def _as_counts(snapshot: dict) -> dict:
    return {
        (category, link): (nbytes, snapshot["category_link_messages"][category][link])
        for category, by_link in snapshot["category_link_bytes"].items()
        for link, nbytes in by_link.items()
        if nbytes or snapshot["category_link_messages"][category][link]
    }


@pytest.mark.dist
@pytest.mark.parametrize("world_size, workers_per_server", [(2, 1), (3, 3), (4, 2)])
def test_metered_collectives_match_hand_counts(world_size, workers_per_server):
    results = run_distributed(_collectives_case, world_size, workers_per_server, timeout_s=60)
    for rank, result in enumerate(results):
        expected = _expected(rank, world_size, workers_per_server)
        for name, delta in result["deltas"].items():
            assert _as_counts(delta) == expected[name], (rank, name)
    assert all(result["total"] == sum_snapshots(r["own"] for r in results) for result in results)
    if world_size == 2:  # literal hand count: rank 0 sends 0 rows to rank 1, rank 1 sends 2
        assert _as_counts(results[0]["deltas"]["a2a"]) == {}
        assert _as_counts(results[1]["deltas"]["a2a"]) == {("activation", INTER_SERVER): (48, 1)}
    if world_size == 4:  # 2 servers x 2 workers: rank 0 -> 1 intra, -> 2, 3 inter
        links = results[0]["deltas"]["gather"]["link_bytes"]
        assert links == {INTRA_SERVER: 32, INTER_SERVER: 64}


# ---------------------------------------------------------------- gather to one rank


def _gather_cases(world_size: int) -> list[tuple[str, int, list[torch.Tensor]]]:
    """``(name, dst, tensor of every rank)``: uneven counts with a zero-row rank, a 1-D tensor,
    every rank empty; ``dst`` is the first or the last rank."""
    last = world_size - 1
    return [
        (  # rows 0, 2, 1: rank 0 (dst) has none
            "uneven",
            0,
            [
                torch.arange(((2 * r) % 3) * 6, dtype=torch.float32).reshape(-1, 2, 3) + 100 * r
                for r in range(world_size)
            ],
        ),
        (  # 1-D int64, rows 3, 0, 1: the dst (last rank) has some, another has none
            "one_dim",
            last,
            [
                torch.arange((3 * (r + 1)) % 4, dtype=torch.int64) + 10 * r
                for r in range(world_size)
            ],
        ),
        ("all_empty", 0, [torch.empty(0, 4, dtype=torch.float64) for _ in range(world_size)]),
    ]


def _gather_varlen_case(rank: int, world_size: int, workers_per_server: int) -> dict:
    """Every ``_gather_cases`` gather under a ``CollectiveRecorder``; this rank's results, meter
    deltas and audit problems."""
    comm = Comm.create(CommMeter(), Topology(world_size, workers_per_server), timeout_s=30)
    out = {}
    for name, dst, tensors in _gather_cases(world_size):
        before = comm.meter.snapshot()
        with CollectiveRecorder() as recorder:
            result = comm.gather_varlen(tensors[rank], dst, category="parameter")
        delta = comm.meter.delta(before)
        out[name] = {
            "result": result,
            "delta": delta,
            "problems": recorder.problems(delta),
            "ops": [(call.op, call.category) for call in recorder.calls],
        }
    return out


@pytest.mark.dist
@pytest.mark.parametrize("world_size, workers_per_server", [(2, 1), (3, 3)])
def test_gather_varlen_concatenates_on_dst_only_and_counts_real_rows(
    world_size, workers_per_server
):
    results = run_distributed(_gather_varlen_case, world_size, workers_per_server, timeout_s=60)
    topology = Topology(world_size, workers_per_server)
    for name, dst, tensors in _gather_cases(world_size):
        row_bytes = {"uneven": 2 * 3 * 4, "one_dim": 8, "all_empty": 4 * 8}[name]
        for rank, result in enumerate(r[name] for r in results):
            if rank == dst:
                assert torch.equal(result["result"], torch.cat(tensors)), (name, rank)
            else:
                assert result["result"] is None, (name, rank)
            # Hand count: 8 B of sizes to every peer; the real rows to dst, one message.
            expected = {}
            for q in range(world_size):
                if q != rank:
                    key = ("control", topology.link_class(rank, q))
                    nbytes, messages = expected.get(key, (0, 0))
                    expected[key] = (nbytes + 8, messages + 1)
            sent = 0 if rank == dst else tensors[rank].shape[0] * row_bytes
            if sent:
                expected[("parameter", topology.link_class(rank, dst))] = (sent, 1)
            assert _as_counts(result["delta"]) == expected, (name, rank)
            assert result["problems"] == [], (name, rank)
            payload = [op for op, category in result["ops"] if category == "parameter"]
            assert payload == ([] if name == "all_empty" else ["gather"]), (name, rank)
    if world_size == 2:  # literal: "uneven" rank 1 sends 2 rows of 2x3 float32 to rank 0
        assert _as_counts(results[1]["uneven"]["delta"])[("parameter", INTER_SERVER)] == (48, 1)
        assert _as_counts(results[0]["uneven"]["delta"]) == {("control", INTER_SERVER): (8, 1)}
