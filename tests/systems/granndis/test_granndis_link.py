"""GraNNDIS trains link prediction (4 gloo processes, 2 servers x 2 workers, float64): the
exact modes' full-graph steps equal ``single``'s full batch (loss and gradients, two epochs'
negatives), their evaluation statistics sum to ``single``'s; no validation or test pair joins
its endpoints in any layout a rank trains on; the server modes move no input feature across
servers (only the step's endpoint rows do). The same on a typed graph (RGCN over a directed
split's relations and their inverses, DistMult's trained diagonal per relation): FLX equals
``single``, no validation or test triple nor its inverse is in a training layout, FLX and
FLX-EAS move no feature across servers."""

from __future__ import annotations

import pytest
import torch

from lightning_gnnscale.comm import Comm, CommMeter, Topology
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.graph.generators import sbm, typed_sbm
from lightning_gnnscale.kit.loaders import StepBatcher
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.inference import full_logits
from lightning_gnnscale.systems.granndis import GraNNDISConfig, GraNNDISDataModule, halo_hook
from lightning_gnnscale.systems.granndis.config import CoBConfig, EASConfig
from lightning_gnnscale.systems.granndis.partdir import EvalShare
from lightning_gnnscale.systems.granndis.strategy import finish_rows
from lightning_gnnscale.tasks import TaskConfig, build_task
from tests.helpers.dist import run_distributed

WORLD, WORKERS, LAYERS, HIDDEN = 4, 2, 2, 8
EPOCHS = (0, 1)
TASK = TaskConfig("link_prediction", num_negatives=2, filter_negatives=True, eval_negatives=20)
EXACT = {
    "fb_base": GraNNDISConfig(mode="fb_base"),
    "flx": GraNNDISConfig(mode="flx"),
    "flx_k1": GraNNDISConfig(mode="flx", preload_k=1),
    "cob_none": GraNNDISConfig(mode="cob", cob=CoBConfig(sampler="none")),
}
SAMPLED = {
    "flx_eas": GraNNDISConfig(mode="flx_eas", eas=EASConfig(hops=1, fanout=2)),
    "cob_sage": GraNNDISConfig(mode="cob", cob=CoBConfig(fanout=2)),
}
SERVER_MODES = ("flx", "cob_none", "flx_eas", "cob_sage")
# typed link prediction: a directed split (inverse relations in the message passing), triples
# scored by DistMult (a trained head), in the same processes as the homogeneous variants
TYPED_TASK = TaskConfig(
    "link_prediction",
    num_negatives=2,
    filter_negatives=True,
    eval_negatives=20,
    undirected=False,
    decoder="distmult",
)
TYPED = {
    "typed_flx": GraNNDISConfig(mode="flx"),
    "typed_flx_eas": GraNNDISConfig(mode="flx_eas", eas=EASConfig(hops=1, fanout=2)),
}


def dataset():
    return sbm(num_nodes=160, num_classes=3, avg_degree=6.0, num_features=5, seed=5).to(
        torch.float64
    )


def typed_dataset():
    graph = {"num_nodes": 120, "num_relations": 3, "num_classes": 3, "avg_degree": 2.0}
    return typed_sbm(**graph, num_features=5, seed=5).to(torch.float64)


def make_net(in_dim, num_relations=0):
    """SAGE (homogeneous) or RGCN over ``num_relations``, and the modules whose gradients a
    step returns (a typed task's trained head last)."""
    torch.manual_seed(0)
    kind, extra = ("rgcn", {"num_relations": num_relations}) if num_relations else ("sage", {})
    net = BlockGNN(kind, in_dim, HIDDEN, TASK.embedding_dim, LAYERS, 0.0, init="glorot", **extra)
    return net.double()


def step(net, batch, task, hook=None):
    """Loss of one batch (divided by the step's global terms) and the parameter gradients
    (the net's, then a trained head's)."""
    params = [*net.parameters(), *task.decoder.parameters()]
    for p in params:
        p.grad = None
    out = net(batch.blocks, batch.x, layer_hook=hook)
    loss = task.loss_sum(out, batch.y) / batch.global_seed_count
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in params]


def layout_pairs(plan):
    """Global ``(src, dst, relation)`` of every edge of a one-hop plan (all layers' edges;
    relation ``None`` when homogeneous)."""
    kind = plan.edge_type
    return plan.rows[plan.edge_src], plan.rows[plan.edge_dst], kind


def quantised(rows):
    """Embeddings rounded to multiples of 2^-20: equal rows score bit for bit alike, whatever
    order their sums ran in (a fixed negative equal to the positive's endpoint is a tie that
    1-ulp differences would break either way)."""
    return torch.round(rows * 2**20) / 2**20


