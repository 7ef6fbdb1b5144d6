"""Typed graphs (docs/architecture.md, "Typed graphs"): the typed CSC, per-relation sampling,
the RGCN layer against PyG's ``RGCNConv``, the ``typed_sbm`` generator, evaluation over
relations, and the rules that refuse what is not built."""

from __future__ import annotations

import re

import pytest
import torch
from torch_geometric.nn import RGCNConv

from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.block import Block
from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.generators import typed_sbm
from lightning_gnnscale.graph.sampler import NeighborSampler, sample_typed_edge_ids
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.inference import layerwise_inference
from lightning_gnnscale.models.relational import BlockRGCN
from tests.helpers.config import make_cfg


def small_typed(num_nodes=60, num_edges=400, num_relations=3, seed=0) -> Graph:
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(num_nodes, (num_edges,), generator=gen)
    dst = torch.randint(num_nodes, (num_edges,), generator=gen)
    kind = torch.randint(num_relations, (num_edges,), generator=gen)
    return Graph.from_edge_index(
        torch.stack([src, dst]),
        num_nodes,
        edge_type=kind,
        x=torch.randn(num_nodes, 5, generator=gen, dtype=torch.float64),
        relations=tuple(f"r{r}" for r in range(num_relations)),
    )


def edge_triples(graph: Graph) -> set[tuple[int, int, int]]:
    src, dst = graph.edge_index()
    return set(zip(src.tolist(), dst.tolist(), graph.edge_type.tolist(), strict=True))


# ------------------------------------------------------------------------- the typed CSC
def test_a_typed_csc_keeps_each_relation_once_per_pair_sorted_by_relation_then_source():
    src = torch.tensor([0, 0, 1, 2, 0, 2])
    dst = torch.tensor([1, 1, 1, 1, 1, 0])
    kind = torch.tensor([1, 1, 0, 1, 0, 0])  # (0->1, r1) twice: merged; (0->1, r0) kept
    g = Graph.from_edge_index(
        torch.stack([src, dst]), 3, edge_type=kind, x=torch.zeros(3, 1), relations=("a", "b")
    )
    assert edge_triples(g) == {(0, 1, 1), (2, 1, 1), (0, 1, 0), (2, 0, 0)}  # 1->1 dropped
    segment = slice(int(g.indptr[1]), int(g.indptr[2]))
    assert g.edge_type[segment].tolist() == [0, 1, 1]
    assert g.indices[segment].tolist() == [0, 0, 2]
    assert g.without_types().num_edges == 3  # 0->1, 2->1, 2->0: the two 0->1 merged


def test_an_unsorted_or_out_of_range_typed_graph_is_refused():
    g = small_typed()
    flipped = g.edge_type.clone()
    first = int(g.indptr[(g.in_degree() > 1).nonzero()[0]])
    flipped[first], flipped[first + 1] = 2, 0  # breaks (relation, source) order
    with pytest.raises(ValueError, match="sorted by \\(relation, source\\)"):
        Graph(g.indptr, g.indices, g.x, edge_type=flipped, relations=g.relations)
    with pytest.raises(ValueError, match="outside"):
        Graph(g.indptr, g.indices, g.x, edge_type=g.edge_type + 5, relations=g.relations)
    with pytest.raises(ValueError, match="come together"):
        Graph(g.indptr, g.indices, g.x, edge_type=g.edge_type)


def test_relation_indptr_gives_each_node_and_relation_its_run():
    g = small_typed()
    slots = g.relation_indptr()
    src, dst = g.edge_index()
    for v in range(g.num_nodes):
        for r in range(g.num_relations):
            run = slice(int(slots[v * 3 + r]), int(slots[v * 3 + r + 1]))
            want = sorted(src[(dst == v) & (g.edge_type == r)].tolist())
            assert g.indices[run].tolist() == want
            assert bool((g.edge_type[run] == r).all())


# --------------------------------------------------------------------- per-relation sampling
def test_each_relation_keeps_its_own_fanout_of_real_edges():
    g = small_typed(num_edges=900)
    fanouts = (2, -1, 1)
    sampler = NeighborSampler(
        g.indptr, g.indices, [2], seed=3, edge_type=g.edge_type,
        relation_fanouts=[fanouts], num_relations=3,
    )  # fmt: skip
    seeds = torch.arange(0, 60, 2)
    (block,) = sampler.sample(seeds)
    triples = edge_triples(g)
    src = block.src_ids[block.edge_index[0]]
    dst = block.src_ids[block.edge_index[1]]
    for s, d, r in zip(src.tolist(), dst.tolist(), block.edge_type.tolist(), strict=True):
        assert (s, d, r) in triples
    got = torch.zeros(seeds.numel(), 3, dtype=torch.long)
    got.index_put_((block.edge_index[1], block.edge_type), torch.ones_like(src), accumulate=True)
    _, all_dst = g.edge_index()
    for i, v in enumerate(seeds.tolist()):
        for r, f in enumerate(fanouts):
            degree = int(((all_dst == v) & (g.edge_type == r)).sum())
            assert int(got[i, r]) == (degree if f == -1 else min(degree, f))
    key = block.edge_index[1] * 3 + block.edge_type
    assert bool((key[1:] >= key[:-1]).all())  # by destination, then relation


