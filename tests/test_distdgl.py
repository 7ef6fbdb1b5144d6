"""DistDGL: training and evaluation equal `single` (float64), byte counts, METIS vs random, e2e."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config import ConfigError, validate
from lightning_gnnscale.graph.book import PartitionBook, relabel_graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.partition import partition
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN, layerwise_inference
from lightning_gnnscale.run import train
from lightning_gnnscale.systems.distdgl.datamodule import DistDGLDataModule, PartitionedGraph
from tests.helpers.config import make_cfg
from tests.helpers.dist import run_distributed

FANOUTS = [5, 3]
KINDS = ("gcn", "sage", "gat")


def partitioned(world_size, method="random", num_nodes=300):
    graph = sbm(num_nodes=num_nodes, num_classes=4, avg_degree=8.0, num_features=10, seed=5)
    parts = partition(graph, method, world_size, seed=0)
    book = PartitionBook.from_parts(parts, world_size)
    return PartitionedGraph(relabel_graph(graph, book).to(torch.float64), book, {})


def datamodule(data, rank, world_size, comm, batch_size=64):
    """The real DistDGLDataModule, set up with a stand-in for the Trainer."""
    dm = DistDGLDataModule(data, FANOUTS, batch_size, seed=3)
    dm.trainer = SimpleNamespace(
        global_rank=rank, world_size=world_size, strategy=SimpleNamespace(comm=comm)
    )
    dm.setup("fit")
    return dm


def make_net(kind, data):
    torch.manual_seed(0)
    g = data.graph
    return BlockGNN(kind, g.num_features, 16, g.num_classes, num_layers=2, dropout=0.0).double()


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
        counts = dm.eval_counts(net.eval(), ("val", "test"))
        out[kind, "eval"] = comm.all_reduce(counts, category="control")
    return out


@pytest.mark.dist
@pytest.mark.parametrize("world_size", [2, 3])
def test_training_and_evaluation_equal_single(world_size):
    """Same step seeds -> same gradient as one process; distributed layer-wise inference
    counts equal single-process inference; feature bytes equal an independent count."""
    data = partitioned(world_size)
    g, book = data.graph, data.book
    results = run_distributed(_train_rank, world_size, timeout_s=150)
    sampler = NeighborSampler(g.indptr, g.indices, FANOUTS, seed=3)
    steps = sum(1 for key in results[0] if key[0] == "gcn" and key[1] != "eval")
    for kind in KINDS:
        for step in range(steps):
            seeds = torch.cat([r[kind, step][0] for r in results])
            assert seeds.numel() == results[0][kind, step][4]  # global seed count
            net = make_net(kind, data)
            blocks = sampler.sample(seeds, epoch=1, step=step)
            loss = F.cross_entropy(net(blocks, g.x[blocks[0].src_ids]), g.y[seeds], reduction="sum")
            (loss / seeds.numel()).backward()
            ref = torch.cat([p.grad.flatten() for p in net.parameters()])
            expected = 0  # independent count of the bytes all owners send for this step
            for rank, r in enumerate(results):
                own_seeds, inputs, _, grad, _ = r[kind, step]
                torch.testing.assert_close(grad, ref, rtol=0, atol=1e-12)
                remote_rows = int((book.nid2part(inputs) != rank).sum())
                remote_labels = int((book.nid2part(own_seeds) != rank).sum())
                expected += remote_rows * g.num_features * 8 + remote_labels * 8  # float64, int64
            # each rank's meter counts what it sends (the rows it serves); summed over ranks
            assert sum(r[kind, step][2] for r in results) == expected
        net = make_net(kind, data).eval()
        pred = layerwise_inference(net, g.indptr, g.indices, g.x).argmax(1)
        for split, got in zip(("val", "test"), results[0][kind, "eval"]):
            ids = g.split_ids(split)
            assert got.tolist() == [float((pred[ids] == g.y[ids]).sum()), float(ids.numel())]
    assert sum(r["gcn", 0][2] for r in results) > 0  # some rows were remote


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
    metrics, objects = train(
        make_cfg(
            tmp_path,
            "strategy=distdgl",
            "model=sage",
            "strategy.embedding_dim=16",
            "trainer.max_epochs=6",
        )
    )
    history = metrics["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    graph = objects["graph"]
    net = BlockGNN("sage", 16, 64, graph.num_classes, num_layers=2)
    dense_bytes = 4 * sum(p.numel() for p in net.parameters())  # float32, once per rank
    steps = -(-(int(graph.train_mask.sum()) // 2) // 32)  # smallest chunk / local batch (64/2)
    ring = 2 * dense_bytes * steps  # 2 ranks, each sends 2(P-1)/P x param bytes per step
    assert history[-1]["comm_bytes"]["gradient"] > ring
    assert history[-1]["comm_bytes"]["feature"] > 0  # pulled embedding rows


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("model=custom",), "cannot run model=custom"),
        (("data.num_workers=1",), "data.num_workers=0"),
        (("strategy.partition.method=spectral",), "valid:"),
        (("strategy.sparse_optimizer=adam",), "valid:"),
        (("strategy.embedding_dim=8", f"ckpt_path={__file__}"), "cannot resume"),
    ],
)
def test_distdgl_config_errors(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(tmp_path, "strategy=distdgl", *overrides))
