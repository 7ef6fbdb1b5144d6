"""ByteGNN's link prediction (docs/systems/bytegnn.md, "Link prediction"): on 2 ranks with
the socket store, the S-Worker's full-batch step and the evaluation equal ``single``'s in
float64; no validation or test pair reaches a training block; the DAG samples ahead of the
trainer and the store moves only remote rows; each rank's part holds its share of the split.
The same on a typed graph with a directed split (triples, their inverse relations, RGCN)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import torch

from lightning_gnnscale.comm import Comm, CommMeter, Topology
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.generators import sbm, typed_sbm
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.inference import full_logits
from lightning_gnnscale.systems.bytegnn.config import ByteGNNConfig, DagConfig
from lightning_gnnscale.systems.bytegnn.datamodule import ByteGNNDataModule
from lightning_gnnscale.systems.bytegnn.link import LinkPart
from lightning_gnnscale.systems.single.datamodule import SingleDataModule
from lightning_gnnscale.tasks import TaskConfig
from lightning_gnnscale.tasks.link.decoders import DistMultDecoder
from tests.helpers.dist import run_distributed

SEED, WORLD = 7, 2
FULL = DataConfig(batch_size=-1, fanouts=[-1, -1])
SPLITS = ("val", "test")


R = 2  # a typed case's relations (its directed split passes messages over 2R)


def _dataset(typed=False):
    if typed:
        return typed_sbm(160, num_relations=R, avg_degree=3.0, num_features=5, seed=4).to(
            torch.float64
        )
    return sbm(num_nodes=160, num_classes=3, avg_degree=6.0, num_features=5, seed=4).to(
        torch.float64
    )


def _task(typed=False):
    # typed: a directed split, so the message graph holds the inverse relations r + R
    return TaskConfig("link_prediction", num_negatives=2, undirected=False if typed else None)


def _net(typed=False):
    torch.manual_seed(0)
    if typed:
        return BlockGNN("rgcn", 5, 8, 6, 2, dropout=0.0, num_relations=2 * R).double()
    return BlockGNN("sage", 5, 8, 6, 2, dropout=0.0).double()


def _datamodule(cls, config, cache_dir, data=FULL, typed=False):
    return cls(_dataset(typed), config, data, seed=SEED, task=_task(typed), cache_dir=cache_dir)


def _distmult():
    """A DistMult head with fixed random diagonals (it scores each triple under its relation,
    where the dot product would ignore a lost relation)."""
    decoder = DistMultDecoder(R, 6).double()
    with torch.no_grad():
        decoder.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(3))
    return decoder


def _held_out(split) -> set:
    """The validation and test pairs, both directions (a typed split's: triples, and their
    inverses under ``r + R``)."""
    pos = torch.cat([split.val_pos, split.test_pos], 1)
    if not split.is_typed:
        return set(map(tuple, torch.cat([pos, pos.flip(0)], 1).t().tolist()))
    rel = torch.cat([split.val_rel, split.test_rel])
    triples = torch.cat([torch.stack([*pos, rel]), torch.stack([*pos.flip(0), rel + R])], 1)
    return set(map(tuple, triples.t().tolist()))


def _step(net, task, batch):
    """``(loss, flat gradient)`` of this rank's share of a step (the net's, then the task's
    head's: a typed case trains a DistMult head)."""
    params = [*net.parameters(), *task.decoder.parameters()]
    for p in params:
        p.grad = None
    loss = task.loss_sum(net(batch.blocks, batch.x), batch.y) / batch.global_seed_count
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in params])


