"""GSplit from a partition directory (docs/partitioning.md, docs/systems/gsplit.md): a rank
that holds only its own part and the shared topology (the other parts' folders deleted)
samples, loads, shuffles, evaluates and predicts exactly what the in-memory rank does;
train.py from a directory equals the in-memory run bit for bit; a directory made with other
settings fails before any rank starts."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.graph.book import PartitionBook, RangeBook, relabel_csc
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.partition_dir import PartitionDir, PartitionDirError, part_folder
from lightning_gnnscale.graph.sampler import sample_neighbors
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.partition import partition
from lightning_gnnscale.systems.gsplit import GSplitConfig, GSplitDataModule
from lightning_gnnscale.systems.gsplit.strategy import shuffle_hook
from tests.helpers.dist import run_distributed
from tests.helpers.partition_runs import (
    launcher_without_ranks,
    resume_from_directory,
    train_both_ways,
)
from tests.test_partition_dir import SBM

FANOUTS = [5, 3]


def make_dm(cache_dir, partition_dir=None, config=None):
    """A float64 GSplit DataModule on the small sbm graph (default: its default config)."""
    data = DataConfig(batch_size=64, fanouts=FANOUTS, partition_dir=partition_dir)
    return GSplitDataModule(
        "sbm",
        config or GSplitConfig(),
        data,
        seed=3,
        cache_dir=cache_dir,
        dtype=torch.float64,
        dataset_options=SBM,
    )


def test_the_relabelled_csc_keeps_every_segments_order():
    """Position ``i`` of a node's in-edge segment is the same neighbour before and after."""
    graph = sbm(num_nodes=200, num_classes=3, avg_degree=6.0, num_features=2, seed=1).graph
    parts = torch.randint(0, 3, (200,), generator=torch.Generator().manual_seed(2))
    book = PartitionBook.from_parts(parts, 3)
    indptr, indices = relabel_csc(graph.indptr, graph.indices, book)
    old = torch.arange(200)
    src, dst_pos = sample_neighbors(graph.indptr, graph.indices, old, -1, 0)
    new_src, new_pos = sample_neighbors(indptr, indices, book.old2new[old], -1, 0)
    assert torch.equal(new_pos, dst_pos) and torch.equal(book.new2old[new_src], src)


# ------------------------------------------------------------ ranks that hold only their part
def _steps(dm, comm, probe=True):
    """Per step of epoch 1: blocks, input rows, labels and a GCN's loss and gradient (the
    shuffle hook moving rows); then evaluation counts, predictions and (if ``probe``) the
    redundancy probe's samples."""
    torch.manual_seed(0)
    net = BlockGNN("gcn", dm.input_dim, 16, dm.out_dim, num_layers=2, dropout=0.0).double()
    make_hook = shuffle_hook(comm)
    out = []
    for step in range(dm.steps_per_epoch):
        batch = dm.make_batch(1, step)
        net.zero_grad()
        logits = net(batch.blocks, batch.x, layer_hook=make_hook(batch))
        loss = F.cross_entropy(logits, batch.y, reduction="sum") / batch.global_seed_count
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in net.parameters()])
        comm.all_reduce(grad, category="gradient")
        blocks = [(b.src_ids, b.edge_index, b.src_deg) for b in batch.blocks]
        out.append((blocks, batch.x, batch.y, loss.detach(), grad))
    net.eval()
    counts = comm.all_reduce(dm.eval_statistics(net, ("train", "val", "test")), category="control")
    predictions = [dm.predict_rows(net, None, "logits")]
    predictions.append(dm.predict_rows(net, torch.tensor([299, 0, 150, 7]), "embeddings"))
    if not probe:
        return out, counts, predictions
    # the redundancy probe's samples of epoch 0's first step: whole, and rank-salted halves
    probe, seeds = dm.whole_batch_sampler(), dm.step_seeds(0, 0)
    samples = [probe.sample(seeds, 0, 0)]
    samples += [probe.sample(h, 0, 0, salt=r) for r, h in enumerate(torch.tensor_split(seeds, 2))]
    probed = [[(b.src_ids, b.edge_index, b.src_deg) for b in blocks] for blocks in samples]
    return out, counts, predictions, probed


def _own_part_rank(rank, world_size, tmp_path):
    comm = Comm.create()
    context = RankContext(comm, torch.device("cpu"))
    in_memory = make_dm(tmp_path / "cache")
    in_memory.setup_rank(context, in_memory.rank_part(context))
    in_memory.context = context  # as setup() sets it (evaluation reads it)
    want = _steps(in_memory, comm)
    # this rank's own copy of the directory, the other parts' folders removed
    mine = tmp_path / f"rank{rank}"
    shutil.copytree(tmp_path / "parts", mine)
    for k in range(world_size):
        if k != rank:
            shutil.rmtree(mine / part_folder(k))
    from_dir = make_dm(tmp_path / "cache", partition_dir=str(mine))
    from_dir.setup_rank(context, from_dir.rank_part(context))
    from_dir.context = context
    assert isinstance(from_dir.parts, RangeBook)  # the [P + 1] offsets, no [N] split function
    return want, _steps(from_dir, comm)


def _edge_set(src_ids, edge_index, src_deg):
    """A block as the set of its (source, destination, source degree) id triples and its
    sources."""
    edges = torch.stack([src_ids[edge_index[0]], src_ids[edge_index[1]], src_deg[edge_index[0]]])
    return set(map(tuple, edges.T.tolist())), sorted(src_ids.tolist())


def _gathered(predictions):
    """The ranks' prediction shares as one ``{id: row}`` table."""
    ids = torch.cat([p[0] for p in predictions])
    rows = torch.cat([p[1] for p in predictions])
    order = torch.argsort(ids)
    return ids[order], rows[order]


