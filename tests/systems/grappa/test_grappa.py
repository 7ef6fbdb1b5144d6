"""Grappa, single process: chunking, schedules, partitions, in-partition sampling, step
equalisation, the super-epoch clock, estimators (E1-E8) and Monte-Carlo checks (S1-S3, S5);
the test names' labels are those of docs/systems/grappa.md, "Tests"."""

import dataclasses
import itertools
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.node_targets import SPLITS, NodeDataset, NodeTargets
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.inference import layerwise_inference
from lightning_gnnscale.systems.grappa import EarlyTriggerConfig, GrappaConfig, chunking
from lightning_gnnscale.systems.grappa.callbacks import GrappaStats
from lightning_gnnscale.systems.grappa.chunking import (
    ChunkStore,
    ChunkStoreError,
    chunk_assignment,
    chunk_store_path,
    write_chunk_store,
)
from lightning_gnnscale.systems.grappa.datamodule import GrappaDataModule
from lightning_gnnscale.systems.grappa.directory import home_chunks
from lightning_gnnscale.systems.grappa.estimators import (
    batch_factor,
    c_resampling,
    c_resampling_literal,
    c_uniform,
    gcn_kappa,
    kappa,
)
from lightning_gnnscale.systems.grappa.partition import PartitionSampler, build_partition
from lightning_gnnscale.systems.grappa.schedule import Schedule, super_epoch_len
from lightning_gnnscale.systems.grappa.superepochs import SuperEpochClock
from lightning_gnnscale.tasks import build_task

TASK = build_task("node_classification")


def small_dataset(n=400, seed=1) -> NodeDataset:
    return sbm(num_nodes=n, num_classes=4, avg_degree=8.0, num_features=6, seed=seed)


def small_graph(n=400, seed=1) -> Graph:
    return small_dataset(n, seed).graph


def chunk_store(dataset, *args, targets=None, task=TASK):
    """``write_chunk_store`` of ``dataset`` and ``task``'s ``targets`` (default: the
    dataset's own, node classification's); ``args``: count, method, seed, folder."""
    targets = targets if targets is not None else dataset.targets
    return write_chunk_store(dataset, targets, task, *args)


def rank_part(store, rank, world):
    """Rank ``rank`` of ``world``'s part of ``store`` (what ``preprocess`` gives it)."""
    return store.part(home_chunks(rank, world, store.num_chunks), TASK.out_dim_of(store.meta))


def every_chunk(store):
    """A part that reads every chunk of ``store`` and evaluates none."""
    return store.part((), TASK.out_dim_of(store.meta))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return chunk_store(small_dataset(), 4, "random", 0, str(tmp_path_factory.mktemp("chunks")))


# ------------------------------------------------------------------------- P1-P3: chunks
@pytest.mark.parametrize("method", ["random", "random_iid", "metis"])
def test_chunking_is_a_seeded_cover(method):
    g = small_graph()
    chunk = chunk_assignment(g, 5, method, seed=3)
    assert chunk.shape == (g.num_nodes,) and int(chunk.min()) >= 0 and int(chunk.max()) < 5
    assert torch.equal(chunk, chunk_assignment(g, 5, method, seed=3))
    if method == "random":
        sizes = torch.bincount(chunk, minlength=5)
        assert int(sizes.max() - sizes.min()) <= 1
    if method != "metis":
        assert not torch.equal(chunk, chunk_assignment(g, 5, method, seed=4))


@pytest.mark.parametrize("c", [3, 4, 7, 8])
def test_pinned_sweep_covers_every_ordered_pair_once_per_cycle(c):
    sched = Schedule("pinned_sweep", c)
    seen = []
    for t in range(5, 5 + c - 1):  # any C-1 consecutive super-epochs
        specs = sched.partitions(t)
        partners = [s.owned_chunks[1] for s in specs]
        assert all(v != p for p, v in enumerate(partners))
        assert sorted(partners) == list(range(c))  # a bijection
        assert all(s.seed_chunks == (p,) for p, s in enumerate(specs))
        assert specs != sched.partitions(t + 1)
        seen += [(p, v) for p, v in enumerate(partners)]
    assert sorted(seen) == [(p, j) for p in range(c) for j in range(c) if j != p]
    assert Schedule("fixed", c).partitions(0) == Schedule("fixed", c).partitions(9)


@pytest.mark.parametrize("c", [4, 5, 8])
def test_tournament_rounds_are_matchings_covering_every_pair_once(c):
    sched = Schedule("tournament", c)
    pairs = []
    for t in range(sched.cycle):
        specs = sched.partitions(t)
        chunks = sorted(x for s in specs for x in s.owned_chunks)
        assert chunks == list(range(c))  # perfect matching (one chunk alone when c is odd)
        assert all(s.seed_chunks == s.owned_chunks for s in specs)
        pairs += [s.owned_chunks for s in specs if len(s.owned_chunks) == 2]
    assert sorted(pairs) == sorted(itertools.combinations(range(c), 2))


def test_shuffled_sweep_order_is_a_permutation_of_each_cycle():
    sched = Schedule("pinned_sweep", 6, "shuffled", seed=2)
    rounds = [sched.round(t) for t in range(5, 10)]
    assert sorted(rounds) == list(range(5))
    assert rounds == [
        Schedule("pinned_sweep", 6, "shuffled", seed=2).round(t) for t in range(5, 10)
    ]


# -------------------------------------------------------------- chunk store: key, digests
def _rewired(g):
    """``g`` with one edge ``u -> v`` moved to ``w -> v`` (same node and edge counts)."""
    src, dst = g.edge_index()
    v = int(dst[0])
    w = next(u for u in range(g.num_nodes) if u != v and not bool((src[dst == v] == u).any()))
    src = src.clone()
    src[0] = w
    fields = {f.name: getattr(g, f.name) for f in dataclasses.fields(g)}
    fields.pop("indptr"), fields.pop("indices")
    return Graph.from_edge_index(torch.stack([src, dst]), g.num_nodes, **fields)


def _changed(g, name, index=7):
    value = g.x.clone()
    value[index] += 1.0
    return dataclasses.replace(g, x=value)


def _changed_targets(targets, column, index=7):
    """``targets`` with row ``index`` of ``column`` (``target`` or a split) changed."""
    value = getattr(targets, column).clone()
    if value.dtype == torch.bool:
        value[index] = ~value[index]
    else:
        value[index] = (value[index] + 1) % targets.out_dim
    return dataclasses.replace(targets, **{column: value})


