"""HopGNN on typed graphs (docs/systems/hopgnn.md, "Typed graphs"): RGCN on typed_sbm with
per-relation fanouts equals one process in float64 under every schedule; the micrograph
sets' blocks carry relations; sampling moves no byte (the typed topology is replicated); a
rank holding only its part of a typed partition directory samples, evaluates and predicts
what the in-memory rank does; a directory's relations are checked when loaded."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.generators import typed_sbm
from lightning_gnnscale.graph.order import EpochOrder
from lightning_gnnscale.graph.partition import partition
from lightning_gnnscale.graph.partition_dir import PartitionDir, PartitionDirError, part_folder
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.systems.hopgnn import HopGNNConfig, HopGNNDataModule, HopGNNPrepared
from lightning_gnnscale.systems.hopgnn.planner import remote_inputs, sample_steps
from lightning_gnnscale.systems.hopgnn.strategy import run_iteration, sum_gradients
from lightning_gnnscale.tasks import TaskConfig
from tests.helpers.dist import run_distributed

R = 3
FANOUTS = [4, 3]
PER_RELATION = {"rel_1": [2, 1]}  # rel_1 keeps fewer neighbours than the others
RELATION_FANOUTS = [(4, 2, 4), (3, 1, 3)]
SEED = 3
ITERS = 3
TYPED = {"num_nodes": 150, "num_relations": R, "num_classes": 3, "avg_degree": 4.0,
         "num_features": 6, "seed": 5}  # fmt: skip
VARIANTS = {
    "default": {},
    "no_pregather_grads": {"pregather": False, "payload": "grads"},
    "merge_model_T1": {"steps": 1},
    "merge_home_T2": {"steps": 2, "merge_policy": "home", "merge_score": "min_roots"},
    "model_centric": {"mode": "model_centric", "merge_adaptive": False},
}


def small_typed():
    return typed_sbm(**TYPED).to(torch.float64)


def make_net(dataset):
    torch.manual_seed(0)
    features, classes = dataset.graph.num_features, dataset.num_classes
    return BlockGNN("rgcn", features, 8, classes, 2, 0.0, num_relations=R, num_bases=2).double()


def step_loss(net):
    return lambda sub: (
        F.cross_entropy(net(sub.blocks, sub.x), sub.y, reduction="sum") / sub.global_seed_count
    )


def _train_rank(rank, world_size, part, batch_size):
    dataset = small_typed()
    comm = Comm.create()
    out = {}
    data = DataConfig(batch_size, FANOUTS, fanouts_per_relation=PER_RELATION)
    for label, changes in VARIANTS.items():
        config = dataclasses.replace(HopGNNConfig(), **changes)
        dm = HopGNNDataModule(dataset, config, data, seed=SEED)
        dm.setup_rank(
            RankContext(comm, torch.device("cpu")), dm.part_of(HopGNNPrepared(part, {}), rank)
        )
        net = make_net(dataset)
        opt = torch.optim.SGD(net.parameters(), lr=0.5)
        params = list(net.parameters())
        typed_edges, sampled_bytes, replayed_bytes = 0, [], []
        for step in range(ITERS):
            before = comm.meter.snapshot()
            batch = dm.make_batch(1, step)
            sampled_bytes.append(comm.meter.delta(before)["bytes"])
            for sub in batch.steps:
                for block in sub.blocks if sub is not None else ():
                    assert block.edge_type is not None
                    assert block.edge_type.shape == (block.edge_index.shape[1],)
                    typed_edges += block.edge_type.numel()
            if label == "default":  # the same fetch, replayed: nothing else moved
                plan = dm.plan(1, step)
                sampled = sample_steps(plan, rank, dm.sampler, 1, step)
                ids = torch.unique(torch.cat([remote_inputs(b, dm.part, rank) for b in sampled]))
                before = comm.meter.snapshot()
                dm.shard.fetch(ids)
                replayed_bytes.append(comm.meter.delta(before)["bytes"])
            opt.zero_grad()
            loss, accumulator = run_iteration(batch, comm, params, step_loss(net), config)
            loss.backward()
            sum_gradients(comm, params, accumulator)
            opt.step()
        out[label] = [p.detach().clone() for p in params]
        out[label, "typed_edges"] = typed_edges
        out[label, "bytes"] = (sampled_bytes, replayed_bytes)
    return out


def reference(dataset, batch_size):
    """One process, the same global mini-batches and per-relation sampling keys."""
    graph, y = dataset.graph, dataset.targets.target
    net = make_net(dataset)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    order = EpochOrder(dataset.targets.train.nonzero().flatten(), SEED)
    sampler = NeighborSampler(
        graph.indptr, graph.indices, FANOUTS, SEED, graph.edge_type, RELATION_FANOUTS, R
    )
    for step in range(ITERS):
        seeds = order.step(1, step, batch_size)
        blocks = sampler.sample(seeds, epoch=1, step=step)
        opt.zero_grad()
        logits = net(blocks, graph.x[blocks[0].src_ids])
        (F.cross_entropy(logits, y[seeds], reduction="sum") / seeds.numel()).backward()
        opt.step()
    return list(net.parameters())


@pytest.mark.dist
@pytest.mark.parametrize(("world_size", "batch_size"), [(2, 16), (3, 5)])
def test_rgcn_on_a_typed_graph_equals_one_process(world_size, batch_size):
    """float64, RGCN with bases, per-relation fanouts, ``ITERS`` iterations: every schedule's
    parameters (merged or not, pre-gathered or not, model-centric) equal one process's on
    every rank; every block carries its edges' relations; an iteration's bytes are those of
    its one feature fetch (the typed topology is replicated: no relation moves)."""
    dataset = small_typed()
    part = partition(dataset.graph, "metis", world_size, seed=0)
    results = run_distributed(_train_rank, world_size, part, batch_size, timeout_s=240)
    want = reference(dataset, batch_size)
    for r in results:
        for label in VARIANTS:
            if label == "merge_home_T2" and world_size < 2:
                continue
            for got, ref in zip(r[label], want, strict=True):
                torch.testing.assert_close(got, ref, rtol=0, atol=1e-10)
        assert r["default", "typed_edges"] > 0
        sampled, replayed = r["default", "bytes"]
        assert sampled == replayed and any(b.get("feature", 0) > 0 for b in sampled)


# ------------------------------------------------------------------ partition directories
def make_dm(cache_dir, name="hopgnn", partition_dir=None, per_relation=None, task=None):
    data = DataConfig(
        batch_size=32,
        fanouts=FANOUTS,
        partition_dir=partition_dir,
        fanouts_per_relation=PER_RELATION if per_relation is None else per_relation,
    )
    return HopGNNDataModule(
        "typed_sbm",
        HopGNNConfig.preset(name),
        data,
        seed=SEED,
        cache_dir=cache_dir,
        dtype=torch.float64,
        dataset_options=TYPED,
        **({} if task is None else {"task": task}),
    )


def _iterations(dm, new2old=None):
    """Epoch 1's micrograph sets (blocks in original ids with relations and degrees, input
    rows, targets), then the evaluation counts and every node's logits."""
    torch.manual_seed(0)
    net = BlockGNN("rgcn", dm.input_dim, 8, dm.out_dim, 2, 0.0, num_relations=dm.num_relations)
    net = net.double()
    out = []
    for step in range(dm.steps_per_epoch):
        for s in dm.make_batch(1, step).steps:
            if s is None:
                out.append(None)
                continue
            ids = [b.src_ids if new2old is None else new2old[b.src_ids] for b in s.blocks]
            blocks = [(i, b.edge_index, b.src_deg, b.edge_type) for i, b in zip(ids, s.blocks)]
            out.append((blocks, s.x, s.y))
    counts = dm.comm.all_reduce(
        dm.eval_statistics(net.eval(), ("train", "val", "test")), category="control"
    )
    return out, counts, dm.predict_rows(net, None, "logits")


