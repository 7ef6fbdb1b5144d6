"""GraNNDIS on 4 gloo processes (2 servers x 2 workers): FB_base, FLX (k = L) and CoB without
sampling equal one-process full-graph training (logits, loss, gradients; float64); the meter's
link classes show which traffic crosses servers; end-to-end runs through ``train``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm, CommMeter, Topology
from lightning_gnnscale.comm.audit import CollectiveRecorder
from lightning_gnnscale.comm.hierarchical import ServerGroups
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.graph.block import Block
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.node_targets import NodeDataset
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.systems.granndis import GraNNDISConfig, GraNNDISDataModule, halo_hook
from lightning_gnnscale.systems.granndis.config import (
    CoBConfig,
    EASConfig,
    GraNNDISPartitionConfig,
)
from tests.helpers.dist import run_distributed

WORLD, WORKERS, LAYERS, HIDDEN, CLASSES = 4, 2, 2, 8, 3
KINDS = ("sage", "gcn", "gat")
CONTIGUOUS = GraNNDISPartitionConfig(
    server="contiguous", intra="contiguous", fb_base="hierarchical"
)
# (label, config): a worker without targets appears in "fb_base_no_targets" (ranks 2, 3 own
# vertices and halos but no target) and "flx_empty_server" (server 1 has no target, so ranks
# 2, 3 hold nothing at all: empty halos).
VARIANTS = {
    "fb_base": GraNNDISConfig(mode="fb_base"),
    "fb_base_no_targets": GraNNDISConfig(mode="fb_base", partition=CONTIGUOUS),
    "fb_base_hier": GraNNDISConfig(
        mode="fb_base", partition=GraNNDISPartitionConfig(fb_base="hierarchical")
    ),
    "flx": GraNNDISConfig(mode="flx"),
    "flx_unmasked": GraNNDISConfig(mode="flx", masking=False),
    "flx_empty_server": GraNNDISConfig(mode="flx", partition=CONTIGUOUS),
    "flx_k0": GraNNDISConfig(mode="flx", preload_k=0),
    "flx_k1": GraNNDISConfig(mode="flx", preload_k=1),
    "cob_none": GraNNDISConfig(mode="cob", cob=CoBConfig(num_per_epoch=3, sampler="none")),
    "flx_eas": GraNNDISConfig(mode="flx_eas", eas=EASConfig(hops=2, fanout=2)),
    "cob_sage": GraNNDISConfig(mode="cob", cob=CoBConfig(num_per_epoch=2, fanout=2)),
    "cob_eas": GraNNDISConfig(mode="cob", cob=CoBConfig(num_per_epoch=2, sampler="eas")),
}
EXACT_VARIANTS = [v for v in VARIANTS if v not in ("flx_eas", "cob_sage", "cob_eas")]
FEW_TARGETS = ("fb_base_no_targets", "flx_empty_server")


def small_dataset(few_targets: bool = False) -> NodeDataset:
    dataset = sbm(num_nodes=240, num_classes=CLASSES, avg_degree=6.0, num_features=5, seed=5).to(
        torch.float64
    )
    if few_targets:  # training targets only among the first 100 ids (server 0, contiguous)
        targets = dataset.targets
        train = targets.train & (torch.arange(targets.num_rows) < 100)
        dataset = NodeDataset(dataset.graph, dataclasses.replace(targets, train=train))
    return dataset


def make_net(kind, graph):
    torch.manual_seed(0)
    net = BlockGNN(kind, graph.num_features, HIDDEN, CLASSES, LAYERS, 0.0, heads=2)
    return net.double()


def _rank(rank, world_size, cache_dir):
    comm = Comm.create(CommMeter(), Topology(world_size, WORKERS))
    context = RankContext(comm, torch.device("cpu"))
    groups = ServerGroups(CommMeter(), comm.topology, rank, comm.timeout)
    data = DataConfig(batch_size=-1, fanouts=[-1] * LAYERS)
    out = {}
    for label, config in VARIANTS.items():
        dataset = small_dataset(label in FEW_TARGETS)
        graph = dataset.graph
        dm = GraNNDISDataModule(
            dataset, config, data, seed=0, cache_dir=cache_dir, topology=comm.topology
        )
        dm.setup_rank(context, dm.rank_part(context))
        for kind in KINDS:
            net = make_net(kind, graph)
            steps = []
            for step in range(dm.steps_per_epoch):
                batch = dm.make_batch(0, step)
                before = comm.meter.snapshot()
                net.zero_grad()
                logits = net(batch.blocks, batch.x, layer_hook=halo_hook(comm)(batch))
                loss = F.cross_entropy(logits, batch.y, reduction="sum") / batch.global_seed_count
                loss.backward()
                traffic = comm.meter.delta(before)  # halo exchange only (before the sync)
                params = list(net.parameters())
                grads = [comm.all_reduce(p.grad.clone(), category="gradient") for p in params]
                hier = [groups.all_reduce(p.grad.clone(), category="gradient") for p in params]
                steps.append(
                    {
                        "ids": batch.plan.final.owned[: batch.plan.final.num_loss],
                        "logits": logits.detach(),
                        "loss": loss.item(),
                        "count": batch.global_seed_count,
                        "grads": grads,
                        "hierarchical_grads": hier,
                        "bytes": traffic["category_link_bytes"],
                    }
                )
            out[label, kind] = steps
        out[label, "owned"] = [p.final.owned for p in dm.plans]
    out.update(_hierarchical_probe(rank, world_size))
    out["disagreement"] = _disagreement_probe(rank, world_size, cache_dir)
    return out


def _disagreement_probe(rank, world_size, cache_dir):
    """Rank 2 splits server 1's graph over its workers differently from rank 3; returns the
    error ``setup_rank`` raised on this rank (``None`` if none)."""
    comm = Comm.create(CommMeter(), Topology(world_size, WORKERS), timeout_s=30)
    intra = "contiguous" if rank == 2 else "metis"
    config = GraNNDISConfig(mode="flx", partition=GraNNDISPartitionConfig(intra=intra))
    data = DataConfig(batch_size=-1, fanouts=[-1] * LAYERS)
    dm = GraNNDISDataModule(
        small_dataset(), config, data, seed=0, cache_dir=cache_dir, topology=comm.topology
    )
    context = RankContext(comm, torch.device("cpu"))
    try:
        dm.setup_rank(context, dm.rank_part(context))
    except RuntimeError as error:
        return str(error)
    return None


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def results(cache_dir):
    return run_distributed(_rank, WORLD, str(cache_dir), timeout_s=300)


def reference(kind, dataset, targets):
    """One process, full neighbourhoods: logits of ``targets``, the mean loss, gradients."""
    graph = dataset.graph
    net = make_net(kind, graph)
    blocks = NeighborSampler(graph.indptr, graph.indices, [-1] * LAYERS).sample(targets)
    logits = net(blocks, graph.x[blocks[0].src_ids])
    loss = F.cross_entropy(logits, dataset.targets.target[targets], reduction="sum")
    loss = loss / targets.numel()
    loss.backward()
    return logits.detach(), loss.item(), [p.grad for p in net.parameters()]


@pytest.mark.parametrize("label", EXACT_VARIANTS)
@pytest.mark.parametrize("kind", KINDS)
def test_each_step_equals_one_process_full_graph_training(results, label, kind):
    """Every step's targets, logits, loss and summed gradients (flat all-reduce and the
    hierarchical one) equal the one-process full-graph values on the same targets (the whole
    training set for full-graph modes, the co-batch for CoB): float64, 1e-10."""
    dataset = small_dataset(label in FEW_TARGETS)
    steps = len(results[0][label, kind])
    covered = []
    for step in range(steps):
        per_rank = [r[label, kind][step] for r in results]
        ids = torch.cat([s["ids"] for s in per_rank])
        order = torch.argsort(ids)
        targets = ids[order]
        covered.append(targets)
        assert all(s["count"] == targets.numel() for s in per_rank)
        want_logits, want_loss, want_grads = reference(kind, dataset, targets)
        logits = torch.cat([s["logits"] for s in per_rank])[order]
        torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-10)
        assert sum(s["loss"] for s in per_rank) == pytest.approx(want_loss, abs=1e-10)
        for s in per_rank:
            for key in ("grads", "hierarchical_grads"):
                for got, want in zip(s[key], want_grads, strict=True):
                    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    every = torch.cat(covered).sort().values
    train = dataset.targets.train.nonzero().flatten()
    assert torch.equal(every, train)  # each target once per epoch
    if label in FEW_TARGETS:
        assert [len(results[r][label, kind][0]["ids"]) for r in (2, 3)] == [0, 0]


@pytest.mark.parametrize("label", ["flx", "cob_none", "flx_eas", "cob_sage", "cob_eas"])
@pytest.mark.parametrize("kind", KINDS)
def test_server_graphs_split_over_workers_equal_one_worker_per_server(
    results, cache_dir, label, kind
):
    """Spec §7 tests 13 and 15: the logits of the (sampled) server graphs split over 2
    workers with intra-server halo exchange equal those of the same server graphs on one
    worker per server (no exchange); the intra-server split is an implementation detail."""
    dataset = small_dataset()
    graph = dataset.graph
    data = DataConfig(batch_size=-1, fanouts=[-1] * LAYERS)
    dm = GraNNDISDataModule(dataset, VARIANTS[label], data, seed=0, cache_dir=cache_dir)
    net = make_net(kind, graph)
    for step in range(len(results[0][label, kind])):
        got = {}
        for r in results:
            s = r[label, kind][step]
            got.update(zip(s["ids"].tolist(), s["logits"]))
        want = {}
        for server in range(WORLD // WORKERS):
            plans, _ = dm.build_all_plans(Topology(WORLD // WORKERS, 1))[server]
            plan = plans[step].final
            with torch.no_grad():
                logits = net(list(plan.blocks), graph.x[plan.owned])
            want.update(zip(plan.owned[: plan.num_loss].tolist(), logits))
        assert sorted(got) == sorted(want)
        for v, row in want.items():
            torch.testing.assert_close(got[v], row, rtol=0, atol=1e-10)


def mfg_reference(net, graph, vertices, level, is_target, num_layers):
    """Spec §7 test 15's oracle, built from the spec's MFG semantics rather than the plan
    code: layer ``j`` reads the vertices of ``G_s`` (induced on ``vertices``) with level
    ``<= K - j``, writes those with level ``<= K - j - 1`` (the last layer: the level-0
    targets), over the edges of ``G_s`` between them; GCN degrees of the whole graph.
    Returns ``{target id: logits}``."""
    n = vertices.numel()
    position = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    position[vertices] = torch.arange(n)
    dst = torch.repeat_interleave(torch.arange(n), graph.in_degree()[vertices])
    src = torch.cat([graph.indices[graph.indptr[v] : graph.indptr[v + 1]] for v in vertices])
    src = position[src]
    src, dst = src[src >= 0], dst[src >= 0]
    degree = graph.in_degree()[vertices]
    key = 2 * level + ((level == 0) & ~is_target).long()  # sources and targets are prefixes
    order = torch.argsort(key, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n)
    blocks = []
    for j in range(num_layers):
        num_src = int((key <= 2 * (num_layers - j)).sum())
        last = j == num_layers - 1
        num_dst = int((key == 0).sum()) if last else int((key <= 2 * (num_layers - j - 1)).sum())
        keep = (rank[src] < num_src) & (rank[dst] < num_dst)
        edges = torch.stack([rank[src[keep]], rank[dst[keep]]])
        ids = vertices[order[:num_src]]
        blocks.append(Block(ids, num_dst, edges, degree[order[:num_src]]))
    with torch.no_grad():
        logits = net(blocks, graph.x[blocks[0].src_ids])
    return dict(zip(blocks[-1].dst_ids.tolist(), logits))


@pytest.mark.parametrize("label", ["flx", "cob_none", "flx_eas", "cob_sage", "cob_eas"])
@pytest.mark.parametrize("kind", KINDS)
def test_masked_one_hop_graphs_equal_the_layerwise_computation_graph(
    results, cache_dir, label, kind
):
    """Spec §7 test 15: on each step's (sampled) server graph ``G_s`` with its levels, the
    distributed logits equal a layer-wise computation graph that shrinks by level (the mask
    rule as MFG semantics), with full-graph GCN degrees in every mode. Catches masks that are
    dropped or off by one layer."""
    dataset = small_dataset()
    graph = dataset.graph
    config = VARIANTS[label]
    data = DataConfig(batch_size=-1, fanouts=[-1] * LAYERS)
    dm = GraNNDISDataModule(dataset, config, data, seed=0, cache_dir=cache_dir)
    net = make_net(kind, graph)
    for step in range(len(results[0][label, kind])):
        got = {}
        for r in results:
            s = r[label, kind][step]
            got.update(zip(s["ids"].tolist(), s["logits"]))
        want = {}
        for server in range(WORLD // WORKERS):
            plans, _ = dm.build_all_plans(Topology(WORLD // WORKERS, 1))[server]
            plan = plans[step].final  # one worker: every vertex of G_s owned, none in a halo
            order = torch.argsort(plan.owned)
            vertices, level = plan.owned[order], plan.level[order]
            is_target = dataset.targets.train[vertices] & (level == 0)
            want.update(mfg_reference(net, graph, vertices, level, is_target, LAYERS))
        assert sorted(got) == sorted(want)
        for v, row in want.items():
            torch.testing.assert_close(got[v], row, rtol=0, atol=1e-10)


def _link_bytes(results, label, kind, category, link):
    return sum(s["bytes"][category][link] for r in results for s in r[label, kind])


SERVER_ONLY = [v for v in VARIANTS if not v.startswith(("fb_base", "flx_k"))]


@pytest.mark.parametrize("label", SERVER_ONLY)
def test_server_layouts_move_nothing_between_servers(results, label):
    """FLX and CoB exchange halos inside a server only: 0 inter-server feature, activation and
    activation-gradient bytes, while intra-server halos do move."""
    for category in ("feature", "activation", "activation_grad"):
        assert _link_bytes(results, label, "sage", category, "inter_server") == 0
    if label != "flx_empty_server":
        assert _link_bytes(results, label, "sage", "activation", "intra_server") > 0


def test_fb_base_bytes_follow_the_cut(results):
    """FB_base's halo bytes per step: layer 0 moves F-wide input rows, layer 1 H-wide hidden
    rows forward and their gradients back, over the cut counted from the owners (spec §5):
    inter = (F + 2H) * 8 * cut_inter, intra likewise."""
    graph = small_dataset().graph
    owner = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    for r in range(WORLD):
        owner[results[r]["fb_base", "owned"][0]] = r
    cut = {"inter_server": 0, "intra_server": 0}
    for r in range(WORLD):
        mine = (owner == r).nonzero().flatten()
        sources = {
            int(u) for v in mine for u in graph.indices[graph.indptr[v] : graph.indptr[v + 1]]
        }
        for u in sources - set(mine.tolist()):
            link = "intra_server" if owner[u] // WORKERS == r // WORKERS else "inter_server"
            cut[link] += 1
    assert cut["inter_server"] > 0
    for link, rows in cut.items():
        per_row = {"feature": graph.num_features, "activation": HIDDEN, "activation_grad": HIDDEN}
        for category, width in per_row.items():
            got = _link_bytes(results, "fb_base", "sage", category, link)
            assert got == width * 8 * rows, (link, category)


def test_partial_preloading_moves_fewer_inter_server_bytes_as_k_grows(results):
    """FLX(k): inter-server halo bytes are non-increasing in k and 0 at k = L; at k = 1 only
    the hidden layer's rows (and their gradients) cross servers, no input rows; FLX(0) moves
    what FB_base with a hierarchical partition moves (spec §7, test 12)."""
    kinds = ("feature", "activation", "activation_grad")
    inter = {
        label: sum(_link_bytes(results, label, "sage", c, "inter_server") for c in kinds)
        for label in ("flx_k0", "flx_k1", "flx")
    }
    assert inter["flx_k0"] >= inter["flx_k1"] >= inter["flx"] == 0
    assert inter["flx_k0"] > inter["flx_k1"] > 0
    assert _link_bytes(results, "flx_k1", "sage", "feature", "inter_server") == 0
    # k = 0 is FB_base on the hierarchical partition: the same bytes on every link
    for category in kinds:
        for link in ("inter_server", "intra_server"):
            k0 = _link_bytes(results, "flx_k0", "sage", category, link)
            assert k0 == _link_bytes(results, "fb_base_hier", "sage", category, link)


def test_ranks_that_built_different_layouts_all_fail_at_set_up(results):
    """Server 1's ranks disagree on its layout: every rank (server 0's too, whose own plans
    agree) raises the same clear error at set-up instead of waiting in the next collective."""
    messages = [r["disagreement"] for r in results]
    assert all(m is not None and "built different layouts" in m for m in messages), messages
    assert all(m.startswith("ranks [2, 3] receive halo rows") for m in messages), messages


def _last_state(output_dir):
    ckpt = torch.load(output_dir / "checkpoints" / "last.ckpt", weights_only=False)
    return ckpt["state_dict"]


EXACT = (
    "dtype=float64",
    "model.dropout=0.0",
    "model.optimizer=sgd",
    "trainer.max_epochs=2",
    "data.batch_size=-1",
    "data.fanouts=[-1,-1]",
)


@pytest.mark.e2e
def test_trainer_runs_equal_single_with_a_clean_audit(tmp_path):
    """Through ``train`` (2 servers x 2 workers, audit on): FLX (DDP gradient sync) and FB_base
    (hierarchical gradient sync) end with the parameters of ``single`` full-graph training;
    under FLX only gradients cross servers."""
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg

    ref, a = train(make_cfg(tmp_path / "single", "strategy=single", "model=sage", *EXACT))
    want = _last_state(a["output_dir"])
    runs = {
        "flx": ("strategy=granndis_flx",),
        "fb_base": ("strategy=granndis_fb_base", "strategy.grad_sync=hierarchical"),
    }
    summaries = {}
    for label, args in runs.items():
        summary, objects = train(
            make_cfg(tmp_path / label, *args, "model=sage", "audit=true", *EXACT)
        )
        got = _last_state(objects["output_dir"])
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=0, atol=1e-10)
        assert summary["world_size"] == 4 and summary["audited_collectives"] > 0
        assert summary["train_loss"] == pytest.approx(ref["train_loss"], abs=1e-9)
        summaries[label] = summary["system"]
    inter = summaries["flx"]["bytes_by_link"]["inter_server"]
    assert inter["feature"] == inter["forward"] == inter["backward"] == 0
    assert inter["gradient"] > 0
    assert summaries["flx"]["rho"] > 1 and summaries["flx"]["preload_depth"] == 2
    fb_base = summaries["fb_base"]
    assert fb_base["bytes_by_link"]["inter_server"]["forward"] > 0
    assert fb_base["rho"] == 1 and fb_base["preload_depth"] is None
    # modelled time: the slowest rank's compute plus its bytes over the links, so never
    # below the compute and never faster on a slower inter-server link
    for system in summaries.values():
        times = system["modelled_epoch_time_s"]
        assert system["compute_s"] <= times["paper"] <= times["paper_10gbe"] <= times["paper_1gbe"]


def _hierarchical_probe(rank, world_size):
    out = {}
    for workers in (1, 2, 4):
        meter = CommMeter()
        groups = ServerGroups(meter, Topology(world_size, workers), rank)
        value = torch.arange(10, dtype=torch.float64) * (rank + 1)
        with CollectiveRecorder() as recorder:
            before = meter.snapshot()
            summed = groups.all_reduce(value.clone(), category="gradient")
            recorder.assert_accounted(meter.delta(before))
        out["hierarchical", workers] = summed, meter.snapshot()["category_link_bytes"]["gradient"]
    return out


def test_hierarchical_all_reduce_sums_and_crosses_servers_only_between_heads(results):
    """For 4 x 1, 2 x 2 and 1 x 4 servers x workers: the three-stage sum equals the plain sum
    on every rank; inter-server bytes are the heads' ring, 2 (S - 1) / S * nbytes per head;
    every call is metered (audit)."""
    want = torch.arange(10, dtype=torch.float64) * sum(range(1, WORLD + 1))
    nbytes = 10 * 8
    for workers in (1, 2, 4):
        servers = WORLD // workers
        for rank_results in results:
            torch.testing.assert_close(
                rank_results["hierarchical", workers][0], want, rtol=0, atol=0
            )
        links = [rank_results["hierarchical", workers][1] for rank_results in results]
        inter = sum(link["inter_server"] for link in links)
        intra = sum(link["intra_server"] for link in links)
        assert inter == servers * (2 * (servers - 1) * nbytes // servers), workers
        ring = 2 * (workers - 1) * nbytes // workers
        assert intra == servers * (workers * ring + (workers - 1) * nbytes), workers