def test_typed_sampling_of_halves_merges_to_the_whole():
    """Keys depend on (node, relation) only, so any split of the frontier draws the same."""
    g = small_typed(num_edges=900)
    slots = g.relation_indptr()
    dst = torch.arange(60)
    whole = sample_typed_edge_ids(slots, dst, (2, 1, 3), key=99)
    halves = [
        sample_typed_edge_ids(slots, part, (2, 1, 3), key=99) for part in (dst[:25], dst[25:])
    ]
    assert torch.equal(whole[0], torch.cat([halves[0][0], halves[1][0]]))
    assert torch.equal(whole[1], torch.cat([halves[0][1], halves[1][1] + 25]))


def test_one_relation_samples_what_the_homogeneous_sampler_samples():
    g = small_typed(num_relations=1, num_edges=900)
    typed = NeighborSampler(
        g.indptr, g.indices, [3, 2], seed=5, edge_type=g.edge_type, num_relations=1
    )
    plain = NeighborSampler(g.indptr, g.indices, [3, 2], seed=5)
    for a, b in zip(typed.sample(torch.arange(10), 1, 2), plain.sample(torch.arange(10), 1, 2)):
        assert torch.equal(a.src_ids, b.src_ids) and torch.equal(a.edge_index, b.edge_index)


# ---------------------------------------------------------------------------- the layer
@pytest.mark.parametrize("num_bases", [0, 2])
def test_the_rgcn_layer_equals_pyg_rgcnconv(num_bases):
    torch.manual_seed(0)
    n_src, n_dst, num_edges, num_rel = 30, 10, 90, 3
    src = torch.randint(n_src, (num_edges,))
    dst = torch.sort(torch.randint(n_dst, (num_edges,))).values
    kind = torch.randint(num_rel, (num_edges,))
    block = Block(
        torch.arange(n_src), n_dst, torch.stack([src, dst]), torch.zeros_like(src[:n_src]), kind
    )
    layer = BlockRGCN(5, 4, num_rel, num_bases).double()
    torch.nn.init.normal_(layer.bias)
    oracle = RGCNConv(5, 4, num_rel, num_bases=num_bases or None, aggr="mean").double()
    with torch.no_grad():
        oracle.weight.copy_(layer.weight)
        if num_bases:
            oracle.comp.copy_(layer.comp)
        oracle.root.copy_(layer.root.weight.T)
        oracle.bias.copy_(layer.bias)
    x = torch.randn(n_src, 5, dtype=torch.float64)
    want = oracle((x, x[:n_dst]), block.edge_index, kind)
    torch.testing.assert_close(layer(block, x), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("heads", "concat", "num_bases"), [(1, True, 0), (3, True, 2), (2, False, 0)]
)
def test_the_rgat_layer_is_pyg_rgatconv_plus_its_self_loop_weight(heads, concat, num_bases):
    from torch_geometric.nn import RGATConv

    from lightning_gnnscale.models.relational import BlockRGAT

    torch.manual_seed(1)
    n_src, n_dst, num_edges, num_rel = 30, 10, 90, 3
    src = torch.randint(n_src, (num_edges,))
    dst = torch.sort(torch.randint(n_dst, (num_edges,))).values
    kind = torch.randint(num_rel, (num_edges,))
    block = Block(
        torch.arange(n_src), n_dst, torch.stack([src, dst]), torch.zeros_like(src[:n_src]), kind
    )
    out = 6 if concat else 2
    layer = BlockRGAT(5, out, num_rel, heads, concat, num_bases).double()
    torch.nn.init.normal_(layer.bias)
    channels = layer.channels
    oracle = RGATConv(
        5, channels, num_rel, num_bases=num_bases or None, heads=heads, concat=concat
    ).double()
    with torch.no_grad():
        if num_bases:
            oracle.basis.copy_(layer.weight)
            oracle.att.copy_(layer.comp)
        else:
            oracle.weight.copy_(layer.weight)
        oracle.q.copy_(layer.q.repeat(1, 1))
        oracle.k.copy_(layer.k)
        oracle.bias.copy_(layer.bias)
    x = torch.randn(n_src, 5, dtype=torch.float64)
    want = oracle(x, block.edge_index, kind, size=(n_src, n_src))[:n_dst] + layer.root(x[:n_dst])
    torch.testing.assert_close(layer(block, x), want, rtol=0, atol=1e-12)


