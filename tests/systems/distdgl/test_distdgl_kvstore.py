"""KVStore pull/push and DistEmbedding + sparse optimisers against dense single-tensor oracles
(docs/systems/distdgl.md#kv-store)."""

from __future__ import annotations

import functools

import pytest
import torch

from lightning_gnnscale.comm import Comm, CommMeter
from lightning_gnnscale.graph.book import PartitionBook
from lightning_gnnscale.kit.embeddings import (
    SPARSE_OPTIMIZERS,
    DistEmbedding,
    KVStore,
    SparseAdagrad,
    SparseSGD,
)
from tests.helpers.dist import run_distributed

NUM_NODES = 23
DIM = 3
LR = 0.3
STEPS = 3


def _book(world_size: int) -> PartitionBook:
    """A random partition; with 3 parts, part 1 is empty."""
    generator = torch.Generator().manual_seed(world_size)
    parts = torch.randint(0, world_size, (NUM_NODES,), generator=generator)
    if world_size == 3:
        parts[parts == 1] = 2
    return PartitionBook.from_parts(parts, num_parts=world_size)


def _features() -> torch.Tensor:
    """Global rows in relabelled (gid) order, float64."""
    return torch.randn(
        NUM_NODES, DIM, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )


def _labels() -> torch.Tensor:
    """A 1-D int64 node tensor: rows with an empty trailing shape."""
    return torch.arange(NUM_NODES) * 10


def _shard(x: torch.Tensor, book: PartitionBook, rank: int) -> torch.Tensor:
    return x[int(book.node_offsets[rank]) : int(book.node_offsets[rank + 1])].clone()


def _random_ids(generator: torch.Generator, low: int, high: int, count: int) -> torch.Tensor:
    if high <= low:
        return torch.empty(0, dtype=torch.int64)
    return torch.randint(low, high, (count,), generator=generator)


def _pull_cases(world_size: int) -> list[tuple[str, list[torch.Tensor]]]:
    """``(case name, ids per rank)``: every rank pulls its own list in the same collective."""
    book = _book(world_size)
    generator = torch.Generator().manual_seed(100 + world_size)
    ranks = range(world_size)
    lo = [int(book.node_offsets[r]) for r in ranks]
    hi = [int(book.node_offsets[r + 1]) for r in ranks]
    cases = [
        ("empty", [torch.empty(0, dtype=torch.int64) for _ in ranks]),
        ("all_local", [_random_ids(generator, lo[r], hi[r], 9) for r in ranks]),
        (
            "all_remote",
            [
                torch.cat([torch.arange(0, lo[r]), torch.arange(hi[r], NUM_NODES)]).flip(0)
                for r in ranks
            ],
        ),
        ("one_id_repeated", [torch.full((5,), NUM_NODES - 1 - r) for r in ranks]),
        (
            "only_rank0_pulls",
            [_random_ids(generator, 0, NUM_NODES, 30)]
            + [torch.empty(0, dtype=torch.int64)] * (world_size - 1),
        ),
    ]
    for i in range(6):  # random sizes with many duplicates, unsorted
        ids = [
            _random_ids(
                generator, 0, NUM_NODES, int(torch.randint(0, 40, (1,), generator=generator))
            )
            for _ in ranks
        ]
        cases.append((f"random_{i}", ids))
    return cases


def _push_ids(world_size: int) -> list[torch.Tensor]:
    """Ids every rank pushes: duplicates within a rank and ids shared between ranks."""
    generator = torch.Generator().manual_seed(200 + world_size)
    return [torch.randint(0, NUM_NODES, (15,), generator=generator) for _ in range(world_size)]


def _push_rows(rank: int, count: int) -> torch.Tensor:
    return torch.randn(
        count, DIM, generator=torch.Generator().manual_seed(300 + rank), dtype=torch.float64
    )


def _embedding_ids(world_size: int, rank: int, step: int) -> torch.Tensor:
    """Lookups of one rank in one step: few ids out of many rows, with duplicates."""
    generator = torch.Generator().manual_seed(1000 * world_size + 10 * step + rank)
    return torch.randint(0, NUM_NODES, (8,), generator=generator)


def _embedding_loss(rows: torch.Tensor, rank: int, step: int) -> torch.Tensor:
    """Non-linear in the rows and different per position, so duplicates get distinct gradients."""
    weights = torch.randn(
        rows.shape,
        generator=torch.Generator().manual_seed(50 + 7 * step + rank),
        dtype=torch.float64,
    )
    return (rows * weights).sum() + 0.5 * (rows**3).sum()


def _train_embedding(kv: KVStore, optimizer_name: str, world_size: int, rank: int) -> torch.Tensor:
    """``STEPS`` sparse steps on this rank's lookups; the final shard of the table."""
    table = _features()
    emb = DistEmbedding(
        kv, f"emb_{optimizer_name}", kv.num_local, DIM, lambda gids: table[gids].clone()
    )
    optimizer = SparseSGD([emb], LR) if optimizer_name == "sgd" else SparseAdagrad([emb], LR)
    for step in range(STEPS):
        ids = _embedding_ids(world_size, rank, step)
        half = ids.numel() // 2  # two lookups per step, both traced
        rows = torch.cat([emb(ids[:half]), emb(ids[half:])])
        _embedding_loss(rows, rank, step).backward()
        optimizer.step()
    return kv.local_shard(emb.name).clone()