@pytest.mark.dist
def test_a_gsplit_rank_with_only_its_part_equals_the_in_memory_rank(tmp_path):
    """Every step's blocks (in original ids, with degrees), input rows, labels, loss and
    gradient, the evaluation counts, the predictions and the redundancy probe's samples are
    equal, exactly, with the other part's folder deleted."""
    make_dm(tmp_path / "cache").write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)
    opened = PartitionDir.open(tmp_path / "parts")
    new2old = torch.cat([opened.load_part(k)["orig_ids"] for k in range(2)])
    results = run_distributed(_own_part_rank, 2, tmp_path, timeout_s=150)
    for want, got in results:
        (want_steps, want_counts, _, want_probe), (got_steps, got_counts, _, got_probe) = want, got
        assert len(want_steps) == len(got_steps) > 0
        for w, g in zip(want_steps, got_steps, strict=True):
            for (w_ids, w_edges, w_deg), (g_ids, g_edges, g_deg) in zip(w[0], g[0], strict=True):
                assert torch.equal(w_ids, new2old[g_ids])
                assert torch.equal(w_edges, g_edges) and torch.equal(w_deg, g_deg)
            for a, b in zip(w[1:], g[1:], strict=True):
                assert torch.equal(a, b)
        assert torch.equal(want_counts, got_counts)
        for w_blocks, g_blocks in zip(want_probe, got_probe, strict=True):  # the same samples
            for w, g in zip(w_blocks, g_blocks, strict=True):  # (sources in another order)
                assert _edge_set(*w) == _edge_set(new2old[g[0]], *g[1:])
    # Predictions: the same ids, rows equal to rounding. Layer-wise inference multiplies
    # other row sets (the in-memory rank's node range against the part's vertices), and a
    # matrix product's rounding of a row may depend on the rows beside it.
    for output in (0, 1):  # every node's logits; four nodes' embeddings
        want_ids, want_rows = _gathered([r[0][2][output] for r in results])
        got_ids, got_rows = _gathered([r[1][2][output] for r in results])
        assert torch.equal(want_ids, got_ids)
        torch.testing.assert_close(got_rows, want_rows, rtol=0, atol=1e-12)
    assert want_ids.tolist() == [0, 7, 150, 299]


# --------------------------------------------------------------------------------- train.py
def cfg_overrides(root) -> list[str]:
    """A small float64 GSplit GAT run (the partition command gets the same, plus the size)."""
    return [
        f"paths.root={root}",
        "strategy=gsplit",
        "model=gat",
        "dtype=float64",
        "dataset.num_features=8",
        "data.fanouts=[5,3]",
        "data.batch_size=64",  # pre-sampling runs the training schedule: part of the partition
    ]


@pytest.mark.e2e
def test_gsplit_trains_from_a_directory_as_in_memory_and_resumes(tmp_path, monkeypatch):
    """float64, 2 ranks: the final weights from the directory equal the in-memory run's bit
    for bit (atol 0), and so does every epoch's loss and validation accuracy and the test
    accuracy; the launcher never loads the dataset. A directory run stopped after one epoch
    and resumed from its checkpoint ends with the uninterrupted run's weights bit for bit."""
    common = cfg_overrides(tmp_path)
    _, got = train_both_ways(tmp_path, monkeypatch, common, keys=("train_loss", "val_acc"))
    resume_from_directory(tmp_path, common, got)


def test_a_gsplit_directory_that_does_not_fit_fails_before_any_rank_starts(tmp_path, monkeypatch):
    """Another part count, partitioner, pre-sampling schedule (fanouts, batch size) or
    system, and a missing shared topology, are refused in the launcher, naming the key or
    the file."""
    common = cfg_overrides(tmp_path)
    out, run = launcher_without_ranks(tmp_path, monkeypatch, common)
    other = tmp_path / "distdgl"

    with pytest.raises(PartitionDirError, match="'num_parts' is 2 but this run has 3") as err:
        run("trainer.devices=3")
    assert "partition.json" in str(err.value)
    with pytest.raises(PartitionDirError, match="'method' is 'gsplit' but this run has 'node'"):
        run("strategy.partition.method=node")
    with pytest.raises(PartitionDirError, match="'partition_options' is .*'batch_size': 64"):
        run("data.batch_size=32")
    with pytest.raises(PartitionDirError, match="'partition_options' is .*'presample_epochs'"):
        run("strategy.partition.presample_epochs=3")
    partition([*common, "strategy=distdgl", "dataset.num_nodes=300"], other, log=lambda *_: 0)
    with pytest.raises(PartitionDirError, match="'system' is 'distdgl' but this run has 'gsplit'"):
        run(parts=other)
    shutil.rmtree(out / "shared-topology")
    with pytest.raises(PartitionDirError, match="shared group 'topology' is missing"):
        run()


def test_a_directory_without_training_nodes_is_refused(tmp_path, monkeypatch):
    """As in memory (the base's ``train_ids``): no training node is an error at set-up."""
    make_dm(tmp_path / "cache").write_partition_dir(tmp_path / "parts", 1, log=lambda *_: 0)
    load_shared = PartitionDir.load_shared

    def no_train_ids(self, name, rank):
        arrays = dict(load_shared(self, name, rank))
        arrays["train_ids"] = arrays["train_ids"][:0]
        return arrays

    monkeypatch.setattr(PartitionDir, "load_shared", no_train_ids)
    dm = make_dm(tmp_path / "cache", partition_dir=str(tmp_path / "parts"))
    context = RankContext(Comm.create(), torch.device("cpu"))
    with pytest.raises(ValueError, match="no training nodes"):
        dm.setup_rank(context, dm.rank_part(context))