def test_chunk_store_key_covers_everything_the_chunks_hold(tmp_path):
    """Changing any one input of the chunk files (features, the task's targets, each split,
    structure, dtype) or of the chunking (count, method, seed) gives another store; the
    issue's case, ``feature_signal=0`` on the same sbm, writes a store holding the new
    features."""
    data = small_dataset()
    g, t = data.graph, data.targets
    assert g.num_edges == _rewired(g).num_edges and g.num_nodes == _rewired(g).num_nodes
    variants = {
        "base": (g, t, 4, "random", 0),
        "rewired": (_rewired(g), t, 4, "random", 0),
        "dtype": (g.to(torch.float64), t, 4, "random", 0),
        "num_chunks": (g, t, 5, "random", 0),
        "method": (g, t, 4, "random_iid", 0),
        "seed": (g, t, 4, "random", 1),
        "x": (_changed(g, "x"), t, 4, "random", 0),
        **{c: (g, _changed_targets(t, c), 4, "random", 0) for c in ("target", *SPLITS)},
    }
    paths = {name: chunk_store_path(*args, tmp_path) for name, args in variants.items()}
    assert len(set(paths.values())) == len(paths)
    assert chunk_store_path(small_graph(), t, 4, "random", 0, tmp_path) == paths["base"]
    flat = sbm(
        num_nodes=400, num_classes=4, avg_degree=8.0, num_features=6, seed=1, feature_signal=0.0
    )
    assert torch.equal(flat.graph.indices, g.indices)
    assert torch.equal(flat.targets.target, t.target)
    old, new = (chunk_store(h, 4, "random", 0, str(tmp_path)) for h in (data, flat))
    assert old.path != new.path
    for c in range(4):
        record = new.load(c)
        assert torch.equal(record["x"], flat.graph.x[record["nodes"]])
    # the chunking's key (a checkpoint's layout) is the same for the float64 store, and
    # changes with the features' values
    f64, changed = (
        chunk_store(NodeDataset(variants[name][0], t), 4, "random", 0, str(tmp_path))
        for name in ("dtype", "x")
    )
    assert f64.path != old.path and f64.key == old.key != changed.key != new.key
    assert (old.dtype, f64.dtype) == (torch.float32, torch.float64)


def _fresh_rank(monkeypatch, store):
    """The store as a rank process sees it: nothing checked yet in this process."""
    monkeypatch.setattr(chunking, "_VERIFIED", set())
    return ChunkStore(store.path, store.meta)


