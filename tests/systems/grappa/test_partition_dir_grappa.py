"""Grappa from a partition directory (docs/systems/grappa.md, "From a partition directory"): a
rank whose directory holds only its part and the chunks it lists builds the partitions, batches
and evaluation counts of the in-memory rank, exactly; its full-graph evaluation and predictions
read only its home chunks; train.py from a directory equals the in-memory run bit for bit; a
directory that does not fit the run fails before any rank starts."""

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.graph.partition_dir import (
    PartitionDir,
    PartitionDirError,
    part_folder,
    shared_folder,
)
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.inference import node_rows
from lightning_gnnscale.systems.grappa import GrappaConfig, GrappaDataModule
from lightning_gnnscale.systems.grappa.directory import chunk_group, load_chunk_part
from lightning_gnnscale.systems.grappa.partition import build_partition
from lightning_gnnscale.systems.grappa.schedule import PartitionSpec
from tests.helpers.dist import run_distributed
from tests.helpers.partition_runs import launcher_without_ranks
from tests.test_partition_dir import SBM, _assert_equal

F32_F64 = (torch.float32, torch.float64)


def make_dm(cache_dir, partition_dir=None, config=None, dtype=torch.float64, options=SBM):
    """A Grappa DataModule on the small sbm graph (4 chunks for 2 ranks by default)."""
    data = DataConfig(batch_size=64, fanouts=[5, 3], partition_dir=partition_dir)
    return GrappaDataModule(
        "sbm",
        config or GrappaConfig(super_epoch_len=1),
        data,
        seed=3,
        cache_dir=cache_dir,
        dtype=dtype,
        dataset_options=options,
    )


def _own_rank_copy(tmp_path, rank, world_size):
    """This rank's copy of the directory: its part and the chunk groups it lists only."""
    mine = tmp_path / f"rank{rank}"
    shutil.copytree(tmp_path / "parts", mine)
    listed = set(PartitionDir.open(mine).meta["parts"][rank]["shared"])
    for k in range(world_size):
        if k != rank:
            shutil.rmtree(mine / part_folder(k))
    for folder in mine.glob(f"{shared_folder('')}*"):
        if folder.name.removeprefix(shared_folder("")) not in listed:
            shutil.rmtree(folder)
    return mine


def _epochs(dm, comm, config):
    """Three epochs (three super-epochs: the partitions change) of batches and a GCN's scaled
    gradients, then every evaluation mode's counts and the predicted logits of all nodes."""
    torch.manual_seed(0)
    net = BlockGNN("gcn", dm.input_dim, 16, dm.out_dim, num_layers=2, dropout=0.0).double()
    out = []
    for epoch in range(3):
        for step in range(dm.steps_per_epoch):
            batch = dm.training_batch(epoch, step)
            net.zero_grad()
            loss = F.cross_entropy(net(batch.blocks, batch.x), batch.y)
            (loss * batch.coverage).backward()
            grad = torch.cat([p.grad.flatten() for p in net.parameters()])
            comm.all_reduce(grad, category="gradient")
            blocks = [(b.src_ids, b.edge_index, b.src_deg) for b in batch.blocks]
            out.append((blocks, batch.x, batch.y, torch.tensor(batch.coverage), grad))
    counts = {}
    for mode in ("global_fullgraph", "isolated"):
        dm.config = dataclasses.replace(config, eval_mode=mode)
        counts[mode] = comm.all_reduce(
            dm.eval_statistics(net.eval(), ("val", "test")), category="control"
        )
    dm.config = config
    ids, logits = dm.predict_rows(net, None, "logits")
    ids = comm.all_gather_varlen(ids, category="control")[0]
    logits = comm.all_gather_varlen(logits, category="control")[0]
    some = torch.tensor([5, 0, 17, 5])
    picked = dm.predict_rows(net, some, "embeddings")
    return out, counts, (ids, logits), picked, net


