"""Grappa under ``task=link_prediction`` (docs/systems/grappa.md, "Link prediction"): one
chunk's step is ``single``'s in float64, no evaluation pair reaches a partition's training
structure or block, every training pair is trained by exactly one partition per super-epoch
(or excluded and counted, never dropped), evaluation from the home chunks equals ``single``'s,
and training stays gradient-only."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import lightning_gnnscale as gs
from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig, run_config
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.generators import sbm, typed_sbm
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.run import train
from lightning_gnnscale.systems.grappa import GrappaConfig
from lightning_gnnscale.systems.grappa.datamodule import GrappaDataModule
from lightning_gnnscale.tasks import TaskConfig
from lightning_gnnscale.tasks.link.decoders import DistMultDecoder
from tests.helpers.config import make_cfg
from tests.helpers.dist import run_distributed

FANOUTS = [4, 3]
R = 3  # the typed graph's relations (a directed split passes messages over 2R)


def make_dataset():
    return sbm(num_nodes=240, num_classes=3, avg_degree=8.0, num_features=6, seed=5).to(
        torch.float64
    )


def make_typed():
    """A small typed graph (symmetric; a split with ``undirected=False`` adds inverses)."""
    options = {"num_nodes": 200, "num_relations": R, "num_classes": 3, "avg_degree": 4.0}
    return typed_sbm(**options, num_features=6, seed=5).to(torch.float64)


def distmult(width=8):
    """A DistMult head whose diagonals differ per relation (so a wrong relation scores apart)."""
    head = DistMultDecoder(R, width).double()
    with torch.no_grad():
        head.weight.copy_(torch.rand(R, width, generator=torch.Generator().manual_seed(3)) + 0.5)
    return head


class LocalComm:
    """Rank ``rank`` of ``world_size`` in one process (no collective runs: the early trigger
    is off and batches need none)."""

    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def all_reduce(self, tensor, op="sum", *, category):
        return tensor


def grappa_dm(
    cache, rank=0, world=1, task=None, comm=None, batch_size=48, dataset=None, **settings
):
    dm = GrappaDataModule(
        dataset or make_dataset(),
        GrappaConfig(**settings),
        DataConfig(batch_size=batch_size, fanouts=FANOUTS),
        seed=7,
        cache_dir=cache,
        task=task or TaskConfig("link_prediction"),
    )
    dm.trainer = SimpleNamespace(max_epochs=4, is_last_batch=True)
    parts = dm.prepare(world)
    if comm is None:
        comm = Comm.local() if world == 1 else LocalComm(rank, world)
    dm.setup_rank(RankContext(comm, torch.device("cpu")), parts[rank])
    return dm


def single_dm(task=None, batch_size=48, dataset=None):
    _, DataModule, config = gs.system("single")
    return DataModule(
        dataset or make_dataset(),
        config,
        DataConfig(batch_size=batch_size, fanouts=FANOUTS),
        seed=7,
        task=task or TaskConfig("link_prediction"),
    )


def make_net(kind="sage", num_relations=1):
    torch.manual_seed(0)
    return BlockGNN(kind, 6, 16, 8, 2, dropout=0.0, num_relations=num_relations).double()


def step_gradient(dm, net, epoch, step):
    net.zero_grad()
    batch = dm.make_batch(epoch, step)
    loss = dm.task.loss_sum(net(batch.blocks, batch.x), batch.y) / batch.global_seed_count
    loss.backward()
    return batch, loss.detach(), torch.cat([p.grad.flatten() for p in net.parameters()])


def evaluation_pairs(split) -> set[tuple[int, int]]:
    pairs = torch.cat([split.val_pos, split.test_pos], 1)
    both = torch.cat([pairs, pairs.flip(0)], 1)
    return set(map(tuple, both.t().tolist()))


@pytest.mark.parametrize(
    ("negatives", "typed"), [("uniform", False), ("joint", False), ("uniform", True)]
)
def test_one_chunk_steps_equal_singles_in_float64(tmp_path, negatives, typed):
    """One rank, one chunk (``partitions_per_rank=1``: the partition is the whole graph):
    every step's batch, coverage 1, loss and gradient are ``single``'s, bit for bit, and so are
    the evaluation statistics (home chunks through ``owned_link_statistics``). Typed: RGCN on a
    directed typed split (inverse relations), every row carrying its pair's relation, blocks
    their edges', and a DistMult head scoring triples (relations reach the loss and the
    evaluation)."""
    split = {"undirected": False} if typed else {}
    task = TaskConfig("link_prediction", negatives=negatives, num_negatives=2, **split)
    data = make_typed if typed else make_dataset
    size = 600 if typed else 160  # the typed case: 4 steps of one epoch (CI time)
    grappa = grappa_dm(tmp_path, task=task, batch_size=size, partitions_per_rank=1, dataset=data())
    single = single_dm(task, batch_size=size, dataset=data())
    assert grappa.steps_per_epoch == single.steps_per_epoch > 1
    net = make_net("rgcn", 2 * R) if typed else make_net()
    if typed:
        assert grappa.num_relations == single.num_relations == 2 * R
        assert grappa.task.relations == single.task.relations == ("rel_0", "rel_1", "rel_2")
        grappa.task.decoder = single.task.decoder = distmult()
    for epoch in (0,) if typed else (0, 1):
        for step in range(single.steps_per_epoch):
            b_g, loss_g, grad_g = step_gradient(grappa, net, epoch, step)
            b_s, loss_s, grad_s = step_gradient(single, net, epoch, step)
            assert b_g.coverage == 1.0
            assert torch.equal(b_g.y, b_s.y) and b_g.y.shape[1] == 3 + typed
            for a, b in zip(b_g.blocks, b_s.blocks, strict=True):
                assert (a.edge_type is None) != typed and (a.edge_type is None) == (
                    b.edge_type is None
                )
                assert a.edge_type is None or torch.equal(a.edge_type, b.edge_type)
            assert b_g.global_seed_count == b_s.global_seed_count
            assert torch.equal(loss_g, loss_s) and torch.equal(grad_g, grad_s)
    splits = ("val", "test")
    assert torch.equal(grappa.eval_statistics(net, splits), single.eval_statistics(net, splits))


@pytest.mark.parametrize(
    "halo_hops, pair_sources",
    [(1, "owned"), (1, "held"), (0, "owned")],  # (0, held): refused
)
def test_partitions_train_each_pair_once_on_training_edges_only(tmp_path, halo_hops, pair_sources):
    """Two ranks, two phases, every super-epoch of a cycle: no validation or test pair (either
    direction) is an edge of any partition's local graph or of any block of an epoch's steps; the
    partitions of a super-epoch train disjoint sets of training pairs, whose union is every
    pair but the excluded ones; those are counted exactly and reported: none where halo
    sources train (``pair_sources=held`` with the 1-hop halo: a pair's source is its
    destination's in-neighbour), else those whose source chunk the partition does not own.
    Over a schedule cycle every training pair is trained (the sweep brings its chunks
    together)."""
    dms = [
        grappa_dm(tmp_path, r, 2, halo_hops=halo_hops, pair_sources=pair_sources, super_epoch_len=1)
        for r in range(2)
    ]
    halo_pairs = halo_hops == 1 and pair_sources == "held"
    split = dms[0].targets.split
    held_out = evaluation_pairs(split)
    n_train = split.train_pos.shape[1]
    chunk = dms[0].chunks.chunk_ids()
    cycle = dms[0].schedule.cycle
    excluded_total, edges, ever_trained = 0, 0, set()
    for t in range(cycle):
        trained = []
        for dm in dms:
            for phase in range(dm.phases):
                part, _, _ = dm._partition_entry(phase, t)
                gid = part.local2global
                dst = torch.repeat_interleave(torch.arange(part.num_nodes), part.indptr.diff())
                local = torch.stack([gid[part.indices], gid[dst]], 1)
                assert not held_out & set(map(tuple, local.tolist()))
                trained.append(part.pair_ids)
                excluded_total += part.excluded_pairs
                # held: destination owned, source owned or halo; excluded: source elsewhere
                src_chunk = chunk[split.train_pos[0, part.pair_ids]]
                assert bool(
                    torch.isin(chunk[part.pairs[1]], torch.tensor(part.spec.seed_chunks)).all()
                )
                owned_src = torch.isin(src_chunk, torch.tensor(part.spec.owned_chunks))
                assert bool(owned_src.all()) != halo_pairs
        ids = torch.cat(trained)
        assert ids.unique().numel() == ids.numel()  # no pair trained twice
        ever_trained.update(ids.tolist())
        excluded = n_train - ids.numel()
        assert (excluded == 0) == halo_pairs
        assert dms[0].excluded_at(t) == excluded / n_train
    assert (excluded_total > 0) != halo_pairs
    assert ever_trained == set(range(n_train))
    # sampled blocks of an epoch's steps on both ranks
    for dm in dms:
        for epoch in (0,):
            for step in range(dm.steps_per_epoch):
                batch = dm.make_batch(epoch, step)
                gid = dm.partition(dm.locate(step)[0]).local2global
                for block in batch.blocks:
                    src, dst = block.edge_index
                    pairs = torch.stack([gid[block.src_ids[src]], gid[block.dst_ids[dst]]], 1)
                    edges += pairs.shape[0]
                    assert not held_out & set(map(tuple, pairs.tolist()))
        report = dm.schedule_report()
        assert report.excluded_pair_fraction == dm.mean_excluded_fraction()
        assert (report.excluded_pair_fraction > 0) != halo_pairs
    assert edges > 500


def test_negatives_are_owned_nodes_and_keyed(tmp_path):
    """A partition's negatives are nodes it owns (a global draw it does not own is redrawn
    among them), the same on a rebuilt DataModule; partitions draw apart (keys offset by the
    partition id)."""
    a, b = (grappa_dm(tmp_path, 0, 2, super_epoch_len=1) for _ in range(2))
    batch_a, batch_b = a.make_batch(0, 0), b.make_batch(0, 0)
    assert torch.equal(batch_a.y, batch_b.y)
    assert torch.equal(batch_a.blocks[-1].dst_ids, batch_b.blocks[-1].dst_ids)
    nodes = batch_a.blocks[-1].dst_ids
    negative_dst = nodes[batch_a.y[batch_a.y[:, 2] == 0, 1]]
    positive_dst = nodes[batch_a.y[batch_a.y[:, 2] == 1, 1]]
    core = a.partition(0).num_core
    assert bool((negative_dst < core).all()) and bool((positive_dst < core).all())
    assert 0 < batch_a.coverage < 1  # defined, and below 1: the partition is not the graph


def _eval_rank(rank, world_size, cache):
    comm = Comm.create()
    dm = grappa_dm(cache, rank, world_size, comm=comm)
    stats = dm.eval_statistics(make_net("gcn"), ("val", "test"))
    return stats, comm.meter.snapshot()


@pytest.mark.dist
def test_two_ranks_evaluation_sums_to_singles(tmp_path):
    """Two ranks, each embedding only its home chunks (halo rows exchanged per layer) and
    pulling the rows its pairs need: the statistics sum to ``single``'s on one process (GCN:
    the halo's degrees are each stage's)."""
    grappa_dm(tmp_path, 0, 2)  # the chunk store, written once before the ranks read it
    results = run_distributed(_eval_rank, 2, str(tmp_path), timeout_s=120)
    total = sum(stats for stats, _ in results)
    want = single_dm().eval_statistics(make_net("gcn"), ("val", "test"))
    assert torch.allclose(total, want, rtol=0, atol=1e-9)


def test_refused_settings(tmp_path):
    """What link prediction cannot honour under Grappa is refused before any rank starts."""
    for setting, message in (
        ("strategy.estimator=node", "estimator=node"),
        ("strategy.eval_mode=isolated", "eval_mode=isolated"),
        ("strategy.pair_sources=halo", "valid:"),
    ):
        with pytest.raises(ConfigError, match=message):
            run_config(make_cfg(tmp_path, "strategy=grappa", "task=link_prediction", setting))
    # a node task has no pairs: a pair_sources other than the default has no effect there
    with pytest.raises(ConfigError, match="pair_sources=held"):
        run_config(make_cfg(tmp_path, "strategy=grappa", "strategy.pair_sources=held"))
    run_config(
        make_cfg(tmp_path, "strategy=grappa", "task=link_prediction", "strategy.pair_sources=held")
    )
    task = TaskConfig("link_prediction", filter_negatives=True)
    with pytest.raises(ConfigError, match="filter_negatives"):
        grappa_dm(tmp_path, task=task)
    with pytest.raises(ConfigError, match="estimator=node"):  # a plain script's DataModule
        grappa_dm(tmp_path, estimator="node")


TYPED_DISTMULT = (
    "dataset=typed_sbm",
    "dataset.num_nodes=300",
    "dataset.num_relations=3",
    "dataset.num_features=8",
    "model=rgcn",
    "task.undirected=false",
    "task.decoder=distmult",
)


@pytest.mark.e2e
@pytest.mark.parametrize("typed", [(), TYPED_DISTMULT], ids=["sbm", "typed_distmult"])
def test_two_rank_run_is_gradient_only_and_reports_the_excluded_fraction(tmp_path, typed):
    """``train.py strategy=grappa task=link_prediction`` on 2 ranks with the gradient-only
    audit (at the defaults a pair whose source the partition does not own is excluded):
    every training step moves gradient bytes only, and ``summary.json`` reports the excluded
    fraction. Typed, with a DistMult head: each step's one all-reduce carries the net's and
    the head's gradients together (so the coverage scale applies to both)."""
    metrics, objects = train(
        make_cfg(
            tmp_path,
            "strategy=grappa",
            "task=link_prediction",
            "trainer.devices=2",
            "strategy.audit_collectives=true",
            *typed,
        )
    )
    if typed:
        net = BlockGNN("rgcn", 8, 64, 64, 2, num_relations=2 * R)
        params = sum(p.numel() for p in net.parameters()) + R * 64  # the head: R diagonals
        assert metrics["system"]["grappa_allreduced_numel_per_step"] == [params]
    summary = json.loads((Path(objects["output_dir"]) / "summary.json").read_text())
    system = summary["system"]
    assert system["grappa_audited_steps"] > 0
    assert 0 < system["grappa_excluded_pair_fraction"] < 1
    assert summary["test_auc"] is not None and summary["comm_bytes_per_epoch"]["gradient"] > 0


