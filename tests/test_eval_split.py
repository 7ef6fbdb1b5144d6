"""Evaluation split across ranks equals the replicated (one-process) evaluation (float64)."""

from __future__ import annotations

import pytest
import torch

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.inference import full_logits, node_range, replicated_eval_statistics
from lightning_gnnscale.tasks import build_task
from tests.helpers.dist import run_distributed

KINDS = ("gcn", "sage", "gat")
SPLITS = ("train", "val", "test")
CLASSIFICATION = build_task("node_classification")
CHUNK = 37  # several chunks per rank, boundaries that differ from the one-process run


def make_dataset():
    return sbm(num_nodes=301, num_classes=4, avg_degree=6.0, num_features=10, seed=5).to(
        torch.float64
    )


def make_net(kind, dataset, num_layers=3):
    torch.manual_seed(1)
    num_features = dataset.graph.num_features
    net = BlockGNN(kind, num_features, 16, dataset.num_classes, num_layers=num_layers)
    return net.double().eval()


def _rank(rank, world_size):
    comm = Comm.create()
    dataset = make_dataset()
    graph, targets = dataset.graph, dataset.targets
    out = {}
    for kind in KINDS:
        net = make_net(kind, dataset)
        before = comm.meter.snapshot()
        counts = replicated_eval_statistics(
            CLASSIFICATION, graph, targets, net, SPLITS, rank, world_size, CHUNK, comm
        )
        delta = comm.meter.delta(before)
        own = full_logits(graph, net, CHUNK, comm, gather=False)
        whole = full_logits(graph, net, CHUNK, comm)
        out[kind] = (counts, own, whole, delta["bytes"])
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_split_evaluation_equals_one_process(world_size):
    dataset = make_dataset()
    graph, targets = dataset.graph, dataset.targets
    results = run_distributed(_rank, world_size, timeout_s=120)
    for kind in KINDS:
        net = make_net(kind, dataset)
        ref_logits = full_logits(graph, net, 1000)
        ref_counts = replicated_eval_statistics(
            CLASSIFICATION, graph, targets, net, SPLITS, 0, 1, 1000
        )
        total = sum(r[kind][0] for r in results)
        assert torch.equal(total, ref_counts), kind
        own = torch.cat([r[kind][1] for r in results])
        torch.testing.assert_close(own, ref_logits, rtol=1e-12, atol=1e-12)
        for r in results:
            torch.testing.assert_close(r[kind][2], ref_logits, rtol=1e-12, atol=1e-12)
        for rank, r in enumerate(results):
            start, stop = node_range(graph.num_nodes, rank, world_size)
            assert r[kind][1].shape[0] == stop - start
            # the two hidden layers' own rows to every peer, as activations (float64, 16 wide)
            assert r[kind][3]["activation"] == 2 * (stop - start) * 16 * 8 * (world_size - 1)


def test_node_range_covers_the_nodes_once():
    for n, p in [(10, 3), (2, 3), (0, 2), (301, 2)]:
        ranges = [node_range(n, r, p) for r in range(p)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [b - a for a, b in ranges]
        assert max(sizes) - min(sizes) <= 1


def test_without_a_comm_every_rank_counts_every_pth_node():
    dataset = make_dataset()
    graph, targets = dataset.graph, dataset.targets
    net = make_net("sage", dataset, num_layers=2)
    ref = replicated_eval_statistics(CLASSIFICATION, graph, targets, net, SPLITS, 0, 1, 50)
    parts = [
        replicated_eval_statistics(
            CLASSIFICATION, graph, targets, net, SPLITS, r, 3, 50, Comm.local()
        )
        for r in range(3)
    ]
    assert torch.equal(sum(parts), ref)
    assert not torch.equal(parts[0], ref)


def test_ddp_run_reports_training_and_evaluation_apart(tmp_path):
    """2-process ddp: the split evaluation's activations are evaluation bytes (never training
    bytes), and the summary reports training and evaluation time apart; the epoch time keeps
    its meaning (training + validation)."""
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg

    cfg = make_cfg(tmp_path, "strategy=ddp", "trainer.devices=2", "model.num_layers=2")
    metrics, _ = train(cfg)
    # at least the hidden layer's rows of every node, float32 (counts are a few hundred bytes)
    hidden_rows = cfg.dataset.num_nodes * cfg.model.hidden * 4
    assert metrics["eval_comm_bytes_per_epoch"] >= hidden_rows
    assert metrics["comm_bytes_per_epoch"]["activation"] == 0
    assert metrics["eval_time_s"] > 0 and metrics["train_epoch_time_s"] > 0
    for row in metrics["history"]:
        assert row["eval_s"] > 0
        assert row["train_epoch_s"] + row["eval_s"] == pytest.approx(row["epoch_s"])
    assert metrics["epoch_time_s"] > metrics["train_epoch_time_s"]
