"""DistDGL: training and evaluation equal `single` (float64), byte counts, METIS vs random,
sparse-embedding updates through Lightning (with and without prefetching loaders), resume with
embeddings, config errors, e2e."""

import os
from collections import deque
from dataclasses import replace

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from hydra.errors import ConfigCompositionException
from lightning.pytorch.callbacks import Callback

from lightning_gnnscale.checkpoints import checkpoint_shards
from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.block import Block
from lightning_gnnscale.graph.book import PartitionBook, relabel_graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.node_targets import NodeDataset
from lightning_gnnscale.graph.partition import partition
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.module import GNNModule
from lightning_gnnscale.preflight import validate
from lightning_gnnscale.run import build_datamodule, build_strategy, train
from lightning_gnnscale.systems.distdgl import (
    DistDGLConfig,
    DistDGLDataModule,
    PartitionConfig,
    PartitionedGraph,
)
from tests.helpers.config import make_cfg
from tests.helpers.dist import run_distributed

FANOUTS = [5, 3]
KINDS = ("gcn", "sage", "gat")


def partitioned(world_size, method="random", num_nodes=300):
    dataset = sbm(num_nodes=num_nodes, num_classes=4, avg_degree=8.0, num_features=10, seed=5)
    graph, targets = dataset.graph, dataset.targets
    parts = partition(graph, method, world_size, seed=0, splits=targets.split_matrix())
    book = PartitionBook.from_parts(parts, world_size)
    relabelled = relabel_graph(graph, book).to(torch.float64)
    return PartitionedGraph(relabelled, targets.rows(book.new2old), book, {})


def datamodule(data, rank, world_size, comm, batch_size=64):
    """The real DistDGLDataModule, set up for this rank on the given partition (no Trainer)."""
    assert (comm.rank, comm.world_size) == (rank, world_size)
    config = DistDGLConfig(partition=PartitionConfig(method="random"))
    dm = DistDGLDataModule(
        NodeDataset(data.graph, data.targets),
        config,
        DataConfig(batch_size=batch_size, fanouts=FANOUTS),
        seed=3,
    )
    dm.setup_rank(RankContext(comm, torch.device("cpu")), dm.part_of(data, rank))
    return dm


def make_net(kind, data):
    torch.manual_seed(0)
    width = data.graph.num_features
    return BlockGNN(kind, width, 16, data.targets.out_dim, num_layers=2, dropout=0.0).double()


def _train_rank(rank, world_size):
    data = partitioned(world_size)
    comm = Comm.create()
    dm = datamodule(data, rank, world_size, comm)
    out = {}
    for kind in KINDS:
        net = make_net(kind, data)
        for step in range(dm.steps_per_epoch):
            before = comm.meter.snapshot()
            batch = dm.make_batch(1, step)
            feature_bytes = comm.meter.delta(before)["bytes"]["feature"]
            net.zero_grad()
            loss = F.cross_entropy(net(batch.blocks, batch.x), batch.y, reduction="sum")
            (loss / batch.global_seed_count).backward()
            grad = torch.cat([p.grad.flatten() for p in net.parameters()])
            comm.all_reduce(grad, category="gradient")
            out[kind, step] = (
                batch.blocks[-1].dst_ids,
                batch.blocks[0].src_ids,
                feature_bytes,
                grad,
                batch.global_seed_count,
            )
        counts = dm.eval_statistics(net.eval(), ("val", "test"))
        out[kind, "eval"] = comm.all_reduce(counts, category="control")
        dm.data = replace(dm.data, eval_chunk_size=7)  # layers over 7 core rows at a time
        counts = dm.eval_statistics(net.eval(), ("val", "test"))
        out[kind, "eval_chunked"] = comm.all_reduce(counts, category="control")
        dm.data = replace(dm.data, eval_chunk_size=DataConfig().eval_chunk_size)
    return out


def _whole_graph_logits(net, g):
    """Every layer on one block of all in-edges at once: none of the chunking, sampling or
    block building of layer-wise inference."""
    dst = torch.repeat_interleave(torch.arange(g.num_nodes), g.indptr.diff())
    block = Block(
        src_ids=torch.arange(g.num_nodes),
        num_dst=g.num_nodes,
        edge_index=torch.stack([g.indices, dst]),
        src_deg=g.in_degree(),
    )
    h = g.x
    for i in range(net.num_layers):
        h = net.layer_output(i, block, h)
    return h


