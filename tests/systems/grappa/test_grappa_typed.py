"""Grappa on typed graphs (docs/systems/grappa.md, "Typed graphs"): with one chunk on one rank
the partition is the whole graph and a step with RGCN equals single's bit for bit in float64
(blocks with relations, loss, gradients, coverage 1, evaluation); a partition samples per
relation what the whole graph draws wherever it holds the neighbourhood; the coverage counts
each relation's neighbourhood (R = 1 is the homogeneous formula bit for bit); random chunking
balances node types; a rank reading its part of a typed partition directory builds the
in-memory rank's batches, gradients and evaluation; a directory's edge types are checked
when read; Grappa-50S serves relations; the GCN coverage is refused on a typed graph."""

from __future__ import annotations

import dataclasses
import shutil
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.generators import typed_sbm
from lightning_gnnscale.graph.partition_dir import PartitionDirError, shared_folder
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.inference import layerwise_inference
from lightning_gnnscale.systems.grappa import GrappaConfig, GrappaDataModule
from lightning_gnnscale.systems.grappa.chunking import chunk_assignment
from lightning_gnnscale.systems.grappa.directory import chunk_group
from lightning_gnnscale.systems.grappa.estimators import kappa, relation_kappa
from lightning_gnnscale.systems.grappa.partition import build_partition
from lightning_gnnscale.systems.grappa.schedule import Schedule
from tests.helpers.dist import run_distributed
from tests.systems.grappa.test_grappa import TASK, RankComm, chunk_store, every_chunk
from tests.systems.grappa.test_partition_dir_grappa import _own_rank_copy

R = 3
FANOUTS = [3, 2]
PER_RELATION = {"rel_1": [1, 1]}  # rel_1 keeps fewer neighbours than the others
RELATION_FANOUTS = [(3, 1, 3), (2, 1, 2)]
TYPED = {"num_nodes": 200, "num_relations": R, "num_classes": 3, "avg_degree": 4.0,
         "num_features": 6, "seed": 5}  # fmt: skip


def small_typed():
    return typed_sbm(**TYPED).to(torch.float64)


def rgcn(features=6, classes=3):
    torch.manual_seed(0)
    return BlockGNN("rgcn", features, 8, classes, 2, 0.0, num_relations=R, num_bases=2).double()


def typed_dm(tmp_path, world=1, rank=0, dataset=None, **settings):
    """Rank ``rank`` of ``world``'s DataModule on the small typed graph (seed 1), set up."""
    dm = GrappaDataModule(
        dataset if dataset is not None else small_typed(),
        GrappaConfig(**settings),
        DataConfig(batch_size=40, fanouts=FANOUTS, fanouts_per_relation=PER_RELATION),
        seed=1,
        cache_dir=str(tmp_path),
    )
    dm.trainer = SimpleNamespace(max_epochs=4, is_last_batch=True)
    parts = dm.prepare(world)
    dm.setup_rank(RankContext(RankComm(rank, world), torch.device("cpu")), dm.part_of(parts, rank))
    return dm


def grads(net):
    return [p.grad.clone() for p in net.parameters()]


def test_one_chunk_on_one_rank_equals_single_bit_for_bit_in_float64(tmp_path):
    """C = 1: the partition is the whole graph (local ids = global ids), so each batch's
    blocks are the whole graph's per-relation sampler's for the same seeds and keys (sources,
    edges, relations, degrees), every coverage is 1 (``c = 1`` whatever the estimator), the
    RGCN loss and gradients are single's, and the isolated and full-graph evaluations are
    layer-wise inference over the whole typed graph."""
    data = small_typed()
    g = data.graph
    dm = typed_dm(tmp_path, partitions_per_rank=1, dataset=data)
    part = dm.partition(0)
    assert torch.equal(part.local2global, torch.arange(g.num_nodes))
    assert torch.equal(part.edge_type, g.edge_type)
    whole = NeighborSampler(g.indptr, g.indices, FANOUTS, 1, g.edge_type, RELATION_FANOUTS, R)
    net, ref = rgcn(), rgcn()
    for epoch, step in ((0, 0), (0, 1), (1, 0)):
        batch = dm.make_batch(epoch, step)
        seeds = batch.blocks[-1].dst_ids
        want = whole.sample(seeds, epoch, step, salt=0)
        for a, b in zip(batch.blocks, want, strict=True):
            assert a.edge_type is not None
            for name in ("src_ids", "edge_index", "edge_type", "src_deg"):
                assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert batch.coverage == 1.0 and torch.equal(batch.kappa, torch.ones(seeds.numel()))
        assert torch.equal(batch.x, g.x[want[0].src_ids])
        assert torch.equal(batch.y, data.targets.target[seeds])
        for model, blocks, x in ((net, batch.blocks, batch.x), (ref, want, g.x[want[0].src_ids])):
            model.zero_grad()
            F.cross_entropy(model(blocks, x), data.targets.target[seeds]).backward()
        for a, b in zip(grads(net), grads(ref), strict=True):
            assert torch.equal(a, b)
    full = layerwise_inference(net, g.indptr, g.indices, g.x, edge_type=g.edge_type)
    assert torch.equal(dm.isolated_logits(net, part), full)
    assert torch.equal(dm.home_rows(net, net.num_layers)[1], full)


