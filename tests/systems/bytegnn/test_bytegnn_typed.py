"""ByteGNN on typed graphs (docs/systems/bytegnn.md, "Typed graphs"): the S-Worker's blocks are
the typed reference sampler's with their relations, on one rank and through the owners of 2
ranks, which count the relations they send as ``structure`` bytes; RGCN's full-batch step and
evaluation equal ``single``'s in float64; per-relation fanouts reach the DAG; a partition
directory carries the types and a directory that lies about them is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lightning_gnnscale.comm import Comm, CommMeter, Topology
from lightning_gnnscale.comm.transport import SocketTransport
from lightning_gnnscale.config_types import DataConfig, ModelConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.files import file_digest
from lightning_gnnscale.graph.book import (
    PartitionBook,
    RangeBook,
    build_local_partition,
    relabel_graph,
)
from lightning_gnnscale.graph.generators import typed_sbm
from lightning_gnnscale.graph.partition import partition
from lightning_gnnscale.graph.partition_dir import (
    METADATA,
    PartitionDir,
    PartitionDirError,
    metadata_digest,
    part_folder,
)
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.graph.seed_split import SeedSplit
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.inference import full_logits
from lightning_gnnscale.models.module import GNNModule
from lightning_gnnscale.store_secret import read_secret
from lightning_gnnscale.systems.bytegnn.config import ByteGNNConfig, DagConfig, SchedulerConfig
from lightning_gnnscale.systems.bytegnn.datamodule import ByteGNNDataModule
from lightning_gnnscale.systems.bytegnn.store import NSC, GraphStore
from lightning_gnnscale.systems.bytegnn.sworker import SWorker
from lightning_gnnscale.systems.single.datamodule import SingleDataModule
from lightning_gnnscale.tasks import TaskConfig
from tests.helpers.dist import run_distributed

R = 3  # relations
SEED = 7
FULL = DataConfig(batch_size=-1, fanouts=[-1, -1])
TYPED = {"num_nodes": 160, "num_relations": R, "num_features": 5, "avg_degree": 3.0}


def _relabelled(world_size, method="random", num_nodes=600):
    """A typed sbm relabelled by a ``method`` partition: ``(graph, targets, book)``."""
    dataset = typed_sbm(num_nodes=num_nodes, num_relations=R, num_features=5, seed=4)
    parts = partition(dataset.graph, method, world_size, seed=1)
    book = PartitionBook.from_parts(parts, world_size)
    return relabel_graph(dataset.graph, book), dataset.targets.rows(book.new2old), book


def _store(graph, targets, book, k, carried=False):
    """Rank ``k``'s typed store: with the ``[N]`` degrees, or (``carried``) without them, as
    a rank loaded from a partition directory holds it (degrees travel with the samples)."""
    local = build_local_partition(graph, targets, book, k)
    kinds = graph.edge_type[local.edge_ids]
    degree = graph.in_degree()
    if not carried:
        return GraphStore(local, book, degree, None, edge_type=kinds, num_relations=R)
    seeds = targets.train.nonzero().flatten()
    return GraphStore(
        local,
        RangeBook(book.node_offsets),
        None,
        None,
        local_degree=degree[local.local2global],
        seed_ids=seeds,
        seed_degree=degree[seeds],
        edge_type=kinds,
        num_relations=R,
    )


def _worker(store, split, relation_fanouts, threads, nsc, ff):
    return SWorker(
        store,
        split,
        [max(hop) for hop in relation_fanouts],
        SEED,
        DagConfig(nsc_tasks=nsc, ff_tasks=ff),
        SchedulerConfig(),
        threads,
        timeout_s=30.0,
        cpu_percent=lambda: 50.0,
        relation_fanouts=relation_fanouts,
    )


def _reference(graph, relation_fanouts):
    fanouts = [max(hop) for hop in relation_fanouts]
    return NeighborSampler(
        graph.indptr,
        graph.indices,
        fanouts,
        seed=SEED,
        edge_type=graph.edge_type,
        relation_fanouts=relation_fanouts,
        num_relations=R,
    )


def _same_blocks(got_blocks, want_blocks) -> bool:
    same = len(got_blocks) == len(want_blocks)
    for got, want in zip(got_blocks, want_blocks):
        same &= got.num_dst == want.num_dst and torch.equal(got.src_ids, want.src_ids)
        same &= torch.equal(got.edge_index, want.edge_index)
        same &= torch.equal(got.edge_type, want.edge_type)
        same &= torch.equal(got.src_deg, want.src_deg)
    return bool(same)


# ------------------------------------------------------------------------------- one rank
@pytest.mark.parametrize(
    "relation_fanouts,threads,nsc,ff,carried",
    [
        ([(4, 2, 3), (3, 1, 2)], 1, 1, 1, False),
        ([(4, 2, 3), (3, 1, 2)], 2, 3, 2, False),
        ([(-1, 2, 1), (2, 2, -1)], 2, 4, 3, False),
        ([(4, 2, 3), (3, -1, 2)], 2, 3, 2, True),
    ],
)
def test_typed_blocks_equal_the_typed_reference_sampler_edge_for_edge(
    relation_fanouts, threads, nsc, ff, carried
):
    """Every relation keeps its own fanout, and each block's edges, their relations and the
    degrees are ``NeighborSampler``'s typed blocks, for any chunking and thread count, with
    the ``[N]`` degrees or with degrees carried by the samples."""
    graph, targets, book = _relabelled(1)
    store = _store(graph, targets, book, 0, carried)
    split = SeedSplit(targets.train.nonzero().flatten(), 1, 0, 64, SEED)
    worker = _worker(store, split, relation_fanouts, threads, nsc, ff)
    reference = _reference(graph, relation_fanouts)
    worker.last_epoch = 0
    worker.start()
    try:
        for step in range(3):
            batch = worker.take(0, step)
            expected = reference.sample(split.seeds(0, step), epoch=0, step=step)
            assert _same_blocks(batch.blocks, expected)
            assert torch.equal(batch.x, graph.x[expected[0].src_ids])
            for block in batch.blocks:  # every relation reached the block
                assert torch.bincount(block.edge_type, minlength=R).min() > 0
    finally:
        worker.stop()


def test_a_typed_store_refuses_untyped_sampling_and_a_request_for_other_relations():
    graph, targets, book = _relabelled(1)
    store = _store(graph, targets, book, 0)
    ids = torch.arange(10)
    counts, src, kinds = store.serve(NSC, [ids, torch.tensor([2, 1, 3, 5])])[0]
    assert kinds.dtype == torch.uint8 and kinds.numel() == src.numel() == int(counts.sum())
    with pytest.raises(ValueError, match="2 fanouts for 3 relations"):
        store.serve(NSC, [ids, torch.tensor([2, 1, 5])])
    with pytest.raises(ValueError, match="per relation"):
        store.sample(ids, 3, 5)
    split = SeedSplit(ids, 1, 0, 5, SEED)
    with pytest.raises(ValueError, match="come together"):
        SWorker(store, split, [2, 2], SEED, DagConfig(), SchedulerConfig(), 1, 30.0)
    with pytest.raises(ValueError, match="2 hops of 3 relations"):
        _worker(store, split, [(2, 2, 2), (2, 2)], 1, 1, 1)


def test_more_than_256_relations_travel_as_int32():
    """Past 256 relations the answer's relations are int32, and equal the graph's."""
    from lightning_gnnscale.graph.csc import Graph

    gen = torch.Generator().manual_seed(0)
    n, e, relations = 50, 2000, 300
    edges = torch.randint(n, (2, e), generator=gen)
    kinds = torch.randint(relations, (e,), generator=gen)
    graph = Graph.from_edge_index(
        edges,
        n,
        edge_type=kinds,
        x=torch.zeros(n, 1),
        relations=tuple(f"r{r}" for r in range(relations)),
    )
    dataset = typed_sbm(num_nodes=n, num_relations=2, num_features=1, seed=0)
    book = PartitionBook.from_parts(torch.zeros(n, dtype=torch.int64), 1)
    local = build_local_partition(graph, dataset.targets, book, 0)
    store = GraphStore(
        local,
        book,
        graph.in_degree(),
        None,
        edge_type=graph.edge_type[local.edge_ids],
        num_relations=relations,
    )
    ids = torch.arange(n)
    params = torch.tensor([-1] * relations + [3])
    counts, src, got = store.serve(NSC, [ids, params])[0]
    assert got.dtype == torch.int32 and int(counts.sum()) == graph.num_edges
    assert torch.equal(got.long(), graph.edge_type) and torch.equal(src, graph.indices)


# ------------------------------------------------------------------- two ranks, the owners
def _owners_rank(rank, world_size):
    relation_fanouts = [(4, 2, 3), (3, 1, 2)]
    graph, targets, book = _relabelled(world_size, num_nodes=500)
    meter = CommMeter()
    comm = Comm.create(meter, Topology(world_size, world_size), timeout_s=30.0)
    store = _store(graph, targets, book, rank)
    transport = SocketTransport(rank, comm.topology, 30.0, read_secret())
    transport.start(store.serve, comm, store.request_bytes, store.max_in_degree)
    store.transport = transport
    split = SeedSplit(targets.train.nonzero().flatten(), world_size, rank, 60, SEED)
    worker = _worker(store, split, relation_fanouts, threads=2, nsc=1, ff=1)
    reference = _reference(graph, relation_fanouts)
    worker.last_epoch = 0
    worker.start()
    mismatches, asked, answered = 0, 0, 0  # this rank's requests' and its peers' answers' bytes
    for step in range(split.steps):
        batch = worker.take(0, step)
        expected = reference.sample(split.seeds(0, step), 0, step)
        mismatches += not _same_blocks(batch.blocks, expected)
        seeds = expected[-1].dst_ids
        remote = int((book.nid2part(seeds) != rank).sum())
        asked += 8 * remote * 2  # the seeds' ids for their target rows and their features
        for block in expected[::-1]:  # hop by hop from the seeds, one NSC and FF task each
            far = book.nid2part(block.dst_ids) != rank
            if far.any():  # one request per hop: ids and [fanouts, key]; counts and sources
                far_edges = int(far[block.edge_index[1]].sum())
                asked += 8 * int(far.sum()) + 8 * (R + 1)
                answered += 8 * int(far.sum()) + (8 + 1) * far_edges  # a source, a relation
            new = block.src_ids[block.num_dst :]
            asked += 8 * int((book.nid2part(new) != rank).sum())  # the new vertices' features
    comm.barrier()  # every rank has taken its last batch: no request is still on its way
    worker.stop()
    transport.flush(meter)
    structure = meter.snapshot()["bytes"]["structure"]
    comm.barrier()
    transport.close()
    return {"mismatches": mismatches, "asked": asked, "answered": answered, "bytes": structure}


@pytest.mark.dist
def test_two_ranks_sample_the_typed_reference_and_count_the_relations_they_send():
    """Through the owners of 2 ranks the blocks are the typed reference's, and the
    ``structure`` bytes are exactly the requests' ids and fanouts and the answers' counts,
    sources and one byte per sampled edge's relation."""
    results = run_distributed(_owners_rank, 2, timeout_s=120)
    assert all(r["mismatches"] == 0 for r in results)
    assert all(r["answered"] > 0 for r in results)
    want = sum(r["asked"] + r["answered"] for r in results)
    assert sum(r["bytes"] for r in results) == want


