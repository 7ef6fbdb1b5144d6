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
from lightning_gnnscale.graph.partition_dir import (
    PartitionDir,
    PartitionDirError,
    part_folder,
    shared_folder,
)
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.schema import DataConfig
from lightning_gnnscale.systems.base import node_rows
from lightning_gnnscale.systems.contract import RankContext
from lightning_gnnscale.systems.grappa import GrappaConfig, GrappaDataModule
from lightning_gnnscale.systems.grappa.directory import DirChunks, chunk_group
from tests.helpers.dist import run_distributed
from tests.helpers.partition_runs import launcher_without_ranks, train_both_ways
from tests.test_partition_dir import SBM, _assert_equal


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
    net = BlockGNN("gcn", dm.input_dim, 16, dm.num_classes, num_layers=2, dropout=0.0).double()
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
            dm.eval_counts(net.eval(), ("val", "test")), category="control"
        )
    dm.config = config
    ids, logits = dm.predict_rows(net, None, "logits")
    ids = comm.all_gather_varlen(ids, category="control")[0]
    logits = comm.all_gather_varlen(logits, category="control")[0]
    some = torch.tensor([5, 0, 17, 5])
    picked = dm.predict_rows(net, some, "embeddings")
    return out, counts, (ids, logits), picked, net


def _rank(rank, world_size, tmp_path, config):
    comm = Comm.create()
    context = RankContext(comm, torch.device("cpu"))
    in_memory = make_dm(tmp_path / "cache", config=config)
    in_memory.setup_rank(context, in_memory.prepare(world_size))
    in_memory.context = context  # as setup() sets it (the replicated evaluation reads it)
    want = _epochs(in_memory, comm, config)
    mine = _own_rank_copy(tmp_path, rank, world_size)
    from_dir = make_dm(tmp_path / "cache", partition_dir=str(mine), config=config)
    from_dir.setup_rank(context, from_dir.prepare(world_size, [rank]))
    from_dir.context = context
    got = _epochs(from_dir, comm, config)
    # the in-memory predictions: layer-wise inference over the whole graph
    net = want[-1]
    oracle = node_rows(in_memory.graph, net, None, "logits", 1 << 16)
    full = torch.empty(in_memory.graph.num_nodes, oracle[1].shape[1], dtype=torch.float64)
    full[oracle[0]] = oracle[1]
    some = node_rows(in_memory.graph, net, torch.tensor([5, 0, 17, 5]), "embeddings", 1 << 16)
    return want[:-1], got[:-1], (full, some), in_memory.graph.num_nodes


@pytest.mark.dist
@pytest.mark.parametrize("preset", ["grappa", "grappa_50s"])
def test_a_grappa_rank_with_only_its_chunks_equals_the_in_memory_rank(tmp_path, preset):
    """Over three super-epochs, every batch (blocks with degrees, input rows, labels, coverage)
    and gradient, and both evaluation modes' counts are equal, exactly, with the other part's
    folder and every chunk group the rank does not list deleted; the predicted logits of
    every node equal whole-graph inference's, and each node is predicted by one rank."""
    config = dataclasses.replace(GrappaConfig.preset(preset), super_epoch_len=1)
    make_dm(tmp_path / "cache", config=config).write_partition_dir(
        tmp_path / "parts", 2, log=lambda *_: 0
    )
    results = run_distributed(_rank, 2, tmp_path, config, timeout_s=150)
    requested = []
    for want, got, oracle, num_nodes in results:
        (w_steps, w_counts, _, _), (g_steps, g_counts, g_pred, g_some) = want, got
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
    chunks = DirChunks(dm.prepare(4, [0]), 0, torch.float64)
    with pytest.raises(PartitionDirError, match=f"part 0 does not list shared group '{name}'"):
        chunks.load(int(name.removeprefix("chunk")))


# --------------------------------------------------------------------------------- train.py
def cfg_overrides(root: Path) -> list[str]:
    """A small float64 Grappa run (the partition command gets the same, plus paths.root)."""
    return [f"paths.root={root}", "strategy=grappa", "dtype=float64", "dataset.num_features=8"]