@pytest.mark.parametrize("halo_hops", [0, 1])
def test_a_partition_samples_per_relation_what_the_whole_graph_draws(tmp_path, halo_hops):
    """A 4-chunk partition: every block edge is a graph edge with its relation, a node keeps
    ``min(f_r, local in-edges under r)`` per relation, and with the 1-hop halo (every owned
    node holds all its in-edges) the seed hop is the whole graph's draw, edge for edge."""
    data = small_typed()
    g = data.graph
    dm = typed_dm(tmp_path, partitions_per_rank=4, halo_hops=halo_hops, dataset=data)
    batch = dm.make_batch(1, 2)
    part = dm.partition(dm.locate(2)[0])
    edges = {}
    src_g, dst_g = g.edge_index()
    for s, d, r in zip(src_g.tolist(), dst_g.tolist(), g.edge_type.tolist()):
        edges[s, d, r] = True
    for hop, block in enumerate(batch.blocks[::-1]):  # hop from the seeds
        src, dst = block.edge_index
        gs, gd = part.local2global[block.src_ids[src]], part.local2global[block.dst_ids[dst]]
        assert all(
            (s, d, r) in edges
            for s, d, r in zip(gs.tolist(), gd.tolist(), block.edge_type.tolist())
        )
        slot = dst * R + block.edge_type
        got = torch.bincount(slot, minlength=block.num_dst * R).view(-1, R)
        local = torch.stack(
            [
                torch.bincount(
                    torch.repeat_interleave(torch.arange(part.num_nodes), part.indptr.diff())[
                        part.edge_type == r
                    ],
                    minlength=part.num_nodes,
                )
                for r in range(R)
            ],
            1,
        )[block.dst_ids]
        assert torch.equal(got, local.clamp(max=torch.tensor(RELATION_FANOUTS[hop])))
    seeds = part.local2global[batch.blocks[-1].dst_ids]
    whole = NeighborSampler(g.indptr, g.indices, FANOUTS, 1, g.edge_type, RELATION_FANOUTS, R)
    want = whole.sample(seeds, 1, 2, salt=dm.partition_id(dm.locate(2)[0]))[-1]
    got = batch.blocks[-1]
    got_edges = (
        part.local2global[got.src_ids[got.edge_index[0]]],
        part.local2global[got.dst_ids[got.edge_index[1]]],
        got.edge_type,
    )
    want_edges = (
        want.src_ids[want.edge_index[0]],
        want.dst_ids[want.edge_index[1]],
        want.edge_type,
    )
    same = all(torch.equal(a, b) for a, b in zip(got_edges, want_edges))
    assert same == (halo_hops == 1)  # without the halo a seed lacks its remote in-edges