# ------------------------------------------------------------- RGCN against single, float64
def _dataset():
    return typed_sbm(**TYPED, seed=3).to(torch.float64)


def _net(num_bases):
    torch.manual_seed(0)
    net = BlockGNN("rgcn", 5, 8, 4, 2, dropout=0.0, num_relations=R, num_bases=num_bases)
    return net.double()


def _step(net, task, batch):
    """``(loss, flat gradient)`` of this rank's share of a step."""
    net.zero_grad()
    loss = task.loss_sum(net(batch.blocks, batch.x), batch.y) / batch.global_seed_count
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in net.parameters()])


def _rgcn_rank(rank, world_size, cache_dir):
    comm = Comm.create(CommMeter(), Topology(world_size, world_size), timeout_s=60)
    context = RankContext(comm, torch.device("cpu"))
    out = {"steps": {}, "rows": {}}
    per_relation = DataConfig(
        batch_size=40, fanouts=[3, 2], fanouts_per_relation={"rel_1": [1, -1]}
    )
    for name, data in (("full", FULL), ("per_relation", per_relation)):
        config = ByteGNNConfig(dag=DagConfig(nsc_tasks=2, ff_tasks=2))
        dm = ByteGNNDataModule(_dataset(), config, data, seed=SEED, cache_dir=cache_dir)
        prepared = dm.prepare(world_size)
        dm.setup_rank(context, dm.part_of(prepared, rank))
        dm.context = context
        dm.sworker.last_epoch = 0
        dm.sworker.start()
        batch = dm.make_batch(0, 0)
        if name == "full":
            for bases in (0, 2):
                out["steps"][bases] = _step(_net(bases), dm.task, batch)
                out["rows"][bases] = dm.core_outputs(_net(bases), 2)
            out["ids"] = dm.core_orig_ids
        else:
            reference = NeighborSampler(
                prepared.graph.indptr,
                prepared.graph.indices,
                list(data.fanouts),
                seed=SEED,
                edge_type=prepared.graph.edge_type,
                relation_fanouts=dm.relation_fanouts,
                num_relations=R,
            )
            expected = reference.sample(dm.sworker.split.seeds(0, 0), 0, 0)
            out["relation_fanouts"] = dm.relation_fanouts
            out["same"] = _same_blocks(batch.blocks, expected)
        comm.barrier()
        dm.stop_service()
    return out