@pytest.mark.dist
@pytest.mark.parametrize("world_size", [2, 3])
def test_training_and_evaluation_equal_single(world_size):
    """Same step seeds -> same gradient as one process; distributed layer-wise inference
    counts equal single-process inference; feature bytes equal an independent count."""
    data = partitioned(world_size)
    g, book, targets = data.graph, data.book, data.targets
    results = run_distributed(_train_rank, world_size, timeout_s=150)
    sampler = NeighborSampler(g.indptr, g.indices, FANOUTS, seed=3)
    steps = sum(1 for key in results[0] if key[0] == "gcn" and isinstance(key[1], int))
    for kind in KINDS:
        for step in range(steps):
            seeds = torch.cat([r[kind, step][0] for r in results])
            assert seeds.numel() == results[0][kind, step][4]  # global seed count
            net = make_net(kind, data)
            blocks = sampler.sample(seeds, epoch=1, step=step)
            out = net(blocks, g.x[blocks[0].src_ids])
            loss = F.cross_entropy(out, targets.target[seeds], reduction="sum")
            (loss / seeds.numel()).backward()
            ref = torch.cat([p.grad.flatten() for p in net.parameters()])
            expected = 0  # independent count of the bytes all owners send for this step
            for rank, r in enumerate(results):
                own_seeds, inputs, _, grad, _ = r[kind, step]
                torch.testing.assert_close(grad, ref, rtol=0, atol=1e-12)
                remote_rows = int((book.nid2part(inputs) != rank).sum())
                remote_seeds = int((book.nid2part(own_seeds) != rank).sum())
                expected += remote_rows * g.num_features * 8 + remote_seeds * 8  # float64, int64
            # each rank's meter counts what it sends (the rows it serves); summed over ranks
            assert sum(r[kind, step][2] for r in results) == expected
        net = make_net(kind, data).eval()
        pred = _whole_graph_logits(net, g).argmax(1)
        for key in ("eval", "eval_chunked"):
            for split, got in zip(("val", "test"), results[0][kind, key]):
                ids = targets.split(split).nonzero().flatten()
                correct = (pred[ids] == targets.target[ids]).sum()
                assert got.tolist() == [float(correct), float(ids.numel())]
    assert sum(r["gcn", 0][2] for r in results) > 0  # some rows were remote


def _chunked_halo_rank(rank, world_size):
    data = partitioned(world_size)
    comm = Comm.create()
    dm = datamodule(data, rank, world_size, comm)
    net = make_net("gcn", data).eval()
    out = {}
    for chunk in (DataConfig().eval_chunk_size, 7):
        dm.data = replace(dm.data, eval_chunk_size=chunk)
        before = comm.meter.snapshot()
        rows = dm.core_outputs(net, net.num_layers)
        sent = comm.meter.delta(before)["bytes"]
        out[chunk] = rows, sent["feature"], sent["activation"], dict(dm.eval_halo_rows)
    return out


@pytest.mark.dist
def test_evaluation_pulls_the_halo_rows_per_chunk():
    """Layer-wise inference over 7 core rows at a time pulls each chunk's halo rows only (a
    chunk holds far fewer than the whole halo), re-pulling the halo rows several chunks read:
    the rows equal one chunk's (to 1e-12: the layers' matmuls run on other shapes), and the
    bytes served are the pulled rows' (input
    layer: F float64s, the next: the hidden width), more than once per halo row."""
    data = partitioned(2)
    ranks = run_distributed(_chunked_halo_rank, 2, timeout_s=120)
    big = DataConfig().eval_chunk_size
    widths = (data.graph.num_features, 16)
    for chunk in (big, 7):
        halo = [r[chunk][3] for r in ranks]
        for layer, category in enumerate((1, 2)):  # feature, then activation bytes
            served = sum(r[chunk][category] for r in ranks)
            assert served == sum(h["pulled"][layer] for h in halo) * widths[layer] * 8
    for r in ranks:
        torch.testing.assert_close(r[7][0], r[big][0], rtol=0, atol=1e-12)  # other matmuls
        whole, chunked = r[big][3], r[7][3]
        assert whole["pulled"] == whole["distinct"] == chunked["distinct"]
        assert whole["largest"] == whole["distinct"][0]  # one chunk: the whole halo at once
        assert chunked["largest"] < whole["largest"] / 3
        assert chunked["pulled"][0] > 1.5 * chunked["distinct"][0]  # the extra bytes