@pytest.mark.parametrize(("halo_hops", "count_halo"), [(0, False), (1, False), (1, True)])
def test_coverage_counts_each_relations_neighbourhood(tmp_path, halo_hops, count_halo):
    """Per owned node and relation: ``D_r`` its global in-edges under ``r``, ``ell_r`` those
    from owned sources (every held source with ``count_halo_as_local``), summing to the
    homogeneous ``deg`` and ``ell``; the batch's kappa is their per-relation mean."""
    data = small_typed()
    g = data.graph
    store = chunk_store(data, 4, "random", 0, str(tmp_path))
    part = build_partition(
        every_chunk(store), Schedule("pinned_sweep", 4).partition(1, 2), TASK, halo_hops, count_halo
    )
    own = part.local2global[: part.num_core]
    owned = torch.zeros(g.num_nodes, dtype=torch.bool)
    owned[own] = True
    src, dst = g.edge_index()
    slot = dst * R + g.edge_type
    deg = torch.bincount(slot, minlength=g.num_nodes * R).view(-1, R)[own]
    counted = owned[src] | torch.tensor(count_halo and halo_hops == 1)
    ell = torch.bincount(slot[counted], minlength=g.num_nodes * R).view(-1, R)[own]
    assert torch.equal(part.deg_rel, deg) and torch.equal(part.ell_rel, ell)
    assert torch.equal(part.deg_rel.sum(1), part.deg[: part.num_core])
    assert torch.equal(part.ell_rel.sum(1), part.ell)
    alpha = 1.0
    per = (ell.double() + alpha) / (deg.double() + alpha)
    present = deg > 0
    want = torch.where(
        present.any(1),
        (per * present).sum(1) / present.sum(1).clamp(min=1),
        torch.ones(own.numel(), dtype=torch.float64),
    )
    torch.testing.assert_close(relation_kappa(ell, deg, alpha), want, rtol=0, atol=1e-15)


def test_one_relation_is_the_homogeneous_coverage_bit_for_bit():
    torch.manual_seed(0)
    deg = torch.randint(0, 9, (50, 1))
    ell = (deg * torch.rand(50, 1)).long()
    for alpha in (0.0, 1.0):
        assert torch.equal(relation_kappa(ell, deg, alpha), kappa(ell[:, 0], deg[:, 0], alpha))


def test_random_chunking_balances_every_node_type():
    g = small_typed().graph
    chunk = chunk_assignment(g, 6, "random", 0)
    sizes = torch.bincount(chunk, minlength=6)
    assert int(sizes.max() - sizes.min()) <= 1
    for t in range(len(g.node_types)):
        per = torch.bincount(chunk[g.node_type == t], minlength=6)
        assert int(per.max() - per.min()) <= 1, t


def test_the_gcn_coverage_is_refused_on_a_typed_graph(tmp_path):
    with pytest.raises(ConfigError, match="neighbor_weighting=gcn on a typed graph"):
        typed_dm(tmp_path, neighbor_weighting="gcn")


# ------------------------------------------------------------- typed partition directories
def dir_dm(cache, partition_dir=None, config=None, task=None):
    data = DataConfig(
        batch_size=40,
        fanouts=FANOUTS,
        fanouts_per_relation=PER_RELATION,
        partition_dir=partition_dir,
    )
    return GrappaDataModule(
        "typed_sbm",
        config or GrappaConfig(super_epoch_len=1),
        data,
        seed=3,
        cache_dir=cache,
        dtype=torch.float64,
        dataset_options=TYPED,
        **({"task": task} if task is not None else {}),
    )


def _typed_epochs(dm, comm, config):
    net = rgcn(dm.input_dim, dm.out_dim)
    assert dm.num_relations == R
    out = []
    for epoch in range(3):
        for step in range(dm.steps_per_epoch):
            batch = dm.training_batch(epoch, step)
            net.zero_grad()
            (F.cross_entropy(net(batch.blocks, batch.x), batch.y) * batch.coverage).backward()
            grad = torch.cat([p.grad.flatten() for p in net.parameters()])
            comm.all_reduce(grad, category="gradient")
            blocks = [(b.src_ids, b.edge_index, b.edge_type, b.src_deg) for b in batch.blocks]
            out.append((blocks, batch.x, batch.y, torch.tensor(batch.coverage), grad))
    counts = {}
    for mode in ("global_fullgraph", "isolated"):
        dm.config = dataclasses.replace(config, eval_mode=mode)
        counts[mode] = comm.all_reduce(dm.eval_statistics(net.eval(), ("val",)), category="control")
    dm.config = config
    ids, logits = dm.predict_rows(net, None, "logits")
    return out, counts, ids, logits