@pytest.mark.dist
def test_two_ranks_step_and_evaluate_rgcn_as_single_in_float64(tmp_path):
    """RGCN (full weights and a 2-matrix basis) on 2 ranks: the full-batch step's losses and
    gradients sum to ``single``'s and each rank's evaluation rows of its core are
    ``single``'s full-neighbourhood logits, to 1e-12; with ``data.fanouts_per_relation`` the
    DAG samples each relation with its own fanout (the typed reference's blocks)."""
    results = run_distributed(_rgcn_rank, 2, tmp_path / "cache", timeout_s=150)
    single = SingleDataModule(_dataset(), None, FULL, seed=SEED, cache_dir=tmp_path / "cache")
    batch = single.make_batch(0, 0)
    for bases in (0, 2):
        loss, grad = _step(_net(bases), single.task, batch)
        got = [r["steps"][bases] for r in results]
        torch.testing.assert_close(sum(g[0] for g in got), loss, rtol=0, atol=1e-12)
        torch.testing.assert_close(sum(g[1] for g in got), grad, rtol=0, atol=1e-12)
        want = full_logits(single.graph, _net(bases), 4096, None)
        for r in results:
            torch.testing.assert_close(r["rows"][bases], want[r["ids"]], rtol=0, atol=1e-12)
    assert sum(r["ids"].numel() for r in results) == TYPED["num_nodes"]
    for r in results:
        assert r["relation_fanouts"] == [(3, 1, 3), (2, -1, 2)]
        assert r["same"]


