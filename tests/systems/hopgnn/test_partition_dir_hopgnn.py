"""HopGNN from a partition directory (docs/partitioning.md, docs/systems/hopgnn.md): a rank
that holds only its feature shard and the replicated group (the other parts' folders deleted)
plans, samples, fetches, evaluates and predicts exactly what the in-memory rank does, under
``hopgnn`` and ``hopgnn_mc``; train.py from a directory equals the in-memory run bit for bit;
a directory made with other settings fails before any rank starts."""

import shutil

import pytest
import torch

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.graph.book import RangeBook
from lightning_gnnscale.graph.partition_dir import PartitionDir, PartitionDirError, part_folder
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.systems.hopgnn import HopGNNConfig, HopGNNDataModule
from tests.helpers.dist import run_distributed
from tests.helpers.partition_runs import launcher_without_ranks
from tests.test_partition_dir import SBM

FANOUTS = [5, 3]


def make_dm(cache_dir, name, partition_dir=None):
    """A float64 ``hopgnn`` / ``hopgnn_mc`` DataModule on the small sbm graph (METIS)."""
    data = DataConfig(batch_size=64, fanouts=FANOUTS, partition_dir=partition_dir)
    return HopGNNDataModule(
        "sbm",
        HopGNNConfig.preset(name),
        data,
        seed=3,
        cache_dir=cache_dir,
        dtype=torch.float64,
        dataset_options=SBM,
    )


def _iterations(dm, new2old=None):
    """Per iteration of epoch 1: every kept step's blocks (in original ids), input rows and
    labels, and the migrations; then evaluation counts and predictions."""
    torch.manual_seed(0)
    net = BlockGNN("gat", dm.input_dim, 16, dm.out_dim, num_layers=2, dropout=0.0).double()
    out = []
    for step in range(dm.steps_per_epoch):
        batch = dm.make_batch(1, step)
        steps = []
        for s in batch.steps:
            if s is None:
                steps.append(None)
                continue
            ids = [b.src_ids if new2old is None else new2old[b.src_ids] for b in s.blocks]
            blocks = [(i, b.edge_index, b.src_deg) for i, b in zip(ids, s.blocks)]
            steps.append((blocks, s.x, s.y))
        out.append((steps, batch.y, batch.hops, batch.stats["remote_rows"]))
    comm = dm.comm
    counts = comm.all_reduce(
        dm.eval_statistics(net.eval(), ("train", "val", "test")), category="control"
    )
    predictions = [dm.predict_rows(net, None, "logits")]
    predictions.append(dm.predict_rows(net, torch.tensor([299, 0, 150, 7]), "embeddings"))
    return out, counts, predictions


def _own_part_rank(rank, world_size, tmp_path):
    comm = Comm.create()
    context = RankContext(comm, torch.device("cpu"))
    results = {}
    for name in ("hopgnn", "hopgnn_mc"):
        in_memory = make_dm(tmp_path / "cache", name)
        in_memory.setup_rank(context, in_memory.rank_part(context))
        in_memory.context = context  # as setup() sets it (evaluation reads it)
        want = _iterations(in_memory)
        # this rank's own copy of the directory, the other parts' folders removed
        mine = tmp_path / f"{name}-rank{rank}"
        shutil.copytree(tmp_path / name, mine)
        for k in range(world_size):
            if k != rank:
                shutil.rmtree(mine / part_folder(k))
        from_dir = make_dm(tmp_path / "cache", name, partition_dir=str(mine))
        from_dir.setup_rank(context, from_dir.rank_part(context))
        from_dir.context = context
        assert isinstance(from_dir.part, RangeBook)  # the [P + 1] offsets, no [N] partition
        assert from_dir.shard.rows.shape[0] < 300  # its own feature rows only
        results[name] = (want, _iterations(from_dir, from_dir.sampler.orig_ids))
    return results


def _gathered(predictions):
    ids = torch.cat([p[0] for p in predictions])
    rows = torch.cat([p[1] for p in predictions])
    order = torch.argsort(ids)
    return ids[order], rows[order]


