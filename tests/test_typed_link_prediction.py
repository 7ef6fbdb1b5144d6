"""Typed link prediction (issue 40, deliverable 5): a typed split that keeps each positive's
relation and leaks no evaluation triple into a training block, DistMult, filtered ranking
against a hand-computed case, ranks that sum to one process in float64, Kinships through
``construct`` and a short Kinships run that beats the popularity baseline (docs/tasks.md,
"Typed link prediction")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import lightning_gnnscale as gs
from lightning_gnnscale.config_types import DataConfig, run_config
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.generators import typed_sbm
from lightning_gnnscale.graph.node_targets import NodeDataset
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.tasks import TaskConfig, build_task
from lightning_gnnscale.tasks.link.decoders import DistMultDecoder
from lightning_gnnscale.tasks.link.metrics import filtered_ranking_statistics, ranking_metrics
from tests.helpers.config import make_cfg

REPO = Path(__file__).resolve().parents[1]
FANOUTS = [4, 3]


def directed_typed(seed: int = 3, num_nodes: int = 120) -> NodeDataset:
    """A directed typed graph (3 relations): typed_sbm's edges one way only, so a split is
    directed and passes messages over inverse relations too."""
    data = typed_sbm(num_nodes=num_nodes, num_relations=3, num_features=6, seed=seed)
    g = data.graph
    src, dst = g.edge_index()
    keep = src < dst
    graph = Graph.from_edge_index(
        torch.stack([src[keep], dst[keep]]),
        g.num_nodes,
        edge_type=g.edge_type[keep],
        relations=g.relations,
        x=g.x.double(),
        name="directed-typed",
    )
    return NodeDataset(graph, data.targets)


def make_datamodule(name: str, task: TaskConfig, dataset: NodeDataset | None = None):
    _, DataModule, config = gs.system(name)
    if name == "ddp":
        config = type(config)(salt_by_rank=False)
    return DataModule(
        dataset or directed_typed(),
        config,
        DataConfig(batch_size=96, fanouts=FANOUTS),
        seed=7,
        task=task,
    )


TYPED = TaskConfig("link_prediction", decoder="distmult", evaluation="filtered", num_negatives=3)


# ------------------------------------------------------------------------------- the split
def test_the_typed_split_keeps_relations_and_adds_inverse_message_relations():
    """Every edge is one positive with its own relation; the training structure holds the
    training triples and their inverses (relation ``r + R``), nothing else."""
    dm = make_datamodule("single", TYPED)
    g, split = dm.graph, dm.targets.split
    assert not split.undirected and split.num_relations == 3
    assert split.relations == (*g.relations, *(f"{r}_inverse" for r in g.relations))
    assert dm.num_relations == 6 and len(dm.relation_fanouts[0]) == 6
    triples = {
        (s, r, d)
        for name in ("train", "val", "test")
        for (s, d), r in zip(
            split.positives(name).t().tolist(), split.positive_relations(name).tolist()
        )
    }
    src, dst = g.edge_index()
    assert triples == set(zip(src.tolist(), g.edge_type.tolist(), dst.tolist()))
    train = dm.task.stage_graph(g, dm.targets, "train")  # a valid typed Graph
    expected = {(s, r, d) for s, d, r in zip(*split.train_pos.tolist(), split.train_rel.tolist())}
    expected |= {(d, r + 3, s) for s, r, d in expected}
    ts, td = train.edge_index()
    assert set(zip(ts.tolist(), train.edge_type.tolist(), td.tolist())) == expected


@pytest.mark.parametrize("name", ["single", "ddp"])
def test_no_evaluation_triple_reaches_a_training_block(name):
    """Every edge of every block of every step of two epochs (full neighbourhoods), on each
    of 2 ranks: none is a validation or test triple, nor its inverse."""
    dm = make_datamodule(name, TYPED)
    dm.data = DataConfig(batch_size=96, fanouts=[-1, -1])
    split = dm.targets.split
    held = set()
    for part in ("val", "test"):
        for (s, d), r in zip(split.positives(part).t().tolist(), split.positive_relations(part)):
            held |= {(s, int(r), d), (d, int(r) + 3, s)}
    assert held
    ranks = 2 if name == "ddp" else 1
    edges = 0
    for rank in range(ranks):
        dm.rank, dm.world_size = rank, ranks
        for epoch in range(2):
            for step in range(dm.steps_per_epoch):
                for block in dm.make_batch(epoch, step).blocks:
                    src, dst = block.edge_index
                    s, d = block.src_ids[src].tolist(), block.dst_ids[dst].tolist()
                    seen = set(zip(s, block.edge_type.tolist(), d))
                    edges += len(seen)
                    assert not held & seen
    assert edges > 500


def test_negatives_keep_the_positives_relation_and_filter_under_it():
    """``Batch.y`` carries each pair's relation; a negative's is its positive's, and filtered
    negatives are never training triples of that relation."""
    task = TaskConfig("link_prediction", decoder="distmult", num_negatives=4)
    dm = make_datamodule("single", TaskConfig(**{**task.__dict__, "filter_negatives": True}))
    targets = dm.targets
    seeds = torch.randperm(
        targets.split.train_pos.shape[1], generator=torch.Generator().manual_seed(0)
    )[:50]
    nodes, y = dm.task.step_rows(targets, seeds, torch.arange(50), epoch=0, step=0)
    assert y.shape == (50 * 5, 4)
    rel = targets.split.train_rel[seeds]
    assert torch.equal(y[:50, 3], rel) and torch.equal(y[50:, 3], rel.repeat_interleave(4))
    assert torch.equal(nodes[y[:50, 0]], targets.split.train_pos[0, seeds])
    assert torch.equal(nodes[y[:50, 1]], targets.split.train_pos[1, seeds])
    neg_src, neg_dst = nodes[y[50:, 0]], nodes[y[50:, 1]]
    found = targets.train_lookup.find(neg_src, neg_dst, y[50:, 3])
    assert (found < 0).all()


# ------------------------------------------------------------------------------ DistMult
def test_distmult_scores_a_diagonal_per_relation():
    torch.manual_seed(0)
    dec = DistMultDecoder(3, 4).double()
    with torch.no_grad():
        dec.weight.copy_(torch.randn(3, 4, dtype=torch.float64))
    hs, ht = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    rel = torch.tensor([0, 2, 1, 2, 0])
    by_hand = torch.stack([(hs[i] * dec.weight[rel[i]] * ht[i]).sum() for i in range(5)])
    torch.testing.assert_close(dec(hs, ht, rel), by_hand)
    torch.testing.assert_close(dec(ht, hs, rel), by_hand)  # symmetric
    cand = torch.randn(5, 7, 4, dtype=torch.float64)
    cand[:, 2] = ht
    torch.testing.assert_close(dec.score_candidates(hs, cand, rel)[:, 2], by_hand)
    emb = torch.randn(9, 4, dtype=torch.float64)
    all_scores = dec.score_all(hs, emb, rel)
    torch.testing.assert_close(all_scores[:, 3], dec(hs, emb[3].expand(5, 4), rel))
    with pytest.raises(ValueError, match="needs each pair's relation"):
        dec(hs, ht)
    assert torch.equal(DistMultDecoder(1, 4)(hs, ht), (hs * ht).sum(-1))  # starts as the dot


def test_distmult_is_a_trained_head_and_needs_a_system_that_trains_one(tmp_path, monkeypatch):
    """The module registers the decoder (a weight per relation of the graph); a system
    without ``TRAINS_TASK_HEAD`` refuses ``task.decoder=distmult``, one without
    ``FILTERED_RANKING`` the filtered evaluation, before any rank (every registered system
    trains heads now: SANCUS is made one that does not)."""
    from lightning_gnnscale.systems.sancus.config import SancusConfig

    monkeypatch.setattr(SancusConfig, "TRAINS_TASK_HEAD", False)
    dm = make_datamodule("single", TYPED)
    model = gs.ModelConfig(name="rgcn", hidden=8, num_layers=2, dropout=0.0)
    module = gs.GNNModule.from_config(model, dm)
    assert isinstance(module.head, DistMultDecoder) and module.head.weight.shape == (3, 64)
    assert module.task.decoder is module.head
    from lightning_gnnscale.config_types import registered_systems

    configs = registered_systems()
    for name in ("single", "sancus", "hopgnn"):  # both flags, neither, a head but no filter
        for setting, flag in (
            ("task.decoder=distmult", "TRAINS_TASK_HEAD"),
            ("task.evaluation=filtered", "FILTERED_RANKING"),
        ):
            cfg = make_cfg(tmp_path, f"strategy={name}", "task=link_prediction", setting)
            if getattr(configs[name], flag):
                run_config(cfg)
            else:
                with pytest.raises(ConfigError, match=f"{setting}: strategy={name} does not"):
                    run_config(cfg)
    with pytest.raises(ConfigError, match="task.evaluation=filtered ranks against every node"):
        TaskConfig("link_prediction", evaluation="filtered", eval_negatives=500)


# ------------------------------------------------------------------------ filtered ranking
def test_filtered_ranks_by_hand_with_ties():
    """Row 0: the answer (2.0) among 3.0, a tie 2.0, 1.0, and a filtered 5.0: rank
    1 + (1 + 2) / 2 = 2.5 (unfiltered it would be 4). Row 1: answer 1.0, two filtered
    candidates, a kept tie and a kept 0.0: 1 + (0 + 1) / 2 = 1.5."""
    pos = torch.tensor([2.0, 1.0])
    scores = torch.tensor([[3.0, 2.0, 2.0, 1.0, 5.0], [1.0, 1.0, 1.0, 1.0, 0.0]])
    filtered = torch.tensor([[0, 1, 0, 0, 1], [1, 1, 0, 1, 0]], dtype=torch.bool)
    stats = filtered_ranking_statistics(pos, scores, filtered)
    assert stats.tolist() == [2.0, 1 / 2.5 + 1 / 1.5, 0.0, 2.0, 2.0]
    assert ranking_metrics(stats)["mrr"] == pytest.approx((0.4 + 2 / 3) / 2)


def test_the_filtered_evaluation_of_a_hand_made_knowledge_graph():
    """4 entities, 2 relations, 1-D embeddings ``[1, 1, 2, 3]`` and the dot decoder. Test
    triple ``(0, r1, 3)``: as tail its true neighbours 1, 2 of ``(0, r1, ?)`` are filtered and
    entity 0 (score 1 < 3) stays: rank 1; as head, ``(1, r0, 3)`` and ``(2, r0, 3)`` are of
    another relation and stay: scores 3 (a tie), 6, 9 against 3: rank 1 + (2 + 3) / 2 = 3.5."""
    edges = torch.tensor([[0, 0, 1, 2, 3, 0], [1, 2, 3, 3, 0, 3]])
    kinds = torch.tensor([1, 1, 0, 0, 0, 1])
    split = {(0, 1): 0, (0, 2): 0, (1, 3): 0, (2, 3): 0, (3, 0): 1, (0, 3): 2}
    graph = Graph.from_edge_index(
        edges, 4, edge_type=kinds, relations=("r0", "r1"), x=torch.eye(4), name="hand"
    )
    src, dst = graph.edge_index()
    edge_split = torch.tensor([split[(s, d)] for s, d in zip(src.tolist(), dst.tolist())])
    from lightning_gnnscale.graph.node_targets import NodeTargets

    empty = torch.zeros(4, dtype=torch.bool)
    rows = NodeTargets(torch.full((4,), -1), empty, empty, empty, 0)
    dataset = NodeDataset(graph, rows, edge_split.to(torch.int8))
    task = build_task(TaskConfig("link_prediction", evaluation="filtered"))
    targets = task.prepare(dataset, 0)
    emb = torch.tensor([[1.0], [1.0], [2.0], [3.0]], dtype=torch.float64)
    stats = task.link_statistics(lambda stage: emb, targets, ("test",), 0, 1)[0]
    metrics = task.metric_values(stats)
    assert stats[2] == 2  # one triple, two directions
    assert metrics["mrr"] == pytest.approx((1 + 1 / 3.5) / 2)
    assert [metrics[f"hits@{k}"] for k in (1, 3, 10)] == [0.5, 0.5, 1.0]
    with pytest.raises(ConfigError, match="carries its own edge split"):
        build_task(TaskConfig("link_prediction", test_fraction=0.2)).prepare(dataset, 0)


# ---------------------------------------------------------------- single vs ddp, float64
def _step(dm, net, epoch, step):
    net.zero_grad()
    dm.task.decoder.zero_grad()
    batch = dm.make_batch(epoch, step)
    loss = dm.task.loss_sum(net(batch.blocks, batch.x), batch.y) / batch.global_seed_count
    loss.backward()
    params = [*net.parameters(), *dm.task.decoder.parameters()]
    return loss.detach(), torch.cat([p.grad.flatten() for p in params])


def test_ddp_ranks_sum_to_single_in_float64_on_typed_link_prediction():
    """RGCN + DistMult on a directed typed graph: 2 unsalted ``ddp`` ranks' step losses and
    gradients (net and decoder) sum to ``single``'s, and their filtered evaluation statistics
    sum to one process's."""
    single, ddp = make_datamodule("single", TYPED), make_datamodule("ddp", TYPED)
    torch.manual_seed(0)
    net = BlockGNN("rgcn", 6, 16, 64, 2, dropout=0.0, num_relations=single.num_relations).double()
    head = single.task.trained_head().double()
    ddp.task.decoder = head
    with torch.no_grad():
        head.weight.normal_()
    epoch, step = 1, single.steps_per_epoch - 1
    loss, grad = _step(single, net, epoch, step)
    losses, grads = [], []
    for rank in range(2):
        ddp.rank, ddp.world_size = rank, 2
        rank_loss, rank_grad = _step(ddp, net, epoch, step)
        losses.append(rank_loss)
        grads.append(rank_grad)
    torch.testing.assert_close(sum(losses), loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(sum(grads), grad, rtol=1e-10, atol=1e-13)
    emb = torch.randn(single.graph.num_nodes, 64, dtype=torch.float64)
    one = single.task.link_statistics(lambda s: emb, single.targets, ("val", "test"), 0, 1)
    two = sum(
        ddp.task.link_statistics(lambda s: emb, ddp.targets, ("val", "test"), r, 2)
        for r in range(2)
    )
    torch.testing.assert_close(two, one, rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------ Kinships
def _pykeen_kinships() -> Path:
    found = importlib.util.find_spec("pykeen")
    if found is None or found.origin is None:
        pytest.skip("the pykeen wheel is not installed (scripts/install.sh installs it)")
    return Path(found.origin).parent / "datasets" / "kinships"


def _scripts(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kinships(tmp_path_factory) -> Path:
    folder = _pykeen_kinships()
    out = tmp_path_factory.mktemp("kinships") / "kinships"
    _scripts("kinships").build(out)
    assert folder.is_dir()
    return out


def test_kinships_loads_as_a_typed_graph_with_pykeens_split(kinships):
    """Every triple of PyKEEN's three files is one edge, of its relation, in its file's split
    (a pair related several ways keeps every relation); the graph is typed, named by the
    metadata's relations; identity features."""
    from lightning_gnnscale.graph.constructed import node_ids
    from lightning_gnnscale.graph.datasets import load_dataset

    folder = _pykeen_kinships()
    files = {"train": 0, "valid": 1, "test": 2}
    expected = {
        (*line.split("\t"),): code
        for part, code in files.items()
        for line in (folder / f"{part}.txt").read_text().splitlines()
        if line
    }
    data = load_dataset("constructed", root=kinships)
    g = data.graph
    assert g.is_typed and g.num_relations == 25 and g.num_nodes == 104
    assert g.num_edges == len(expected) == 10_686
    names = node_ids(kinships).to_pylist()
    src, dst = g.edge_index()
    got = {
        (names[s], g.relations[r], names[d]): int(k)
        for s, r, d, k in zip(src.tolist(), g.edge_type.tolist(), dst.tolist(), data.edge_split)
    }
    assert got == expected
    assert torch.equal(g.x, torch.eye(104))
    from lightning_gnnscale.graph.dataset_config import dataset_config

    assert dataset_config("constructed", root=str(kinships)).is_typed


def test_a_triple_in_two_splits_is_refused(tmp_path):
    from lightning_gnnscale.construct import ConstructError, construct
    from tests.test_construct import write_spec

    rows = "a\tr\tb\nb\tr\tc\n"
    (tmp_path / "train.tsv").write_text(rows)
    (tmp_path / "test.tsv").write_text("c\tr\ta\nb\tr\tc\n")
    table = {"format": "tsv", "column_names": ["h", "r", "t"], "src": "h", "dst": "t", "type": "r"}
    spec = {
        "id_type": "str",
        "edges": [
            {**table, "file": str(tmp_path / "train.tsv"), "split": "train"},
            {**table, "file": str(tmp_path / "test.tsv"), "split": "test"},
        ],
    }
    with pytest.raises(ConstructError, match=r"test.tsv.*row 2.*another split"):
        construct(write_spec(tmp_path, spec), tmp_path / "out", log=lambda *_: None)


def test_a_typed_constructed_dataset_is_refused_before_spawn_where_untyped(
    tmp_path, kinships, monkeypatch
):
    """A typed constructed folder is known typed from its metadata: a system that does not
    train link prediction on typed graphs (SANCUS, made one: every registered system trains it
    now) refuses it before any rank starts."""
    from lightning_gnnscale.systems.sancus.config import SancusConfig

    monkeypatch.setattr(SancusConfig, "TYPED_LINK_PREDICTION", False)
    cfg = make_cfg(
        tmp_path,
        "strategy=sancus",
        "task=link_prediction",
        "dataset=constructed",
        f"dataset.root={kinships}",
        tiny=False,
    )
    with pytest.raises(ConfigError, match=r"link prediction on a typed graph.*strategy=sancus"):
        run_config(cfg)


def test_the_popularity_script_agrees_with_the_suites_filtered_metric(kinships):
    """The script's own numpy ranking and the task's filtered statistics, given degree
    scores (a 1-D embedding of the degree and a constant 1 for the query: the dot product
    scores every candidate by its degree), give the same MRR and Hits@K."""
    from lightning_gnnscale.graph.datasets import load_dataset

    script = _scripts("kg_popularity").popularity(str(kinships), "test")
    data = load_dataset("constructed", root=kinships)
    task = build_task(TaskConfig("link_prediction", evaluation="filtered"))
    targets = task.prepare(data, 0)
    train = targets.split.train_pos
    degree = torch.bincount(train.flatten(), minlength=104).double()
    emb = torch.stack([degree, torch.ones(104, dtype=torch.float64)], 1)
    task.decoder = _QueryOnes()
    metrics = task.metric_values(task.link_statistics(lambda s: emb, targets, ("test",), 0, 1)[0])
    assert script["rankings"] == 2 * 1074
    for key in ("mrr", "hits@1", "hits@3", "hits@10"):
        assert metrics[key] == pytest.approx(script[key], abs=1e-12), key


class _QueryOnes(torch.nn.Module):
    """Scores a candidate by its first column (the query's row is ignored)."""

    def score_all(self, h_query, emb, rel=None):
        return emb[:, 0].expand(h_query.shape[0], -1)

    def score_candidates(self, h_src, h_cand, rel=None):
        return h_cand[..., 0]


def test_a_short_kinships_run_beats_popularity_twice_over(tmp_path, kinships):
    """``experiment=kinships`` (RGCN + DistMult, filtered evaluation), shortened: its test
    MRR is at least twice the popularity baseline's (scripts/kg_popularity.py)."""
    from lightning_gnnscale.run import train

    baseline = _scripts("kg_popularity").popularity(str(kinships), "test")["mrr"]
    cfg = make_cfg(
        tmp_path,
        "strategy=single",
        "task=link_prediction",
        "dataset=constructed",
        f"dataset.root={kinships}",
        "experiment=kinships",
        "trainer.max_epochs=15",
        "trainer.enable_progress_bar=false",
        "logger=none",
        tiny=False,
    )
    metrics, _ = train(cfg)
    assert metrics["test_mrr"] >= 2 * baseline, (metrics["test_mrr"], baseline)