# ---------------------------------------------------------------------- partition directory
def _dm(cache_dir, partition_dir=None, **data):
    data = DataConfig(batch_size=40, fanouts=[3, 2], partition_dir=partition_dir, **data)
    graph = None if partition_dir is not None else typed_sbm(**TYPED, seed=3)
    return ByteGNNDataModule(graph, ByteGNNConfig(), data, seed=SEED, cache_dir=cache_dir)


def _rewrite(out, k, name, array=None):
    """Replace (``array``) or remove part ``k``'s ``name``.npy, resealing the metadata as a
    writer would (so only the types' own checks can refuse it)."""
    meta = json.loads((out / METADATA).read_text())
    files = meta["parts"][k]["files"]
    path = out / part_folder(k) / f"{name}.npy"
    if array is None:
        path.unlink()
        del files[f"{name}.npy"]
    else:
        np.save(path, array.numpy(), allow_pickle=False)
        files[f"{name}.npy"] = {"bytes": path.stat().st_size, "blake2b": file_digest(path)}
    meta["blake2b"] = metadata_digest(meta)
    (out / METADATA).write_text(json.dumps(meta))


def test_a_typed_directory_carries_the_types_and_refuses_wrong_ones(tmp_path):
    """The directory's parts hold the in-memory parts' relations and node types, its metadata
    the names; relation fanouts come from those names; a part without its relations, with a
    relation out of range, or with a segment not sorted by relation is refused, naming the
    file."""
    in_memory = _dm(tmp_path / "cache")
    prepared = in_memory.prepare(2)
    out = tmp_path / "parts"
    in_memory.write_partition_dir(out, 2, log=lambda *_: 0)
    meta = json.loads((out / METADATA).read_text())
    assert meta["relations"] == ["rel_0", "rel_1", "rel_2"]
    assert meta["node_types"] == ["type_0", "type_1"]
    from_dir = _dm(tmp_path / "cache", str(out), fanouts_per_relation={"rel_2": [1, 1]})
    assert from_dir.num_relations == R
    assert from_dir.relation_fanouts == [(3, 3, 1), (2, 2, 1)]
    opened = from_dir.prepare(2)
    for k in range(2):
        want, got = in_memory.part_of(prepared, k), from_dir.load_part(opened, k)
        assert torch.equal(got.edge_type, want.edge_type)
        assert torch.equal(got.node_type, want.node_type)
        assert got.edge_type.numel() == got.local.num_edges
    with pytest.raises(ConfigError, match=r"\['rel_9'\].*\['rel_0', 'rel_1', 'rel_2'\]"):
        _dm(tmp_path / "cache", str(out), fanouts_per_relation={"rel_9": [1, 1]}).prepare(2)

    kinds = in_memory.part_of(prepared, 0).edge_type.clone()
    indptr = in_memory.part_of(prepared, 0).local.indptr
    wide = kinds.clone()
    wide[5] = R
    _rewrite(out, 0, "edge_type", wide)
    with pytest.raises(PartitionDirError, match=r"edge_type.npy: values in \[0, 3\]"):
        _dm(tmp_path / "cache", str(out)).load_part(PartitionDir.open(out), 0)
    unsorted = kinds.clone()
    v = int(torch.nonzero(indptr.diff() >= 2).flatten()[0])  # a segment of two edges or more
    first = int(indptr[v])
    unsorted[first], unsorted[first + 1] = 2, 0
    _rewrite(out, 0, "edge_type", unsorted)
    with pytest.raises(PartitionDirError, match=r"edge_type.npy: edge .* sorted by relation"):
        _dm(tmp_path / "cache", str(out)).load_part(PartitionDir.open(out), 0)
    _rewrite(out, 0, "edge_type")
    with pytest.raises(
        PartitionDirError, match=r"holds no edge_type.npy, but .* lists 'relations'"
    ):
        _dm(tmp_path / "cache", str(out)).prepare(2)