SHARE_ROWS = EvalShare.rows


def quantised_rows(self, *args, **kwargs):
    return quantised(SHARE_ROWS(self, *args, **kwargs))


def _rank(rank, world_size, cache_dir):
    comm = Comm.create(CommMeter(), Topology(world_size, WORKERS))
    context = RankContext(comm, torch.device("cpu"))
    out = {}
    for label, config in VARIANTS.items():
        dm = datamodule(config, cache_dir, comm.topology, typed=label in TYPED)
        dm.setup_rank(context, dm.rank_part(context))
        dm.context = context
        net = make_net(dm.input_dim, dm.num_relations if label in TYPED else 0)
        dm.task.trained_head()  # a typed task's DistMult (the module's head), in float64
        dm.task.decoder.double()
        net.register_forward_hook(finish_rows, with_kwargs=True)
        steps = []
        for epoch in EPOCHS:
            batch = dm.make_batch(epoch, 0)
            before = comm.meter.snapshot()
            loss, grads = step(net, batch, dm.task, halo_hook(comm)(batch))
            traffic = comm.meter.delta(before)["category_link_bytes"]
            loss = comm.all_reduce(loss.reshape(1), category="control")
            grads = [comm.all_reduce(g, category="gradient") for g in grads]
            steps.append({"loss": loss, "grads": grads, "bytes": traffic, "pairs": len(batch.y)})
        # every training structure this rank's plans pass messages over, in global ids
        edges = []
        for plan in dm.plans:
            for p in (plan.preload, plan.final):
                if p is not None:
                    edges.append(layout_pairs(p))
        shares = dm.part.link.shares
        embedded = {s: dm.share_rows(net, LAYERS, shares[s]) for s in ("train", "test")}
        EvalShare.rows = quantised_rows
        try:
            stats = dm.eval_statistics(net, ("val", "test"))
        finally:
            EvalShare.rows = SHARE_ROWS
        stats = comm.all_reduce(stats, category="control")
        out[label] = {
            "steps": steps,
            "edges": edges,
            "stats": stats,
            "ids": dm.part.orig_ids,
            "embedded": embedded,
        }
    return out


VARIANTS = {**EXACT, **SAMPLED, **TYPED}


