"""GSplit on typed graphs (docs/systems/gsplit.md#typed-graphs): split-parallel sampling per
relation draws exactly what ``single``'s typed sampler draws, edge for edge with its relation,
and RGCN's loss and gradients equal ``single``'s in float64 (replicated and partitioned
topology); a rank that holds only its part of a typed partition directory equals the in-memory
rank; pre-sampling counts each typed edge; a damaged directory's relations are refused."""

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.csc_rows import CSCRows
from lightning_gnnscale.graph.generators import typed_sbm
from lightning_gnnscale.graph.partition_dir import PartitionDir, PartitionDirError, part_folder
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.systems.gsplit import GSplitConfig, GSplitDataModule
from lightning_gnnscale.systems.gsplit.datamodule import check_node_types, typed_rows
from lightning_gnnscale.systems.gsplit.partition import presample
from lightning_gnnscale.systems.gsplit.sampler import SplitSampler, shuffle
from lightning_gnnscale.systems.gsplit.strategy import shuffle_hook
from tests.helpers.dist import run_distributed

# per hop, each of the 3 relations' fanout: distinct values, so a relation-blind draw differs
RELATION_FANOUTS = [(3, 1, 2), (2, 2, 1)]
EPOCH, STEP, SEED = 2, 1, 5


def typed_dataset():
    return typed_sbm(num_nodes=240, num_relations=3, avg_degree=4.0, num_features=6, seed=3).to(
        torch.float64
    )


def setup_typed(world_size):
    dataset = typed_dataset()
    graph = dataset.graph
    parts = torch.randint(
        0, world_size, (graph.num_nodes,), generator=torch.Generator().manual_seed(1)
    )
    seeds = dataset.targets.train.nonzero().flatten()[:40]
    return dataset, parts, seeds


# relational models: RGCN with full weights and with 2 bases, RGAT
MODELS = (("rgcn", 0), ("rgcn", 2), ("rgat", 0))


def make_relational(dataset, kind, num_bases):
    torch.manual_seed(0)
    graph = dataset.graph
    return BlockGNN(
        kind,
        graph.num_features,
        10,
        dataset.num_classes,
        2,
        dropout=0.0,
        heads=2,
        num_relations=graph.num_relations,
        num_bases=num_bases,
    ).double()


def typed_edges(blocks):
    """Per block (input layer first), its (source, destination, relation) id triples."""
    out = []
    for b in blocks:
        src, dst = b.src_ids[b.edge_index]
        out.append(set(zip(src.tolist(), dst.tolist(), b.edge_type.tolist(), strict=True)))
    return out


def _typed_split_rank(rank, world_size, topology):
    dataset, parts, seeds = setup_typed(world_size)
    graph, y = dataset.graph, dataset.targets.target
    comm = Comm.create()
    typed = (graph.edge_type, graph.num_relations)
    if topology == "partitioned":
        rows = CSCRows.owned(
            graph.indptr, graph.indices, (parts == rank).nonzero().flatten(), *typed
        )
    else:
        rows = CSCRows.whole(graph.indptr, graph.indices, *typed)
    fanouts = [max(hop) for hop in RELATION_FANOUTS]
    sampler = SplitSampler(comm, parts, rows, fanouts, SEED, relation_fanouts=RELATION_FANOUTS)
    targets = seeds[parts[seeds] == rank]
    blocks, plans, inputs = sampler.sample(targets, EPOCH, STEP)
    out = {"edges": typed_edges(blocks), "inputs": inputs}
    for model in MODELS:
        net = make_relational(dataset, *model)
        logits = net(
            blocks, graph.x[inputs], layer_hook=lambda i, h: shuffle(h, plans[i], comm, layer=i)
        )
        loss = F.cross_entropy(logits, y[blocks[-1].dst_ids], reduction="sum")
        (loss / seeds.numel()).backward()
        grad = torch.cat([p.grad.flatten() for p in net.parameters()])
        comm.all_reduce(grad, category="gradient")
        total = comm.all_reduce(loss.detach().clone(), category="control")
        out[model] = (blocks[-1].dst_ids, logits.detach(), total / seeds.numel(), grad)
    return out