def _rank(rank, world_size, cache_dir, typed=False):
    config = ByteGNNConfig(dag=DagConfig(nsc_tasks=2, ff_tasks=2), sampling_threads=2)
    dm = _datamodule(ByteGNNDataModule, config, cache_dir, typed=typed)
    prepared = dm.prepare(world_size)
    comm = Comm.create(CommMeter(), Topology(world_size, world_size), timeout_s=60)
    dm.setup_rank(RankContext(comm, torch.device("cpu")), dm.part_of(prepared, rank))
    dm.context = RankContext(comm, torch.device("cpu"))
    new2old, split = prepared.book.new2old, dm.targets.split
    held_out = _held_out(split)
    net, worker = _net(typed), dm.sworker
    if typed:  # a trained head: its gradient sums over the ranks to single's, as the net's
        dm.task.decoder = _distmult()
    relations, pair_rel = Counter(), []
    worker.last_epoch = 1
    worker.start()
    steps, leaks, edges, remote_rows = [], 0, 0, 0
    for epoch in range(2):
        assert dm.steps_per_epoch == 1
        batch = dm.make_batch(epoch, 0)
        if epoch == 0:  # the next epoch's DAG runs while the trainer holds this batch
            deadline = time.monotonic() + 20
            while worker.finished < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            ahead = worker.finished
        steps.append(_step(net, dm.task, batch))
        pair_rel.append(Counter(batch.y[:, 3].tolist()) if typed else batch.y.shape[1])
        for block in batch.blocks:
            src, dst = block.edge_index
            pairs = torch.stack([new2old[block.src_ids[src]], new2old[block.dst_ids[dst]]], 1)
            if typed:  # triples (src, dst, relation)
                pairs = torch.cat([pairs, block.edge_type[:, None]], 1)
                relations.update(block.edge_type.tolist())
            edges += pairs.shape[0]
            leaks += len(held_out & set(map(tuple, pairs.tolist())))
        remote_rows += int((prepared.book.nid2part(batch.blocks[0].src_ids) != rank).sum())
    comm.barrier()  # every rank has taken its batches: no request is on its way
    dm.flush_meter()
    sampled = comm.meter.snapshot()["category_link_bytes"]
    stats = dm.link_statistics(net, SPLITS)
    embedded = {stage: dm.core_outputs(net, net.num_layers, stage) for stage in ("train", "test")}
    comm.barrier()
    dm.stop_service()
    return {
        "steps": steps,
        "leaks": leaks,
        "edges": edges,
        "ahead": ahead,
        "remote_rows": remote_rows,
        "stats": stats,
        "ids": dm.core_orig_ids,
        "embedded": embedded,
        "bytes": sampled,
        "relations": relations,
        "pair_rel": pair_rel,
    }


@pytest.mark.dist
@pytest.mark.parametrize("typed", [False, True], ids=["homogeneous", "typed"])
def test_two_ranks_step_and_evaluate_as_single_without_leakage(tmp_path, typed):
    """The ranks' full-batch losses and gradients of two epochs sum to ``single``'s (its
    epoch permutation keys the negatives); each stage's core embeddings are ``single``'s
    over that stage's edges, and the ranks' evaluation statistics sum to the one-process
    statistics of those embeddings; no block edge joins a held-out pair; the second epoch's
    DAG finished before the trainer asked for it; the store's feature bytes are exactly the
    remote input rows'.

    (The statistics are compared on the ranks' own embeddings, not ``single``'s: a negative
    equal to its positive's destination ties with it up to the two scoring kernels'
    rounding, so a last-bit difference in the embeddings can move a reciprocal rank.)

    Typed (a directed split of ``typed_sbm``, RGCN over its 2R message relations, a DistMult
    head): the same, with triples: the steps' pairs carry their relations, the blocks every
    relation and its inverse, no held-out triple nor its inverse is a block edge, the head's
    gradient sums to single's, and the statistics score each triple under its relation."""
    results = run_distributed(_rank, WORLD, tmp_path / "cache", typed, timeout_s=120)
    for r in results:
        assert r["leaks"] == 0 and r["edges"] > 500
        assert sorted(r["relations"]) == (list(range(2 * R)) if typed else [])
        assert r["ahead"] == 2  # sampled ahead of training
        assert all(r["bytes"][c]["intra_server"] > 0 for c in ("structure", "feature"))
    row_bytes = _dataset().graph.x.shape[1] * _dataset().graph.x.element_size()
    moved = sum(r["bytes"]["feature"]["intra_server"] for r in results)
    assert moved == sum(r["remote_rows"] for r in results) * row_bytes
    single = _datamodule(SingleDataModule, None, tmp_path / "cache", typed=typed)
    net = _net(typed)
    if typed:
        single.task.decoder = _distmult()
    for epoch in range(2):
        batch = single.make_batch(epoch, 0)
        if typed:  # the step's pairs carry their relations (y's last column), as single's
            got = sum((r["pair_rel"][epoch] for r in results), Counter())
            assert got == Counter(batch.y[:, 3].tolist())
        else:
            assert all(r["pair_rel"][epoch] == 3 for r in results)
        loss, grad = _step(net, single.task, batch)
        got = [r["steps"][epoch] for r in results]
        torch.testing.assert_close(sum(g[0] for g in got), loss, rtol=0, atol=1e-12)
        torch.testing.assert_close(sum(g[1] for g in got), grad, rtol=0, atol=1e-12)
    num_nodes = single.graph.num_nodes
    stages = {}
    for stage in ("train", "test"):
        graph = single.task.stage_graph(single.graph, single.targets, stage)
        want = full_logits(graph, net, 4096, None)
        stages[stage] = torch.empty_like(want)
        for r in results:
            torch.testing.assert_close(r["embedded"][stage], want[r["ids"]], rtol=0, atol=1e-12)
            stages[stage][r["ids"]] = r["embedded"][stage]
        assert stages[stage].shape[0] == num_nodes

    def embed(stage):
        return stages[stage]

    want = single.task.link_statistics(embed, single.targets, SPLITS, 0, 1)
    torch.testing.assert_close(sum(r["stats"] for r in results), want, rtol=0, atol=1e-9)