def test_corrupt_chunk_files_are_rebuilt_by_the_launcher_and_named_by_a_rank(
    tmp_path, monkeypatch, capsys
):
    """A truncated chunk and a loadable chunk file of the wrong chunk: a rank fails naming
    the file and the fix; the launching process (``write_chunk_store``) rewrites both, and the
    rank then reads the original records."""
    data = small_dataset()
    g = data.graph
    store = chunk_store(data, 4, "random", 0, str(tmp_path))
    folder = Path(store.path)
    original = {c: (folder / f"chunk_{c}.pt").read_bytes() for c in range(4)}
    truncated, wrong = folder / "chunk_1.pt", folder / "chunk_2.pt"
    truncated.write_bytes(original[1][: len(original[1]) // 2])
    shutil.copyfile(folder / "chunk_0.pt", wrong)
    assert torch.load(wrong, weights_only=True)["nodes"].numel()  # loadable, but chunk 0's
    rank = _fresh_rank(monkeypatch, store)
    for path, c in ((truncated, 1), (wrong, 2)):
        with pytest.raises(ChunkStoreError, match="digest") as err:
            rank.load(c)
        assert str(path) in str(err.value) and str(folder) in str(err.value)
        assert "rerun" in str(err.value) and "delete" in str(err.value)
    with pytest.raises(ChunkStoreError, match=str(wrong)):
        build_partition(every_chunk(rank), Schedule("pinned_sweep", 4).partition(2, 0), TASK)
    capsys.readouterr()
    rebuilt = chunk_store(data, 4, "random", 0, str(tmp_path))
    said = capsys.readouterr().out
    assert str(truncated) in said and str(wrong) in said and "chunk_0.pt" not in said
    assert rebuilt.path == store.path and rebuilt.meta == store.meta
    assert {c: (folder / f"chunk_{c}.pt").read_bytes() for c in range(4)} == original
    rank = _fresh_rank(monkeypatch, rebuilt)
    chunk = chunk_assignment(g, 4, "random", 0)
    for c in range(4):
        assert torch.equal(rank.load(c)["nodes"], (chunk == c).nonzero().flatten())
    (folder / "meta.json").write_text("{not json")  # unreadable metadata: rebuilt too
    assert chunk_store(data, 4, "random", 0, str(tmp_path)).meta == store.meta


def test_a_chunk_file_that_torch_cannot_load_is_named(tmp_path, monkeypatch):
    """A file that matches its recorded digest but is no torch file (a store written by hand or
    corrupted before its digest was taken): the load error names the file."""
    store = chunk_store(small_dataset(), 2, "random", 0, str(tmp_path))
    path = Path(store.path) / "chunk_1.pt"
    path.write_bytes(b"not a torch file")
    meta = {**store.meta, "digests": [*store.meta["digests"][:1], chunking.file_digest(path)]}
    rank = _fresh_rank(monkeypatch, ChunkStore(store.path, meta))
    rank.load(0)
    with pytest.raises(ChunkStoreError, match="cannot be loaded") as err:
        rank.load(1)
    assert str(path) in str(err.value)


# ------------------------------------------------------------------- P4, P5, P8: partitions
@pytest.mark.parametrize("halo_hops", [0, 1])
def test_partitions_seeds_locality_and_degrees(store, halo_hops):
    """Each partition's nodes, edges, degrees and rows, its target rows those of its nodes
    (its halo's in no split), and its seeds the task's training seeds, each in one partition."""
    data = small_dataset()
    g, targets = data.graph, data.targets
    deg = g.in_degree()
    chunk = every_chunk(store).chunk_ids()
    for t in range(3):
        seeds = []
        for spec in Schedule("pinned_sweep", 4).partitions(t):
            part = build_partition(every_chunk(store), spec, TASK, halo_hops)
            own = part.local2global[: part.num_core]
            assert torch.equal(own, torch.isin(torch.arange(g.num_nodes), own).nonzero().flatten())
            assert set(chunk[own].tolist()) == set(spec.owned_chunks)
            assert torch.equal(part.deg, deg[part.local2global])  # P8: global degree
            assert torch.equal(part.x, g.x[part.local2global])
            assert torch.equal(part.targets.target, targets.target[part.local2global])
            core = part.targets.rows(slice(0, part.num_core))
            assert torch.equal(core.split_matrix(), targets.rows(own).split_matrix())
            assert not part.targets.split_matrix()[part.num_core :].any()
            dst = torch.repeat_interleave(torch.arange(part.num_nodes), part.n_avail)
            edges = set(
                zip(part.local2global[part.indices].tolist(), part.local2global[dst].tolist())
            )
            src_g, dst_g = g.edge_index()
            into_own = torch.isin(dst_g, own)
            both = into_own & torch.isin(src_g, own)
            expected = both if halo_hops == 0 else into_own
            assert edges == set(zip(src_g[expected].tolist(), dst_g[expected].tolist()))  # P5
            assert int(part.n_avail[part.num_core :].sum()) == 0  # halo nodes: no in-edges
            # each owned node's in-edges in the whole graph's order (the sampler keys on it)
            local_src = part.local2global[part.indices]
            for i in range(0, part.num_core, 7):
                v = int(part.local2global[i])
                whole = g.indices[g.indptr[v] : g.indptr[v + 1]]
                if halo_hops == 0:
                    whole = whole[torch.isin(whole, own)]
                assert torch.equal(local_src[part.indptr[i] : part.indptr[i + 1]], whole)
            owned_in = torch.zeros(g.num_nodes, dtype=torch.int64).index_add_(
                0, dst_g[both], torch.ones(int(both.sum()), dtype=torch.int64)
            )
            assert torch.equal(part.ell, owned_in[own])  # P8: owned in-neighbours
            seeds.append(part.local2global[part.seeds])
        all_seeds = torch.cat(seeds)
        assert all_seeds.unique().numel() == all_seeds.numel()  # P4: disjoint
        assert torch.equal(all_seeds.sort().values, TASK.train_seeds(targets))  # P4: cover


def test_count_halo_as_local_makes_coverage_full_with_one_hop_halo(store):
    spec = Schedule("pinned_sweep", 4).partition(0, 0)
    part = build_partition(every_chunk(store), spec, TASK, 1, True)
    assert torch.equal(part.ell, part.deg[: part.num_core])


# ---------------------------------------------------------------------- P6, P7: sampling
def test_sampling_stays_inside_the_partition_and_matches_the_whole_graph_at_the_seed_hop(store):
    g = small_graph()
    part = build_partition(every_chunk(store), Schedule("pinned_sweep", 4).partition(2, 1), TASK, 1)
    fanouts = [3, 2]
    seeds = part.seeds[:20]
    blocks = PartitionSampler(part, fanouts, seed=7).sample(seeds, 1, 2, 5)
    for hop, block in enumerate(blocks[::-1]):  # hop from the seeds
        assert int(block.src_ids.max()) < part.num_nodes  # P6: local ids only
        src, dst = block.edge_index
        gs, gd = part.local2global[block.src_ids[src]], part.local2global[block.dst_ids[dst]]
        counts = torch.bincount(dst, minlength=block.num_dst)
        avail = part.n_avail[block.dst_ids]
        assert torch.equal(counts, avail.clamp(max=fanouts[hop]))  # P7
        edge_keys = set(zip(gs.tolist(), gd.tolist()))
        src_g, dst_g = g.edge_index()
        assert edge_keys <= set(zip(src_g.tolist(), dst_g.tolist()))
    # the seed hop draws exactly what the whole graph's sampler draws for the same keys
    whole = NeighborSampler(g.indptr, g.indices, fanouts, seed=7).sample(
        part.local2global[seeds], 1, 2, 5
    )
    assert sorted(part.local2global[blocks[-1].src_ids].tolist()) == sorted(
        whole[-1].src_ids.tolist()
    )


# ------------------------------------------------------------------------ P9: step counts
class RankComm:
    """Rank ``rank`` of ``world_size`` in one process: the early trigger's vote all-reduce
    (``control``) returns this rank's own vote."""

    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def all_reduce(self, tensor, op="sum", *, category):
        assert category == "control"
        return tensor


def make_dm(store, world, rank, k=1, batch_size=40, graph=None, comm=None, max_epochs=4, **kw):
    """Rank ``rank`` of ``world``'s DataModule over ``store`` (seed 1, fanouts [3, 2], a
    Trainer of ``max_epochs``), set up; ``kw`` are ``GrappaConfig`` settings."""
    dm = GrappaDataModule(
        graph if graph is not None else small_dataset(),
        GrappaConfig(partitions_per_rank=k, **kw),
        DataConfig(batch_size=batch_size, fanouts=[3, 2]),
        seed=1,
    )
    dm.trainer = SimpleNamespace(max_epochs=max_epochs, is_last_batch=True)  # at an epoch end
    comm = comm if comm is not None else RankComm(rank, world)
    dm.setup_rank(RankContext(comm, torch.device("cpu")), rank_part(store, rank, world))
    return dm


@pytest.mark.parametrize(("world", "k"), [(4, 1), (2, 2), (1, 4)])
def test_equalised_steps_visit_every_seed_once_per_epoch(store, world, k):
    dms = [make_dm(store, world, r, k) for r in range(world)]
    assert len({dm.steps_per_epoch for dm in dms}) == 1
    for epoch in (0, 1):
        seeds = []
        for dm in dms:
            for step in range(dm.steps_per_epoch):
                batch = dm.make_batch(epoch, step)
                part = dm.partition(dm.locate(step)[0])
                seeds.append(part.local2global[batch.blocks[-1].dst_ids])
                assert batch.global_seed_count == batch.num_seeds
                assert batch.kappa.shape == (batch.num_seeds,)
        got = torch.cat(seeds)
        assert torch.equal(got.sort().values, dms[0].train_ids)


@pytest.mark.parametrize("batch_size", [8, 12, 24, 40])
def test_equalised_steps_split_evenly_and_never_leave_a_step_empty(store, batch_size):
    """A partition that fills the phase's steps at ``local_batch`` slices as ddp would (last
    step shorter); any other is spread over all steps with sizes differing by at most 1, so no
    step of a rank is empty while the others train."""
    spread = 0
    for rank in range(4):
        dm = make_dm(store, 4, rank, batch_size=batch_size)
        n, n_steps, lb = dm.partition(0).seeds.numel(), dm.n_steps[0], dm.local_batch
        sizes = [dm.make_batch(0, step).num_seeds for step in range(n_steps)]
        assert sum(sizes) == n
        if math.ceil(n / lb) == n_steps:
            assert sizes == [min(lb, n - i * lb) for i in range(n_steps)]
        else:
            spread += 1
            assert sizes == [t.numel() for t in torch.arange(n).tensor_split(n_steps)]
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    assert spread  # the store's chunks differ in size, so some rank spreads


def test_seed_order_and_sampler_are_built_once_per_partition_and_epoch(store, monkeypatch):
    import lightning_gnnscale.graph.order as order_module
    import lightning_gnnscale.systems.grappa.datamodule as grappa_dm

    calls = {"order": 0, "sampler": 0}
    permute = order_module.epoch_permutation

    def counting_permutation(*args):
        calls["order"] += 1
        return permute(*args)

    class CountingSampler(grappa_dm.PartitionSampler):
        def __init__(self, *args):
            calls["sampler"] += 1
            super().__init__(*args)

    monkeypatch.setattr(order_module, "epoch_permutation", counting_permutation)
    monkeypatch.setattr(grappa_dm, "PartitionSampler", CountingSampler)
    dm = make_dm(store, 1, 0, k=4, batch_size=8, cache_partitions=True)
    for epoch in (0, 1):
        for step in range(dm.steps_per_epoch):
            dm.make_batch(epoch, step)
    assert dm.steps_per_epoch > 8
    assert calls == {"order": 4 * 2, "sampler": 4}  # 4 partitions x 2 epochs; 4 partitions


def test_fullgraph_mode_has_one_step_per_phase_and_s_equals_ell(store):
    dm = make_dm(store, 2, 0, k=2, mode="fullgraph")
    assert dm.steps_per_epoch == 2  # M8: k optimiser steps per epoch
    batch = dm.make_batch(0, 1)
    part = dm.partition(1)
    assert batch.num_seeds == part.seeds.numel()
    assert torch.equal(batch.seed_samples, part.ell[batch.blocks[-1].dst_ids])
    assert batch.blocks[0].num_src == int(  # every local in-edge was followed
        torch.unique(torch.cat([b.src_ids for b in batch.blocks])).numel()
    )


def test_node_estimator_attaches_kappa_as_seed_weights(store):
    batch = make_dm(store, 4, 1, estimator="node").make_batch(0, 0)
    assert torch.allclose(batch.seed_weight.double(), batch.kappa)


def test_isolated_evaluation_neither_counts_builds_nor_evicts_the_training_partition(store):
    dm = make_dm(store, 2, 1, k=2, eval_mode="isolated")
    for step in range(dm.steps_per_epoch):
        dm.make_batch(0, step)
    held = dm.partition(1)
    builds, io = dm.builds, dm.io_bytes
    counts = dm.eval_statistics(BlockGNN("sage", 6, 16, 4, 2), ("val", "test"))
    assert (dm.builds, dm.io_bytes) == (builds, io)
    assert dm.partition(1) is held and dm.builds == builds
    targets, seeds = dm.targets, [dm.partition(i) for i in range(2)]
    owned = torch.cat([p.local2global[: p.num_core][p.seed_owned] for p in seeds])
    assert counts[0, 1] == int(targets.val[owned].sum())
    assert counts[1, 1] == int(targets.test[owned].sum())


def dense_gcn_logits(net, x, src, dst, deg):
    """Reference GCN forward on a small local graph, dense: ``A[v, v] = 1/(D_v+1)``, ``A[v, u]
    = 1/sqrt((D_u+1)(D_v+1))`` per local edge ``u -> v``, ``D`` the degrees it is given."""
    norm = (deg.double() + 1).rsqrt()
    a = torch.diag(norm**2)
    a.index_put_((dst, src), norm[dst] * norm[src], accumulate=True)
    h = x.double()
    for i, layer in enumerate(net.layers):
        h = a @ (h @ layer.lin.weight.T) + layer.bias
        h = torch.relu(h) if i < len(net.layers) - 1 else h
    return h


def gcn_net(in_dim=6):
    torch.manual_seed(3)
    return BlockGNN("gcn", in_dim, 16, 4, num_layers=2, dropout=0.0).double().eval()


def test_isolated_evaluation_of_a_whole_graph_partition_equals_global_evaluation(tmp_path):
    """One chunk: the partition is the whole graph, so isolated evaluation (local graph) must
    give the global evaluation's logits and counts."""
    data = small_dataset().to(torch.float64)
    g = data.graph
    one = chunk_store(data, 1, "random", 0, str(tmp_path))
    net = gcn_net()
    iso = make_dm(one, 1, 0, eval_mode="isolated")
    glob = make_dm(one, 1, 0, eval_mode="global_fullgraph", graph=data)
    part = iso.partition(0)
    assert part.num_core == g.num_nodes and torch.equal(
        part.local2global, torch.arange(g.num_nodes)
    )
    torch.testing.assert_close(
        iso.isolated_logits(net, part),
        layerwise_inference(net, g.indptr, g.indices, g.x),
        rtol=0,
        atol=1e-12,
    )
    splits = ("train", "val", "test")
    assert torch.equal(iso.eval_statistics(net, splits), glob.eval_statistics(net, splits))


@pytest.mark.parametrize("halo_hops", [0, 1])
def test_isolated_evaluation_normalises_gcn_by_global_degrees(tmp_path, halo_hops):
    """A strict subset (2 of 4 chunks): isolated evaluation equals a dense GCN over the local
    edges (built from the whole graph) normalised by the *global* degrees, as training is;
    halo nodes (no local in-edges) and, without a halo, the owned nodes lose in-edges."""
    data = small_dataset().to(torch.float64)
    g = data.graph
    st = chunk_store(data, 4, "random", 0, str(tmp_path))
    dm = make_dm(st, 4, 1, eval_mode="isolated", halo_hops=halo_hops)
    part = dm.partition(0)
    assert bool((part.n_avail < part.deg).any())  # local in-degrees are not the global ones
    own = part.local2global[: part.num_core]
    src_g, dst_g = g.edge_index()
    keep = torch.isin(dst_g, own) & (torch.isin(src_g, own) if halo_hops == 0 else True)
    nodes = torch.cat([own, src_g[keep]]).unique()
    assert torch.equal(part.local2global.sort().values, nodes)
    local = torch.full((g.num_nodes,), -1, dtype=torch.int64)
    local[part.local2global] = torch.arange(part.num_nodes)
    net = gcn_net()
    deg = g.in_degree()[part.local2global]
    expect = dense_gcn_logits(
        net, g.x[part.local2global], local[src_g[keep]], local[dst_g[keep]], deg
    )
    torch.testing.assert_close(dm.isolated_logits(net, part), expect, rtol=0, atol=1e-12)


# ------------------------------------------------------------ P10-P12: super-epoch clock
def run_controller(dm, epochs, deltas=None, logged=None, start=0, stats=None):
    """Drive ``dm``'s super-epoch clock through ``epochs`` epochs (from epoch ``start``) as
    ``GrappaDataModule.training_batch`` does: each step's deficit recorded (``deltas[e]`` for
    epoch ``e``, default one step of 0), then the epoch's end counted. ``GrappaStats`` (or
    ``stats``) sees the same steps (coverage 1) and logs into ``logged``. Returns ``t`` at the
    start of each epoch."""
    stats = stats if stats is not None else GrappaStats(dm.schedule_report)
    module = SimpleNamespace(log_dict=(logged if logged is not None else []).append)
    ts = []
    for e in range(epochs):
        ts.append(dm.t)
        for d in deltas[e] if deltas else [0.0]:
            dm.clock.record(d)
            batch = SimpleNamespace(coverage=1.0, deficit=d)
            stats.on_train_batch_end(None, module, None, batch, 0)
        dm.clock.end_epoch(start + e, dm.comm)
        stats.on_train_epoch_end(None, module)
    return ts


def test_super_epoch_length_and_boundaries(store):
    assert super_epoch_len("auto", 10, 3) == 3 and super_epoch_len("auto", 2, 7) == 1
    assert super_epoch_len(4, 10, 3) == 4
    dm = make_dm(store, 4, 0, super_epoch_len=3)
    assert run_controller(dm, 7) == [0, 0, 0, 1, 1, 1, 2]
    dm = make_dm(store, 4, 0, super_epoch_len=1)
    ts = run_controller(dm, 2)
    assert ts == [0, 1]
    spec0 = dm.schedule.partition(0, 0)
    assert spec0 != dm.schedule.partition(0, 1)  # repartition changes assignments


def test_auto_super_epoch_length_needs_the_trainers_max_epochs():
    with pytest.raises(ValueError, match="max_epochs"):
        super_epoch_len("auto", None, 3)
    assert super_epoch_len(2, None, 3) == 2


def test_controller_counts_an_epoch_end_once_and_logs_epoch_means(store):
    """Lightning re-runs an epoch end on some resumes: a counted epoch is not counted again,
    an uncounted one (state saved before its end) advances; c and delta are logged as means."""
    dm, logged = make_dm(store, 4, 0, super_epoch_len=2), []
    ctrl, stats = dm.clock, GrappaStats(dm.schedule_report)
    run_controller(dm, 2, [[0.2, 0.4], [0.6]], logged, stats=stats)
    assert (dm.t, dm.e_in, ctrl.switches) == (1, 0, [1])
    assert [d["grappa/delta"] for d in logged] == pytest.approx([0.3, 0.6])
    assert [d["grappa/c"] for d in logged] == [1.0, 1.0]
    ctrl.end_epoch(1, dm.comm)  # the re-run end of epoch 1: already counted
    stats.on_train_epoch_end(None, SimpleNamespace(log_dict=logged.append))
    assert (dm.t, dm.e_in, ctrl.switches, len(logged)) == (1, 0, [1], 2)
    fresh = make_dm(store, 4, 0, super_epoch_len=2)
    saved = {**dm.state_dict(), "t": 0, "e_in": 1, "switches": [], "last_epoch": 0}
    fresh.load_state_dict(saved)  # saved inside epoch 1
    resumed = fresh.clock
    resumed.end_epoch(1, fresh.comm)
    assert (fresh.t, fresh.e_in, resumed.switches) == (1, 0, [1])


def test_resume_keeps_the_checkpoints_super_epoch_length(store):
    """``super_epoch_len: auto`` follows ``max_epochs``: a run resumed with a new
    ``max_epochs`` keeps the checkpoint's length (and switches where the original would); an
    explicit length that differs is refused, naming the key; old states (no length) load."""
    dm = make_dm(store, 4, 0, max_epochs=3)  # auto: 3 epochs // a cycle of 3
    ctrl = dm.clock
    run_controller(dm, 1)
    assert (ctrl.length, dm.t, dm.e_in) == (1, 1, 0)
    longer = super_epoch_len("auto", 9, 3)
    resumed_dm = make_dm(store, 4, 0, max_epochs=9)
    resumed = resumed_dm.clock
    assert longer == 3
    resumed_dm.load_state_dict(dm.state_dict())
    assert resumed.length == 1
    assert run_controller(resumed_dm, 3, start=1) == [1, 2, 3]
    assert resumed_dm.t == 4
    with pytest.raises(ValueError, match="strategy.super_epoch_len=3"):
        SuperEpochClock(3).load_state_dict(ctrl.state_dict())
    old = {k: v for k, v in ctrl.state_dict().items() if k != "length"}
    kept = SuperEpochClock(3)
    kept.load_state_dict(old)
    assert kept.length == 3


def trigger_dm(store, window_steps=4, min_epochs=1):
    trigger = EarlyTriggerConfig(True, 0.9, window_steps, min_epochs)
    return make_dm(store, 4, 0, super_epoch_len=10, early_trigger=trigger)


def test_early_trigger_fires_on_a_full_window_above_threshold_only(store):
    high, low = [[0.95] * 4] * 3, [[0.5] * 4] * 3
    dm = trigger_dm(store)
    ctrl = dm.clock
    assert run_controller(dm, 3, high) == [0, 1, 2]
    assert ctrl.early_switches == 3  # after each of the 3 epochs
    assert run_controller(trigger_dm(store), 3, low) == [0, 0, 0]
    assert run_controller(trigger_dm(store, min_epochs=2), 3, high) == [0, 0, 1]
    assert run_controller(trigger_dm(store, window_steps=8), 2, [[0.95] * 4] * 2) == [0, 0]


def test_state_round_trip_rebuilds_identical_partitions(store):
    trigger = EarlyTriggerConfig(enabled=True, window_steps=3)
    dm = make_dm(store, 2, 1, k=2, super_epoch_len=2, early_trigger=trigger)
    ctrl = dm.clock
    run_controller(dm, 3, [[0.1, 0.2]] * 3)
    before = [dm.make_batch(3, s) for s in range(dm.steps_per_epoch)]
    fresh = make_dm(store, 2, 1, k=2, super_epoch_len=2, early_trigger=trigger)
    fresh_ctrl = fresh.clock
    for key, other in (
        ("chunking", "grappa-chunks-other"),
        ("dtype", "torch.float64"),
        ("schedule", "tournament"),
        ("sweep_order", "shuffled"),
        ("sweep_seed", 7),
        ("partitions_per_rank", 1),
    ):
        with pytest.raises(ValueError, match=key):
            fresh.load_state_dict({**dm.state_dict(), key: other})
    fresh.load_state_dict(dm.state_dict())
    assert (fresh.t, fresh.e_in) == (dm.t, dm.e_in) == (1, 1)
    assert fresh_ctrl.window == ctrl.window
    for s, b in enumerate(before):
        a = fresh.make_batch(3, s)
        assert torch.equal(a.blocks[-1].dst_ids, b.blocks[-1].dst_ids)
        assert torch.equal(a.blocks[0].src_ids, b.blocks[0].src_ids)


def test_training_batches_count_each_epoch_end_and_keep_the_trained_partitions(store):
    """The train loader's ``training_batch`` records every step's deficit and counts the
    epoch's end when its last batch is built; the partitions in use (evaluation's) stay those
    the epoch trained until the next batch. An epoch whose last batch is never built
    (``limit_train_batches``) is counted when the next epoch's first batch is."""
    trigger = EarlyTriggerConfig(enabled=True, threshold=0.0, window_steps=100, min_epochs=5)
    dm = make_dm(store, 4, 0, super_epoch_len=2, early_trigger=trigger)
    n = dm.steps_per_epoch
    assert n > 1
    deficits = []
    for step in range(n):
        batch = dm.training_batch(0, step)
        deficits.append(batch.deficit)
        assert (dm.clock.last_epoch, dm.e_in) == ((0, 1) if step == n - 1 else (-1, 0))
    assert dm.clock.window == deficits and 0 < max(deficits) < 1
    for step in range(n):
        dm.training_batch(1, step)
    assert (dm.t, dm.e_in, dm.clock.switches) == (1, 0, [1])
    assert dm.partition(0).spec == dm.schedule.partition(0, 0)  # epoch 1's, for evaluation
    for step in range(n - 1):  # epoch 2 stops before its last batch
        dm.training_batch(2, step)
    assert (dm.clock.last_epoch, dm.e_in) == (1, 0)
    dm.training_batch(3, 0)
    assert (dm.clock.last_epoch, dm.t, dm.e_in) == (2, 1, 1)
    assert dm.partition(0).spec == dm.schedule.partition(0, 1)


def _preset_epochs(store, dataset, name, world, epochs):
    """Every rank's training batches of preset ``name`` over ``epochs`` epochs (one-epoch
    super-epochs): per batch, its coverage and its input nodes' global ids; and the largest
    partition's node count."""
    trace, largest = [], 0
    for rank in range(world):
        dm = GrappaDataModule(
            dataset, GrappaConfig.preset(name), DataConfig(batch_size=40, fanouts=[3, 2]), seed=1
        )
        dm.trainer = SimpleNamespace(max_epochs=epochs)
        context = RankContext(RankComm(rank, world), torch.device("cpu"))
        dm.setup_rank(context, rank_part(store, rank, world))
        for epoch in range(epochs):
            for step in range(dm.steps_per_epoch):
                batch = dm.training_batch(epoch, step)
                part = dm.partition(dm.locate(step)[0])
                largest = max(largest, part.num_nodes)
                trace.append((batch.coverage, part.local2global[batch.blocks[0].src_ids].tolist()))
    return trace, largest


def test_default_partitions_are_strict_subsets_and_the_presets_differ_on_two_ranks(tmp_path):
    """Issue 22 item 0: with the defaults on 2 ranks every partition is a strict subset of the
    graph, coverage is below 1, and grappa, grappa_uw, grappa_fp and grappa_naive train
    different batches (before, ``partitions_per_rank=1`` gave 2 chunks: every partition was the
    whole graph, c = 1, and the four presets were identical)."""
    dataset, world = small_dataset(), 2
    chunks = GrappaConfig().chunk_count(world)
    assert chunks >= 3
    store = chunk_store(dataset, chunks, "random", 1, str(tmp_path))
    presets = ("grappa", "grappa_uw", "grappa_fp", "grappa_naive")
    runs = {name: _preset_epochs(store, dataset, name, world, epochs=2) for name in presets}
    for name, (_, largest) in runs.items():
        assert largest < dataset.graph.num_nodes, name
    coverage = {name: [c for c, _ in trace] for name, (trace, _) in runs.items()}
    assert max(coverage["grappa"]) < 1 and max(coverage["grappa_fp"]) < 1
    assert set(coverage["grappa_uw"]) == set(coverage["grappa_naive"]) == {1.0}
    for a, b in itertools.combinations(presets, 2):
        assert runs[a][0] != runs[b][0], (a, b)


# ---------------------------------------------------------------------------- E1-E8
def test_e1_full_coverage_is_the_plain_average():
    deg = torch.tensor([3, 7, 1, 12])
    k = kappa(deg, deg, 1.0)
    s = torch.tensor([3, 5, 1, 5])
    assert torch.equal(k, torch.ones(4, dtype=torch.float64))
    for est in ("uniform", "resampling", "resampling_literal", "none"):
        assert batch_factor(est, k, s) == 1.0


def test_e2_constant_coverage_is_a_pure_rescale(monkeypatch):
    """E2: every seed of every rank at coverage 0.3 (different ``ell`` and ``D``, alpha = 1):
    ``c_uniform = 0.3``, and the aggregate the strategy forms (the SUM all-reduce of each
    rank's loss-scaled gradient) is 0.3 x plain ddp's mean gradient (cosine 1)."""
    from lightning_gnnscale.kit.strategies import MeteredDDPStrategy
    from lightning_gnnscale.systems.grappa.strategy import GrappaStrategy

    world = 2
    monkeypatch.setattr(GrappaStrategy, "world_size", property(lambda self: world))
    monkeypatch.setattr(MeteredDDPStrategy, "training_step", lambda self, batch, i: batch.loss)
    ranks = [([2, 5, 8], [9, 19, 29]), ([11, 2], [39, 9])]  # (ell + 1) / (D + 1) = 0.3
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3).double()
    aggregate = plain = 0
    for ell, deg in ranks:
        ell, deg = torch.tensor(ell), torch.tensor(deg)
        k = kappa(ell, deg, 1.0)
        assert c_uniform(k) == pytest.approx(0.3, rel=1e-12)
        x, y = torch.randn(ell.numel(), 4, dtype=torch.float64), torch.randint(3, (ell.numel(),))
        loss = torch.nn.functional.cross_entropy(net(x), y)
        strategy = GrappaStrategy(GrappaConfig(estimator="uniform", scaling_impl="loss_scale"))
        c = batch_factor("uniform", k, ell.clamp(max=3), 1.0)  # what the DataModule attaches
        batch = SimpleNamespace(coverage=c, loss=loss)
        scaled = strategy.training_step(batch, 0)
        grads = torch.autograd.grad(scaled, list(net.parameters()), retain_graph=True)
        aggregate = aggregate + torch.cat([g.flatten() for g in grads])  # the SUM all-reduce
        grads = torch.autograd.grad(loss, list(net.parameters()))
        plain = plain + torch.cat([g.flatten() for g in grads]) / world  # ddp's mean
    torch.testing.assert_close(aggregate, 0.3 * plain, rtol=1e-12, atol=0)
    cosine = torch.nn.functional.cosine_similarity(aggregate, plain, dim=0)
    assert float(cosine) == pytest.approx(1.0, abs=1e-12)


def test_e3_range_and_monotonicity():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        deg = torch.randint(0, 30, (6,), generator=gen)
        ell = (torch.rand(6, generator=gen) * (deg + 1)).long().clamp(max=deg)
        s = ell.clamp(max=5)
        k = kappa(ell, deg, 1.0)
        cu, cr = c_uniform(k), c_resampling(k, s)
        assert 0 < cr <= 1 and 0 < cu <= 1
        i = int(torch.randint(6, (1,), generator=gen))
        if ell[i] < deg[i]:
            ell2 = ell.clone()
            ell2[i] += 1
            k2 = kappa(ell2, deg, 1.0)
            assert c_uniform(k2) >= cu and c_resampling(k2, s) >= cr - 1e-15


def test_e4_shrinkage_ordering_resampling_le_harmonic_le_arithmetic():
    gen = torch.Generator().manual_seed(1)
    for _ in range(500):
        n = int(torch.randint(1, 20, (1,), generator=gen))
        deg = torch.randint(0, 50, (n,), generator=gen)
        ell = (torch.rand(n, generator=gen) * (deg + 1)).long().clamp(max=deg)
        alpha = float(torch.rand(1, generator=gen)) * 2
        s = ell.clamp(max=int(torch.randint(1, 10, (1,), generator=gen)))
        s = torch.where(s.double() + alpha >= 1, s, torch.ones_like(s))
        k = kappa(ell, deg, alpha)
        hm = float(1 / (1 / k).mean())
        assert c_resampling(k, s, alpha) <= hm + 1e-12 <= c_uniform(k) + 2e-12


def test_e5_literal_eq12_by_hand():
    ell, deg, s = torch.tensor([1, 2, 4]), torch.tensor([3, 2, 9]), torch.tensor([1, 2, 3])
    k = kappa(ell, deg, 1.0)  # 2/4, 1, 5/10
    r = (4 / 2 - 1) * (1 + 1) + 0 + (10 / 5 - 1) * (3 + 1)  # 2 + 0 + 4
    assert c_resampling_literal(k, s) == pytest.approx(min(1.0, 1 / r))
    assert c_resampling_literal(torch.ones(3, dtype=torch.float64), s) == 1.0
    big = kappa(torch.tensor([0, 0]), torch.tensor([50, 50]), 1.0)
    assert 0 < c_resampling_literal(big, torch.tensor([0, 0])) <= 1


def test_e6_gcn_kappa_is_the_local_mass_and_uniform_reduces_to_ratio():
    # one seed with 4 in-neighbours of degrees 0, 3, 8, 15; the first two are local
    indptr, deg = torch.tensor([0, 4]), torch.tensor([0, 3, 8, 15])
    local = torch.tensor([True, True, False, False])
    w = (deg.double() + 1).rsqrt()
    expect = (w[:2].sum() + 1) / (w.sum() + 1)
    assert float(gcn_kappa(indptr, torch.arange(4), local, deg, 1.0)[0]) == pytest.approx(expect)
    flat = torch.zeros(4, dtype=torch.int64)  # equal weights: ell / D with alpha = 0
    assert float(gcn_kappa(indptr, torch.arange(4), local, flat, 0.0)[0]) == pytest.approx(0.5)


def test_e7_gcn_kappa_is_the_p_over_q_constant_of_the_local_restriction():
    """E7: restricting GCN neighbour weights p to the local neighbours (q = p / local mass)
    gives p/q equal on every local neighbour, and that constant is ``gcn_kappa`` (alpha = 0)."""
    gen = torch.Generator().manual_seed(2)
    deg = torch.randint(0, 30, (12,), generator=gen)
    local = torch.zeros(12, dtype=torch.bool)
    local[[0, 3, 4, 9]] = True
    p = (deg.double() + 1).rsqrt()
    p /= p.sum()
    q = torch.where(local, p / p[local].sum(), torch.zeros_like(p))
    ratio = p[local] / q[local]
    k = gcn_kappa(torch.tensor([0, 12]), torch.arange(12), local, deg, 0.0)
    assert torch.allclose(ratio, k.expand_as(ratio), rtol=0, atol=1e-12)


def test_gcn_weighting_in_the_datamodule_matches_the_whole_graph_and_needs_the_halo(store):
    """Finding: without the halo the GCN coverage would be 1 everywhere; with it, each seed's
    kappa is the local share of its whole-graph GCN in-neighbour mass."""
    with pytest.raises(ValueError, match="halo_hops=1"):
        make_dm(store, 4, 1, halo_hops=0, neighbor_weighting="gcn")
    g = small_graph()
    dm = make_dm(store, 4, 1, neighbor_weighting="gcn")
    batch = dm.make_batch(0, 0)
    part = dm.partition(0)
    gids = part.local2global[batch.blocks[-1].dst_ids]
    own = part.local2global[: part.num_core]
    deg = g.in_degree()
    ptr = torch.cat([torch.zeros(1, dtype=torch.int64), deg[gids].cumsum(0)])
    src = torch.cat([g.indices[g.indptr[v] : g.indptr[v + 1]] for v in gids.tolist()])
    expect = gcn_kappa(ptr, src, torch.isin(src, own), deg[src], dm.config.degree_smoothing)
    assert bool((expect < 1).any())
    torch.testing.assert_close(batch.kappa, expect, rtol=0, atol=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_e8_degenerate_nodes_give_finite_factors(alpha):
    ell, deg, s = torch.tensor([0, 0, 3]), torch.tensor([0, 5, 3]), torch.tensor([0, 0, 3])
    k = kappa(ell, deg, alpha)
    assert k[0] == 1.0 and bool(torch.isfinite(k).all())
    for est in ("uniform", "resampling", "resampling_literal"):
        c = batch_factor(est, k, s, alpha)
        assert math.isfinite(c) and 0 <= c <= 1
    assert batch_factor("resampling", k[:0], s[:0], alpha) == 1.0


@pytest.mark.parametrize("estimator", ["resampling", "uniform", "none"])
@pytest.mark.parametrize("scaling_impl", ["comm_hook", "loss_scale"])
def test_strategy_training_step_sets_the_hook_scale_to_the_batch_factor_over_w(
    store, monkeypatch, estimator, scaling_impl
):
    """``GrappaStrategy.training_step`` on a real batch: ``comm_hook`` puts ``c / W`` into the
    DDP hook state (loss untouched), ``loss_scale`` multiplies the loss by it (hook scale 1)."""
    from lightning_gnnscale.comm import GradientHookState
    from lightning_gnnscale.kit.strategies import MeteredDDPStrategy
    from lightning_gnnscale.systems.grappa.strategy import GrappaStrategy

    monkeypatch.setattr(
        MeteredDDPStrategy,
        "training_step",
        lambda self, *a, **k: torch.ones((), dtype=torch.float64),
    )
    monkeypatch.setattr(GrappaStrategy, "world_size", property(lambda self: 4))
    batch = make_dm(store, 4, 1, estimator=estimator).make_batch(0, 0)
    strategy = GrappaStrategy(GrappaConfig(estimator=estimator, scaling_impl=scaling_impl))
    strategy.grad_hook_state = GradientHookState(comm=None)
    loss = strategy.training_step(batch, 0)
    c = batch_factor(estimator, batch.kappa, batch.seed_samples, 1.0)
    assert (c < 1) == (estimator != "none")
    expect_hook, expect_loss = (c / 4, 1.0) if scaling_impl == "comm_hook" else (1.0, c / 4)
    assert strategy.grad_hook_state.scale == pytest.approx(expect_hook, rel=1e-12)
    assert float(loss) == pytest.approx(expect_loss, rel=1e-12)
    assert batch.coverage == pytest.approx(c, rel=1e-12)


def _call(op, category=None, framework=None, numel=1):
    from lightning_gnnscale.comm import CollectiveCall

    return CollectiveCall(op, numel, "torch.int64", 8 * numel, "0", category, 0, False, framework)


def test_gradient_only_audit_allows_control_and_framework_calls_between_steps_only(monkeypatch):
    """Between steps: ``control`` calls (the early trigger's vote) and Lightning's per-step
    SIGTERM broadcast (a known framework call, counted in the summary) pass; inside a step
    only gradient all-reduces do, and an unmarked call fails anywhere."""
    from lightning_gnnscale.callbacks import CollectiveAudit
    from lightning_gnnscale.comm import CommMeter
    from lightning_gnnscale.systems.grappa import callbacks as grappa_callbacks

    meter = CommMeter()
    context = SimpleNamespace(meter=meter)
    monkeypatch.setattr(grappa_callbacks, "rank_context", lambda trainer: context)
    run_audit = CollectiveAudit()  # the run-wide audit's recorder is the one read
    run_audit._recorder = SimpleNamespace(calls=[])
    trainer = SimpleNamespace(callbacks=[run_audit])
    calls = run_audit._recorder.calls
    sigterm = _call("broadcast", framework="lightning.pytorch.loops.training_epoch_loop")
    audit = grappa_callbacks.GradientOnlyAudit()
    audit.on_train_epoch_start(trainer, None)
    for step in range(3):
        calls += [sigterm, _call("all_reduce", "control")]
        audit.on_train_batch_start(trainer, None, None, step)
        calls.append(_call("all_reduce", "gradient", numel=5))
        audit.on_train_batch_end(trainer, None, None, None, step)
    stats = audit.summary_stats()
    assert stats["grappa_audited_framework_calls"] == 3 and stats["grappa_audited_steps"] == 3
    assert stats["grappa_allreduced_numel_per_step"] == [5]
    calls.append(sigterm)  # inside a step
    with pytest.raises(AssertionError, match="broadcast .* in a training step"):
        audit.on_train_batch_end(trainer, None, None, None, 3)
    assert grappa_callbacks.gradient_only_problems([_call("broadcast")], {"bytes": {}}, True)


def test_gradient_only_audit_reads_the_recorder_its_provider_names(monkeypatch):
    """The run-wide recorder comes from the ``shared`` provider (a public protocol, not another
    callback's private attribute); with no run-wide audit the callback opens its own."""
    from lightning_gnnscale.comm import CommMeter
    from lightning_gnnscale.systems.grappa import callbacks as grappa_callbacks

    context = SimpleNamespace(meter=CommMeter())
    monkeypatch.setattr(grappa_callbacks, "rank_context", lambda trainer: context)
    source = SimpleNamespace(epoch_recorder=SimpleNamespace(calls=[]))
    trainer = SimpleNamespace(callbacks=[])  # no CollectiveAudit: only the provider knows it
    audit = grappa_callbacks.GradientOnlyAudit(shared=lambda t: source if t is trainer else None)
    audit.on_train_epoch_start(trainer, None)
    audit.on_train_batch_start(trainer, None, None, 0)
    source.epoch_recorder.calls.append(_call("broadcast"))  # unmarked, inside the step
    with pytest.raises(AssertionError, match="broadcast .* in a training step"):
        audit.on_train_batch_end(trainer, None, None, None, 0)
    assert grappa_callbacks.run_audit(trainer) is None


# ------------------------------------------------------------------ S1-S3, S5: Monte Carlo
def _subset_draws(n_local, size, draws, replace, gen):
    if replace:
        return torch.randint(n_local, (draws, size), generator=gen)
    return torch.rand(draws, n_local, generator=gen).argsort(1)[:, :size]


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("full", [False, True])
def test_s1_s2_importance_sampling_identity(replace, full):
    gen = torch.Generator().manual_seed(3)
    d = 12
    g = torch.randn(d, 8, generator=gen, dtype=torch.float64)
    local = torch.arange(d) if full else torch.tensor([0, 2, 5, 7, 11])
    k = float(kappa(torch.tensor([local.numel()]), torch.tensor([d]), 0.0)[0])
    picks = local[_subset_draws(local.numel(), 3, 20000, replace, gen)]
    est = k * g[picks].mean(1)  # [draws, 8]
    target = g[local].sum(0) / d
    se = est.std(0) / math.sqrt(est.shape[0])
    assert bool(((est.mean(0) - target).abs() <= 4 * se + 1e-12).all())
    if full:
        assert torch.allclose(target, g.mean(0))


def test_s3_uniform_factor_is_the_least_squares_scalar():
    gen = torch.Generator().manual_seed(4)
    mu = torch.randn(16, generator=gen, dtype=torch.float64)
    k = torch.rand(64, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    draws = 4000
    g = mu + torch.randn(draws, 64, 16, generator=gen, dtype=torch.float64)
    plain = g.mean(1)  # E[g_S]
    corr = (k[None, :, None] * g).mean(1)  # node-level corrected
    e_g, e_corr = plain.mean(0), corr.mean(0)
    c_star = float(e_g @ e_corr / (e_g @ e_g))
    assert c_star == pytest.approx(c_uniform(k), rel=0.02)


@pytest.mark.parametrize("c", [4, 8])
def test_s5_expected_coverage_under_random_chunking(tmp_path, c):
    gen = torch.Generator().manual_seed(5)
    n, avg = 4000, 40
    src = torch.randint(n, (n * avg // 2,), generator=gen)
    dst = torch.randint(n, (n * avg // 2,), generator=gen)
    g = Graph.from_edge_index(
        torch.stack([src, dst]),
        n,
        undirected=True,
        x=torch.zeros(n, 1),
    )
    none = torch.zeros(n, dtype=torch.bool)
    targets = NodeTargets(torch.zeros(n, dtype=torch.int64), ~none, none, none, 1)
    st = chunk_store(NodeDataset(g, targets), c, "random", 0, str(tmp_path))
    ks = []
    for spec in Schedule("pinned_sweep", c).partitions(0):
        part = build_partition(every_chunk(st), spec, TASK, halo_hops=0)
        ks.append(kappa(part.ell[part.seeds], part.deg[part.seeds], 0.0))
    assert float(torch.cat(ks).mean()) == pytest.approx(2 / c, abs=0.02)


# ---------------------------------------------------------------------------- bench grappa
def test_bench_grappa_table(tmp_path):
    """Grappa's bytes: its equalised step count (the largest partition's) x the ring all-reduce
    of every parameter; P = 4 too, where the ring factor 2(P-1)/P is 1.5, not 1."""
    from lightning_gnnscale.bench.cli import main
    from lightning_gnnscale.bench.grappa import make_graph
    from lightning_gnnscale.graph.partition import partition

    out = tmp_path / "bench"
    args = ["grappa", "--nodes", "600", "--features", "8", "--parts", "1,2,4", "--depths", "2"]
    assert main([*args, "--batch-size", "100", "--partitioning", "random", "--out", str(out)]) == 0
    rows = json.loads((out / "grappa_traffic.json").read_text())["rows"]
    one, two, four = rows
    assert one["conventional_feature_mb"] == one["grappa_gradient_mb"] == 0  # no peers
    n_params = sum(p.numel() for p in BlockGNN("sage", 8, 128, 8, 2).parameters())
    dataset = make_graph("sbm", 600, 8, 0)
    graph, train = dataset.graph, dataset.targets.train.nonzero().flatten()
    for row in (two, four):
        p = row["parts"]
        assert row["conventional_feature_mb"] > 0 and row["conventional_structure_mb"] > 0
        owners = partition(graph, "random", p, seed=0)[train]
        sizes = torch.bincount(owners, minlength=p)
        assert row["grappa_steps"] == max(math.ceil(int(n) / math.ceil(100 / p)) for n in sizes)
        assert row["grappa_steps"] > row["steps_per_partition"]  # uneven partitions
        ring = 2 * (p - 1) / p
        assert row["grappa_gradient_mb"] == pytest.approx(
            row["grappa_steps"] * ring * 4 * n_params / 1e6
        )
    assert "| random | 2 | 2 |" in (out / "grappa_traffic.md").read_text()


def test_a_chunk_file_holds_what_partitions_read_and_the_degrees_come_from_indptr(tmp_path):
    """A chunk file holds no ``deg`` (an older store's is never read: partitions read
    :data:`~.chunking.CHUNK_FILES` only); the record's in-degrees are ``indptr``'s differences."""
    dataset = small_dataset()
    graph = dataset.graph
    store = chunk_store(dataset, 4, "random", 0, str(tmp_path))
    assert set(torch.load(Path(store.path) / "chunk_1.pt")) == set(chunking.CHUNK_FILES)
    record = store.part((0, 1), 4).load(1)
    assert torch.equal(record["deg"], graph.in_degree()[record["nodes"]])


def test_the_chunks_hold_the_tasks_targets_and_the_metadata_the_datasets_class_count(tmp_path):
    """Under node regression the chunk files' ``y`` are the task's targets (float rows, not the
    dataset's labels), ``train_counts`` count the task's training seeds, a partition's target
    rows are those of its nodes and its seeds the task's, and the store's metadata keeps the
    dataset's class count (its parts the task's head width)."""
    data = DataConfig(batch_size=40, fanouts=[3, 2])
    dm = GrappaDataModule(
        small_dataset(), GrappaConfig(), data, seed=1, cache_dir=tmp_path, task="node_regression"
    )
    targets, part = dm.targets, dm.prepare(2)[0]
    assert targets.target.is_floating_point() and part.out_dim == targets.out_dim == 1
    chunk = part.chunk_ids()
    for c in range(part.num_chunks):
        record = part.load(c)
        assert torch.equal(record["y"], targets.target[record["nodes"]])
    seeds = torch.bincount(chunk[dm.train_ids], minlength=part.num_chunks)
    assert part.meta["train_counts"] == seeds.tolist()
    path = chunk_store_path(dm.graph, targets, part.num_chunks, "random", 1, tmp_path)
    assert json.loads((path / "meta.json").read_text())["num_classes"] == 4
    spec = Schedule("pinned_sweep", part.num_chunks).partition(1, 0)
    isolated = build_partition(part, spec, dm.task)
    assert torch.equal(isolated.targets.target, targets.target[isolated.local2global])
    owned = isolated.local2global[: isolated.num_core]
    in_seed_chunks = torch.isin(chunk[dm.train_ids], torch.tensor(spec.seed_chunks))
    assert torch.equal(owned[isolated.seeds], dm.train_ids[in_seed_chunks])