def datamodule(config, cache_dir, topology, typed=False):
    data = DataConfig(batch_size=-1, fanouts=[-1] * LAYERS)
    graph, task = (typed_dataset(), TYPED_TASK) if typed else (dataset(), TASK)
    return GraNNDISDataModule(
        graph, config, data, seed=0, cache_dir=cache_dir, topology=topology, task=task
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every rank's steps, plans' edges and evaluation; the plans built once here (the
    launcher's ``prepare``), not by each of the 4 ranks."""
    cache_dir = str(tmp_path_factory.mktemp("cache"))
    topology = Topology(WORLD, WORKERS)
    for label, config in VARIANTS.items():
        dm = datamodule(config, cache_dir, topology, typed=label in TYPED)
        dm.part_of(dm.prepare(WORLD), 0)
    return run_distributed(_rank, WORLD, cache_dir, timeout_s=300)


def single_run(typed):
    """``single``'s full-batch step of each epoch (full neighbourhoods over the training
    structure, a typed graph's per relation) and its evaluation statistics."""
    data, task = (
        (typed_dataset(), build_task(TYPED_TASK)) if typed else (dataset(), build_task(TASK))
    )
    targets = task.prepare(data, 0)
    train = task.train_seeds(targets)
    batcher = StepBatcher.on_graph(
        data.graph, targets, task, [-1] * LAYERS, train, train.numel(), 0, 0, 1, False
    )
    net = make_net(data.graph.num_features, len(task.message_relations(data.graph)))
    task.trained_head()
    task.decoder.double()
    steps = [step(net, batcher[epoch, 0], task) for epoch in EPOCHS]

    def embed(stage):
        return full_logits(task.stage_graph(data.graph, targets, stage), net, 1 << 20, None)

    stats = task.link_statistics(lambda s: quantised(embed(s)), targets, ("val", "test"), 0, 1)
    embedded = {s: embed(s) for s in ("train", "test")}
    return {"steps": steps, "stats": stats, "targets": targets, "embedded": embedded}


@pytest.fixture(scope="module")
def single():
    return single_run(typed=False)


@pytest.fixture(scope="module")
def typed_single():
    return single_run(typed=True)


@pytest.mark.dist
@pytest.mark.parametrize("label", [*EXACT, "typed_flx"])
def test_an_exact_mode_equals_single_in_float64(results, single, typed_single, label):
    """The ranks' losses and summed gradients of every epoch's full-graph step equal
    ``single``'s full batch of the same positives and negatives; the evaluation statistics
    (AUC counts, reciprocal ranks, hits) summed over ranks equal ``single``'s. Typed: every
    pair scored under its relation, DistMult's gradients summed with the net's."""
    single = typed_single if label in TYPED else single
    assert len(single["steps"][0][1]) == len(results[0][label]["steps"][0]["grads"])
    for epoch, (want_loss, want_grads) in enumerate(single["steps"]):
        got = results[0][label]["steps"][epoch]
        torch.testing.assert_close(got["loss"][0], want_loss, rtol=0, atol=1e-12)
        for g, w in zip(got["grads"], want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    for r in results:
        for stage, want in single["embedded"].items():
            got = r[label]["embedded"][stage]
            torch.testing.assert_close(got, want[r[label]["ids"]], rtol=0, atol=1e-12)
    torch.testing.assert_close(results[0][label]["stats"], single["stats"], rtol=0, atol=1e-9)


@pytest.mark.dist
@pytest.mark.parametrize("label", list(VARIANTS))
def test_no_evaluation_pair_reaches_a_training_layout(results, single, typed_single, label):
    """No validation or test pair, in either direction, is an edge of any layout a rank
    trains on (every stage of every step), on any rank; typed: no validation or test triple
    ``(s, r, d)``, nor its inverse ``(d, r + R, s)``, while the layouts do carry inverse
    edges; and the steps do train."""
    targets = (typed_single if label in TYPED else single)["targets"]
    split, n = targets.split, targets.num_nodes
    held = torch.cat([split.val_pos, split.test_pos], 1)
    if label in TYPED:
        r = split.num_relations
        rel = torch.cat([split.val_rel, split.test_rel])
        keys = torch.cat(
            [(held[0] * n + held[1]) * 2 * r + rel, (held[1] * n + held[0]) * 2 * r + rel + r]
        )
    else:
        keys = torch.cat([held[0] * n + held[1], held[1] * n + held[0]])
    seen = inverse = 0
    for ranks in results:
        for src, dst, kind in ranks[label]["edges"]:
            key = (
                src * n + dst if kind is None else (src * n + dst) * 2 * split.num_relations + kind
            )
            assert not bool(torch.isin(key, keys).any())
            seen += src.numel()
            inverse += 0 if kind is None else int((kind >= split.num_relations).sum())
    assert seen > 0 and all(s["pairs"] > 0 for s in results[0][label]["steps"])
    assert (inverse > 0) == (label in TYPED)


@pytest.mark.dist
@pytest.mark.parametrize("label", [*SERVER_MODES, *TYPED])
def test_server_modes_move_no_feature_across_servers(results, label):
    """GraNNDIS's point under link prediction: FLX, FLX-EAS and CoB send 0 input-feature
    bytes between servers (FB_base sends some); the step's endpoint rows are what crosses
    (``activation``), at most one row of width ``embedding_dim`` per endpoint asked for."""

    def total(name, category, link):
        return sum(s["bytes"][category][link] for r in results for s in r[name]["steps"])

    assert total(label, "feature", "inter_server") == 0
    assert total(label, "feature", "intra_server") > 0
    assert total("fb_base", "feature", "inter_server") > 0
    endpoint_bytes = sum(s["pairs"] for r in results for s in r[label]["steps"]) * 2
    assert 0 < total(label, "activation", "inter_server") <= endpoint_bytes * TASK.embedding_dim * 8


def test_cob_with_several_co_batches_refuses_link_prediction_before_spawn(tmp_path):
    """``cob.num_per_epoch > 1`` cannot hold a step's negatives (drawn over the whole graph):
    refused when the run is typed and by a plain script's DataModule, naming the setting."""
    from lightning_gnnscale.config_types import run_config
    from lightning_gnnscale.errors import ConfigError
    from tests.helpers.config import make_cfg

    settings = ["strategy=granndis_cob", "task=link_prediction", "strategy.cob.num_per_epoch=2"]
    with pytest.raises(ConfigError, match="strategy.cob.num_per_epoch=2 with task=link_pred"):
        run_config(make_cfg(tmp_path, *settings))
    config = GraNNDISConfig(mode="cob", name="granndis_cob", cob=CoBConfig(num_per_epoch=2))
    with pytest.raises(ConfigError, match="strategy.cob.num_per_epoch=1"):
        datamodule(config, str(tmp_path), Topology(WORLD, WORKERS))
    run_config(make_cfg(tmp_path, *settings[:2]))  # one co-batch per server trains it