@pytest.mark.e2e
def test_grappa_trains_from_a_directory_as_in_memory(tmp_path, monkeypatch):
    """The default run (float64, 2 ranks, eval_mode=global_fullgraph): the final weights
    from the directory equal the in-memory run's bit for bit, and so does every epoch's
    validation accuracy; the launcher never loads the dataset."""
    train_both_ways(tmp_path, monkeypatch, cfg_overrides(tmp_path))


def test_a_grappa_directory_that_does_not_fit_fails_before_any_rank_starts(tmp_path, monkeypatch):
    """Another chunking, another schedule (which decides the chunks each part lists) and a
    missing chunk group are refused in the launcher, naming the key or the file."""
    common = cfg_overrides(tmp_path)
    out, run = launcher_without_ranks(tmp_path, monkeypatch, common)

    with pytest.raises(PartitionDirError, match="'method' is 'random' but this run has 'metis'"):
        run("strategy.chunking=metis")
    with pytest.raises(PartitionDirError, match="'partition_options' is .*'schedule': 'pinned"):
        run("strategy.schedule=fixed")
    group = out / shared_folder(chunk_group(3))
    shutil.rmtree(group)
    with pytest.raises(PartitionDirError, match=f"shared group 'chunk00003' is missing: {group}"):
        run()


# ----------------------------------------------------------------------- plain Lightning
def _plain_lightning_ranks(out: Path) -> None:
    """Both DataModules under ``L.Trainer(precision="64-true")``, one epoch then
    ``trainer.predict``: the in-memory one, and one given only the directory (dataset None,
    written in float32, cast on load)."""
    import lightning as L

    import lightning_gnnscale as gs

    results = {}
    for key in ("memory", "directory"):
        L.seed_everything(0, verbose=False)
        if key == "memory":
            dm = make_dm(out / "cache", dtype=torch.float32)
        else:
            data = DataConfig(batch_size=64, fanouts=[5, 3], partition_dir=str(out / "f32"))
            dm = GrappaDataModule(None, GrappaConfig(super_epoch_len=1), data, seed=3)
        module = gs.GNNModule.from_config(gs.ModelConfig(hidden=8, num_layers=2), dm)
        trainer = L.Trainer(
            strategy=gs.GrappaStrategy(dm.config),
            accelerator="cpu",
            devices=2,
            max_epochs=1,
            precision="64-true",
            callbacks=[gs.StepSeed(0)],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            num_sanity_val_steps=0,
        )
        trainer.fit(module, datamodule=dm)
        (share,) = trainer.predict(module, datamodule=dm.predict_on(output="logits"))
        weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
        results[key] = (weights, share["node_ids"], share["logits"])
    torch.save(results, out / f"rank{trainer.global_rank}.pt")


@pytest.mark.dist
def test_trainer_predict_from_a_directory_gives_the_in_memory_rows(tmp_path):
    """A plain Lightning script: the weights after one epoch from the directory equal the
    in-memory ones bit for bit, and ``trainer.predict``'s shares of the two ranks cover every
    node once, with the in-memory logits (to 1e-12)."""
    from lightning_gnnscale.launch import launch_local

    make_dm(tmp_path / "cache", dtype=torch.float32).write_partition_dir(
        tmp_path / "f32", 2, log=lambda *_: 0
    )
    launch_local(_plain_lightning_ranks, (tmp_path,), devices=2, num_nodes=1, timeout_s=300)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    rows = {}
    for key in ("memory", "directory"):
        ids = torch.cat([r[key][1] for r in ranks])
        logits = torch.cat([r[key][2] for r in ranks])
        assert torch.equal(ids.sort().values, torch.arange(SBM["num_nodes"])), key
        rows[key] = logits[ids.argsort()]
    for r in ranks:
        _assert_equal(r["memory"][0], r["directory"][0])
    assert rows["directory"].dtype == torch.float64
    torch.testing.assert_close(rows["directory"], rows["memory"], rtol=0, atol=1e-12)