@pytest.mark.dist
def test_a_hopgnn_rank_with_only_its_part_equals_the_in_memory_rank(tmp_path):
    """``hopgnn`` and ``hopgnn_mc``: every iteration's micrograph sets (blocks in original
    ids, with degrees; input rows, local and fetched; labels), migrations and fetched row
    counts, the evaluation counts and the predictions are equal, with the other part's folder
    deleted (predicted rows to rounding: see the GSplit test)."""
    for name in ("hopgnn", "hopgnn_mc"):
        dm = make_dm(tmp_path / "cache", name)
        dm.write_partition_dir(tmp_path / name, 2, log=lambda *_: 0)
    results = run_distributed(_own_part_rank, 2, tmp_path, timeout_s=150)
    for name in ("hopgnn", "hopgnn_mc"):
        for by_rank in results:
            (want, want_counts, _), (got, got_counts, _) = by_rank[name]
            assert len(want) == len(got) > 0
            for w, g in zip(want, got, strict=True):
                assert w[2:] == g[2:] and torch.equal(w[1], g[1])
                for w_step, g_step in zip(w[0], g[0], strict=True):
                    assert (w_step is None) == (g_step is None)
                    if w_step is None:
                        continue
                    for wb, gb in zip(w_step[0], g_step[0], strict=True):
                        assert all(torch.equal(a, b) for a, b in zip(wb, gb, strict=True))
                    assert torch.equal(w_step[1], g_step[1]) and torch.equal(w_step[2], g_step[2])
            assert torch.equal(want_counts, got_counts)
        for output in (0, 1):  # every node's logits; four nodes' embeddings
            want_ids, want_rows = _gathered([r[name][0][2][output] for r in results])
            got_ids, got_rows = _gathered([r[name][1][2][output] for r in results])
            assert torch.equal(want_ids, got_ids)
            torch.testing.assert_close(got_rows, want_rows, rtol=0, atol=1e-12)
        assert want_ids.tolist() == [0, 7, 150, 299]
    opened = PartitionDir.open(tmp_path / "hopgnn")
    assert opened.meta["parts"][0]["shared"] == ["topology"]


# --------------------------------------------------------------------------------- train.py
def cfg_overrides(root, name="hopgnn") -> list[str]:
    """A small float64 HopGNN GAT run (the partition command gets the same, plus the size)."""
    return [
        f"paths.root={root}",
        f"strategy={name}",
        "model=gat",
        "dtype=float64",
        "dataset.num_features=8",
        "data.fanouts=[5,3]",
    ]


def test_a_hopgnn_directory_that_does_not_fit_fails_before_any_rank_starts(tmp_path, monkeypatch):
    """Another part count, partitioner or option, the other HopGNN preset, and a missing
    replicated group are refused in the launcher, naming the key or the file."""
    common = cfg_overrides(tmp_path)
    out, run = launcher_without_ranks(tmp_path, monkeypatch, common)

    with pytest.raises(PartitionDirError, match="'num_parts' is 2 but this run has 3") as err:
        run("trainer.devices=3")
    assert "partition.json" in str(err.value)
    with pytest.raises(PartitionDirError, match="'method' is 'metis' but this run has 'random'"):
        run("strategy.partition.method=random")
    with pytest.raises(
        PartitionDirError, match="'system' is 'hopgnn' but this run has 'hopgnn_mc'"
    ):
        run("strategy=hopgnn_mc")
    shutil.rmtree(out / "shared-topology")
    with pytest.raises(PartitionDirError, match="shared group 'topology' is missing"):
        run()


# ------------------------------------------------------------------- merging controller
def _recording(end_epoch, seconds):
    def record(s):
        seconds.append(s)
        end_epoch(s)

    return record