@pytest.mark.dist
@pytest.mark.parametrize(("world_size", "topology"), [(2, "replicated"), (3, "partitioned")])
def test_typed_split_parallel_equals_single(world_size, topology):
    """float64, RGCN (full weights and 2 bases) and RGAT, per-relation fanouts: the ranks' blocks
    together hold exactly ``single``'s typed sample (every edge with its relation), each input
    is loaded once by its owner, and logits, loss and gradients equal ``single``'s."""
    dataset, parts, seeds = setup_typed(world_size)
    graph = dataset.graph
    ref = NeighborSampler(
        graph.indptr,
        graph.indices,
        [max(hop) for hop in RELATION_FANOUTS],
        seed=SEED,
        edge_type=graph.edge_type,
        relation_fanouts=RELATION_FANOUTS,
        num_relations=graph.num_relations,
    ).sample(seeds, EPOCH, STEP)
    results = run_distributed(_typed_split_rank, world_size, topology, timeout_s=150)
    want = typed_edges(ref)
    for layer in range(len(ref)):
        got = [e for r in results for e in r["edges"][layer]]
        assert len(got) == len(set(got))  # no edge is sampled on two ranks
        assert set(got) == want[layer]
    assert {t[2] for t in want[-1]} == set(range(graph.num_relations))  # every relation drawn
    inputs = torch.cat([r["inputs"] for r in results])
    assert torch.equal(inputs.sort().values, ref[0].src_ids.sort().values)
    for rank, r in enumerate(results):
        assert bool((parts[r["inputs"]] == rank).all())
    y = dataset.targets.target[seeds]
    row = {int(s): i for i, s in enumerate(seeds)}
    for model in MODELS:
        net = make_relational(dataset, *model)
        ref_logits = net(ref, graph.x[ref[0].src_ids])
        loss = F.cross_entropy(ref_logits, y, reduction="sum") / seeds.numel()
        loss.backward()
        ref_grad = torch.cat([p.grad.flatten() for p in net.parameters()])
        for r in results:
            dst, logits, total, grad = r[model]
            at = torch.tensor([row[int(v)] for v in dst], dtype=torch.int64)
            torch.testing.assert_close(logits, ref_logits.detach()[at], rtol=0, atol=1e-10)
            torch.testing.assert_close(total, loss.detach(), rtol=0, atol=1e-12)
            torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-10)


# ------------------------------------------------------ DataModules: memory and a directory
TYPED_OPTIONS = {"num_nodes": 300, "num_relations": 3, "avg_degree": 4.0, "num_features": 6}


def make_dm(cache_dir, partition_dir=None, topology="replicated", probe=0):
    data = DataConfig(
        batch_size=48,
        fanouts=[3, 2],
        fanouts_per_relation={"rel_1": [1, 2], "rel_2": [2, 1]},
        partition_dir=partition_dir,
    )
    return GSplitDataModule(
        "typed-sbm",
        GSplitConfig(topology=topology, redundancy_probe_steps=probe),
        data,
        seed=3,
        cache_dir=cache_dir,
        dtype=torch.float64,
        dataset_options=TYPED_OPTIONS,
    )


def _typed_steps(dm, comm, probe):
    """Per step of epoch 1: blocks (with relations), inputs, labels, RGCN's loss and gradient;
    then evaluation counts, every node's logits and (``probe``) the redundancy probe's
    whole-batch sample."""
    torch.manual_seed(0)
    net = BlockGNN(
        "rgcn", dm.input_dim, 8, dm.out_dim, 2, dropout=0.0, num_relations=dm.num_relations
    ).double()
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
        blocks = [(b.src_ids, b.edge_index, b.edge_type) for b in batch.blocks]
        out.append((blocks, batch.x, batch.y, loss.detach(), grad))
    net.eval()
    counts = comm.all_reduce(dm.eval_statistics(net, ("train", "val", "test")), category="control")
    ids, rows = dm.predict_rows(net, None, "logits")
    probed = None
    if probe:
        blocks = dm.whole_batch_sampler().sample(dm.step_seeds(0, 0), 0, 0)
        probed = [(b.src_ids, b.edge_index, b.edge_type) for b in blocks]
    return out, counts, (ids, rows), probed