def _rank(rank, world_size, tmp_path, config, options):
    comm = Comm.create()
    context = RankContext(comm, torch.device("cpu"))
    in_memory = make_dm(tmp_path / "cache", config=config, options=options)
    in_memory.setup_rank(context, in_memory.rank_part(context))
    in_memory.context = context  # as setup() sets it (the replicated evaluation reads it)
    want = _epochs(in_memory, comm, config)
    mine = _own_rank_copy(tmp_path, rank, world_size)
    from_dir = make_dm(tmp_path / "cache", str(mine), config=config, options=options)
    from_dir.setup_rank(context, from_dir.rank_part(context))
    from_dir.context = context
    got = _epochs(from_dir, comm, config)
    assert from_dir.state_dict() == in_memory.state_dict()  # a checkpoint of either resumes
    home = from_dir.home_partition()  # built once: every evaluation and prediction reused it
    assert home is (from_dir.remote.base if from_dir.remote is not None else home)
    # the in-memory predictions: layer-wise inference over the whole graph
    net = want[-1]
    oracle = node_rows(in_memory.graph, net, None, "logits", 1 << 16)
    full = torch.empty(in_memory.graph.num_nodes, oracle[1].shape[1], dtype=torch.float64)
    full[oracle[0]] = oracle[1]
    some = node_rows(in_memory.graph, net, torch.tensor([5, 0, 17, 5]), "embeddings", 1 << 16)
    return want[:-1], got[:-1], (full, some), in_memory.graph.num_nodes


# Grappa-FP without halo on 3 ranks, on a graph whose METIS chunks are its 6 communities: the
# parts of ranks 0 and 1 leave a chunk out (a rank's copy lacks that chunk group)
FEW_CROSS = ({**SBM, "num_classes": 6, "homophily": 0.995}, 3)
FIXED = dict(num_chunks=6, schedule="fixed", halo_hops=0, chunking="metis")


@pytest.mark.dist
@pytest.mark.parametrize(
    ("preset", "settings", "options", "world_size"),
    [("grappa", {}, SBM, 2), ("grappa_50s", {}, SBM, 2), ("grappa", FIXED, *FEW_CROSS)],
    ids=["grappa", "grappa_50s", "fixed-unlisted-chunks"],
)
def test_a_grappa_rank_with_only_its_chunks_equals_the_in_memory_rank(
    tmp_path, preset, settings, options, world_size
):
    """Over three super-epochs, every batch (blocks with degrees, input rows, targets, coverage)
    and gradient, and both evaluation modes' counts are equal, exactly, with the other parts'
    folders and every chunk group the rank does not list deleted (under the pinned sweep each
    part lists every chunk; under ``fixed`` without halo some lists leave chunks out); the
    predictions equal the in-memory rank's bit for bit, and whole-graph inference's to
    1e-12, and each node is predicted by one rank; the DataModule's checkpoint state is the
    in-memory one."""
    config = dataclasses.replace(GrappaConfig.preset(preset), super_epoch_len=1, **settings)
    meta = make_dm(tmp_path / "cache", config=config, options=options).write_partition_dir(
        tmp_path / "parts", world_size, log=lambda *_: 0
    )
    if settings:
        listed = [len(part["shared"]) for part in meta["parts"]]
        assert min(listed) < meta["num_chunks"], f"no chunk group is left out: {listed}"
    results = run_distributed(_rank, world_size, tmp_path, config, options, timeout_s=150)
    requested = []
    for want, got, oracle, num_nodes in results:
        (w_steps, w_counts, w_pred, w_some), (g_steps, g_counts, g_pred, g_some) = want, got
        for a, b in zip([*w_pred, *w_some], [*g_pred, *g_some], strict=True):
            assert torch.equal(a, b)  # the in-memory predictions run the same kernel
        assert len(w_steps) == len(g_steps) > 0
        for w, g in zip(w_steps, g_steps, strict=True):
            for wb, gb in zip(w[0], g[0], strict=True):
                for a, b in zip(wb, gb, strict=True):
                    assert torch.equal(a, b)
            for a, b in zip(w[1:], g[1:], strict=True):
                assert torch.equal(a, b)
        for mode in w_counts:
            assert torch.equal(w_counts[mode], g_counts[mode]), mode
        full, some = oracle
        ids, logits = g_pred
        assert torch.equal(ids.sort().values, torch.arange(num_nodes))
        torch.testing.assert_close(logits, full[ids], rtol=0, atol=1e-12)
        # the requested ids this rank holds, in request order (duplicates kept)
        g_ids, g_rows = g_some
        assert g_ids.tolist() == [i for i in (5, 0, 17, 5) if i in set(g_ids.tolist())]
        rows = {int(i): r for i, r in zip(*some)}
        for i, row in zip(g_ids.tolist(), g_rows):
            torch.testing.assert_close(row, rows[i], rtol=0, atol=1e-12)
        requested += g_ids.tolist()
    assert sorted(requested) == [0, 5, 5, 17]  # every requested id by one rank