def _dense_embedding(optimizer_name: str, world_size: int) -> torch.Tensor:
    """Reference: ``nn.Embedding`` with a dense torch optimiser on the summed loss of all ranks."""
    emb = torch.nn.Embedding.from_pretrained(_features(), freeze=False)
    if optimizer_name == "sgd":
        optimizer = torch.optim.SGD(emb.parameters(), lr=LR)
    else:  # same update as SparseAdagrad: accumulator starts at 0, eps outside the sqrt
        optimizer = torch.optim.Adagrad(emb.parameters(), lr=LR, eps=1e-10)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = sum(
            _embedding_loss(emb(_embedding_ids(world_size, r, step)), r, step)
            for r in range(world_size)
        )
        loss.backward()
        optimizer.step()
    return emb.weight.detach()


def _kv_scenario(rank: int, world_size: int) -> dict:
    """Everything one rank does: pulls of every case, pushes, sparse-embedding training."""
    book = _book(world_size)
    comm = Comm.create(CommMeter(), timeout_s=30)
    kv = KVStore(comm, book)
    kv.init_data("feat", _shard(_features(), book, rank))
    kv.init_data("label", _shard(_labels(), book, rank))
    result = {"pull": {}, "push": {}}
    before = comm.meter.snapshot()
    result["gather"] = {  # with one rank the result is the shard itself: copy it
        name: None if rows is None else rows.clone()
        for name, rows in (
            ("label", kv.gather("label")),
            ("feat", kv.gather("feat", world_size - 1)),
        )
    }
    result["gather"]["bytes"] = comm.meter.delta(before)["bytes"]
    for name, ids in _pull_cases(world_size):
        before = comm.meter.snapshot()
        feat = kv.pull("feat", ids[rank])
        feat_bytes = comm.meter.delta(before)["bytes"]
        result["pull"][name] = {
            "feat": feat,
            "bytes": feat_bytes,
            "label": kv.pull("label", ids[rank]),
        }

    ids, rows = _push_ids(world_size)[rank], _push_rows(rank, 15)
    kv.push("feat", ids, rows)
    result["push"]["overwrite"] = kv.pull("feat", torch.arange(NUM_NODES))
    kv.init_data("acc", _shard(_features(), book, rank))
    kv.push("acc", ids, rows, "add")
    result["push"]["add"] = kv.pull("acc", torch.arange(NUM_NODES))
    kv.register_push_handler(
        "scaled_sub", lambda shard, local_ids, data: shard.index_add_(0, local_ids, data, alpha=-LR)
    )
    before = comm.meter.snapshot()
    kv.push("acc", ids, rows, "scaled_sub", category="gradient")
    result["push"]["scaled_sub_bytes"] = comm.meter.delta(before)["bytes"]
    result["push"]["scaled_sub"] = kv.pull("acc", torch.arange(NUM_NODES))

    result["embedding"] = {
        name: _train_embedding(kv, name, world_size, rank) for name in ("sgd", "adagrad")
    }
    return result


@functools.cache
def _results(world_size: int) -> list[dict]:
    if world_size == 1:
        return [_kv_scenario(0, 1)]
    return run_distributed(_kv_scenario, world_size, timeout_s=60)


