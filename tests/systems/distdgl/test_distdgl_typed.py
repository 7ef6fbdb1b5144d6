"""DistDGL on typed graphs (docs/systems/distdgl.md, "Typed graphs"): the owners' per-relation
samples equal one process's on the relabelled graph, relation for relation, at no extra bytes;
RGCN steps and layer-wise evaluation equal `single`'s in float64; partition directories carry
and check the relations."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.graph.book import PartitionBook, build_local_partition, relabel_graph
from lightning_gnnscale.graph.generators import typed_sbm
from lightning_gnnscale.graph.node_targets import NodeDataset
from lightning_gnnscale.graph.partition import partition
from lightning_gnnscale.graph.partition_dir import PartitionDirError
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.inference import layerwise_inference
from lightning_gnnscale.systems.distdgl import DistDGLConfig, PartitionConfig, PartitionedGraph
from lightning_gnnscale.systems.distdgl.datamodule import DistDGLDataModule, check_part_relations
from lightning_gnnscale.systems.distdgl.sampler import DistNeighborSampler
from tests.helpers.dist import run_distributed

R = 3
# per hop, every relation's fanout: sampled, full, and mixed per relation
RELATION_FANOUTS = ([(4, 1, 2), (2, 3, 1)], [(-1, -1, -1), (-1, -1, -1)], [(3, -1, 1), (1, 1, 5)])
FANOUTS = [4, 3]
PER_RELATION = {"rel_1": [2, -1]}  # rel_0 and rel_2 keep FANOUTS


def typed_partitioned(world_size, empty_part=False, num_nodes=240):
    """A typed SBM relabelled over a random partition (float64), as ``preprocess`` gives it."""
    dataset = typed_sbm(
        num_nodes=num_nodes, num_relations=R, avg_degree=5.0, num_features=6, seed=2
    )
    parts = partition(dataset.graph, "random", world_size, seed=1)
    if empty_part:  # the last rank owns nothing: its collectives must still run
        parts = torch.where(parts == world_size - 1, 0, parts)
    book = PartitionBook.from_parts(parts, world_size)
    relabelled = relabel_graph(dataset.graph, book).to(torch.float64)
    return PartitionedGraph(relabelled, dataset.targets.rows(book.new2old), book, {})


def reference_sampler(graph, relation_fanouts, seed):
    fanouts = [hop[0] for hop in relation_fanouts]
    return NeighborSampler(
        graph.indptr,
        graph.indices,
        fanouts,
        seed,
        edge_type=graph.edge_type,
        relation_fanouts=relation_fanouts,
        num_relations=R,
    )


def _sample_rank(rank, world_size, empty_part):
    data = typed_partitioned(world_size, empty_part)
    graph, book = data.graph, data.book
    local = build_local_partition(graph, data.targets, book, rank)
    comm = Comm.create()
    out = []
    for relation_fanouts in RELATION_FANOUTS:
        fanouts = [hop[0] for hop in relation_fanouts]
        sampler = DistNeighborSampler(
            comm, book, local, graph.in_degree(), fanouts, 9, relation_fanouts
        )
        for step in range(3):
            gen = torch.Generator().manual_seed(100 * step + rank)
            seeds = torch.randperm(graph.num_nodes, generator=gen)[: 5 + 7 * rank]
            if empty_part and rank == world_size - 1 and step == 0:
                seeds = seeds[:0]  # a rank with no seeds at all
            before = comm.meter.snapshot()
            blocks = sampler.sample(seeds, epoch=2, step=step)
            sent = comm.meter.delta(before)["bytes"]
            out.append((relation_fanouts, step, seeds, blocks, sent))
    return out


@pytest.mark.dist
@pytest.mark.parametrize(("world_size", "empty_part"), [(2, False), (3, True)])
def test_owners_sample_each_relation_as_one_process_does_at_no_extra_bytes(world_size, empty_part):
    """Every block (nodes, edges, degrees and relations, in order) equals the typed
    ``NeighborSampler``'s on the relabelled graph; the ``structure`` bytes a rank sends per
    step are an independent count of a homogeneous answer's (8 B a request, 8 B a count, 8 B a
    sampled source per remote frontier node): the relation adds none."""
    data = typed_partitioned(world_size, empty_part)
    graph, book = data.graph, data.book
    results = run_distributed(_sample_rank, world_size, empty_part, timeout_s=150)
    typed_edges = 0
    for rank, per_rank in enumerate(results):
        for relation_fanouts, step, seeds, blocks, sent in per_rank:
            ref = reference_sampler(graph, relation_fanouts, 9).sample(seeds, epoch=2, step=step)
            assert len(blocks) == len(ref)
            for got, want in zip(blocks, ref):
                assert torch.equal(got.src_ids, want.src_ids)
                assert torch.equal(got.edge_index, want.edge_index)
                assert torch.equal(got.src_deg, want.src_deg)
                assert torch.equal(got.edge_type, want.edge_type)
                typed_edges += int((want.edge_type > 0).sum())
            # what this rank sends: its requests for remote frontier nodes, and the answers
            # (count + sources) to the remote ranks' requests of its own nodes
            expected = 0
            for other, others in enumerate(results):
                theirs = [o for o in others if o[0] == relation_fanouts and o[1] == step][0]
                for block in theirs[3]:  # equal to their reference blocks (checked)
                    dst = block.src_ids[: block.num_dst]
                    sampled = torch.bincount(block.edge_index[1], minlength=block.num_dst)
                    owner = book.nid2part(dst)
                    if other == rank:  # requests sent
                        expected += 8 * int((owner != rank).sum())
                    else:  # answers served: a count and the sources of each request
                        mine = owner == rank
                        expected += 8 * int(mine.sum()) + 8 * int(sampled[mine].sum())
            assert sent["structure"] == expected, (rank, relation_fanouts, step)
            assert sent["feature"] == 0
    assert typed_edges > 0  # relations other than 0 were sampled


def typed_datamodule(data, rank, world_size, comm, batch_size=64):
    """The real DistDGLDataModule on this rank's typed part (no Trainer), RGCN-ready."""
    config = DistDGLConfig(partition=PartitionConfig(method="random"))
    dm = DistDGLDataModule(
        NodeDataset(data.graph, data.targets),
        config,
        DataConfig(batch_size=batch_size, fanouts=FANOUTS, fanouts_per_relation=PER_RELATION),
        seed=3,
    )
    dm.setup_rank(RankContext(comm, torch.device("cpu")), dm.part_of(data, rank))
    return dm