def test_evaluation_over_relations_equals_the_full_fanout_forward():
    """Layer-wise inference carries each edge's relation, as a sampled block does."""
    g = small_typed(num_edges=700)
    net = BlockGNN("rgcn", 5, 8, 3, num_layers=2, dropout=0.0, num_relations=3).double().eval()
    sampler = NeighborSampler(g.indptr, g.indices, [-1, -1], edge_type=g.edge_type, num_relations=3)
    nodes = torch.arange(g.num_nodes)
    blocks = sampler.sample(nodes)
    want = net(blocks, g.x[blocks[0].src_ids])
    got = layerwise_inference(net, g.indptr, g.indices, g.x, 7, edge_type=g.edge_type)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="without edge_type"):  # never silently one relation
        layerwise_inference(net, g.indptr, g.indices, g.x, 7)


# ------------------------------------------------------------------------ the generator
def test_typed_sbm_puts_the_classes_in_one_relation_and_nowhere_else():
    data = typed_sbm(num_nodes=4000, num_classes=4, num_relations=3, homophily=0.9, seed=1)
    g, y = data.graph, data.targets.target
    src, dst = g.edge_index()
    same = y[src] == y[dst]
    assert same[g.edge_type == 0].float().mean() > 0.85
    for r in (1, 2):
        assert abs(float(same[g.edge_type == r].float().mean()) - 0.25) < 0.03
    # node types carry no label: every type's class histogram is close to uniform
    for t in range(len(g.node_types)):
        share = torch.bincount(y[g.node_type == t], minlength=4).double()
        assert float((share / share.sum() - 0.25).abs().max()) < 0.04
    again = typed_sbm(num_nodes=4000, num_classes=4, num_relations=3, homophily=0.9, seed=1)
    assert torch.equal(again.graph.edge_type, g.edge_type) and torch.equal(again.graph.x, g.x)
    erased = typed_sbm(num_nodes=4000, num_classes=4, num_relations=3, homophily=0.9, seed=1,
                       typed=False).graph  # fmt: skip
    plain = g.without_types()
    assert not erased.is_typed and torch.equal(erased.indices, plain.indices)
    assert torch.equal(erased.indptr, plain.indptr)


# ------------------------------------------------------------------------------- rules
def _run_config(tmp_path, *settings):
    from lightning_gnnscale.config_types import run_config

    return run_config(make_cfg(tmp_path, *settings))


def test_systems_without_typed_graphs_refuse_them_naming_those_that_train_them(
    tmp_path, monkeypatch
):
    """A system whose config does not declare ``TYPED_GRAPHS`` (ddp's, with the flag taken
    away here, as every port declares it) refuses a typed dataset and a relational model
    before any rank starts, naming the names that train them."""

    from lightning_gnnscale.systems.ddp.config import DataParallelConfig
    from lightning_gnnscale.systems.registry import SYSTEMS

    monkeypatch.setattr(DataParallelConfig, "TYPED_GRAPHS", False)
    able = sorted(n for n, spec in SYSTEMS.items() if spec.config_type.TYPED_GRAPHS)
    assert "single" in able and "ddp" not in able
    listed = re.escape(str(able))
    with pytest.raises(ConfigError, match=rf"typed graph.*strategy=ddp.*{listed}"):
        _run_config(tmp_path, "strategy=ddp", "dataset=typed_sbm")
    with pytest.raises(ConfigError, match=rf"model=rgcn is relational.*{listed}"):
        _run_config(tmp_path, "strategy=ddp", "model=rgcn")
    monkeypatch.undo()
    _run_config(tmp_path, "strategy=ddp", "dataset=typed_sbm", "model=rgcn")  # accepted


def test_per_relation_fanouts_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="not a typed graph"):
        _run_config(tmp_path, "strategy=single", "+data.fanouts_per_relation={a: [1, 1]}")
    with pytest.raises(ConfigError, match="one fanout per hop"):
        _run_config(
            tmp_path,
            "strategy=single",
            "dataset=typed_sbm",
            "+data.fanouts_per_relation={rel_1: [3]}",
        )
    with pytest.raises(ConfigError, match="num_bases"):
        _run_config(tmp_path, "strategy=single", "model=gcn", "model.num_bases=2")