WORLD_SIZES = [1, pytest.param(2, marks=pytest.mark.dist), pytest.param(3, marks=pytest.mark.dist)]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_pull_equals_global_indexing_and_counts_distinct_remote_rows(world_size):
    results, book = _results(world_size), _book(world_size)
    x, labels = _features(), _labels()
    row_bytes = DIM * x.element_size()
    for name, ids in _pull_cases(world_size):
        owners = [book.nid2part(i) for i in ids]
        for rank in range(world_size):
            pulled = results[rank]["pull"][name]
            assert torch.equal(pulled["feat"], x[ids[rank]]), (name, rank)
            assert torch.equal(pulled["label"], labels[ids[rank]]), (name, rank)
            # Rows this rank serves: distinct ids other ranks ask of it; ids it asks for itself.
            served = sum(
                torch.unique(ids[q][owners[q] == rank]).numel()
                for q in range(world_size)
                if q != rank
            )
            asked = torch.unique(ids[rank][owners[rank] != rank]).numel()
            assert pulled["bytes"]["feature"] == served * row_bytes, (name, rank)
            assert pulled["bytes"]["structure"] == asked * 8, (name, rank)
            if name in ("all_local", "empty"):
                assert pulled["bytes"]["feature"] == 0


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_gather_assembles_the_whole_table_on_dst_only(world_size):
    results, book = _results(world_size), _book(world_size)
    for rank in range(world_size):
        gathered = results[rank]["gather"]
        if rank == 0:
            assert torch.equal(gathered["label"], _labels())
        else:
            assert gathered["label"] is None, rank
        if rank == world_size - 1:
            assert torch.equal(gathered["feat"], _features())
        else:
            assert gathered["feat"] is None, rank
        # Each rank but dst sends its own rows once (part 1 of 3 is empty); sizes 8 B per peer.
        rows = int(book.node_offsets[rank + 1] - book.node_offsets[rank])
        sent = (rank != 0) * rows * 8 + (rank != world_size - 1) * rows * DIM * 8
        assert gathered["bytes"]["parameter"] == sent, rank
        assert gathered["bytes"]["control"] == 2 * 8 * (world_size - 1), rank


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_push_overwrite_add_and_registered_handler_match_dense_reference(world_size):
    results = _results(world_size)
    ids = _push_ids(world_size)
    rows = [_push_rows(rank, 15) for rank in range(world_size)]
    overwritten = _features()
    for rank in range(world_size):  # source-rank order, then push order: the last one wins
        for gid, row in zip(ids[rank].tolist(), rows[rank]):
            overwritten[gid] = row
    added = _features().index_add_(0, torch.cat(ids), torch.cat(rows))
    scaled = added.clone().index_add_(0, torch.cat(ids), torch.cat(rows), alpha=-LR)
    for rank in range(world_size):
        push = results[rank]["push"]
        assert torch.equal(push["overwrite"], overwritten), rank
        torch.testing.assert_close(push["add"], added, rtol=0, atol=1e-12)
        torch.testing.assert_close(push["scaled_sub"], scaled, rtol=0, atol=1e-12)
        remote = (_book(world_size).nid2part(ids[rank]) != rank).sum().item()
        assert push["scaled_sub_bytes"]["gradient"] == remote * DIM * 8
        assert push["scaled_sub_bytes"]["structure"] == remote * 8


def test_the_config_accepts_exactly_the_sparse_optimizers_that_exist():
    """The config holds the names (it loads without torch); each must build an optimizer."""
    from lightning_gnnscale.config_types import EMBEDDING_OPTIMIZERS

    assert sorted(EMBEDDING_OPTIMIZERS) == sorted(SPARSE_OPTIMIZERS)


@pytest.mark.parametrize("optimizer_name", ["sgd", "adagrad"])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_dist_embedding_matches_dense_embedding_with_dense_optimizer(world_size, optimizer_name):
    results = _results(world_size)
    trained = torch.cat([results[rank]["embedding"][optimizer_name] for rank in range(world_size)])
    expected = _dense_embedding(optimizer_name, world_size)
    torch.testing.assert_close(trained, expected, rtol=1e-12, atol=1e-12)
    touched = torch.cat(
        [_embedding_ids(world_size, r, s) for r in range(world_size) for s in range(STEPS)]
    )
    untouched = torch.ones(NUM_NODES, dtype=torch.bool).index_fill_(0, touched, False)
    assert untouched.any() and torch.equal(trained[untouched], _features()[untouched])


def test_local_shard_is_zero_copy_and_bad_arguments_fail_loudly():
    kv = KVStore(Comm.local(), _book(1))
    rows = _features()
    kv.init_data("feat", rows)
    assert kv.local_shard("feat") is rows
    kv.push("feat", torch.tensor([3, 3]), rows[:2] * 0, lambda shard, ids, data: shard.mul_(2))
    torch.testing.assert_close(kv.local_shard("feat"), _features() * 2)  # a callable handler
    with pytest.raises(KeyError, match="no KV data"):
        kv.pull("missing", torch.arange(2))
    with pytest.raises(ValueError, match="owns 23 rows"):
        kv.init_data("short", rows[:-1])
    with pytest.raises(ValueError, match="unknown push handler"):
        kv.push("feat", torch.arange(2), rows[:2], "nope")
    with pytest.raises(ValueError, match="push to 'feat' needs"):
        kv.push("feat", torch.arange(2), rows[:2].float())
    with pytest.raises(ValueError, match="built-in"):
        kv.register_push_handler("add", lambda shard, ids, data: None)
    with pytest.raises(ValueError, match="parts for 1 ranks"):
        KVStore(Comm.local(), _book(2))
    with pytest.raises(ValueError, match="not 5"):
        DistEmbedding(kv, "emb", 5, DIM, lambda gids: rows[gids])


def test_zero_grad_discards_the_traced_lookups():
    kv = KVStore(Comm.local(), _book(1))
    emb = DistEmbedding(kv, "emb", NUM_NODES, DIM, lambda gids: _features()[gids])
    optimizer = SparseSGD([emb], LR)
    emb(torch.tensor([1, 2, 2])).sum().backward()
    optimizer.zero_grad()
    optimizer.step()  # nothing traced: no update
    assert torch.equal(kv.local_shard("emb"), _features())
    emb(torch.tensor([4])).sum().backward()
    optimizer.step()
    assert emb.trace == []
    expected = _features()
    expected[4] -= LR
    assert torch.equal(kv.local_shard("emb"), expected)
