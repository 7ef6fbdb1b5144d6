"""GraNNDIS on typed graphs (docs/systems/granndis.md, "Typed graphs"): on 4 gloo processes (2
servers x 2 workers) RGCN on typed_sbm in FB_base, FLX (k = L and k = 1) and CoB without
sampling equals one process's full-neighbourhood training (logits, loss, gradients; float64);
every step's blocks carry relations; FLX, FLX-EAS and CoB move 0 inter-server feature and
activation bytes; the inference shares equal whole-graph layer-wise inference with relations.
EAS and CoB-SAGE draw their fanout per (vertex, relation); a part's edge types are checked
against the relations; per-relation fanouts are refused where no fanout is used."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm, CommMeter, Topology
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.generators import typed_sbm
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.inference import layerwise_inference
from lightning_gnnscale.systems.granndis import GraNNDISConfig, GraNNDISDataModule, halo_hook
from lightning_gnnscale.systems.granndis.config import CoBConfig, EASConfig
from lightning_gnnscale.systems.granndis.expand import eas_expand, in_edge_ids, sage_expand
from tests.helpers.dist import run_distributed

WORLD, WORKERS, LAYERS, HIDDEN, R = 4, 2, 2, 8, 3
TYPED = {"num_nodes": 200, "num_relations": R, "num_classes": 3, "avg_degree": 3.0,
         "num_features": 5, "seed": 5}  # fmt: skip
VARIANTS = {
    "fb_base": GraNNDISConfig(mode="fb_base"),
    "flx": GraNNDISConfig(mode="flx"),
    "flx_k1": GraNNDISConfig(mode="flx", preload_k=1),
    "cob_none": GraNNDISConfig(mode="cob", cob=CoBConfig(num_per_epoch=2, sampler="none")),
    "flx_eas": GraNNDISConfig(mode="flx_eas", eas=EASConfig(hops=2, fanout=1)),
    "cob_sage": GraNNDISConfig(mode="cob", cob=CoBConfig(num_per_epoch=2, fanout=1)),
}
EXACT = ("fb_base", "flx", "flx_k1", "cob_none")
KINDS = ("rgat", "rgcn")  # the last one's inference shares are checked
SERVER_MODES = ("flx", "cob_none", "flx_eas", "cob_sage")  # halos inside one server only


def small_typed():
    return typed_sbm(**TYPED).to(torch.float64)


def make_net(graph, kind="rgcn"):
    torch.manual_seed(0)
    net = BlockGNN(
        kind, graph.num_features, HIDDEN, 3, LAYERS, 0.0, heads=2, num_relations=R, num_bases=2
    )
    return net.double()


def _steps(dm, comm, net):
    """Per step: the loss rows' ids, logits, loss, summed gradients, whether every block
    carries relations, the blocks' edges and the halo bytes by category and link class."""
    steps = []
    for step in range(dm.steps_per_epoch):
        batch = dm.make_batch(0, step)
        typed = all(
            b.edge_type is not None and b.edge_type.shape == (b.num_edges,) for b in batch.blocks
        )
        before = comm.meter.snapshot()
        net.zero_grad()
        logits = net(batch.blocks, batch.x, layer_hook=halo_hook(comm)(batch))
        loss = F.cross_entropy(logits, batch.y, reduction="sum") / batch.global_seed_count
        loss.backward()
        traffic = comm.meter.delta(before)  # halo exchange only (before the sync)
        grads = [comm.all_reduce(p.grad.clone(), category="gradient") for p in net.parameters()]
        steps.append(
            {
                "ids": batch.plan.final.owned[: batch.plan.final.num_loss],
                "logits": logits.detach(),
                "loss": loss.item(),
                "grads": grads,
                "typed": typed,
                "typed_edges": sum(b.num_edges for b in batch.blocks),
                "bytes": traffic["category_link_bytes"],
            }
        )
    return steps


def _rank(rank, world_size, cache_dir):
    comm = Comm.create(CommMeter(), Topology(world_size, WORKERS))
    context = RankContext(comm, torch.device("cpu"))
    data = DataConfig(batch_size=-1, fanouts=[-1] * LAYERS)
    dataset = small_typed()
    out = {}
    for label, config in VARIANTS.items():
        dm = GraNNDISDataModule(
            dataset, config, data, seed=0, cache_dir=cache_dir, topology=comm.topology
        )
        dm.setup_rank(context, dm.rank_part(context))
        dm.context = context  # as setup() sets it (inference reads its comm)
        for kind in KINDS:
            net = make_net(dataset.graph, kind)
            out[label, kind] = _steps(dm, comm, net)
        out[label, "eval"] = (dm.part.orig_ids, dm.share_rows(net.eval(), LAYERS))
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cache_dir = tmp_path_factory.mktemp("cache")
    return run_distributed(_rank, WORLD, str(cache_dir), timeout_s=300)