@pytest.mark.parametrize("task", ["node_classification", "node_regression"])
def test_a_part_holds_the_tasks_rows_and_seeds_in_memory_and_from_a_directory(tmp_path, task):
    """``part_of``: each core carries the task's rows (node regression's synthetic float
    targets, not the dataset's labels) and the trainer chunks are the task's training seeds;
    ``load_part`` gives the same rows with the task's head width from the directory's meta."""

    def dm(partition_dir=None):
        data = DataConfig(batch_size=32, fanouts=FANOUTS, partition_dir=partition_dir)
        options = dict(num_nodes=150, num_classes=3, num_features=6)
        config = DistDGLConfig(partition=PartitionConfig(method="random"))
        return DistDGLDataModule(
            "sbm", config, data, cache_dir=tmp_path, dataset_options=options, task=task
        )

    in_memory = dm()
    prepared = in_memory.prepare(2)
    book, targets = prepared.book, in_memory.targets  # the task's rows, in original ids
    assert targets.target.is_floating_point() == (task == "node_regression")
    in_memory.write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)
    from_dir = dm(str(tmp_path / "parts"))
    opened = from_dir.prepare(2)
    parts = [in_memory.part_of(prepared, k) for k in range(2)]
    for k, part in enumerate(parts):
        core = book.new2old[int(book.node_offsets[k]) : int(book.node_offsets[k + 1])]
        loaded = from_dir.load_part(opened, k).local.targets
        for got in (part.local.targets, loaded):
            assert got.out_dim == in_memory.out_dim == (1 if task == "node_regression" else 3)
            for name, array in targets.rows(core).arrays().items():
                assert torch.equal(got.arrays()[name], array), (k, name)
    seeds = torch.cat([part.trainer_seeds for part in parts])
    assert torch.equal(book.new2old[seeds].sort().values, in_memory.train_ids)


def _feature_bytes_rank(rank, world_size, method):
    data = partitioned(world_size, method, num_nodes=3000)
    comm = Comm.create()
    dm = datamodule(data, rank, world_size, comm, batch_size=256)
    for step in range(dm.steps_per_epoch):
        dm.make_batch(0, step)
    return comm.meter.snapshot()["bytes"]["feature"]


@pytest.mark.dist
def test_metis_moves_fewer_feature_bytes_than_random():
    metis = sum(run_distributed(_feature_bytes_rank, 2, "metis_balanced", timeout_s=120))
    random = sum(run_distributed(_feature_bytes_rank, 2, "random", timeout_s=120))
    assert metis < 0.7 * random, (metis, random)


# ------------------------------------------------------------------------------ end to end
@pytest.mark.e2e
def test_distdgl_trains_end_to_end_with_a_clean_audit(tmp_path):
    metrics, _ = train(make_cfg(tmp_path, "strategy=distdgl", "model=sage", "audit=true"))
    assert metrics["strategy"] == "distdgl" and metrics["world_size"] == 2
    assert metrics["audited_collectives"] > 0
    per_epoch = metrics["comm_bytes_per_epoch"]
    assert per_epoch["structure"] > 0 and per_epoch["feature"] > 0 and per_epoch["gradient"] > 0
    assert per_epoch["activation"] == 0  # evaluation traffic is reported apart
    assert metrics["eval_comm_bytes_per_epoch"] > 0