def test_an_unknown_relation_is_named_with_the_graph_relations():
    import lightning_gnnscale as gs

    _, DataModule, config = gs.system("single")
    data = gs.DataConfig(fanouts=[5, 5], fanouts_per_relation={"rel_9": [1, 1]})
    dm = DataModule(typed_sbm(num_nodes=200, num_relations=2), config, data)
    with pytest.raises(ConfigError, match=r"\['rel_9'\].*\['rel_0', 'rel_1'\]"):
        dm.prepare(1)


def test_per_relation_fanouts_reach_the_sampler_of_every_hop():
    import lightning_gnnscale as gs

    _, DataModule, config = gs.system("single")
    data = gs.DataConfig(fanouts=[5, 3], fanouts_per_relation={"rel_1": [-1, 1]})
    dm = DataModule(typed_sbm(num_nodes=200, num_relations=3), config, data)
    assert dm.relation_fanouts == [(5, -1, 5), (3, 1, 3)]
    assert dm.batcher().sampler.relation_fanouts == [(5, -1, 5), (3, 1, 3)]


def test_typed_link_prediction_trains_on_single_and_is_refused_where_untyped(tmp_path, monkeypatch):
    """Typed link prediction (tests/test_typed_link_prediction.py has the rest): RGCN +
    DistMult on typed_sbm through train.py; a system that does not declare it refuses it,
    naming those that do (one is made so: every registered system declares it now)."""

    from lightning_gnnscale.config_types import registered_systems, run_config
    from lightning_gnnscale.run import train
    from lightning_gnnscale.systems.sancus.config import SancusConfig

    common = ("dataset=typed_sbm", "task=link_prediction")
    metrics, _ = train(
        make_cfg(tmp_path, "strategy=single", *common, "model=rgcn", "task.decoder=distmult")
    )
    assert 0.0 < metrics["test_mrr"] <= 1.0
    monkeypatch.setattr(SancusConfig, "TYPED_LINK_PREDICTION", False)
    able = sorted(n for n, c in registered_systems().items() if c.TYPED_LINK_PREDICTION)
    assert {"ddp", "single"} <= set(able) and "sancus" not in able
    refusal = rf"link prediction on a typed graph.*{re.escape(str(able))}"
    with pytest.raises(ConfigError, match=refusal):
        run_config(make_cfg(tmp_path, "strategy=sancus", *common))


@pytest.mark.e2e
def test_rgcn_separates_what_a_type_blind_gcn_cannot(tmp_path):
    """The acceptance in small (docs/benchmarks.md has seeds 0-2 at the defaults): on one
    typed_sbm graph RGCN's test accuracy is >= 5 points above GCN's with the types erased,
    and GCN's is above chance (4 classes)."""
    from lightning_gnnscale.run import train

    common = ("strategy=single", "dataset=typed_sbm", "dataset.num_nodes=3000",
              "dataset.num_features=32", "trainer.max_epochs=10")  # fmt: skip
    rgcn, _ = train(make_cfg(tmp_path / "rgcn", *common, "model=rgcn"))
    gcn, _ = train(make_cfg(tmp_path / "gcn", *common, "model=gcn", "dataset.typed=false"))
    assert gcn["test_acc"] > 0.25 + 0.05
    assert rgcn["test_acc"] >= gcn["test_acc"] + 0.05


# ------------------------------------------------------------- shared partition machinery
def test_owned_typed_rows_sample_what_the_whole_typed_graph_samples():
    from lightning_gnnscale.graph.csc_rows import CSCRows

    g = small_typed(num_edges=900)
    ids = torch.tensor([1, 4, 7, 8, 30, 59])
    own = CSCRows.owned(g.indptr, g.indices, ids, g.edge_type, g.num_relations)
    slots = g.relation_indptr()
    eids, want_pos = sample_typed_edge_ids(slots, ids, (2, -1, 1), key=7)
    src, dst_pos, kinds = own.sample_typed(ids, (2, -1, 1), key=7)
    assert torch.equal(src, g.indices[eids]) and torch.equal(dst_pos, want_pos)
    assert torch.equal(kinds, g.edge_type[eids])
    whole = CSCRows.whole(g.indptr, g.indices, g.edge_type, g.num_relations)
    assert torch.equal(whole.sample_typed(ids, (2, -1, 1), key=7)[0], src)