def test_a_homogeneous_directory_refuses_per_relation_fanouts(tmp_path):
    dm = ByteGNNDataModule(
        "sbm",
        ByteGNNConfig(),
        DataConfig(batch_size=40, fanouts=[3, 2]),
        cache_dir=tmp_path,
        dataset_options={"num_nodes": 150, "num_features": 4},
    )
    dm.write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)
    assert "relations" not in json.loads((tmp_path / "parts" / METADATA).read_text())
    data = DataConfig(
        batch_size=40,
        fanouts=[3, 2],
        partition_dir=str(tmp_path / "parts"),
        fanouts_per_relation={"rel_0": [1, 1]},
    )
    plain = DataConfig(batch_size=40, fanouts=[3, 2], partition_dir=str(tmp_path / "parts"))
    assert ByteGNNDataModule(None, ByteGNNConfig(), plain).num_relations == 1
    with pytest.raises(ConfigError, match="homogeneous graph; drop it"):
        ByteGNNDataModule(None, ByteGNNConfig(), data).prepare(2)


def test_a_typed_link_directory_carries_the_pair_relations_and_refuses_wrong_ones(tmp_path):
    """Typed link prediction (a directed split): the directory's metadata names the message
    relations (inverses included: they size the net and take per-relation fanouts) and the
    pairs' relations; each part holds its edges' relations and its pairs', as in memory; a
    pair relation out of range, or a part without its pairs' relations, is refused naming
    the file. A DistMult head built from the directory has the pairs' relations."""
    task = TaskConfig("link_prediction", undirected=False, decoder="distmult")
    data = DataConfig(batch_size=40, fanouts=[3, 2])
    in_memory = ByteGNNDataModule(
        typed_sbm(**TYPED, seed=3),
        ByteGNNConfig(),
        data,
        seed=SEED,
        task=task,
        cache_dir=tmp_path / "cache",
    )
    prepared, out = in_memory.prepare(2), tmp_path / "parts"
    in_memory.write_partition_dir(out, 2, log=lambda *_: 0)
    meta = json.loads((out / METADATA).read_text())
    names = [f"rel_{r}" for r in range(R)]
    assert meta["relations"] == names + [f"{n}_inverse" for n in names]
    assert meta["pair_relations"] == names

    def from_dir(**extra):
        data = DataConfig(batch_size=40, fanouts=[3, 2], partition_dir=str(out), **extra)
        return ByteGNNDataModule(None, ByteGNNConfig(), data, seed=SEED, task=task)

    loaded = from_dir(fanouts_per_relation={"rel_1_inverse": [1, 1]})
    module = GNNModule.from_config(ModelConfig(name="rgcn", hidden=8, num_layers=2), loaded)
    assert module.head.weight.shape == (R, 64)  # DistMult: the pairs' R, before any part
    assert loaded.num_relations == 2 * R
    assert loaded.relation_fanouts == [(3, 3, 3, 3, 1, 3), (2, 2, 2, 2, 1, 2)]
    opened = loaded.prepare(2)
    for k in range(2):
        want, got = in_memory.part_of(prepared, k), loaded.load_part(opened, k)
        assert torch.equal(got.edge_type, want.edge_type)
        assert torch.equal(got.edge_split, want.edge_split)
        assert int(want.edge_type.max()) == 2 * R - 1  # inverse relations are in the part
        for s in ("train", "val", "test"):
            assert torch.equal(got.pair_rel[s], want.pair_rel[s])

    rel = in_memory.part_of(prepared, 0).pair_rel["val"].clone()
    rel[0] = R
    _rewrite(out, 0, "link_val_rel", rel)
    with pytest.raises(PartitionDirError, match=r"link_val_rel.npy: values in \[0, 3\]"):
        from_dir().load_part(PartitionDir.open(out), 0)
    _rewrite(out, 0, "link_train_rel")
    with pytest.raises(PartitionDirError, match=r"holds no link_train_rel.npy, but .*'pair_rel"):
        from_dir().prepare(2)