BASES = (0, 2)  # a full weight per relation, and a basis decomposition


def make_rgcn(data, num_bases):
    torch.manual_seed(0)
    width, classes = data.graph.num_features, data.targets.out_dim
    net = BlockGNN(
        "rgcn", width, 8, classes, num_layers=2, dropout=0.0, num_relations=R, num_bases=num_bases
    )
    return net.double()


def _train_rank(rank, world_size):
    data = typed_partitioned(world_size)
    comm = Comm.create()
    dm = typed_datamodule(data, rank, world_size, comm)
    out = {"relation_fanouts": dm.relation_fanouts}
    for bases in BASES:
        net = make_rgcn(data, bases)
        for step in range(dm.steps_per_epoch):
            batch = dm.make_batch(1, step)
            net.zero_grad()
            loss = F.cross_entropy(net(batch.blocks, batch.x), batch.y, reduction="sum")
            (loss / batch.global_seed_count).backward()
            grad = torch.cat([p.grad.flatten() for p in net.parameters()])
            comm.all_reduce(grad, category="gradient")
            out[bases, step] = (batch.blocks[-1].dst_ids, loss.detach(), grad)
        for chunk in (DataConfig().eval_chunk_size, 7):
            dm.data = replace(dm.data, eval_chunk_size=chunk)
            out[bases, "eval", chunk] = dm.core_outputs(net.eval(), net.num_layers)
    out["core"] = dm.local.core_gids
    return out


@pytest.mark.dist
@pytest.mark.parametrize("world_size", [2, 3])
def test_rgcn_steps_and_evaluation_equal_single_in_float64(world_size):
    """With per-relation fanouts (``rel_1`` its own), each step's summed losses and its
    all-reduced gradient equal one process's on the union of the step's seeds, and every
    rank's layer-wise core rows equal single-process inference over the relations (to 1e-12;
    full and basis-decomposed relation weights)."""
    data = typed_partitioned(world_size)
    g, targets = data.graph, data.targets
    results = run_distributed(_train_rank, world_size, timeout_s=200)
    relation_fanouts = results[0]["relation_fanouts"]
    assert relation_fanouts == [(4, 2, 4), (3, -1, 3)]
    sampler = reference_sampler(g, relation_fanouts, 3)
    steps = sum(1 for key in results[0] if key[0] == 0 and isinstance(key[1], int))
    assert steps > 1
    for bases in BASES:
        for step in range(steps):
            seeds = torch.cat([r[bases, step][0] for r in results])
            net = make_rgcn(data, bases)
            blocks = sampler.sample(seeds, epoch=1, step=step)
            assert int((blocks[0].edge_type > 0).sum()) > 0
            out = net(blocks, g.x[blocks[0].src_ids])
            loss = F.cross_entropy(out, targets.target[seeds], reduction="sum")
            (loss / seeds.numel()).backward()
            ref = torch.cat([p.grad.flatten() for p in net.parameters()])
            total = sum(r[bases, step][1] for r in results)
            torch.testing.assert_close(total, loss.detach(), rtol=0, atol=1e-12)
            for r in results:
                torch.testing.assert_close(r[bases, step][2], ref, rtol=0, atol=1e-12)
        net = make_rgcn(data, bases).eval()
        want = layerwise_inference(net, g.indptr, g.indices, g.x, edge_type=g.edge_type)
        for r in results:
            for chunk in (DataConfig().eval_chunk_size, 7):
                got = r[bases, "eval", chunk]
                torch.testing.assert_close(got, want[r["core"]], rtol=0, atol=1e-12)


