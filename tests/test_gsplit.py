"""GSplit: split-parallel training equals `single` on the same mini-batch; splits are disjoint."""

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.systems.gsplit.sampler import SplitSampler, shuffle
from tests.helpers.dist import run_distributed

FANOUTS = [4, 3]
KINDS = ("gcn", "sage", "gat")
EPOCH, STEP = 3, 1


def setup_graph(world_size):
    graph = sbm(num_nodes=260, num_classes=4, avg_degree=7.0, num_features=8, seed=4)
    graph = graph.to(torch.float64)
    parts = torch.randint(
        0, world_size, (graph.num_nodes,), generator=torch.Generator().manual_seed(7)
    )
    if world_size == 3:  # rank 2 owns a single, isolated-from-the-batch vertex
        parts = torch.where(parts == 2, 0, parts)
        parts[graph.num_nodes - 1] = 2
    seeds = graph.split_ids("train")[:48]
    return graph, parts, seeds


def make_net(kind, graph):
    torch.manual_seed(0)
    return BlockGNN(
        kind, graph.num_features, 12, graph.num_classes, num_layers=2, dropout=0.0, heads=3
    ).double()


def _split_rank(rank, world_size):
    graph, parts, seeds = setup_graph(world_size)
    comm = Comm.create()
    sampler = SplitSampler(comm, parts, graph.indptr, graph.indices, FANOUTS, seed=5)
    targets = seeds[parts[seeds] == rank]
    blocks, plans, inputs = sampler.sample(targets, EPOCH, STEP)
    out = {"layers": [b.dst_ids for b in blocks], "inputs": inputs}
    for kind in KINDS:
        net = make_net(kind, graph)
        logits = net(blocks, graph.x[inputs], layer_hook=lambda i, h: shuffle(h, plans[i], comm))
        loss = F.cross_entropy(logits, graph.y[blocks[-1].dst_ids], reduction="sum")
        (loss / seeds.numel()).backward()
        grad = torch.cat([p.grad.flatten() for p in net.parameters()])
        comm.all_reduce(grad, category="gradient")
        total = comm.all_reduce(loss.detach().clone(), category="control")
        out[kind] = (blocks[-1].dst_ids, logits.detach(), total / seeds.numel(), grad)
    return out


@pytest.mark.dist
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_split_parallel_equals_single(world_size):
    graph, parts, seeds = setup_graph(world_size)
    results = run_distributed(_split_rank, world_size, timeout_s=150)
    ref_blocks = NeighborSampler(graph.indptr, graph.indices, FANOUTS, seed=5).sample(
        seeds, EPOCH, STEP
    )
    # Splits are disjoint and cover every layer; inputs are loaded once, by their owner.
    for layer, ref in enumerate(ref_blocks):
        got = torch.cat([r["layers"][layer] for r in results])
        assert got.unique().numel() == got.numel()
        assert torch.equal(got.sort().values, ref.dst_ids.sort().values)
    inputs = torch.cat([r["inputs"] for r in results])
    assert inputs.unique().numel() == inputs.numel()
    assert torch.equal(inputs.sort().values, ref_blocks[0].src_ids.sort().values)
    for rank, r in enumerate(results):
        assert bool((parts[r["inputs"]] == rank).all())
    if world_size == 3:
        assert results[2]["layers"][-1].numel() == 0  # rank 2 owns no target
    for kind in KINDS:
        net = make_net(kind, graph)
        ref_logits = net(ref_blocks, graph.x[ref_blocks[0].src_ids])
        loss = F.cross_entropy(ref_logits, graph.y[seeds], reduction="sum") / seeds.numel()
        loss.backward()
        ref_grad = torch.cat([p.grad.flatten() for p in net.parameters()])
        row = {int(s): i for i, s in enumerate(seeds)}
        for r in results:
            targets, logits, got_loss, grad = r[kind]
            rows = torch.tensor([row[int(t)] for t in targets], dtype=torch.long)
            torch.testing.assert_close(logits, ref_logits.detach()[rows], rtol=0, atol=1e-12)
            torch.testing.assert_close(got_loss, loss.detach(), rtol=0, atol=1e-12)
            torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-12)


def test_partitioned_cache_ranks_own_rows_by_frequency_and_counts():
    from lightning_gnnscale.systems.gsplit.datamodule import PartitionedFeatureCache

    x = torch.arange(20.0).view(10, 2)
    owned = torch.tensor([1, 3, 5, 7, 9])
    frequency = torch.tensor([0, 5, 0, 1, 0, 9, 0, 0, 0, 3])
    cache = PartitionedFeatureCache(x, owned, frequency, fraction=0.4, policy="presample_freq")
    assert cache.cached.nonzero().flatten().tolist() == [1, 5]  # the 2 most frequent own rows
    rows = cache.load(torch.tensor([5, 7, 9, 1]))
    assert torch.equal(rows, x[[5, 7, 9, 1]]) and (cache.hits, cache.misses) == (2, 2)
    by_id = PartitionedFeatureCache(x, owned, frequency, fraction=0.4, policy="id_order")
    assert by_id.cached.nonzero().flatten().tolist() == [1, 3]


@pytest.mark.e2e
def test_gsplit_trains_end_to_end_with_a_clean_audit(tmp_path):
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg

    metrics, _ = train(
        make_cfg(
            tmp_path,
            "strategy=gsplit",
            "model=sage",
            "strategy.redundancy_probe_steps=2",
            "audit=true",
            "strategy.partition.presample_epochs=2",
        )
    )
    assert metrics["strategy"] == "gsplit" and metrics["audited_collectives"] > 0
    per_epoch = metrics["comm_bytes_per_epoch"]
    assert per_epoch["feature"] == 0  # every input row is loaded by its owner only
    assert per_epoch["activation"] > 0 and per_epoch["activation_grad"] > 0
    assert per_epoch["structure"] > 0 and per_epoch["gradient"] > 0
    system = metrics["system"]
    assert 0 <= system["cross_edge_share"] <= 1 and system["load_imbalance"] >= 1
    assert system["dp_over_split_input_rows"] >= 1  # DP micro-batches load at least as much


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model=custom", "cannot run model=custom"),
        ("data.num_workers=1", "data.num_workers=0"),
        ("strategy.partition.method=spectral", "valid:"),
        ("strategy.cache.policy=lru", "valid:"),
        ("strategy.cache.fraction=1.5", r"\[0, 1\]"),
    ],
)
def test_gsplit_config_errors(tmp_path, override, message):
    from lightning_gnnscale.config import ConfigError, validate
    from tests.helpers.config import make_cfg

    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(tmp_path, "strategy=gsplit", override))


def test_shuffle_bytes_by_layer_match_the_meter(tmp_path):
    """The per-layer forward bytes the stats report add up to the meter's activation bytes."""
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg

    metrics, _ = train(
        make_cfg(
            tmp_path,
            "strategy=gsplit",
            "model=gcn",
            "trainer.max_epochs=1",
            "strategy.partition.presample_epochs=1",
        )
    )
    per_layer = metrics["system"]["bytes_shuffled_per_step_by_layer"]
    steps = metrics["history"][0]["comm_bytes"]
    graph_steps = -(-90 // 64)  # 300 nodes x 30% train, batch 64
    assert sum(per_layer) * graph_steps == pytest.approx(steps["activation"])