@pytest.mark.e2e
def test_distdgl_learnable_embeddings(tmp_path):
    """Featureless mode: sparse-Adagrad node embeddings pushed to their owners learn, and the
    pushes show up as `gradient` bytes beyond the dense all-reduce (hand count)."""
    cfg = make_cfg(
        tmp_path,
        "strategy=distdgl",
        "model=sage",
        "strategy.embedding_dim=16",
        "trainer.max_epochs=6",
    )
    metrics, _ = train(cfg)
    history = metrics["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    dm = build_datamodule(validate(cfg))  # the run's task: its head and training seeds
    net = BlockGNN("sage", 16, 64, dm.out_dim, num_layers=2)
    dense_bytes = 4 * sum(p.numel() for p in net.parameters())  # float32, once per rank
    steps = -(-(dm.train_ids.numel() // 2) // 32)  # smallest chunk / local batch (64/2)
    ring = 2 * dense_bytes * steps  # 2 ranks, each sends 2(P-1)/P x param bytes per step
    assert history[-1]["comm_bytes"]["gradient"] > ring
    assert history[-1]["comm_bytes"]["feature"] > 0  # pulled embedding rows


# ------------------------------------------------------- sparse embeddings through Lightning
SPARSE_LR = 0.5


class _AheadLoader:
    """Iterates ``loader`` keeping ``ahead`` more batches built than it has handed out (as
    DataLoader workers do). It has no length, so Lightning prefetches one more on its own."""

    def __init__(self, loader, ahead: int):
        self.loader, self.ahead = loader, ahead

    def __iter__(self):
        pending = deque()
        for batch in self.loader:
            pending.append(batch)
            if len(pending) > self.ahead:
                yield pending.popleft()
        yield from pending


class _InputRecordingModule(GNNModule):
    """Remembers the input rows and ids the training step actually used."""

    def training_step(self, batch, batch_idx):
        self.step_inputs = (batch.blocks[0].src_ids, batch.x)
        return super().training_step(batch, batch_idx)


class _EmbeddingSteps(Callback):
    """Per step: this rank's embedding shard before and after, the looked-up gids and the
    gradient of their rows, and how many batches the loader had built by the step's start."""

    def __init__(self, built: list, dm: DistDGLDataModule):
        self.built, self.dm, self.records = built, dm, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before = self.dm.kv.local_shard("learned_inputs").clone()
        self.built_at_start = len(self.built)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        gids, rows = pl_module.step_inputs
        self.records.append(
            {
                "before": self.before,
                "after": self.dm.kv.local_shard("learned_inputs").clone(),
                "gids": gids.clone(),
                "grad": rows.grad.clone(),
                "built": self.built_at_start,
            }
        )


def _embedding_fit_rank(rank, world_size, run, dm, ahead):
    """One rank of a real Trainer fit (the system's own build; ``dm`` prepared by the caller)
    in an existing gloo world."""
    os.environ.update(
        LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1"
    )
    L.seed_everything(run.seed, verbose=False)
    strategy = build_strategy(run)
    built = []
    make_batch = dm.make_batch
    dm.make_batch = lambda epoch, step: built.append((epoch, step)) or make_batch(epoch, step)
    if ahead:
        loader = dm.train_dataloader
        dm.train_dataloader = lambda: _AheadLoader(loader(), ahead)
    net = dm.build_model(run.model).to(torch.float64)
    module = _InputRecordingModule(net, run.model.optimizer, run.model.lr, run.model.weight_decay)
    recorder = _EmbeddingSteps(built, dm)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world_size,
        strategy=strategy,
        max_epochs=run.trainer.max_epochs,
        logger=False,
        callbacks=[recorder],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=dm)
    return recorder.records


@pytest.mark.dist
def test_sparse_embedding_steps_are_exact_and_unaffected_by_prefetching(tmp_path):
    """Through Lightning, SparseSGD embeddings (float64, 2 ranks): every step moves exactly the
    rows the step looked up, by -lr x their gradient summed over ranks and lookups, and leaves
    every other row bit-identical; a loader that builds batches ahead gives the same run."""
    run = validate(
        make_cfg(
            tmp_path,
            "strategy=distdgl",
            "model=sage",
            "model.hidden=16",
            "model.dropout=0.0",
            "data.batch_size=32",
            "dtype=float64",
            "strategy.embedding_dim=8",
            "data.embedding_optimizer=sgd",
            f"data.embedding_lr={SPARSE_LR}",
        )
    )
    dm = build_datamodule(run)
    dm.prepare(2)
    runs = {
        ahead: run_distributed(_embedding_fit_rank, 2, run, dm, ahead, timeout_s=240)
        for ahead in (0, 2)
    }
    plain, prefetched = runs[0], runs[2]
    steps = len(plain[0])
    assert steps >= 3 and all(len(r) == steps for run in runs.values() for r in run)
    # the premise: the plain loader builds one batch per step, the other one runs ahead
    assert [rec["built"] for rec in plain[0]] == list(range(1, steps + 1))
    assert prefetched[0][0]["built"] >= 3  # >= 2 batches built beyond step 0 before it ran
    for records in runs.values():
        for t in range(steps):
            before = torch.cat([r[t]["before"] for r in records])  # shards in gid order
            after = torch.cat([r[t]["after"] for r in records])
            gids = torch.cat([r[t]["gids"] for r in records])
            grad = torch.cat([r[t]["grad"] for r in records])
            expected = before.index_add(0, gids, grad, alpha=-SPARSE_LR)
            torch.testing.assert_close(after, expected, rtol=0, atol=1e-13)
            untouched = torch.ones(before.shape[0], dtype=torch.bool)
            untouched[gids] = False
            assert torch.equal(after[untouched], before[untouched])
            assert not torch.equal(after[~untouched], before[~untouched])
            if t + 1 < steps:  # the next step starts from this step's result
                assert torch.equal(torch.cat([r[t + 1]["before"] for r in records]), after)
    for rank in range(2):
        for got, want in zip(prefetched[rank], plain[rank]):
            for key in ("gids", "grad", "after"):
                assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("model=custom",), "cannot run model=custom"),
        (("data.num_workers=1",), "data.num_workers=0"),
        (("strategy.partition.method=spectral",), "valid:"),
        (("data.embedding_optimizer=adam",), "valid:"),
    ],
)
def test_distdgl_config_errors(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(tmp_path, "strategy=distdgl", *overrides))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("strategy.embedding_dim=-1", "strategy.embedding_dim=-1 must be >= 0"),
        ("data.embedding_lr=0", "data.embedding_lr=0.0 must be > 0"),
        ("strategy.partition.overpartition=0", "strategy.partition.overpartition=0 must be"),
        ("strategy.partition.balance=nodes", "strategy.partition.balance='nodes' is unknown"),
    ],
)
def test_distdgl_bad_values_name_their_key(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(tmp_path, "strategy=distdgl", override))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("strategy.embeding_dim=1", "embeding_dim"),  # unknown key
        ("strategy.partition.overpartiton=16", "overpartiton"),  # unknown nested key
        ("strategy.embedding_dim=4.5", "embedding_dim"),  # wrong type
        ("strategy.partition.balance_edges=maybe", "balance_edges"),  # wrong type
    ],
)
def test_distdgl_unknown_keys_and_wrong_types_fail_at_compose_time(tmp_path, override, key):
    with pytest.raises(ConfigCompositionException) as err:
        make_cfg(tmp_path, "strategy=distdgl", override)
    assert key in str(err.value) + str(err.value.__cause__)