def test_a_part_whose_home_chunks_file_disagrees_is_refused(tmp_path, monkeypatch):
    """``part-k/home_chunks.npy`` is what a rank evaluates and predicts: a file that is not
    ``c mod W = k`` (written by another rule: the same chunks in another order, so every count
    still agrees) is refused, naming it."""
    import lightning_gnnscale.systems.grappa.datamodule as datamodule

    rule = datamodule.home_chunks  # the rule the in-memory parts (written here) follow
    monkeypatch.setattr(datamodule, "home_chunks", lambda k, w, c: rule(k, w, c)[::-1])
    make_dm(tmp_path / "cache").write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)
    monkeypatch.setattr(datamodule, "home_chunks", rule)
    dm = make_dm(tmp_path / "cache", str(tmp_path / "parts"))
    opened = dm.prepare(2, [1])
    with pytest.raises(
        PartitionDirError, match=r"home_chunks.npy is \[3, 1\], but rank 1 .*\[1, 3\]"
    ):
        load_chunk_part(opened, 1, dm.out_dim, torch.float64)


def test_partitions_from_a_float32_directory_cast_only_their_rows(tmp_path):
    """A float64 rank on a float32 directory: a chunk loads with its float32 features (the
    memory-mapped file, not a converted copy), ``index`` reads node lists and degrees only,
    and a partition equals the in-memory float64 one (features cast row by row) with the
    I/O bytes of the float32 chunk store's partition (the bytes read)."""
    config = GrappaConfig(super_epoch_len=1)
    f32 = make_dm(tmp_path / "cache", config=config, dtype=torch.float32)
    f32.write_partition_dir(tmp_path / "f32", 2, log=lambda *_: 0)
    opened = make_dm(tmp_path / "cache", str(tmp_path / "f32"), config=config).prepare(2, [0])
    out_dim = f32.task.out_dim_of(opened.meta)
    chunks = load_chunk_part(opened, 0, out_dim, torch.float64)
    assert chunks.load(1)["x"].dtype == torch.float32
    assert set(chunks.index(1)) == {"nodes", "deg"}
    stores = {dtype: make_dm(tmp_path / "cache", dtype=dtype).prepare(2)[0] for dtype in F32_F64}
    assert chunks.key == stores[torch.float32].key == stores[torch.float64].key
    assert chunks.meta == stores[torch.float64].meta and chunks.home == stores[torch.float64].home
    assert chunks.out_dim == stores[torch.float64].out_dim == f32.out_dim
    spec, task = PartitionSpec((0, 1), (0, 1)), f32.task
    got = build_partition(chunks, spec, task)
    want, stored = (
        build_partition(stores[dtype], spec, task) for dtype in (torch.float64, torch.float32)
    )
    for name in ("local2global", "indptr", "indices", "x", "deg", "halo_chunk"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert torch.equal(got.targets.split_matrix(), want.targets.split_matrix())
    assert torch.equal(got.targets.target, want.targets.target)
    assert got.x.dtype == torch.float64
    assert got.io_bytes == stored.io_bytes < want.io_bytes


def test_parts_list_the_chunks_their_schedule_reads(tmp_path):
    """Pinned sweep: every part lists every chunk (the sweep pairs each base chunk with all
    others). Fixed (Grappa-FP) without halo, on a graph whose METIS chunks are its
    communities: a part lists its partitions' two chunks each and the chunks its home chunks'
    halo lies in, no more; a rank cannot load another chunk, and the error names it."""
    sweep = make_dm(tmp_path / "cache", config=GrappaConfig(num_chunks=8))
    meta = sweep.write_partition_dir(tmp_path / "sweep", 2, log=lambda *_: 0)
    assert all(part["shared"] == [chunk_group(c) for c in range(8)] for part in meta["parts"])
    assert meta["node_offsets"][-1] == SBM["num_nodes"]
    fixed = GrappaConfig(num_chunks=8, schedule="fixed", halo_hops=0, chunking="metis")
    communities = {**SBM, "num_classes": 8, "homophily": 0.99}  # few edges between them
    meta = make_dm(tmp_path / "cache", config=fixed, options=communities).write_partition_dir(
        tmp_path / "fixed", 4, log=lambda *_: 0
    )
    sources = meta["chunk_sources"]
    for k, part in enumerate(meta["parts"]):
        home = [k, k + 4]
        want = {k, k + 1, k + 4, (k + 5) % 8} | {s for c in home for s in sources[c]}
        assert part["shared"] == [chunk_group(c) for c in sorted(want)]
        assert part["nodes"] == sum(meta["chunk_sizes"][c] for c in home)
    listed = set(meta["parts"][0]["shared"])
    assert listed - {chunk_group(c) for c in (0, 1, 4, 5)}, "the home chunks' halo adds none"
    unlisted = {chunk_group(c) for c in range(8)} - listed
    assert unlisted, "every chunk is listed: the graph's chunks are not its communities"
    name = min(unlisted)
    dm = make_dm(tmp_path / "cache", str(tmp_path / "fixed"), config=fixed, options=communities)
    chunks = load_chunk_part(dm.prepare(4, [0]), 0, dm.out_dim, torch.float64)
    with pytest.raises(PartitionDirError, match=f"part 0 does not list shared group '{name}'"):
        chunks.load(int(name.removeprefix("chunk")))


# --------------------------------------------------------------------------------- train.py
def cfg_overrides(root: Path) -> list[str]:
    """A small float64 Grappa run (the partition command gets the same, plus paths.root)."""
    return [f"paths.root={root}", "strategy=grappa", "dtype=float64", "dataset.num_features=8"]


@pytest.mark.e2e
def test_a_run_from_a_float32_directory_resumes_in_memory_as_the_uninterrupted_run(
    tmp_path, monkeypatch
):
    """float64, 2 ranks, a directory written in float32: one epoch from the directory, then
    its checkpoint resumed in memory for the second, ends with the weights (and DataModule
    state) of two uninterrupted in-memory epochs, bit for bit: the checkpoint's layout names
    the chunking whatever dtype holds the features."""
    from lightning_gnnscale.partition import partition
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg
    from tests.helpers.partition_runs import NODES
    from tests.test_partition_dir import _weights

    common = cfg_overrides(tmp_path)
    out = tmp_path / "parts"
    f32 = [NODES, *(o.replace("float64", "float32") for o in common)]
    partition(f32, out, log=lambda *_: 0)
    train(make_cfg(tmp_path / "mem", *common))
    first = make_cfg(tmp_path / "dir", *common, f"data.partition_dir={out}", "trainer.max_epochs=1")
    train(first)
    last = tmp_path / "dir" / "out" / "checkpoints" / "last.ckpt"
    train(make_cfg(tmp_path / "resumed", *common, f"ckpt_path={last}"))
    _assert_equal(_weights(tmp_path / "mem" / "out"), _weights(tmp_path / "resumed" / "out"))


def test_a_grappa_directory_that_does_not_fit_fails_before_any_rank_starts(tmp_path, monkeypatch):
    """Another chunking, another schedule (which decides the chunks each part lists), another
    chunk count and a missing chunk group are refused in the launcher, naming the key or the
    file; the counts the defaults resolve to, set explicitly, are accepted (a rank starts)."""
    common = cfg_overrides(tmp_path)
    out, run = launcher_without_ranks(tmp_path, monkeypatch, common)

    with pytest.raises(PartitionDirError, match="'method' is 'random' but this run has 'metis'"):
        run("strategy.chunking=metis")
    with pytest.raises(PartitionDirError, match="'partition_options' is .*'schedule': 'pinned"):
        run("strategy.schedule=fixed")
    with pytest.raises(PartitionDirError, match="'partition_options' is .*'num_chunks': 4"):
        run("strategy.num_chunks=6")
    with pytest.raises(AssertionError, match="a rank was started"):
        run("strategy.num_chunks=4", "strategy.partitions_per_rank=2")  # the defaults' values
    group = out / shared_folder(chunk_group(3))
    shutil.rmtree(group)
    with pytest.raises(PartitionDirError, match=f"shared group 'chunk00003' is missing: {group}"):
        run()