def test_each_rank_holds_its_share_of_the_split(tmp_path):
    """Every training pair is some rank's once, every evaluation pair the owner of its
    source's, and no part holds a validation or test edge in its training structure."""
    dm = _datamodule(ByteGNNDataModule, ByteGNNConfig(), tmp_path)
    prepared, split = dm.prepare(3), dm.targets.split
    parts = [LinkPart.of(prepared, k) for k in range(3)]
    pair_ids = torch.cat([p.pair_ids for p in parts])
    assert Counter(pair_ids.tolist()) == Counter(range(split.train_pos.shape[1]))
    for p in parts:
        assert torch.equal(p.train_pos, split.train_pos[:, p.pair_ids])
        assert int((p.edge_split == 0).sum()) == p.stage_partition("train").num_edges
    for name in ("val", "test"):
        index = torch.cat([p.eval_index[name] for p in parts])
        assert Counter(index.tolist()) == Counter(range(split.positives(name).shape[1]))
        for k, p in enumerate(parts):
            src = prepared.book.old2new[p.eval_pos[name][0]]
            assert bool((prepared.book.nid2part(src) == k).all())
    # the training structure is exactly the split's training edges
    old = prepared.book.new2old
    got = set()
    for p in parts:
        train = p.stage_partition("train")
        dst = torch.repeat_interleave(train.core_gids, train.indptr.diff())
        src = p.local.local2global[train.indices]
        got |= set(zip(old[src].tolist(), old[dst].tolist()))
    indptr, indices = split.structure("train")
    want_dst = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr.diff())
    assert got == set(zip(indices.tolist(), want_dst.tolist()))


@pytest.mark.parametrize("batch_size", [-1, 50])
def test_a_steps_positions_are_its_global_batch_once(batch_size):
    """The ranks' positions of a step are ``0..global - 1`` once each (distinct negatives'
    keys); in a one-step epoch each pair's position is its place in ``single``'s epoch
    permutation."""
    from lightning_gnnscale.graph.order import epoch_permutation
    from lightning_gnnscale.graph.seed_split import SeedSplit
    from lightning_gnnscale.systems.bytegnn.link import LinkSteps

    pair_ids = torch.randperm(301, generator=torch.Generator().manual_seed(1))
    chunks = SeedSplit.chunks(pair_ids, 3)
    sizes = torch.tensor([c.numel() for c in chunks])
    steps = []
    for rank, chunk in enumerate(chunks):
        split = SeedSplit.from_chunk(torch.arange(chunk.numel()), sizes, rank, batch_size, SEED)
        steps.append((LinkSteps(split, chunk, 301, SEED), split, chunk))
    for epoch in range(2):
        for step in range(steps[0][1].steps):
            got = [ls.positions(epoch, step, s.seeds(epoch, step)) for ls, s, _ in steps]
            count = steps[0][1].global_seed_count(step)
            assert sorted(torch.cat(got).tolist()) == list(range(count))
            if batch_size == -1:
                order = epoch_permutation(torch.arange(301), SEED, epoch)
                for (_, s, chunk), positions in zip(steps, got, strict=True):
                    assert torch.equal(order[positions], chunk[s.seeds(epoch, step)])


def test_filtered_negatives_are_refused_when_the_module_is_built(tmp_path):
    with pytest.raises(ConfigError, match="filter_negatives"):
        ByteGNNDataModule(
            _dataset(),
            ByteGNNConfig(),
            FULL,
            task=TaskConfig("link_prediction", filter_negatives=True),
            cache_dir=tmp_path,
        )