def test_relabelling_a_typed_graph_keeps_every_edge_with_its_relation():
    from lightning_gnnscale.graph.book import PartitionBook, relabel_graph, relabelled_edge_ids

    g = small_typed(num_edges=500)
    parts = torch.randint(3, (g.num_nodes,), generator=torch.Generator().manual_seed(1))
    book = PartitionBook.from_parts(parts, 3)
    new = relabel_graph(g, book)
    old2new = book.old2new
    want = {(int(old2new[s]), int(old2new[d]), r) for s, d, r in edge_triples(g)}
    assert edge_triples(new) == want
    assert torch.equal(new.x, g.x[book.new2old])
    indptr, old_edge = relabelled_edge_ids(g.indptr, book)  # segment order kept
    kinds = g.edge_type[old_edge]
    src = old2new[g.indices[old_edge]]
    dst = torch.repeat_interleave(torch.arange(g.num_nodes), indptr[1:] - indptr[:-1])
    assert set(zip(src.tolist(), dst.tolist(), kinds.tolist(), strict=True)) == want


def test_a_sorted_block_carries_the_relations_a_builder_block_carries():
    from lightning_gnnscale.graph.sampler import BlockBuilder, build_block_sorted

    g = small_typed(num_edges=900)
    dst = torch.tensor([3, 9, 12])
    eids, dst_pos = sample_typed_edge_ids(g.relation_indptr(), dst, (2, 2, 2), key=1)
    src, kinds = g.indices[eids], g.edge_type[eids]
    a = BlockBuilder(g.num_nodes, g.in_degree())(dst, src, dst_pos, kinds)
    b = build_block_sorted(dst, src, dst_pos, lambda v: g.in_degree()[v], kinds)
    assert torch.equal(a.src_ids, b.src_ids) and torch.equal(a.edge_index, b.edge_index)
    assert torch.equal(a.edge_type, b.edge_type)


def test_the_cache_key_of_a_typed_graph_covers_its_relations():
    from dataclasses import replace

    from lightning_gnnscale.graph.cache import graph_fingerprint

    data = typed_sbm(num_nodes=300, num_relations=2)
    g, t = data.graph, data.targets
    key = graph_fingerprint(g, t)
    swapped = replace(g, relations=("rel_1", "rel_0"))
    assert graph_fingerprint(swapped, t) != key
    flipped = g.node_type.clone()
    flipped[0] = 1 - flipped[0]
    assert graph_fingerprint(replace(g, node_type=flipped), t) != key
    plain = typed_sbm(num_nodes=300, num_relations=2, typed=False).graph
    assert graph_fingerprint(plain, t)["digest"] != key["digest"]


# ------------------------------------------------------------------ review: no silent path
def test_too_many_bases_are_refused_before_any_rank_starts(tmp_path, monkeypatch):
    import lightning_gnnscale.run as run_module
    from lightning_gnnscale.run import train

    def no_spawn(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(run_module, "launch_local", no_spawn)
    with pytest.raises(ConfigError, match=r"num_bases=9 exceeds the graph's 4 relation"):
        train(make_cfg(tmp_path, "strategy=ddp", "dataset=typed_sbm", "model=rgcn",
                       "model.num_bases=9"))  # fmt: skip


def test_a_relational_layer_refuses_a_block_that_lost_its_relations():
    from lightning_gnnscale.models.relational import BlockRGAT

    block = Block(
        torch.arange(4), 2, torch.tensor([[2, 3], [0, 1]]), torch.zeros(4, dtype=torch.long)
    )
    x = torch.randn(4, 5)
    for layer in (BlockRGCN(5, 3, 3), BlockRGAT(5, 3, 3)):
        with pytest.raises(ValueError, match="without edge_type"):
            layer(block, x)
        assert type(layer)(5, 3, 1)(block, x).shape == (2, 3)  # one relation: homogeneous


def test_relations_beyond_the_count_given_are_refused():
    from lightning_gnnscale.graph.csc import relation_indptr

    g = small_typed()
    with pytest.raises(ValueError, match="num_relations=1"):
        relation_indptr(g.indptr, g.edge_type, 1)
    with pytest.raises(ValueError, match="num_relations=2"):
        NeighborSampler(g.indptr, g.indices, [2], edge_type=g.edge_type, num_relations=2)


def test_settings_without_effect_on_a_system_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="full graph.*fanouts_per_relation"):
        _run_config(tmp_path, "strategy=sancus", "dataset=typed_sbm", "model=rgcn",
                    "+data.fanouts_per_relation.rel_0=[3,3]")  # fmt: skip
    with pytest.raises(ConfigError, match="halo_hops=0 holds no halo"):
        _run_config(tmp_path, "strategy=grappa", "task=link_prediction",
                    "strategy.pair_sources=held", "strategy.halo_hops=0")  # fmt: skip