def test_typed_partitions_see_no_evaluation_triple_and_keep_each_pairs_relation(tmp_path):
    """A directed typed split (2 ranks x 2 phases, a schedule cycle): no validation or test
    triple ``(s, r, d)``, nor its inverse ``(d, r + R, s)``, is an edge of any partition's
    local graph or of a block of an epoch's steps (edges compared with their relations: the
    same endpoints under another relation may be a training edge); each partition's pairs
    keep their relations, and a step's rows carry them (a negative its positive's)."""
    task = TaskConfig("link_prediction", undirected=False)
    dms = [
        grappa_dm(tmp_path, r, 2, task=task, dataset=make_typed(), super_epoch_len=1)
        for r in range(2)
    ]
    split = dms[0].targets.split
    held = [
        torch.cat([split.positives(s), split.positive_relations(s)[None]]) for s in ("val", "test")
    ]
    held = torch.cat(held, 1)
    inverse = torch.stack([held[1], held[0], held[2] + R])
    held_out = set(map(tuple, torch.cat([held, inverse], 1).t().tolist()))
    assert dms[0].num_relations == 2 * R
    edges = 0
    for t in range(dms[0].schedule.cycle):
        for dm in dms:
            for phase in range(dm.phases):
                part, _, _ = dm._partition_entry(phase, t)
                gid = part.local2global
                dst = torch.repeat_interleave(torch.arange(part.num_nodes), part.indptr.diff())
                local = torch.stack([gid[part.indices], gid[dst], part.edge_type], 1)
                assert not held_out & set(map(tuple, local.tolist()))
                assert bool((part.edge_type >= R).any())  # the inverse relations are there
                assert torch.equal(part.pair_rel, split.train_rel[part.pair_ids])
    for dm in dms:
        for step in range(dm.steps_per_epoch):
            batch = dm.make_batch(0, step)
            part = dm.partition(dm.locate(step)[0])
            gid = part.local2global
            for block in batch.blocks:
                src, dst = block.edge_index
                triples = [gid[block.src_ids[src]], gid[block.dst_ids[dst]], block.edge_type]
                edges += src.numel()
                assert not held_out & set(map(tuple, torch.stack(triples, 1).tolist()))
            nodes, y = gid[batch.blocks[-1].dst_ids], batch.y
            pos = y[:, 2] == 1
            # every positive row is a training triple with its relation
            train = torch.cat([split.train_pos, split.train_rel[None]])
            known = set(map(tuple, train.t().tolist()))
            rows = torch.stack([nodes[y[pos, 0]], nodes[y[pos, 1]], y[pos, 3]], 1)
            assert set(map(tuple, rows.tolist())) <= known
            k = dm.task.config.num_negatives
            assert torch.equal(y[~pos, 3], y[pos, 3].repeat_interleave(k))
    assert edges > 500