def _own_part_rank(rank, world_size, tmp_path):
    comm = Comm.create()
    context = RankContext(comm, torch.device("cpu"))
    results = {}
    for name in ("hopgnn", "hopgnn_mc"):
        in_memory = make_dm(tmp_path / "cache", name)
        in_memory.setup_rank(context, in_memory.rank_part(context))
        in_memory.context = context
        want = _iterations(in_memory)
        mine = tmp_path / f"{name}-rank{rank}"
        shutil.copytree(tmp_path / name, mine)
        for k in range(world_size):
            if k != rank:
                shutil.rmtree(mine / part_folder(k))
        from_dir = make_dm(tmp_path / "cache", name, partition_dir=str(mine))
        from_dir.setup_rank(context, from_dir.rank_part(context))
        from_dir.context = context
        assert from_dir.num_relations == R
        results[name] = (want, _iterations(from_dir, from_dir.sampler.orig_ids))
    return results


@pytest.mark.dist
def test_a_rank_with_only_its_typed_part_equals_the_in_memory_rank(tmp_path):
    """``hopgnn`` and ``hopgnn_mc`` from a typed directory (the other part's folder deleted):
    every micrograph set's blocks (original ids, relations, degrees), input rows and targets,
    the evaluation counts and the predictions equal the in-memory rank's; the metadata names
    the relations and node types, and the report counts each part's nodes of every type."""
    for name in ("hopgnn", "hopgnn_mc"):
        make_dm(tmp_path / "cache", name).write_partition_dir(tmp_path / name, 2, log=lambda *_: 0)
    meta = PartitionDir.open(tmp_path / "hopgnn").meta
    assert meta["relations"] == [f"rel_{r}" for r in range(R)]
    assert meta["node_types"] == ["type_0", "type_1"]
    graph = small_typed().graph
    counts = torch.tensor(meta["report"]["node_type_counts"])
    assert counts.shape == (2, 2)
    assert counts.sum(0).tolist() == torch.bincount(graph.node_type, minlength=2).tolist()
    assert counts.sum(1).tolist() == torch.tensor(meta["node_offsets"]).diff().tolist()
    results = run_distributed(_own_part_rank, 2, tmp_path, timeout_s=150)
    for name in ("hopgnn", "hopgnn_mc"):
        for by_rank in results:
            (want, want_counts, _), (got, got_counts, _) = by_rank[name]
            assert len(want) == len(got) > 0
            for w, g in zip(want, got, strict=True):
                assert (w is None) == (g is None)
                if w is None:
                    continue
                for wb, gb in zip(w[0], g[0], strict=True):
                    assert wb[3] is not None
                    assert all(torch.equal(a, b) for a, b in zip(wb, gb, strict=True))
                assert torch.equal(w[1], g[1]) and torch.equal(w[2], g[2])
            assert torch.equal(want_counts, got_counts)
        # predictions: in memory a node range per rank, from the directory its own nodes
        want_ids = torch.cat([r[name][0][2][0] for r in results]).sort()
        got_ids = torch.cat([r[name][1][2][0] for r in results]).sort()
        assert torch.equal(want_ids.values, got_ids.values)
        want_rows = torch.cat([r[name][0][2][1] for r in results])[want_ids.indices]
        got_rows = torch.cat([r[name][1][2][1] for r in results])[got_ids.indices]
        torch.testing.assert_close(got_rows, want_rows, rtol=0, atol=1e-12)