def _dir_rank(rank, world_size, tmp_path, config):
    comm = Comm.create()
    context = RankContext(comm, torch.device("cpu"))
    in_memory = dir_dm(tmp_path / "cache", config=config)
    in_memory.setup_rank(context, in_memory.rank_part(context))
    in_memory.context = context
    want = _typed_epochs(in_memory, comm, config)
    from_dir = dir_dm(tmp_path / "cache", str(_own_rank_copy(tmp_path, rank, world_size)), config)
    from_dir.setup_rank(context, from_dir.rank_part(context))
    from_dir.context = context
    got = _typed_epochs(from_dir, comm, config)
    return want, got


def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    else:
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)


@pytest.mark.dist
@pytest.mark.parametrize("preset", ["grappa", "grappa_50s"])
def test_a_rank_with_only_its_typed_chunks_equals_the_in_memory_rank(tmp_path, preset):
    """Two ranks, three super-epochs of RGCN: every batch (blocks with relations, rows,
    targets, coverage), gradient, evaluation count and prediction from a rank's own copy of
    a typed directory (its part and listed chunk groups) is the in-memory rank's, exactly;
    the metadata names the relations and node types (the model's weights follow them).
    Grappa-50S: the remote expansions' relations come from their owners."""
    config = dataclasses.replace(GrappaConfig.preset(preset), super_epoch_len=1)
    meta = dir_dm(tmp_path / "cache", config=config).write_partition_dir(
        tmp_path / "parts", 2, log=lambda *_: 0
    )
    assert meta["relations"] == ["rel_0", "rel_1", "rel_2"]
    assert meta["node_types"] == ["type_0", "type_1"]
    for want, got in run_distributed(_dir_rank, 2, tmp_path, config, timeout_s=240):
        assert len(want[0]) > 0
        _assert_same(want, got)


def test_a_directorys_edge_types_are_checked_when_read(tmp_path):
    """A chunk group whose edge_type is out of range or not sorted by relation within a
    segment is refused naming the file (rewritten with a valid header and digest, so only
    the values are wrong)."""
    import numpy as np

    dir_dm(tmp_path / "cache").write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)
    folder = tmp_path / "parts" / shared_folder(chunk_group(0))
    path = folder / "edge_type.npy"
    good = np.load(path)
    indptr = np.load(folder / "indptr.npy")
    seg = int(np.argmax((np.diff(indptr) >= 2) & True))  # a segment with two in-edges
    lo = int(indptr[seg])
    bad_values = {"out of range": good.copy(), "unsorted": good.copy()}
    bad_values["out of range"][0] = R
    unsorted = bad_values["unsorted"]
    unsorted[lo], unsorted[lo + 1] = R - 1, 0
    for label, values in bad_values.items():
        copy = tmp_path / label
        shutil.copytree(tmp_path / "parts", copy)
        target = copy / shared_folder(chunk_group(0)) / "edge_type.npy"
        np.save(target, values)
        _redigest(copy, chunk_group(0), "edge_type")
        dm = dir_dm(tmp_path / "cache", str(copy))
        opened = dm.prepare(2, [0])
        part = dm.load_part(opened, 0)
        with pytest.raises(PartitionDirError, match="edge_type.npy must be int64"):
            part.load(0)


def test_a_typed_link_directorys_relations_are_checked(tmp_path):
    """Typed link prediction's directory names the message relations (a directed split's
    inverses after the graph's) and the pairs' relations; a chunk group's pair relation or
    stage edge type out of range (the full structure's: the graph's own ``R``, not ``2R``) is
    refused when read, naming the file, and message relations that are not the pairs' (then
    their inverses) before any rank starts."""
    import json

    import numpy as np

    from lightning_gnnscale.graph.partition_dir import METADATA, metadata_digest
    from lightning_gnnscale.tasks import TaskConfig

    task = TaskConfig("link_prediction", undirected=False)
    parts = tmp_path / "parts"
    meta = dir_dm(tmp_path / "cache", task=task).write_partition_dir(parts, 2, log=lambda *_: 0)
    pair = ["rel_0", "rel_1", "rel_2"]
    assert meta["pair_relations"] == pair
    assert meta["relations"] == [*pair, *(f"{r}_inverse" for r in pair)]
    for name, value in (("train_pair_rel", R), ("full_edge_type", R), ("test_edge_type", 2 * R)):
        copy = tmp_path / name
        shutil.copytree(parts, copy)
        target = copy / shared_folder(chunk_group(0)) / f"{name}.npy"
        values = np.load(target)
        values[-1] = value  # the last in-edge of its segment: still sorted
        np.save(target, values)
        _redigest(copy, chunk_group(0), name)
        dm = dir_dm(tmp_path / "cache", str(copy), task=task)
        part = dm.load_part(dm.prepare(2, [0]), 0)
        with pytest.raises(PartitionDirError, match=f"{name}.npy must be int64"):
            part.load(0)
    meta_path = parts / METADATA
    meta = json.loads(meta_path.read_text())
    meta["relations"] = [*pair, "a", "b", "c"]
    meta["blake2b"] = metadata_digest(meta)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(PartitionDirError, match="'pair_relations'"):
        dir_dm(tmp_path / "cache", str(parts), task=task).prepare(2, [0])