def reference(dataset, targets, kind):
    """One process, full neighbourhoods of every relation: logits, mean loss, gradients."""
    graph = dataset.graph
    net = make_net(graph, kind)
    sampler = NeighborSampler(
        graph.indptr, graph.indices, [-1] * LAYERS, 0, graph.edge_type, None, R
    )
    blocks = sampler.sample(targets)
    logits = net(blocks, graph.x[blocks[0].src_ids])
    loss = F.cross_entropy(logits, dataset.targets.target[targets], reduction="sum")
    loss = loss / targets.numel()
    loss.backward()
    return logits.detach(), loss.item(), [p.grad for p in net.parameters()]


@pytest.mark.parametrize("label", EXACT)
@pytest.mark.parametrize("kind", KINDS)
def test_relational_steps_on_a_typed_graph_equal_one_process(results, label, kind):
    """Every step's targets, logits, loss and summed gradients equal one process's
    full-neighbourhood RGCN / RGAT on the same targets (float64, 1e-10); each target once an
    epoch."""
    dataset = small_typed()
    covered = []
    for step in range(len(results[0][label, kind])):
        per_rank = [r[label, kind][step] for r in results]
        ids = torch.cat([s["ids"] for s in per_rank])
        order = torch.argsort(ids)
        targets = ids[order]
        covered.append(targets)
        want_logits, want_loss, want_grads = reference(dataset, targets, kind)
        logits = torch.cat([s["logits"] for s in per_rank])[order]
        torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-10)
        assert sum(s["loss"] for s in per_rank) == pytest.approx(want_loss, abs=1e-10)
        for s in per_rank:
            for got, want in zip(s["grads"], want_grads, strict=True):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    every = torch.cat(covered).sort().values
    assert torch.equal(every, dataset.targets.train.nonzero().flatten())


@pytest.mark.parametrize("label", list(VARIANTS))
def test_every_block_carries_relations(results, label):
    steps = [s for r in results for kind in KINDS for s in r[label, kind]]
    assert all(s["typed"] for s in steps)
    assert sum(s["typed_edges"] for s in steps) > 0


def _link_bytes(results, label, category, link):
    return sum(s["bytes"][category][link] for r in results for s in r[label, "rgcn"])


@pytest.mark.parametrize("label", SERVER_MODES)
def test_server_modes_move_no_inter_server_row_on_a_typed_graph(results, label):
    """GraNNDIS's point (spec §4.2): FLX, FLX-EAS and CoB move 0 inter-server feature and
    activation bytes (and their gradients), a typed graph's halos staying inside a server;
    FB_base, the baseline, moves some."""
    for category in ("feature", "activation", "activation_grad"):
        assert _link_bytes(results, label, category, "inter_server") == 0
    assert _link_bytes(results, label, "feature", "intra_server") > 0
    assert _link_bytes(results, "fb_base", "feature", "inter_server") > 0


@pytest.mark.parametrize("label", list(VARIANTS))
def test_inference_shares_equal_whole_graph_layerwise_inference(results, label):
    """The ranks' inference shares (halo rows exchanged, relations carried) give the logits of
    whole-graph layer-wise inference with edge types, every node once."""
    dataset = small_typed()
    graph = dataset.graph
    net = make_net(graph).eval()
    want = layerwise_inference(net, graph.indptr, graph.indices, graph.x, edge_type=graph.edge_type)
    ids = torch.cat([r[label, "eval"][0] for r in results])
    rows = torch.cat([r[label, "eval"][1] for r in results])
    assert torch.equal(ids.sort().values, torch.arange(graph.num_nodes))
    torch.testing.assert_close(rows, want[ids], rtol=0, atol=1e-10)


# ------------------------------------------------------------------ sampling per relation
def _relation_candidates(graph, v):
    """``{relation: set of in-neighbours}`` of node ``v``."""
    eid, _ = in_edge_ids(graph, torch.tensor([v]))
    out = {}
    for e in eid.tolist():
        out.setdefault(int(graph.edge_type[e]), set()).add(int(graph.indices[e]))
    return out