def _load(tmp_path, change=None, **kwargs):
    """Set up a one-rank DataModule on ``tmp_path / "parts"``, the shared group's arrays
    passed through ``change``."""
    load_shared = PartitionDir.load_shared

    def changed(self, name, rank):
        arrays = dict(load_shared(self, name, rank))
        return arrays if change is None else change(arrays)

    dm = make_dm(tmp_path / "cache", partition_dir=str(tmp_path / "parts"), **kwargs)
    context = RankContext(Comm.create(), torch.device("cpu"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PartitionDir, "load_shared", changed)
        dm.setup_rank(context, dm.rank_part(context))
    return dm


def test_a_typed_directorys_relations_are_checked_when_loaded(tmp_path):
    """Outside input: a missing ``edge_type``, a relation out of range, a segment not sorted
    by relation, and per-relation fanouts naming another relation are refused at set-up."""
    make_dm(tmp_path / "cache").write_partition_dir(tmp_path / "parts", 1, log=lambda *_: 0)
    assert _load(tmp_path).sampler.relation_fanouts == RELATION_FANOUTS

    def without(arrays):
        del arrays["edge_type"]
        return arrays

    def out_of_range(arrays):
        arrays["edge_type"] = arrays["edge_type"].clone()
        arrays["edge_type"][0] = R
        return arrays

    def unsorted(arrays):
        indptr, kinds = arrays["indptr"], arrays["edge_type"].clone()
        starts = torch.zeros(kinds.numel(), dtype=torch.bool)
        starts[indptr[:-1][indptr[1:] > indptr[:-1]]] = True
        # the first edge whose relation follows another inside its segment, swapped back
        e = int(((kinds[1:] != kinds[:-1]) & ~starts[1:]).nonzero()[0]) + 1
        kinds[e - 1], kinds[e] = kinds[e].clone(), kinds[e - 1].clone()
        arrays["edge_type"] = kinds
        return arrays

    with pytest.raises(PartitionDirError, match="holds no edge_type"):
        _load(tmp_path, without)
    for change in (out_of_range, unsorted):
        with pytest.raises(PartitionDirError, match="sorted by relation"):
            _load(tmp_path, change)
    with pytest.raises(ConfigError, match=r"\['rel_9'\].*\['rel_0', 'rel_1', 'rel_2'\]"):
        _load(tmp_path, per_relation={"rel_9": [1, 1]})


def test_a_typed_link_directorys_relations_are_checked_when_loaded(tmp_path):
    """Typed link prediction from a directory (a directed split): the metadata names the
    message relations (RGCN's ``2R``) and the pairs' (DistMult's ``R``, told to the task
    before its head is built); the sampler, the stages and the pairs carry their relations,
    as the in-memory rank's. Outside input: a missing ``train_rel``, a stage's relation out
    of range, an evaluation pair's relation out of range are refused at set-up."""
    task = TaskConfig(
        "link_prediction", decoder="distmult", undirected=False, filter_negatives=True
    )
    in_memory = make_dm(tmp_path / "cache", task=task)
    in_memory.write_partition_dir(tmp_path / "parts", 1, log=lambda *_: 0)
    names = [f"rel_{r}" for r in range(R)]
    meta = PartitionDir.open(tmp_path / "parts").meta
    assert meta["relations"] == names + [f"{n}_inverse" for n in names]
    assert meta["pair_relations"] == names
    dm = _load(tmp_path, task=task)
    assert dm.num_relations == 2 * R and dm.task.relations == tuple(names)
    assert dm.task.trained_head().weight.shape[0] == R  # DistMult: a diagonal per relation
    context = RankContext(Comm.create(), torch.device("cpu"))
    in_memory.setup_rank(context, in_memory.rank_part(context))
    want, got = in_memory.held, dm.held
    assert got.sampler.relation_fanouts == want.sampler.relation_fanouts
    for split in ("val", "test"):
        assert torch.equal(got.link.relations[split], want.link.relations[split])
    assert torch.equal(got.link.targets.split.train_rel, want.link.targets.split.train_rel)
    # 2 parts (relabelled): every CSC's relations follow their edges, segments in order
    in_memory.write_partition_dir(tmp_path / "parts2", 2, log=lambda *_: 0)
    shared = PartitionDir.open(tmp_path / "parts2").load_shared("topology", 0)
    split, graph, n = in_memory.targets.split, in_memory.graph, TYPED["num_nodes"]
    old = {"": (graph.indptr, graph.indices, graph.edge_type)}
    old |= {f"{s}_": (*split.structure(s), split.structure_edge_type(s)) for s in ("train", "test")}
    orig = shared["orig_ids"]
    assert not torch.equal(orig, torch.arange(n))  # relabelled
    for prefix, (indptr, indices, edge_type) in old.items():
        new_indptr = shared[f"{prefix}indptr"]
        new_dst = orig[torch.repeat_interleave(torch.arange(n), new_indptr.diff())]
        new_src, new_rel = orig[shared[f"{prefix}indices"]], shared[f"{prefix}edge_type"]
        dst = torch.repeat_interleave(torch.arange(n), indptr.diff())
        assert torch.equal(  # segment by segment, in the original order
            torch.stack([new_src, new_rel])[:, torch.argsort(new_dst, stable=True)],
            torch.stack([indices, edge_type])[:, torch.argsort(dst, stable=True)],
        )
    # task.filter_negatives: a part's training lookup (rebuilt in original ids, typed) draws
    # the in-memory negatives
    two = make_dm(tmp_path / "cache", partition_dir=str(tmp_path / "parts2"), task=task)
    targets = two.load_part(two.open_partition_dir(2), 1).link.targets
    seeds = torch.arange(0, targets.split.train_pos.shape[1], 3)
    for step in range(2):
        args = (seeds, torch.arange(seeds.numel()))
        got_rows = two.task.step_rows(targets, *args, epoch=0, step=step)
        want_rows = in_memory.task.step_rows(want.link.targets, *args, epoch=0, step=step)
        assert all(torch.equal(a, b) for a, b in zip(got_rows, want_rows, strict=True))

    def without(arrays):
        del arrays["train_rel"]
        return arrays

    def stage_out_of_range(arrays):
        arrays["test_edge_type"] = arrays["test_edge_type"].clone()
        arrays["test_edge_type"][0] = 2 * R
        return arrays

    with pytest.raises(PartitionDirError, match=r"holds no \['train_rel'\]"):
        _load(tmp_path, without, task=task)
    with pytest.raises(PartitionDirError, match="test_edge_type.npy must be int64"):
        _load(tmp_path, stage_out_of_range, task=task)
    load_part = PartitionDir.load_part

    def bad_val_rel(self, rank):
        arrays = dict(load_part(self, rank))
        arrays["val_rel"] = arrays["val_rel"] + R
        return arrays

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PartitionDir, "load_part", bad_val_rel)
        with pytest.raises(PartitionDirError, match=r"val_rel must be int64 .* in \[0, 3\)"):
            _load(tmp_path, task=task)