def _dm(tmp_path, partition_dir=None):
    data = DataConfig(
        batch_size=32,
        fanouts=FANOUTS,
        fanouts_per_relation=PER_RELATION,
        partition_dir=partition_dir,
    )
    config = DistDGLConfig(partition=PartitionConfig(method="random"))
    options = dict(num_nodes=150, num_relations=R, num_features=6)
    return DistDGLDataModule("typed_sbm", config, data, cache_dir=tmp_path, dataset_options=options)


def test_a_partition_directory_carries_each_parts_relations(tmp_path):
    """A typed directory records the relation and node-type names; each loaded part's
    ``edge_type`` is the in-memory part's, and the relations, the RGCN's width and the
    per-relation fanouts follow from the metadata alone."""
    in_memory = _dm(tmp_path)
    prepared = in_memory.prepare(2)
    meta = in_memory.write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)
    assert meta["relations"] == ["rel_0", "rel_1", "rel_2"]
    assert meta["node_types"] == ["type_0", "type_1"]
    from_dir = _dm(tmp_path, str(tmp_path / "parts"))
    assert from_dir.num_relations == R
    assert from_dir.relation_fanouts == in_memory.relation_fanouts == [(4, 2, 4), (3, -1, 3)]
    opened = from_dir.prepare(2)
    for k in range(2):
        want = in_memory.part_of(prepared, k).local
        got = from_dir.load_part(opened, k).local
        assert want.edge_type is not None and want.edge_type.numel() == want.num_edges
        assert torch.equal(got.edge_type, want.edge_type)
        assert torch.equal(got.indices, want.indices)


@pytest.mark.parametrize(
    ("change", "relations", "message"),
    [
        (lambda t: None, R, "is missing"),
        (lambda t: t, 0, "lists no relations"),
        (lambda t: t.to(torch.int32), R, "must be int64"),
        (lambda t: t[1:], R, "must be int64"),
        (lambda t: torch.where(t == 2, R, t), R, "outside"),
        (lambda t: t.flip(0), R, "not sorted by relation"),
    ],
)
def test_a_parts_relations_are_checked_on_load(change, relations, message):
    """A loaded part's ``edge_type`` (outside input) must agree with the metadata's relations:
    there exactly when typed, int64, one per edge, in range, sorted by relation per segment."""
    data = typed_partitioned(2)
    local = build_local_partition(data.graph, data.targets, data.book, 0)
    check_part_relations(local, R, "dir")  # the part as written passes
    bad = replace(local, edge_type=None)
    object.__setattr__(bad, "edge_type", change(local.edge_type))  # past __post_init__
    with pytest.raises(PartitionDirError, match=message):
        check_part_relations(bad, relations, "dir")


def test_metis_balanced_balances_each_node_type():
    """DistDGL's ``balance_ntypes``: on a graph whose node types sit in one block (class 0),
    the default partitioner spreads every type evenly over the parts, where the type-blind
    partition of the same graph puts nearly all of class 0's type in one part; the training
    nodes stay balanced, and the types enter the partition's cache key."""
    from lightning_gnnscale.graph.cache import graph_fingerprint
    from lightning_gnnscale.graph.generators import sbm
    from lightning_gnnscale.graph.partition import partition_report

    dataset = sbm(num_nodes=3000, num_classes=6, seed=0)
    graph, targets = dataset.graph, dataset.targets
    splits = targets.split_matrix()
    typed = replace(graph, node_type=(targets.target == 0).long(), node_types=("rest", "c0"))
    reports = {}
    for label, g in (("typed", typed), ("blind", graph)):
        parts = partition(g, "metis_balanced", 4, seed=0, splits=splits)
        reports[label] = partition_report(typed, parts, 4, splits=splits)
    assert reports["typed"]["type_balance"] < 1.1 < 2 < reports["blind"]["type_balance"]
    assert reports["typed"]["train_balance"] < 1.1
    assert "type_balance" not in partition_report(graph, parts, 4, splits=splits)
    assert graph_fingerprint(typed, targets) != graph_fingerprint(graph, targets)


@pytest.mark.e2e
def test_typed_training_with_learnable_embeddings_and_per_relation_fanouts(tmp_path):
    """``train.py`` on typed_sbm with RGCN, a relation's own fanouts and learnable node
    embeddings (the table is partitioned as for a homogeneous graph): every collective is
    metered (audit), the loss falls, and sampling, rows and embedding pushes all moved."""
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg

    cfg = make_cfg(
        tmp_path,
        "strategy=distdgl",
        "dataset=typed_sbm",
        "dataset.num_relations=3",
        "model=rgcn",
        "model.num_bases=2",
        "+data.fanouts_per_relation={rel_2: [2, 1]}",
        "strategy.embedding_dim=8",
        "trainer.max_epochs=4",
        "audit=true",
    )
    metrics, _ = train(cfg)
    history = metrics["history"]
    assert metrics["world_size"] == 2 and metrics["audited_collectives"] > 0
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    moved = history[-1]["comm_bytes"]
    assert moved["structure"] > 0 and moved["feature"] > 0 and moved["gradient"] > 0