@pytest.mark.parametrize("expand", ["eas", "sage"])
def test_the_fanout_applies_per_vertex_and_relation(expand):
    """With fanout 1 and one hop from one vertex, every relation with in-neighbours
    contributes one of them (a relation-blind draw would keep one vertex in all)."""
    graph = small_typed().graph
    multi = 0
    for v in range(40):
        candidates = _relation_candidates(graph, v)
        inner = torch.tensor([v])
        if expand == "eas":
            vertices, level = eas_expand(graph, inner, hops=1, fanout=1, seed=2)
        else:
            vertices, level = sage_expand(graph, inner, fanout=1, hops=1, seed=2)
        new = set(vertices[level == 1].tolist())
        assert len(new) <= len(candidates)
        for sources in candidates.values():
            if sources - {v}:
                assert new & sources
        multi += len(new) > 1
    assert multi > 0  # vertices with several relations' picks exist


def test_one_relation_samples_what_the_homogeneous_graph_does():
    """A typed graph with one relation draws exactly the homogeneous graph's vertices (EAS and
    CoB-SAGE: the same hash keys)."""
    dataset = typed_sbm(**{**TYPED, "num_relations": 1})
    typed = dataset.graph
    plain = typed.without_types()
    assert typed.is_typed and torch.equal(plain.indices, typed.indices)
    inner = torch.arange(0, 200, 7)
    for fn in (
        lambda g: eas_expand(g, inner, hops=2, fanout=2, seed=1, salt=1),
        lambda g: eas_expand(g, inner, hops=2, fanout=2, selection="degree_prob", seed=1),
        lambda g: sage_expand(g, inner, fanout=2, hops=2, seed=1, salt=1),
    ):
        for got, want in zip(fn(typed), fn(plain), strict=True):
            assert torch.equal(got, want)


# ------------------------------------------------------------------------- refusals, parts
def test_a_part_whose_edge_types_do_not_fit_the_relations_is_refused(tmp_path):
    dataset = small_typed()
    data = DataConfig(batch_size=-1, fanouts=[-1] * LAYERS)
    dm = GraNNDISDataModule(
        dataset, GraNNDISConfig(), data, seed=0, cache_dir=tmp_path, topology=Topology(2, 1)
    )
    part = dm.part_of(Topology(2, 1), 0)
    part.check_relations(R, "part 0")  # as built
    with pytest.raises(ValueError, match="outside"):
        part.check_relations(R - 1, "part 0")
    with pytest.raises(ValueError, match="names no relations"):
        part.check_relations(0, "part 0")
    plan = part.layouts[None].plans[0].final
    cut = dataclasses.replace(plan, edge_type=plan.edge_type[:-1])
    layout = dataclasses.replace(
        part.layouts[None], plans=[dataclasses.replace(part.layouts[None].plans[0], final=cut)]
    )
    with pytest.raises(ValueError, match="edge_type is"):
        dataclasses.replace(part, layouts={None: layout}).check_relations(R, "part 0")


def test_per_relation_fanouts_are_refused_where_no_fanout_is_used():
    data = DataConfig(batch_size=-1, fanouts=[-1] * LAYERS, fanouts_per_relation={"rel_1": [2, 2]})
    for name in ("granndis", "granndis_flx", "granndis_cob", "granndis_fb_base"):
        with pytest.raises(ConfigError, match="fanouts_per_relation"):
            GraNNDISConfig.preset(name).check_data(data)
    GraNNDISConfig.preset("granndis_mb_base").check_data(data)


def test_a_typed_directory_carries_every_part_s_edge_types_and_refuses_parts_without(
    tmp_path, monkeypatch
):
    """The metadata names the relations and node types; a loaded part's plans and inference
    share hold the in-memory part's edge types; a directory whose parts lost them (a writer
    that drops them) is refused when a rank loads its part."""
    from lightning_gnnscale.graph.partition_dir import PartitionDir, PartitionDirError
    from lightning_gnnscale.systems.granndis.partdir import GraNNDISPart

    dataset = small_typed()
    data = DataConfig(batch_size=-1, fanouts=[-1] * LAYERS)
    topology = Topology(2, 1)
    config = GraNNDISConfig(mode="flx", preload_k=1)  # a preload stage and a final stage
    dm = GraNNDISDataModule(
        dataset, config, data, seed=0, cache_dir=tmp_path / "cache", topology=topology
    )
    meta = dm.write_partition_dir(tmp_path / "typed", 2, log=lambda *_: None)
    assert meta["relations"] == list(dataset.graph.relations)
    assert meta["node_types"] == list(dataset.graph.node_types)
    opened = PartitionDir.open(tmp_path / "typed")
    for rank in range(2):
        loaded, built = dm.load_part(opened, rank), dm.part_of(topology, rank)
        for got, want in zip(loaded.layouts[1].plans, built.layouts[1].plans, strict=True):
            for name in ("final", "preload"):
                assert torch.equal(getattr(got, name).edge_type, getattr(want, name).edge_type)
        assert torch.equal(loaded.eval_share.edge_type, built.eval_share.edge_type)

    arrays = GraNNDISPart.arrays
    monkeypatch.setattr(
        GraNNDISPart,
        "arrays",
        lambda self, offset: {
            k: v for k, v in arrays(self, offset).items() if not k.endswith("edge_type")
        },
    )
    dm.write_partition_dir(tmp_path / "dropped", 2, log=lambda *_: None)
    with pytest.raises(PartitionDirError, match="3 relations"):
        dm.load_part(PartitionDir.open(tmp_path / "dropped"), 0)