def _last_checkpoint(output_dir):
    return torch.load(output_dir / "checkpoints" / "last.ckpt", weights_only=False)


def _tables(output_dir, num_nodes):
    """The learnable-input tables of ``last.ckpt``'s per-rank shards, rows in original ids."""
    shards = checkpoint_shards(output_dir / "checkpoints" / "last.ckpt")
    assert len(shards) == 2  # one file per rank, nothing gathered to rank 0
    tables = {}
    for shard in shards:
        rows = dict(shard["DistDGLDataModule"])
        ids = rows.pop("orig_ids")
        for name, value in rows.items():
            tables.setdefault(name, value.new_full((num_nodes, *value.shape[1:]), float("nan")))
            tables[name][ids] = value
    return tables


@pytest.mark.e2e
def test_resume_with_embeddings_equals_an_uninterrupted_run(tmp_path):
    """float64, 2 ranks, SparseAdagrad embeddings: 2 epochs + resume from `last.ckpt` to 4 end
    with the uninterrupted run's parameters, embedding rows, Adagrad sums and metrics; each
    rank keeps its rows in a shard of its own (audits on)."""
    run = (
        "strategy=distdgl",
        "audit=true",
        "model=sage",
        "dtype=float64",
        "strategy.embedding_dim=8",
        "data.embedding_lr=0.5",
    )
    straight, a = train(make_cfg(tmp_path / "a", *run, "trainer.max_epochs=4"))
    _, first = train(make_cfg(tmp_path / "b", *run, "trainer.max_epochs=2"))
    n = a["graph"].num_nodes
    ckpt = first["output_dir"] / "checkpoints" / "last.ckpt"
    start = _tables(first["output_dir"], n)
    resumed, b = train(make_cfg(tmp_path / "b", *run, "trainer.max_epochs=4", f"ckpt_path={ckpt}"))
    want, got = _last_checkpoint(a["output_dir"]), _last_checkpoint(b["output_dir"])
    assert got["epoch"] == want["epoch"] == 3
    for name, value in want["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][name], value, rtol=0, atol=1e-12)
    assert want["DistDGLDataModule"] == got["DistDGLDataModule"] == {"train_epoch": 4}
    tables, resumed_tables = _tables(a["output_dir"], n), _tables(b["output_dir"], n)
    assert sorted(tables) == ["learned_inputs", "learned_inputs@adagrad_state"]
    assert not torch.equal(start["learned_inputs"], tables["learned_inputs"])  # moved after resume
    for name, value in tables.items():
        assert value.shape == (n, 8) and not value.isnan().any()
        torch.testing.assert_close(resumed_tables[name], value, rtol=0, atol=1e-12)
    for key in ("epochs", "best_epoch", "best_val_acc", "test_acc", "val_acc", "train_loss"):
        assert resumed[key] == pytest.approx(straight[key], abs=1e-9), key
    for x, y in zip(straight["history"], resumed["history"]):
        assert x["train_loss"] == pytest.approx(y["train_loss"], abs=1e-12)
