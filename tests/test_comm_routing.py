"""OwnerRoute: answers come back in request order and cost exactly the hand-counted bytes."""

from __future__ import annotations

import pytest
import torch

from lightning_gnnscale.comm import CATEGORIES, Comm, CommMeter, OwnerRoute
from tests.helpers.dist import run_distributed

NUM_IDS = 10
# Owner of id g with P ranks: OWNER_BASE[g] % P (not contiguous, so grouping really reorders).
OWNER_BASE = [2, 0, 1, 0, 2, 1, 1, 0, 2, 0]
# Requests per rank: uneven, duplicates, the requester's own ids, and a rank asking nothing.
REQUESTS = {
    2: [[7, 4, 4, 2, 9, 5, 0, 4], []],
    3: [[7, 4, 4, 1, 9, 2, 0], [], [3, 8, 5, 3, 6, 0, 8, 2]],
}
ROW_SHAPE = (2, 3)  # trailing shape of a fixed-width answer row (float32)
VALUE_WIDTH = 2  # variable-length answers: int64 rows [g * 100 + j, g], j < g % 4


def _owner(g: int, world_size: int) -> int:
    return OWNER_BASE[g] % world_size


def _table() -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    return torch.randn((NUM_IDS, *ROW_SHAPE), generator=generator)


def _push_rows(rank: int, ids: list[int]) -> torch.Tensor:
    """Rows a rank pushes with its requests: distinct per (rank, position)."""
    n = len(ids)
    return torch.arange(n * 3, dtype=torch.float64).reshape(n, 3) + 1000 * rank


def _varlen_answer(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Owner side (vectorised): ``g % 4`` rows ``[g * 100 + j, g]`` per requested id ``g``."""
    counts = ids % 4
    base = torch.repeat_interleave(ids, counts)
    within = torch.arange(base.numel()) - torch.repeat_interleave(
        torch.cumsum(counts, 0) - counts, counts
    )
    return counts, torch.stack([base * 100 + within, base], dim=1)


def _route_case(rank: int, world_size: int) -> dict:
    comm = Comm.create(CommMeter(), timeout_s=30)
    ids = torch.tensor(REQUESTS[world_size][rank], dtype=torch.int64)
    owners = torch.tensor([_owner(g, world_size) for g in ids.tolist()], dtype=torch.int64)
    # This rank's shard: the rows of ids it owns; other rows are NaN, so a misrouted request
    # answers NaN and fails the comparison.
    owned = torch.tensor([_owner(g, world_size) == rank for g in range(NUM_IDS)])
    shard = torch.where(owned.view(-1, 1, 1), _table(), torch.full_like(_table(), float("nan")))

    deltas = {}
    before = comm.meter.snapshot()
    route = OwnerRoute.build(comm, ids, owners, category="structure")
    deltas["build"] = comm.meter.delta(before)

    before = comm.meter.snapshot()
    rows = route.reply(comm, shard[route.served], category="feature")
    deltas["reply"] = comm.meter.delta(before)

    before = comm.meter.snapshot()
    counts, values = _varlen_answer(route.served)
    back_counts, back_values = route.reply_varlen(comm, counts, values, category="structure")
    deltas["reply_varlen"] = comm.meter.delta(before)

    before = comm.meter.snapshot()
    pushed = route.push(comm, _push_rows(rank, ids.tolist()), category="parameter")
    deltas["push"] = comm.meter.delta(before)
    return {
        "served": route.served,
        "rows": rows,
        "counts": back_counts,
        "values": back_values,
        "pushed": pushed,
        "deltas": deltas,
    }


def _expected_bytes(world_size: int, rank: int) -> dict[str, dict[str, int]]:
    """Hand count of what ``rank`` sends to *other* ranks in each step of ``_route_case``."""
    requests = REQUESTS[world_size]
    remote_asks = [g for g in requests[rank] if _owner(g, world_size) != rank]
    remote_served = [
        g
        for q, asks in enumerate(requests)
        if q != rank
        for g in asks
        if _owner(g, world_size) == rank
    ]
    row_bytes = torch.Size(ROW_SHAPE).numel() * 4
    return {
        "build": {"control": 8 * (world_size - 1), "structure": 8 * len(remote_asks)},
        "reply": {"feature": row_bytes * len(remote_served)},
        "reply_varlen": {
            "structure": 8 * len(remote_served)
            + 8 * VALUE_WIDTH * sum(g % 4 for g in remote_served)
        },
        "push": {"parameter": 3 * 8 * len(remote_asks)},
    }


def _check(results: list[dict], world_size: int) -> None:
    table = _table()
    requests = REQUESTS[world_size]
    for rank, result in enumerate(results):
        asks = requests[rank]
        # Served on the owner side: every requester's ids for this rank, by requester rank.
        expected_served = [
            g for q in range(world_size) for g in requests[q] if _owner(g, world_size) == rank
        ]
        assert result["served"].tolist() == expected_served, rank
        # Fixed-width answers: a direct lookup, in request order.
        assert torch.equal(result["rows"], table[asks]), rank
        # Variable-length answers: per request, in request order.
        assert result["counts"].tolist() == [g % 4 for g in asks], rank
        expected_values = [[g * 100 + j, g] for g in asks for j in range(g % 4)]
        assert result["values"].reshape(-1, VALUE_WIDTH).tolist() == expected_values, rank
        # Pushed rows arrive with their ids, by source rank then the source's request order.
        expected_pushed = [
            _push_rows(q, requests[q])[i].tolist()
            for q in range(world_size)
            for i, g in enumerate(requests[q])
            if _owner(g, world_size) == rank
        ]
        assert result["pushed"].tolist() == expected_pushed, rank
        for step, counted in _expected_bytes(world_size, rank).items():
            expected = {c: counted.get(c, 0) for c in CATEGORIES}
            assert result["deltas"][step]["bytes"] == expected, (rank, step)


@pytest.mark.dist
@pytest.mark.parametrize("world_size", [2, 3])
def test_owner_route_answers_in_request_order_with_hand_counted_bytes(world_size):
    _check(run_distributed(_route_case, world_size, timeout_s=60), world_size)


def test_owner_route_single_process_restores_request_order_and_counts_nothing():
    comm = Comm.local()
    ids = torch.tensor([7, 4, 4, 1, 9, 2, 0, 8])
    table = _table()
    # With one rank the route is the identity: same answers, and nothing is counted.
    route = OwnerRoute.build(comm, ids, torch.zeros_like(ids))
    assert torch.equal(route.served, ids)
    assert torch.equal(route.reply(comm, table[route.served], category="feature"), table[ids])
    counts, values = route.reply_varlen(comm, *_varlen_answer(route.served), category="structure")
    assert counts.tolist() == [g % 4 for g in ids.tolist()]
    assert values.tolist() == [[g * 100 + j, g] for g in ids.tolist() for j in range(g % 4)]
    assert sum(comm.meter.snapshot()["bytes"].values()) == 0


def test_owner_route_rejects_mismatched_shapes():
    comm = Comm.local()
    ids = torch.tensor([3, 1, 2])
    with pytest.raises(ValueError, match="owners"):
        OwnerRoute.build(comm, ids, torch.zeros(2, dtype=torch.int64))
    route = OwnerRoute.build(comm, ids, torch.zeros_like(ids))
    with pytest.raises(ValueError, match="counts"):
        route.reply_varlen(comm, torch.tensor([1, 1]), torch.zeros(2), category="structure")
    with pytest.raises(ValueError, match="counts sum"):
        route.reply_varlen(comm, torch.tensor([1, 1, 1]), torch.zeros(2), category="structure")
