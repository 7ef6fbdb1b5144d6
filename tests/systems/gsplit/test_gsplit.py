"""GSplit: split-parallel training equals `single` on the same mini-batch; splits are disjoint;
bytes and statistics equal brute-force recomputations from the global sample."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm, CommMeter, Topology
from lightning_gnnscale.graph.csc_rows import CSCRows
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.order import epoch_permutation
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.systems.gsplit.datamodule import GSplitDataModule
from lightning_gnnscale.systems.gsplit.sampler import SplitSampler, shuffle
from tests.helpers.dist import run_distributed

FANOUTS = [4, 3]
KINDS = ("gcn", "sage", "gat")
EPOCH, STEP = 3, 1


def setup_graph(world_size):
    """The float64 dataset, a split function over ``world_size`` ranks and 48 training seeds."""
    dataset = sbm(num_nodes=260, num_classes=4, avg_degree=7.0, num_features=8, seed=4)
    dataset = dataset.to(torch.float64)
    graph = dataset.graph
    parts = torch.randint(
        0, world_size, (graph.num_nodes,), generator=torch.Generator().manual_seed(7)
    )
    if world_size == 3:  # rank 2 owns a single, isolated-from-the-batch vertex
        parts = torch.where(parts == 2, 0, parts)
        parts[graph.num_nodes - 1] = 2
    seeds = dataset.targets.train.nonzero().flatten()[:48]
    return dataset, parts, seeds


def make_net(kind, dataset):
    torch.manual_seed(0)
    return BlockGNN(
        kind, dataset.graph.num_features, 12, dataset.num_classes, 2, dropout=0.0, heads=3
    ).double()


def _split_rank(rank, world_size):
    dataset, parts, seeds = setup_graph(world_size)
    graph, y = dataset.graph, dataset.targets.target
    comm = Comm.create()
    sampler = SplitSampler(comm, parts, CSCRows.whole(graph.indptr, graph.indices), FANOUTS, 5)
    targets = seeds[parts[seeds] == rank]
    blocks, plans, inputs = sampler.sample(targets, EPOCH, STEP)
    out = {"layers": [b.dst_ids for b in blocks], "inputs": inputs, "bytes": {}}
    out["bytes"]["sampling"] = comm.meter.snapshot()["bytes"]
    for kind in KINDS:
        net = make_net(kind, dataset)
        before = comm.meter.snapshot()
        logits = net(
            blocks, graph.x[inputs], layer_hook=lambda i, h: shuffle(h, plans[i], comm, layer=i)
        )
        loss = F.cross_entropy(logits, y[blocks[-1].dst_ids], reduction="sum")
        (loss / seeds.numel()).backward()
        out["bytes"][kind] = comm.meter.delta(before)["bytes"]
        grad = torch.cat([p.grad.flatten() for p in net.parameters()])
        comm.all_reduce(grad, category="gradient")
        total = comm.all_reduce(loss.detach().clone(), category="control")
        out[kind] = (blocks[-1].dst_ids, logits.detach(), total / seeds.numel(), grad)
    return out


def remote_rows_by_layer(blocks, parts) -> list[int]:
    """Brute force over global blocks (input layer first): for each layer, the number of
    distinct (consumer rank, vertex) pairs where the consumer computes some destination of
    that layer (it owns it) and needs the vertex's row as an input, but another rank owns it.
    Plain Python over edges; knows nothing of the shuffle plans."""
    owner = parts.tolist()
    counts = []
    for block in blocks:
        src_ids, dst_ids = block.src_ids.tolist(), block.dst_ids.tolist()
        needed = set()
        for s, d in zip(block.edge_index[0].tolist(), block.edge_index[1].tolist()):
            needed.add((owner[dst_ids[d]], src_ids[s]))  # the rank computing d reads s
        for d in dst_ids:  # a destination's own row (SAGE / GAT self term) is always local
            needed.add((owner[d], d))
        counts.append(sum(1 for rank, v in needed if owner[v] != rank))
    return counts


@pytest.mark.dist
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_split_parallel_equals_single(world_size):
    dataset, parts, seeds = setup_graph(world_size)
    graph = dataset.graph
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
        net = make_net(kind, dataset)
        ref_logits = net(ref_blocks, graph.x[ref_blocks[0].src_ids])
        y = dataset.targets.target[seeds]
        loss = F.cross_entropy(ref_logits, y, reduction="sum") / seeds.numel()
        loss.backward()
        ref_grad = torch.cat([p.grad.flatten() for p in net.parameters()])
        row = {int(s): i for i, s in enumerate(seeds)}
        for r in results:
            targets, logits, got_loss, grad = r[kind]
            rows = torch.tensor([row[int(t)] for t in targets], dtype=torch.long)
            torch.testing.assert_close(logits, ref_logits.detach()[rows], rtol=0, atol=1e-12)
            torch.testing.assert_close(got_loss, loss.detach(), rtol=0, atol=1e-12)
            torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-12)

    # Bytes (summed over ranks, self chunk excluded) equal the per-layer remote-row formula:
    # layer 0 moves input features (`feature`, no backward: inputs need no gradient), layer 1
    # hidden rows (`activation` forward, `activation_grad` backward); sampling sends the same
    # remote vertices' ids (int64) to their owners (`structure`).
    remote = remote_rows_by_layer(ref_blocks, parts)
    item = graph.x.element_size()
    expected = {
        "feature": remote[0] * graph.num_features * item,
        "activation": remote[1] * 12 * item,  # hidden width (GAT: 3 heads x 4, flattened)
        "activation_grad": remote[1] * 12 * item,
    }
    for kind in KINDS:
        got = {c: sum(r["bytes"][kind][c] for r in results) for c in expected}
        assert got == expected, kind
    assert sum(r["bytes"]["sampling"]["structure"] for r in results) == sum(remote) * 8
    if world_size > 1:
        assert remote[0] > 0 and remote[1] > 0  # the comparison is not 0 == 0


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


def recomputed_epoch(graph, train_ids, parts, input_frequency, cfg, epoch, world_size):
    """What GSplit's statistics and the meter should report for one training epoch, derived by
    brute force from the global mini-batches (``single``'s sampler and order over the training
    seeds ``train_ids``) and the split function: per-step edges per rank, cross-split edges,
    inputs, cache hits, remote rows."""
    batch = int(cfg.data.batch_size)
    order = epoch_permutation(train_ids, int(cfg.seed), epoch)
    sampler = NeighborSampler(graph.indptr, graph.indices, list(cfg.data.fanouts), int(cfg.seed))
    owner, freq = parts.tolist(), input_frequency.tolist()
    cached = set()
    for rank in range(world_size):  # each rank's cache: its most frequent own inputs
        own = sorted((v for v in range(len(owner)) if owner[v] == rank), key=lambda v: -freq[v])
        cached.update(own[: round(float(cfg.strategy.cache.fraction) * len(own))])
    steps = []
    for step in range(-(-train_ids.numel() // batch)):
        blocks = sampler.sample(order[step * batch : (step + 1) * batch], epoch, step)
        edges, cross = [0] * world_size, 0
        for block in blocks:
            for s, d in block.src_ids[block.edge_index].t().tolist():
                edges[owner[d]] += 1
                cross += owner[s] != owner[d]
        inputs = blocks[0].src_ids.tolist()
        steps.append(
            {
                "edges": edges,
                "cross": cross,
                "inputs": len(inputs),
                "hits": sum(v in cached for v in inputs),
                "remote": remote_rows_by_layer(blocks, parts),
            }
        )
    return steps


def gsplit_artifact(cache_dir):
    """The one partition artifact a fresh run wrote (read from disk, not rebuilt)."""
    from lightning_gnnscale.graph.cache import read_verified

    (path,) = Path(cache_dir).glob("gsplit-partition-*.pt")
    return read_verified(path)


@pytest.mark.e2e
def test_gsplit_trains_end_to_end_with_a_clean_audit(tmp_path):
    """Through the Trainer: the meter's bytes and every logged statistic equal values
    recomputed by brute force from the global mini-batches and the split function."""
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg

    probe_steps = 2
    cfg = make_cfg(
        tmp_path,
        "strategy=gsplit",
        "model=sage",
        f"strategy.redundancy_probe_steps={probe_steps}",
        "audit=true",
        "strategy.partition.presample_epochs=2",
    )
    metrics, objects = train(cfg)
    assert metrics["strategy"] == "gsplit" and metrics["audited_collectives"] > 0
    per_epoch = metrics["comm_bytes_per_epoch"]
    assert per_epoch["activation"] > 0 and per_epoch["activation_grad"] > 0
    assert per_epoch["structure"] > 0 and per_epoch["gradient"] > 0

    graph, world = objects["graph"], int(cfg.trainer.devices)
    train_ids = objects["targets"].train.nonzero().flatten()
    artifact = gsplit_artifact(cfg.paths.cache_dir)
    parts = artifact["parts"]
    item, widths = graph.x.element_size(), [graph.num_features, int(cfg.model.hidden)]
    for row in metrics["history"]:
        steps = recomputed_epoch(
            graph, train_ids, parts, artifact["k0_v"], cfg, row["epoch"], world
        )
        remote = [sum(s["remote"][layer] for s in steps) for layer in range(2)]
        assert remote[0] > 0 and remote[1] > 0
        # layer 0 moves input rows (`feature`), layer 1 hidden rows; inputs have no gradient
        assert row["comm_bytes"]["feature"] == remote[0] * widths[0] * item
        assert row["comm_bytes"]["activation"] == remote[1] * widths[1] * item
        assert row["comm_bytes"]["activation_grad"] == remote[1] * widths[1] * item

    system = metrics["system"]  # GSplitStats keeps the last epoch
    n = len(steps)
    imbalance = sum(max(s["edges"]) / (sum(s["edges"]) / world) for s in steps) / n
    assert system["load_imbalance"] == pytest.approx(imbalance, rel=1e-12)
    total_edges = sum(sum(s["edges"]) for s in steps)
    assert system["cross_edge_share"] == pytest.approx(
        sum(s["cross"] for s in steps) / total_edges, rel=1e-12
    )
    assert system["input_rows_per_step"] == pytest.approx(sum(s["inputs"] for s in steps) / n)
    assert system["cache_hit_rate"] == pytest.approx(
        sum(s["hits"] for s in steps) / sum(s["inputs"] for s in steps), rel=1e-12
    )
    for layer in range(2):
        rows = sum(s["remote"][layer] for s in steps) / n
        assert system["rows_shuffled_per_step_by_layer"][layer] == pytest.approx(rows)
        assert system["bytes_shuffled_per_step_by_layer"][layer] == pytest.approx(
            rows * widths[layer] * item
        )

    # Redundancy probe: rank-salted data-parallel micro-batches of the first steps of epoch 0.
    sampler = NeighborSampler(graph.indptr, graph.indices, list(cfg.data.fanouts), cfg.seed)
    order, batch = epoch_permutation(train_ids, cfg.seed, 0), int(cfg.data.batch_size)
    dp_rows = split_rows = 0
    for step in range(probe_steps):
        seeds = order[step * batch : (step + 1) * batch]
        split_rows += sampler.sample(seeds, 0, step)[0].num_src
        for rank, part in enumerate(torch.tensor_split(seeds, world)):
            dp_rows += sampler.sample(part, 0, step, salt=rank)[0].num_src
    assert system["dp_over_split_input_rows"] == pytest.approx(dp_rows / split_rows, rel=1e-12)
    assert dp_rows > split_rows  # the probe's ratio is not trivially 1
    # the partitioner's prediction is reported next to the measured share
    assert system["predicted_cross_edge_share"] == artifact["expected_cross_fraction"]


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
    from lightning_gnnscale.errors import ConfigError
    from lightning_gnnscale.preflight import validate
    from tests.helpers.config import make_cfg

    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(tmp_path, "strategy=gsplit", override))


def test_shuffle_bytes_by_layer_match_the_meter(tmp_path):
    """The per-layer forward bytes the stats report equal the meter's: layer 0 under
    ``feature`` (input rows), the later layers under ``activation``."""
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
    assert per_layer[0] * graph_steps == pytest.approx(steps["feature"])
    assert sum(per_layer[1:]) * graph_steps == pytest.approx(steps["activation"])
    assert steps["feature"] > 0 and steps["activation"] > 0


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("strategy.cache_fraction=0.5", "cache_fraction"),  # unknown key
        ("strategy.partition.presample_epoch=3", "presample_epoch"),  # unknown nested key
        ("strategy.redundancy_probe_steps=many", "redundancy_probe_steps"),  # wrong type
        ("strategy.partition.presample_epochs=2.5", "presample_epochs"),
        ("strategy.cache.fraction=high", "fraction"),
    ],
)
def test_gsplit_settings_fail_at_compose_time(tmp_path, override, key):
    from hydra.errors import ConfigCompositionException

    from tests.helpers.config import make_cfg

    with pytest.raises(ConfigCompositionException, match=key):
        make_cfg(tmp_path, "strategy=gsplit", override)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("strategy.partition.presample_epochs=0", "strategy.partition.presample_epochs=0 must"),
        ("strategy.partition.ufactor=0", "strategy.partition.ufactor=0 must"),
        (
            "strategy.partition.zero_edge_policy=never",
            "strategy.partition.zero_edge_policy='never'",
        ),
        ("strategy.partition.method=spectral", "strategy.partition.method='spectral'"),
        ("strategy.cache.policy=lru", "strategy.cache.policy='lru'"),
        ("strategy.cache.fraction=-0.1", "strategy.cache.fraction=-0.1 must"),
        ("strategy.redundancy_probe_steps=-1", "strategy.redundancy_probe_steps=-1 must"),
        ("data.num_workers=2", "data.num_workers=2; set data.num_workers=0"),
    ],
)
def test_gsplit_bad_values_name_their_key(tmp_path, override, message):
    from lightning_gnnscale.errors import ConfigError
    from lightning_gnnscale.preflight import validate
    from tests.helpers.config import make_cfg

    cfg = make_cfg(tmp_path, "strategy=gsplit", override)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        validate(cfg)


def test_layer_traffic_is_shared_by_rebuilt_batches():
    """The hook writes the traffic into the batch DDP's forward sees, which may be a field-by-
    field rebuild of the batch the callbacks receive: both must hold the one traffic object."""
    from lightning_utilities import apply_to_collection

    from lightning_gnnscale.systems.gsplit import LayerTraffic, SplitBatch

    batch = SplitBatch([], torch.zeros(3, 2), torch.zeros(3), 3, plans=[], traffic=LayerTraffic(2))
    rebuilt = apply_to_collection(batch, torch.Tensor, lambda t: t.clone())
    assert rebuilt is not batch and rebuilt.x is not batch.x  # really rebuilt
    rebuilt.traffic.record(1, rows=5, row_bytes=8)
    assert (batch.traffic.rows, batch.traffic.bytes) == ([0, 5], [0, 40])
    moved = batch.to("cpu")
    moved.traffic.record(0, rows=2, row_bytes=4)
    assert batch.traffic.rows == [2, 5]


def test_redundancy_probe_sums_travel_in_checkpoints():
    """A run resumed after the probed steps (it probes epoch 0 only) still reports them."""
    from lightning_gnnscale.systems.gsplit import RedundancyProbe

    def unused(*args):
        raise AssertionError("a resumed probe samples nothing")

    probe = RedundancyProbe(2, unused, unused)
    probe.sums += torch.tensor([30.0, 44.0, 20.0, 40.0], dtype=torch.float64)
    probe.probed = 2
    resumed = RedundancyProbe(2, unused, unused)
    resumed.load_state_dict(probe.state_dict())
    assert resumed.summary_stats() == probe.summary_stats()
    assert resumed.summary_stats()["dp_over_split_input_rows"] == 1.5


def _plain_lightning_rank(rank, world_size, dataset, strategy, cache_dir):
    """One rank of the documented plain-Lightning script: no train(), no report callbacks,
    the strategy created by name, nothing prepared before the ranks start."""
    import os

    import lightning as L

    from lightning_gnnscale import GNNModule
    from lightning_gnnscale.config_types import DataConfig, ModelConfig
    from lightning_gnnscale.systems.gsplit import (
        GSplitConfig,
        GSplitDataModule,
        GSplitPartitionConfig,
    )
    from lightning_gnnscale.systems.single import SingleDataModule

    os.environ.update(
        LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1"
    )
    data = DataConfig(batch_size=40, fanouts=FANOUTS)
    if strategy == "gsplit":
        config = GSplitConfig(partition=GSplitPartitionConfig(presample_epochs=1))
        dm = GSplitDataModule(dataset, config, data, seed=5, cache_dir=cache_dir)
    else:
        dm = SingleDataModule(dataset, data=data, seed=5, cache_dir=cache_dir)
    torch.manual_seed(0)
    net = dm.build_model(ModelConfig(name="gat", hidden=12, heads=3, dropout=0.0))
    module = GNNModule(net.double())
    initial = {k: v.detach().clone() for k, v in module.net.state_dict().items()}
    trainer = L.Trainer(
        strategy=strategy,
        devices=world_size,
        accelerator="cpu",
        use_distributed_sampler=False,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=dm)
    state = {k: v.detach().clone() for k, v in module.net.state_dict().items()}
    return initial, state, float(trainer.callback_metrics["val/acc"])


@pytest.mark.dist
def test_plain_lightning_script_equals_single(tmp_path):
    """``L.Trainer(strategy="gsplit")`` with a ``GSplitDataModule`` and no report callbacks:
    each rank prepares (one builds the partition, the other loads it from the cache) and the
    2-rank run trains the same weights as ``single`` (float64, GAT, no dropout)."""
    dataset, _, _ = setup_graph(2)
    split = run_distributed(
        _plain_lightning_rank, 2, dataset, "gsplit", tmp_path / "cache", timeout_s=240
    )
    ((initial, ref, ref_acc),) = run_distributed(
        _plain_lightning_rank, 1, dataset, "single", tmp_path / "cache", timeout_s=240
    )
    assert len(list((tmp_path / "cache").glob("gsplit-partition-*.pt"))) == 1
    assert any(not torch.equal(ref[name], initial[name]) for name in ref)  # it trained
    for _, state, acc in split:
        assert state.keys() == ref.keys()
        for name in ref:
            torch.testing.assert_close(state[name], ref[name], rtol=0, atol=1e-9)
        assert acc == pytest.approx(ref_acc, abs=1e-12)


def test_owner_order_builder_equals_a_sort_by_owner():
    """GSplit's in-memory builder gives the non-destination sources in (owner, id) order (a
    relabelled rank's order) with no sort: equal to the id-ordered block sorted by owner."""
    from lightning_gnnscale.graph.book import sort_sources
    from lightning_gnnscale.graph.sampler import BlockBuilder, SampleKey, sample_neighbors
    from lightning_gnnscale.systems.gsplit.sampler import OwnerOrderBuilder

    dataset, parts, seeds = setup_graph(3)
    graph = dataset.graph
    degree = graph.indptr[1:] - graph.indptr[:-1]
    plain, ordered = BlockBuilder(graph.num_nodes, degree), OwnerOrderBuilder(parts, degree)
    frontier = torch.sort(seeds).values
    for hop in range(3):
        src, dst_pos = sample_neighbors(
            graph.indptr, graph.indices, frontier, 5, SampleKey(1, 0, 0).hop_key(hop)
        )
        want = sort_sources(
            plain(frontier, src, dst_pos), parts[plain(frontier, src, dst_pos).src_ids]
        )
        got = ordered(frontier, src, dst_pos)
        assert torch.equal(got.src_ids, want.src_ids)
        assert torch.equal(got.edge_index, want.edge_index)
        assert torch.equal(got.src_deg, want.src_deg)
        assert not torch.equal(got.src_ids, plain(frontier, src, dst_pos).src_ids)  # not id order
        frontier = got.src_ids


def _disagreeing_part_counts(rank: int, world_size: int) -> None:
    comm = Comm.create(CommMeter(), Topology(world_size, 1), timeout_s=20)
    # rank 1 holds a split function of more parts than ranks: it must not raise alone
    num_parts = world_size + rank
    part = SimpleNamespace(num_parts=num_parts, split_table=torch.arange(6) % num_parts)
    context = SimpleNamespace(rank=rank, world_size=world_size, comm=comm)
    GSplitDataModule.setup_rank(object.__new__(GSplitDataModule), context, part)


@pytest.mark.dist
def test_ranks_disagreeing_on_the_split_function_all_fail_in_the_agreement_check():
    """Every rank reaches the agreement collective before any check of its own part: one
    rank raising first would leave the others waiting in it."""
    with pytest.raises(RuntimeError, match="split function differs between ranks"):
        run_distributed(_disagreeing_part_counts, 2, timeout_s=40)