def _redigest(root, group, name):
    """Record a rewritten shared file's size and digest in the directory's metadata."""
    import json

    from lightning_gnnscale.files import file_digest
    from lightning_gnnscale.graph.partition_dir import METADATA, metadata_digest

    meta_path = root / METADATA
    meta = json.loads(meta_path.read_text())
    path = root / shared_folder(group) / f"{name}.npy"
    meta["shared"][group]["files"][f"{name}.npy"] = {
        "bytes": path.stat().st_size,
        "blake2b": file_digest(path),
    }
    meta["blake2b"] = metadata_digest(meta)
    meta_path.write_text(json.dumps(meta))


def test_a_directorys_relations_are_checked_before_any_rank_starts(tmp_path):
    """The launcher's check of a part (``prepare``): relation names that repeat are refused,
    and so are per-relation fanouts naming a relation the directory does not have."""
    import json

    from lightning_gnnscale.graph.partition_dir import METADATA, metadata_digest

    dir_dm(tmp_path / "cache").write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)
    with pytest.raises(ConfigError, match=r"names \['nope'\].*relations: \['rel_0'"):
        GrappaDataModule(
            "typed_sbm",
            GrappaConfig(),
            DataConfig(
                batch_size=40,
                fanouts=FANOUTS,
                fanouts_per_relation={"nope": [1, 1]},
                partition_dir=str(tmp_path / "parts"),
            ),
            seed=3,
            cache_dir=tmp_path / "cache",
            dtype=torch.float64,
            dataset_options=TYPED,
        ).prepare(2, [0])
    meta_path = tmp_path / "parts" / METADATA
    meta = json.loads(meta_path.read_text())
    meta["relations"] = ["rel_0", "rel_0", "rel_2"]
    meta["blake2b"] = metadata_digest(meta)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(PartitionDirError, match="distinct relation names"):
        dir_dm(tmp_path / "cache", str(tmp_path / "parts")).prepare(2, [0])


@pytest.mark.e2e
def test_rgcn_on_a_typed_graph_is_gradient_only_end_to_end(tmp_path):
    """Two ranks x two phases of RGCN on typed_sbm with both audits on: no feature,
    activation or structure byte in training, every step all-reduces every parameter once
    (``strategy.audit_collectives``), and the coverage corrects (``0 < c < 1``)."""
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg

    metrics, _ = train(
        make_cfg(
            tmp_path,
            "strategy=grappa",
            "dataset=typed_sbm",
            "dataset.num_nodes=400",
            "dataset.num_relations=3",
            "dataset.num_features=8",
            "model=rgcn",
            "model.num_bases=2",
            "+data.fanouts_per_relation.rel_1=[2,2]",
            "dtype=float64",
            "trainer.max_epochs=3",
            "strategy.super_epoch_len=1",
            "strategy.audit_collectives=true",
            "audit=true",
        )
    )
    assert metrics["world_size"] == 2
    per_epoch = metrics["comm_bytes_per_epoch"]
    assert per_epoch["feature"] == per_epoch["activation"] == per_epoch["structure"] == 0
    assert per_epoch["gradient"] > 0
    system = metrics["system"]
    net = BlockGNN("rgcn", 8, 64, 4, 2, num_relations=3, num_bases=2)
    assert system["grappa_allreduced_numel_per_step"] == [sum(p.numel() for p in net.parameters())]
    assert system["grappa_super_epoch_switches"] == 3
    assert 0 < system["grappa_mean_c_rank0"] < 1