def _typed_dir_rank(rank, world_size, tmp_path, topology):
    comm = Comm.create()
    context = RankContext(comm, torch.device("cpu"))
    probe = int(topology == "replicated")

    def set_up(dm):
        dm.setup_rank(context, dm.rank_part(context))
        dm.context = context
        return dm

    in_memory = set_up(make_dm(tmp_path / "cache", topology=topology, probe=probe))
    assert in_memory.sampler.topology.edge_type is not None
    want = _typed_steps(in_memory, comm, probe)
    mine = tmp_path / f"rank{rank}"  # this rank's own copy, the other parts' folders removed
    shutil.copytree(tmp_path / "parts", mine)
    for k in range(world_size):
        if k != rank:
            shutil.rmtree(mine / part_folder(k))
    from_dir = set_up(make_dm(tmp_path / "cache", str(mine), topology, probe))
    assert from_dir.relation_fanouts == in_memory.relation_fanouts == [(3, 1, 2), (2, 2, 1)]
    return want, _typed_steps(from_dir, comm, probe)


@pytest.mark.dist
@pytest.mark.parametrize("topology", ["replicated", "partitioned"])
def test_a_typed_directory_rank_equals_the_in_memory_rank(tmp_path, topology):
    """2 ranks, float64, RGCN, per-relation fanouts from ``data.fanouts_per_relation``: a rank
    holding only its part of a typed directory (relations in the metadata, ``edge_type`` with
    the topology) builds the in-memory rank's blocks (in relabelled ids, each edge with its
    relation), inputs and labels, and gets its loss and gradient exactly; evaluation counts
    and predictions (original ids) agree; the redundancy probe samples the same typed
    mini-batch."""
    make_dm(tmp_path / "cache", topology=topology).write_partition_dir(
        tmp_path / "parts", 2, log=lambda *_: 0
    )
    opened = PartitionDir.open(tmp_path / "parts")
    assert opened.meta["relations"] == ["rel_0", "rel_1", "rel_2"]
    assert opened.meta["node_types"] == ["type_0", "type_1"]
    new2old = torch.cat([opened.load_part(k)["orig_ids"] for k in range(2)])
    results = run_distributed(_typed_dir_rank, 2, tmp_path, topology, timeout_s=200)
    for want, got in results:
        assert len(want[0]) == len(got[0]) > 0
        for w, g in zip(want[0], got[0], strict=True):
            for (w_ids, w_edges, w_types), (g_ids, g_edges, g_types) in zip(
                w[0], g[0], strict=True
            ):
                assert torch.equal(w_ids, new2old[g_ids])
                assert torch.equal(w_edges, g_edges) and torch.equal(w_types, g_types)
                assert w_types.unique().numel() == 3
            for a, b in zip(w[1:], g[1:], strict=True):
                assert torch.equal(a, b)
        assert torch.equal(want[1], got[1])
        if want[3] is not None:  # the same typed sample (sources in another order)
            for w, g in zip(want[3], got[3], strict=True):
                assert triples(*w) == triples(new2old[g[0]], *g[1:])
    want_ids, want_rows = gathered([want[2] for want, _ in results])
    got_ids, got_rows = gathered([got[2] for _, got in results])
    assert torch.equal(want_ids, got_ids) and torch.equal(want_ids, torch.arange(300))
    torch.testing.assert_close(got_rows, want_rows, rtol=0, atol=1e-12)


def triples(src_ids, edge_index, edge_type):
    src, dst = src_ids[edge_index]
    return set(zip(src.tolist(), dst.tolist(), edge_type.tolist(), strict=True))


def gathered(predictions):
    ids = torch.cat([p[0] for p in predictions])
    rows = torch.cat([p[1] for p in predictions])
    order = torch.argsort(ids)
    return ids[order], rows[order]