def _modelled_epoch_rank(rank, world_size, tmp_path):
    """The seconds the controller is given for epoch 0 from a directory, with and without an
    evaluation (``own_rows``: ``feature`` and ``structure`` bytes) inside the open window."""
    comm = Comm.create()
    context = RankContext(comm, torch.device("cpu"))
    out = {}
    for evaluate in (False, True):
        dm = make_dm(tmp_path / "cache", "hopgnn", partition_dir=str(tmp_path / "hopgnn"))
        dm.setup_rank(context, dm.rank_part(context))
        dm.context = context
        seconds = []
        dm.controller.end_epoch = _recording(dm.controller.end_epoch, seconds)
        for step in range(dm.steps_per_epoch):
            dm.make_batch(0, step)
        sent = 0
        if evaluate:
            torch.manual_seed(0)
            net = BlockGNN("gat", dm.input_dim, 16, dm.out_dim, num_layers=2).double()
            before = comm.meter.snapshot()
            dm.own_rows(net.eval(), net.num_layers)
            sent = sum(comm.meter.delta(before)["bytes"].values())
        dm.make_batch(1, 0)  # closes epoch 0's window
        out[evaluate] = (seconds, sent, dm.controller.steps)
    return out


@pytest.mark.dist
def test_evaluation_bytes_stay_out_of_the_controllers_modelled_epoch_time(tmp_path):
    """From a directory evaluation pulls in-neighbours' rows from their owners (in memory it
    sends nothing); an evaluation inside the controller's open window leaves the modelled
    epoch seconds, and the next ``T``, exactly as without it."""
    make_dm(tmp_path / "cache", "hopgnn").write_partition_dir(
        tmp_path / "hopgnn", 2, log=lambda *_: 0
    )
    for by_rank in run_distributed(_modelled_epoch_rank, 2, tmp_path, timeout_s=150):
        (plain, _, plain_steps), (evaluated, sent, evaluated_steps) = by_rank[False], by_rank[True]
        assert sent > 0 and len(plain) == 1 and plain[0] > 0
        assert evaluated == plain and evaluated_steps == plain_steps


def test_a_directory_without_training_nodes_is_refused(tmp_path, monkeypatch):
    """As in memory (the base's ``train_ids``): no training node is an error at set-up."""
    make_dm(tmp_path / "cache", "hopgnn").write_partition_dir(
        tmp_path / "parts", 1, log=lambda *_: 0
    )
    load_shared = PartitionDir.load_shared

    def no_train_ids(self, name, rank):
        arrays = dict(load_shared(self, name, rank))
        arrays["train_ids"] = arrays["train_ids"][:0]
        return arrays

    monkeypatch.setattr(PartitionDir, "load_shared", no_train_ids)
    dm = make_dm(tmp_path / "cache", "hopgnn", partition_dir=str(tmp_path / "parts"))
    context = RankContext(Comm.create(), torch.device("cpu"))
    with pytest.raises(ValueError, match="no training nodes"):
        dm.setup_rank(context, dm.rank_part(context))


@pytest.mark.e2e
def test_hopgnn_from_a_directory_resumes_as_the_uninterrupted_run(tmp_path, monkeypatch):
    """float64, 2 ranks, the merging controller on, 3 epochs (so it takes a decision against
    a measured best): a directory run stopped after epoch 0 and resumed from its checkpoint
    ends with the uninterrupted in-memory run's weights bit for bit, and the same test
    accuracy."""
    from lightning_gnnscale.partition import partition
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg
    from tests.test_partition_dir import _assert_equal, _weights

    common, three = cfg_overrides(tmp_path), "trainer.max_epochs=3"
    out = tmp_path / "parts"
    partition(["dataset.num_nodes=300", *common], out, log=lambda *_: 0)
    want, _ = train(make_cfg(tmp_path / "mem", *common, three))
    directory = [*common, f"data.partition_dir={out}"]
    train(make_cfg(tmp_path / "dir", *directory, "trainer.max_epochs=1"))
    last = tmp_path / "dir" / "out" / "checkpoints" / "last.ckpt"
    got, _ = train(make_cfg(tmp_path / "resumed", *directory, three, f"ckpt_path={last}"))
    _assert_equal(_weights(tmp_path / "mem" / "out"), _weights(tmp_path / "resumed" / "out"))
    assert got["test_acc"] == want["test_acc"]