def test_mb_base_samples_each_relation_with_its_own_fanouts(tmp_path):
    """MB_base's mini-batches are sampled per relation, ``data.fanouts_per_relation`` over
    ``data.fanouts``, and their blocks carry relations."""
    data = DataConfig(batch_size=32, fanouts=[4, 3], fanouts_per_relation={"rel_1": [2, 1]})
    config = GraNNDISConfig.preset("granndis_mb_base")
    dm = GraNNDISDataModule(small_typed(), config, data, seed=0, cache_dir=tmp_path)
    batcher = dm.whole_graph_batcher()
    assert batcher.sampler.relation_fanouts == [(4, 2, 4), (3, 1, 3)]
    blocks = batcher[0, 0].blocks
    assert all(b.edge_type is not None and b.edge_type.shape == (b.num_edges,) for b in blocks)


def test_a_typed_link_prediction_directory_carries_the_pairs_relations(tmp_path, monkeypatch):
    """Typed link prediction (a directed split: inverse relations): the metadata names the
    message relations and the pairs'; a loaded part's training pairs, their lookup edges,
    stage shares and evaluation pairs keep the in-memory part's relations; a DataModule on the
    directory learns the pairs' relations before its head is built (DistMult's ``R``); parts
    without the pairs' relations are refused."""
    from lightning_gnnscale.config_types import ModelConfig
    from lightning_gnnscale.graph.partition_dir import PartitionDir, PartitionDirError
    from lightning_gnnscale.systems.granndis.partdir import GraNNDISPart
    from lightning_gnnscale.tasks import TaskConfig

    task = TaskConfig("link_prediction", undirected=False, decoder="distmult")
    dataset, topology = small_typed(), Topology(2, 1)
    relations = list(dataset.graph.relations)

    def make(partition_dir=None):
        data = DataConfig(batch_size=-1, fanouts=[-1] * LAYERS, partition_dir=partition_dir)
        return GraNNDISDataModule(
            None if partition_dir else dataset, GraNNDISConfig(mode="flx"), data, seed=0,
            cache_dir=tmp_path / "cache",
            topology=topology, task=task,
        )  # fmt: skip

    dm = make()
    meta = dm.write_partition_dir(tmp_path / "typed", 2, log=lambda *_: None)
    assert meta["pair_relations"] == relations
    assert meta["relations"] == relations + [f"{r}_inverse" for r in relations]
    opened = PartitionDir.open(tmp_path / "typed")
    for rank in range(2):
        loaded, built = dm.load_part(opened, rank), dm.part_of(topology, rank)
        got, want = loaded.layouts[LAYERS].link, built.layouts[LAYERS].link
        assert want.rel.numel() > 0 and bool((want.lookup_edge_type >= R).any())
        assert torch.equal(got.rel, want.rel)
        assert torch.equal(got.lookup_edge_type, want.lookup_edge_type)
        for split in ("val", "test"):
            assert torch.equal(loaded.link.relations[split], built.link.relations[split])
        for stage in ("train", "test"):
            assert torch.equal(
                loaded.link.shares[stage].edge_type, built.link.shares[stage].edge_type
            )
    reader = make(str(tmp_path / "typed"))
    reader.build_model(ModelConfig(name="rgcn", hidden=8, num_layers=LAYERS))
    assert reader.task.relations == tuple(relations) and reader.num_relations == 2 * R
    assert reader.task.trained_head().weight.shape[0] == R

    arrays = GraNNDISPart.arrays
    monkeypatch.setattr(
        GraNNDISPart,
        "arrays",
        lambda self, offset: {
            k: v for k, v in arrays(self, offset).items() if not k.endswith("_rel")
        },
    )
    dm.write_partition_dir(tmp_path / "dropped", 2, log=lambda *_: None)
    with pytest.raises(PartitionDirError, match="pairs' edge_type is None"):
        dm.load_part(PartitionDir.open(tmp_path / "dropped"), 0)