# ------------------------------------------------------------------------ pre-sampling
def test_typed_presample_counts_every_typed_edge_as_brute_force_does():
    """A pair under two relations is two edges: pre-sampling (per-relation fanouts) counts
    each typed edge where the typed sampler drew it, as a loop over the same blocks does."""
    edge_index = torch.tensor([[1, 1, 2, 3, 0, 4, 4, 2, 3, 5], [0, 0, 0, 0, 1, 1, 1, 3, 4, 2]])
    kinds = torch.tensor([0, 1, 0, 1, 1, 0, 1, 0, 1, 0])
    graph = Graph.from_edge_index(
        edge_index, 6, edge_type=kinds, x=torch.zeros(6, 1), relations=("a", "b")
    )
    train = torch.tensor([0, 1, 3, 4])
    fanouts = [(1, 1), (2, 1)]
    counts = presample(graph, train, [2, 2], 2, 3, seed=9, relation_fanouts=fanouts)
    src_all, dst_all = graph.edge_index()
    edge_id = {
        (int(s), int(d), int(r)): e
        for e, (s, d, r) in enumerate(zip(src_all, dst_all, graph.edge_type, strict=True))
    }
    sampler = NeighborSampler(
        graph.indptr, graph.indices, [2, 2], 9, graph.edge_type, fanouts, num_relations=2
    )
    from lightning_gnnscale.graph.order import epoch_permutation

    k_e = torch.zeros(graph.num_edges, dtype=torch.int64)
    for epoch in range(3):
        order = epoch_permutation(train, 9, epoch)
        for step in range(2):
            for triples in typed_edges(sampler.sample(order[2 * step : 2 * step + 2], epoch, step)):
                for t in triples:
                    k_e[edge_id[t]] += 1
    assert torch.equal(counts.k_e, k_e)
    assert int(k_e[edge_id[(1, 0, 0)]]) > 0 and int(k_e[edge_id[(1, 0, 1)]]) > 0


# ------------------------------------------------------------ damaged directory relations
def _opened(meta):
    return SimpleNamespace(path=Path("/parts"), meta=meta)


@pytest.mark.parametrize(
    ("edge_type", "relations", "message"),
    [
        (None, ["a", "b"], "names relations \\['a', 'b'\\] but there is no"),
        (torch.tensor([0, 1, 0]), [], "names relations \\[\\] but there is an"),
        (torch.tensor([0, 2, 0]), ["a", "b"], "holds relations outside \\[0, 2\\)"),
        (torch.tensor([1, 0, 0]), ["a", "b"], "segment's relations are not sorted"),
        (torch.tensor([0, 1]), ["a", "b"], "must be int64 \\[3\\]"),
        (torch.tensor([0, 1, 0], dtype=torch.int32), ["a", "b"], "must be int64 \\[3\\]"),
    ],
)
def test_a_damaged_directory_s_relations_are_refused(edge_type, relations, message):
    """``edge_type`` must come exactly with the metadata's ``relations``, be int64 with one
    value per entry, in ``[0, R)``, each segment sorted by relation."""
    indptr = torch.tensor([0, 2, 3])  # segments [0, 1] and [2]
    arrays = {} if edge_type is None else {"edge_type": edge_type}
    with pytest.raises(PartitionDirError, match=message):
        typed_rows(_opened({"relations": relations}), arrays, indptr, relations, "part-0")
    fine = {"edge_type": torch.tensor([0, 1, 1])}
    assert typed_rows(_opened({}), fine, indptr, ["a", "b"], "part-0")["num_relations"] == 2


@pytest.mark.parametrize(
    ("node_type", "names", "message"),
    [
        (None, ["t"], "names node types \\['t'\\] but there is no"),
        (torch.tensor([0, 1]), ["t"], "in \\[0, 1\\)"),
    ],
)
def test_a_damaged_directory_s_node_types_are_refused(node_type, names, message):
    arrays = {} if node_type is None else {"node_type": node_type}
    with pytest.raises(PartitionDirError, match=message):
        check_node_types(_opened({"node_types": names}), arrays, "part-0")
    check_node_types(_opened({"node_types": ["t", "u"]}), {"node_type": torch.tensor([0, 1])}, "p")


def test_a_directory_pre_sampled_with_other_relation_fanouts_is_refused(tmp_path, monkeypatch):
    """Pre-sampling runs the typed schedule: a directory made without per-relation fanouts
    is refused for a run that gives them (and one made with them for a run without), before
    any rank starts, naming ``partition_options``."""
    from lightning_gnnscale.partition import partition
    from tests.helpers.partition_runs import NODES, launcher_without_ranks

    common = [
        f"paths.root={tmp_path}",
        "strategy=gsplit",
        "dataset=typed_sbm",
        "dataset.num_relations=3",
        "dataset.num_features=8",
        "model=rgcn",
        "data.fanouts=[3,2]",
        "data.batch_size=64",  # pre-sampling runs the training schedule: part of the partition
    ]
    per_relation = "+data.fanouts_per_relation.rel_1=[1,2]"
    _, run = launcher_without_ranks(tmp_path, monkeypatch, common)
    with pytest.raises(PartitionDirError, match="'partition_options' is .*'fanouts_per_relation'"):
        run(per_relation)
    other = tmp_path / "per_relation"
    partition([NODES, *common, per_relation], other, log=lambda *_: 0)
    assert PartitionDir.open(other).meta["partition_options"]["fanouts_per_relation"] == {
        "rel_1": [1, 2]
    }
    with pytest.raises(PartitionDirError, match="'partition_options'"):
        run(parts=other)
    with pytest.raises(AssertionError, match="a rank was started"):  # the fitting run starts
        run(per_relation, parts=other)


@pytest.mark.parametrize("names", [["a", "a"], [], "ab", [1, 2]])
def test_a_directory_s_relation_names_must_be_distinct_names(names):
    """The metadata's ``relations`` (and ``node_types``) are checked with the part's files,
    before a model is sized from them."""
    meta = {"num_nodes": 3, "num_edges": 2, "parts": [{"nodes": 3, "edges": 2}]}
    opened = SimpleNamespace(path=Path("/parts"), expect_shape=lambda *_: None)
    for key in ("relations", "node_types"):
        opened.meta = {**meta, key: names}
        with pytest.raises(PartitionDirError, match=f"metadata '{key}' .* is not a list of"):
            GSplitDataModule.check_partition_part(None, opened, 0)
    opened.meta = {**meta, "relations": ["a", "b"], "node_types": ["t"]}
    GSplitDataModule.check_partition_part(None, opened, 0)


# ------------------------------------------------ typed link prediction: damaged directories
@pytest.mark.parametrize(
    ("meta", "fine"),
    [
        ({"relations": ["a", "b"], "pair_relations": ["a", "b"]}, True),  # undirected
        ({"relations": ["a", "b", "a_inverse", "b_inverse"], "pair_relations": ["a", "b"]}, True),
        ({}, True),  # homogeneous
        ({"relations": ["a", "b"]}, False),  # no pair relations
        ({"pair_relations": ["a"]}, False),  # pair relations, no message relations
        ({"relations": ["a", "b", "a_inverse"], "pair_relations": ["a", "b"]}, False),
        ({"relations": ["b", "a"], "pair_relations": ["a", "b"]}, False),
        ({"relations": ["a"], "pair_relations": "a"}, False),
    ],
)
def test_a_typed_link_directory_s_pair_relations_must_name_its_relations(meta, fine):
    """The metadata's ``pair_relations`` (the pairs' relations, ``task.relations``) must be the
    ``relations`` messages pass over, or those followed by each one's inverse."""
    from lightning_gnnscale.systems.gsplit.datamodule import pair_relations

    if fine:
        want = (tuple(meta["pair_relations"]), tuple(meta["relations"])) if meta else None
        assert pair_relations(meta, "/parts") == want
        return
    with pytest.raises(PartitionDirError, match="'pair_relations'"):
        pair_relations(meta, "/parts")


@pytest.mark.parametrize(
    ("rel", "message"),
    [
        (None, "without their relations"),
        (torch.tensor([0, 1], dtype=torch.int32), "must be int64 \\[2\\]"),
        (torch.tensor([0, 1, 1]), "must be int64 \\[2\\]"),
        (torch.tensor([0, 3]), "outside \\[0, 3\\)"),
        (torch.tensor([-1, 0]), "outside \\[0, 3\\)"),
    ],
)
def test_a_part_s_pair_relations_are_checked(rel, message):
    """A part's pair relations (outside input) are int64, one per pair, in ``[0, R)``."""
    from lightning_gnnscale.systems.gsplit.link import check_pair_relations

    arrays = {"val_pos": torch.tensor([[0, 1], [2, 3]])}
    if rel is not None:
        arrays["val_rel"] = rel
    with pytest.raises(ValueError, match=message):
        check_pair_relations(arrays, "val", 3)
    check_pair_relations({**arrays, "val_rel": torch.tensor([0, 2])}, "val", 3)
