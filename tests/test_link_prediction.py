"""``task=link_prediction``: leakage, exactness across ranks, evaluation split across ranks,
the metrics against a brute-force count, the run's summary, the recipe and bad values
(docs/tasks.md, "Link prediction")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import lightning_gnnscale as gs
from lightning_gnnscale.config_types import DataConfig, run_config
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.systems.registry import SYSTEMS
from lightning_gnnscale.tasks import TaskConfig, build_task
from tests.helpers.config import make_cfg

LINK_SYSTEMS = [name for name, spec in SYSTEMS.items() if "link_prediction" in spec.tasks]
# systems whose make_batch samples blocks without a rank's set-up (the others check leakage in
# their own tests: tests/systems/<name>/)
BLOCK_SYSTEMS = [name for name in LINK_SYSTEMS if name in ("single", "ddp")]
FANOUTS = [4, 3]


def make_dataset():
    return sbm(num_nodes=300, num_classes=3, avg_degree=8.0, num_features=10, seed=5).to(
        torch.float64
    )


def make_datamodule(name: str, task: TaskConfig | None = None, batch_size: int = 96):
    _, DataModule, config = gs.system(name)
    if name == "ddp":
        config = type(config)(salt_by_rank=False)
    return DataModule(
        make_dataset(),
        config,
        DataConfig(batch_size=batch_size, fanouts=FANOUTS),
        seed=7,
        task=task or TaskConfig("link_prediction"),
    )


def evaluation_pairs(split) -> set[tuple[int, int]]:
    pairs = torch.cat([split.val_pos, split.test_pos], 1)
    both = torch.cat([pairs, pairs.flip(0)], 1)
    return set(map(tuple, both.t().tolist()))


def test_link_prediction_systems_are_listed():
    """Every registered strategy trains link prediction (the issue's target: none refuses)."""
    assert set(LINK_SYSTEMS) == set(SYSTEMS)


@pytest.mark.parametrize("name", BLOCK_SYSTEMS)
def test_no_evaluation_edge_reaches_a_training_block(name):
    """Every edge of every block of every step of two epochs, on each of 2 ranks: none joins
    the endpoints of a validation or test pair, in either direction."""
    dm = make_datamodule(name)
    held_out = evaluation_pairs(dm.targets.split)
    assert held_out
    ranks = 2 if name == "ddp" else 1
    edges = 0
    for rank in range(ranks):
        dm.rank, dm.world_size = rank, ranks
        for epoch in range(2):
            for step in range(dm.steps_per_epoch):
                for block in dm.make_batch(epoch, step).blocks:
                    src, dst = block.edge_index
                    pairs = torch.stack([block.src_ids[src], block.dst_ids[dst]], 1)
                    edges += pairs.shape[0]
                    assert not held_out & set(map(tuple, pairs.tolist()))
    assert edges > 1000


def _step_gradient(dm, net, epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, flat gradient)`` of this rank's share of one step."""
    net.zero_grad()
    batch = dm.make_batch(epoch, step)
    out = net(batch.blocks, batch.x)
    loss = dm.task.loss_sum(out, batch.y) / batch.global_seed_count
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in net.parameters()])


@pytest.mark.parametrize("negatives", ["uniform", "joint"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_sum_to_the_one_process_step_in_float64(negatives, world_size):
    """ddp's ranks (unsalted keys) each take a share of a step's positive pairs and draw the
    same negatives as one process: their losses and gradients sum to ``single``'s."""
    task = TaskConfig("link_prediction", negatives=negatives, num_negatives=3)
    single, ddp = make_datamodule("single", task), make_datamodule("ddp", task)
    torch.manual_seed(0)
    net = BlockGNN("sage", 10, 16, 8, 2, dropout=0.0).double()
    epoch, step = 1, single.steps_per_epoch - 1  # the short last step
    assert single.train_ids.numel() % single.batch_size
    loss, grad = _step_gradient(single, net, epoch, step)
    losses, grads = [], []
    for rank in range(world_size):
        ddp.rank, ddp.world_size = rank, world_size
        rank_loss, rank_grad = _step_gradient(ddp, net, epoch, step)
        losses.append(rank_loss)
        grads.append(rank_grad)
    torch.testing.assert_close(sum(losses), loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(sum(grads), grad, rtol=1e-10, atol=1e-13)


def test_the_evaluation_split_across_ranks_sums_to_one_process(monkeypatch):
    """``link_statistics`` on 1 rank, summed over 3, and scored in chunks of 3 edges: equal
    counts and metrics; validation embeds over the training edges, test over training and
    validation edges."""
    import lightning_gnnscale.tasks.link_prediction as link

    dm = make_datamodule("single")
    torch.manual_seed(0)
    emb = torch.randn(dm.graph.num_nodes, 8, dtype=torch.float64)
    task, targets = dm.task, dm.targets
    seen = []

    def embed(stage):
        seen.append(stage)
        return emb

    splits = ("val", "test")
    one = task.link_statistics(embed, targets, splits, 0, 1)
    split = targets.split
    assert seen == ["train", "test"]
    train, test = (task.stage_graph(dm.graph, targets, stage) for stage in seen)
    assert (train.indptr, train.indices) == split.structure("train")
    assert (test.indptr, test.indices) == split.structure("test")
    assert train.num_edges + 2 * split.val_pos.shape[1] == test.num_edges
    three = sum(task.link_statistics(lambda s: emb, targets, splits, r, 3) for r in range(3))
    torch.testing.assert_close(three, one, rtol=1e-12, atol=0)
    monkeypatch.setattr(link, "SCORED_ELEMENTS", 3 * 100 * 8)  # 3 edges' candidates at once
    chunked = task.link_statistics(lambda s: emb, targets, splits, 0, 1)
    torch.testing.assert_close(chunked, one, rtol=1e-12, atol=0)
    for name, row in zip(splits, one):
        assert row[2] == split.positives(name).shape[1] > 3  # every edge counted once


def test_metrics_equal_a_brute_force_count():
    """AUC: every positive against every edge's first fixed negative, ties 1/2; MRR and
    Hits@K: each positive's rank among its own 100, OGB's tie rule (a loop per edge)."""
    from lightning_gnnscale.tasks.link.negatives import evaluation_negatives

    dm = make_datamodule("single")
    task, targets = dm.task, dm.targets
    emb = torch.randint(-2, 3, (dm.graph.num_nodes, 4)).to(torch.float64)  # many ties
    metrics = task.metric_values(task.link_statistics(lambda s: emb, targets, ("val",), 0, 1)[0])
    pos = targets.split.val_pos
    negs = evaluation_negatives(
        pos[0], torch.arange(pos.shape[1]), targets.num_nodes, seed=7, split="val", m=100
    )
    score = lambda a, b: float((emb[a] * emb[b]).sum())  # noqa: E731
    pos_scores = [score(s, d) for s, d in pos.t().tolist()]
    neg0 = [score(s, int(n[0])) for s, n in zip(pos[0].tolist(), negs)]
    wins = sum((p > q) + 0.5 * (p == q) for p in pos_scores for q in neg0)
    assert metrics["auc"] == pytest.approx(wins / (len(pos_scores) * len(neg0)), abs=1e-12)
    ranks = []
    for i, (s, p) in enumerate(zip(pos[0].tolist(), pos_scores)):
        scores = [score(s, int(n)) for n in negs[i]]
        better = sum(q > p for q in scores)
        tied = sum(q == p for q in scores)
        ranks.append(1 + better + tied / 2)
    assert metrics["mrr"] == pytest.approx(sum(1 / r for r in ranks) / len(ranks), abs=1e-12)
    for k in (1, 3, 10):
        assert metrics[f"hits@{k}"] == pytest.approx(sum(r <= k for r in ranks) / len(ranks))


def test_train_py_reports_the_link_metrics(tmp_path):
    """``task=link_prediction`` through ``train.py``: the task's metrics in ``summary.json``,
    the best epoch picked by validation MRR."""
    from lightning_gnnscale.run import train

    cfg = make_cfg(tmp_path, "strategy=single", "task=link_prediction", "trainer.max_epochs=3")
    metrics, objects = train(cfg)
    summary = json.loads((Path(objects["output_dir"]) / "summary.json").read_text())
    for split in ("val", "test"):
        for name in ("auc", "mrr", "hits@1", "hits@3", "hits@10"):
            assert 0.0 <= summary[f"{split}_{name}"] <= 1.0, (split, name)
    history = summary["history"]
    assert summary["best_val_mrr"] == max(e["val_mrr"] for e in history)
    best = max(history, key=lambda e: e["val_mrr"])
    assert summary["test_auc"] == best["test_auc"]
    assert metrics["best_val_mrr"] == summary["best_val_mrr"]


def test_the_cora_recipe_is_pygs_link_prediction_recipe(tmp_path):
    """``task=link_prediction dataset=cora``: GCN 128 -> 64, no dropout or weight decay,
    Adam 0.01, 100 full-batch epochs, Glorot weights; another model keeps the recipe."""
    run = run_config(make_cfg(tmp_path, "task=link_prediction", "dataset=cora", tiny=False))
    assert (run.model.name, run.model.hidden, run.model.num_layers) == ("gcn", 128, 2)
    assert (run.model.dropout, run.model.weight_decay, run.model.lr) == (0.0, 0.0, 0.01)
    assert (run.task.embedding_dim, run.trainer.max_epochs) == (64, 100)
    assert (run.data.batch_size, run.data.fanouts) == (-1, [-1, -1])
    node = run_config(make_cfg(tmp_path, "dataset=cora", tiny=False))
    assert (node.model.hidden, node.trainer.max_epochs) == (64, 200)
    sage = run_config(
        make_cfg(tmp_path, "task=link_prediction", "dataset=cora", "model=sage", tiny=False)
    )
    assert (sage.model.name, sage.model.hidden, sage.model.dropout) == ("sage", 128, 0.0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["task.num_negatives=0"], r"task.num_negatives=0 must be in \[1, 10000\]"),
        (["task.eval_negatives=10"], r"task.eval_negatives=10 must be in \[11, 10000\]"),
        (["task.negatives=hard"], r"task.negatives.*'hard'.*uniform"),
        (["task.val_fraction=0.6", "task.test_fraction=0.5"], "must be below 1"),
        (["task.embedding_dim=0"], r"task.embedding_dim=0 must be in"),
        (["task.negatives=joint", "task.filter_negatives=true"], "filters uniform negatives only"),
    ],
)
def test_bad_link_settings_fail_at_compose(tmp_path, settings, message):
    with pytest.raises(ConfigError, match=message):
        run_config(make_cfg(tmp_path, "strategy=single", "task=link_prediction", *settings))


def test_a_link_setting_on_a_node_task_is_refused():
    with pytest.raises(ConfigError, match="task.num_negatives: link_prediction settings"):
        TaskConfig("node_classification", num_negatives=5)


def test_a_system_without_link_prediction_refuses_before_spawn(tmp_path):
    """Refused when the run is typed (before any rank starts), naming the systems that train
    link prediction; every registered system trains it, so a system without it is a subclass
    of one that does."""
    able = sorted(LINK_SYSTEMS)

    class SingleWithoutLinks(type(SYSTEMS["single"].config_type())):
        TASKS = ("node_classification",)

    with pytest.raises(ConfigError, match=rf"strategies that train it: {re.escape(str(able))}"):
        SingleWithoutLinks().check_task("link_prediction")
    for name in sorted(set(SYSTEMS) - set(LINK_SYSTEMS)):  # through train.py's config
        with pytest.raises(ConfigError, match=rf"strategies that train it: {re.escape(str(able))}"):
            run_config(make_cfg(tmp_path, f"strategy={name}", "task=link_prediction"))


def test_build_task_takes_the_settings():
    task = build_task(TaskConfig("link_prediction", num_negatives=4))
    assert task.pairs_per_positive() == 5 and task.loss_terms(10) == 50


def test_a_checkpoint_written_before_the_link_settings_resumes_as_node_classification(tmp_path):
    """A run identity without ``model.init`` and the ``task.*`` link settings (checkpoints
    written before they existed) is node classification's with the torch init; a link
    prediction run differs from it."""
    from lightning_gnnscale.checkpoints import identity_differences

    node = run_config(make_cfg(tmp_path)).identity
    link_settings = ["val_fraction", "test_fraction", "undirected", "negatives", "num_negatives"]
    link_settings += ["filter_negatives", "eval_negatives", "embedding_dim"]
    added = ["model.init", "task.name", *(f"task.{key}" for key in link_settings)]
    old = {k: v for k, v in node.items() if k not in added}
    assert len(old) == len(node) - len(added)
    assert identity_differences(node, old) == []
    link = run_config(make_cfg(tmp_path, "strategy=single", "task=link_prediction")).identity
    assert "task.name: checkpoint 'node_classification'" in " ".join(
        identity_differences(link, old)
    )


def test_filtered_negatives_are_never_training_edges():
    """``task.filter_negatives=true``: no negative of any step is a training edge or its own
    source; unfiltered, some are (the test graph is dense enough for both)."""

    def negatives(filtered: bool) -> set[tuple[int, int]]:
        task = TaskConfig("link_prediction", num_negatives=8, filter_negatives=filtered)
        dm = make_datamodule("single", task)
        found = set()
        for step in range(dm.steps_per_epoch):
            batch = dm.make_batch(0, step)
            nodes = batch.blocks[-1].dst_ids
            neg = batch.y[batch.y[:, 2] == 0]
            found |= set(zip(nodes[neg[:, 0]].tolist(), nodes[neg[:, 1]].tolist()))
        return found

    dm = make_datamodule("single")
    train = dm.targets.split.train_pos
    true = set(map(tuple, torch.cat([train, train.flip(0)], 1).t().tolist()))
    assert negatives(False) & true
    filtered = negatives(True)
    assert not filtered & true and all(s != d for s, d in filtered)


def test_a_split_without_validation_pairs_is_refused():
    dm = make_datamodule("single", TaskConfig("link_prediction", val_fraction=1e-4))
    with pytest.raises(ConfigError, match=r"task.val_fraction=0.0001 leaves no val pair"):
        dm.task.prepare(dm.node_dataset, 7)


def test_the_init_follows_the_model(tmp_path):
    """Glorot for the suite's layers under link prediction; a custom model keeps its own;
    SANCUS's own layers draw as the suite's."""
    custom = ["model=custom", "model.target=torch_geometric.nn.models.GraphSAGE"]
    run = run_config(make_cfg(tmp_path, "strategy=single", "task=link_prediction", *custom))
    assert (run.model.name, run.model.init) == ("custom", None)
    sancus = make_datamodule("sancus").build_model(gs.ModelConfig(hidden=8, dropout=0.0))
    assert sancus.init == "glorot"
    model = gs.ModelConfig(hidden=8)  # a plain script's: init unset, the task's
    assert make_datamodule("single").build_model(model).init == "glorot"
    torch_init = gs.ModelConfig(hidden=8, init="torch")
    assert make_datamodule("single").build_model(torch_init).init == "torch"
    node = gs.system("single")[1](
        make_dataset(), gs.system("single")[2], DataConfig(fanouts=FANOUTS)
    )
    assert node.build_model(model).init == "torch"


def test_a_step_of_too_many_pairs_is_refused_before_any_rank(tmp_path):
    """Every training pair in one step with 10,000 negatives each: refused by the
    DataModule's ``prepare`` (the launcher's, before spawn), naming both settings."""
    from lightning_gnnscale.run import build_datamodule

    settings = ["strategy=single", "task=link_prediction", "task.num_negatives=10000"]
    run = run_config(make_cfg(tmp_path, *settings, "data.batch_size=-1", "dataset.num_nodes=5000"))
    with pytest.raises(ConfigError, match=r"lower data.batch_size .* or task.num_negatives"):
        build_datamodule(run).prepare(1)
    small = run_config(make_cfg(tmp_path, *settings, "data.batch_size=64"))
    build_datamodule(small).prepare(1)


def _target_pairs_in_blocks(dm, epoch: int, step: int) -> int:
    """Block edges of the step joining a positive pair of the step (either direction)."""
    seeds = dm.batcher().step_seeds(epoch, step)
    pos = dm.targets.split.train_pos[:, seeds]
    targets = set(map(tuple, torch.cat([pos, pos.flip(0)], 1).t().tolist()))
    found = 0
    for block in dm.make_batch(epoch, step).blocks:
        src, dst = block.edge_index
        pairs = torch.stack([block.src_ids[src], block.dst_ids[dst]], 1)
        found += len(targets & set(map(tuple, pairs.tolist())))
    return found


def test_graphstorm_exclusion_leaves_a_steps_targets_out_of_its_blocks():
    """``task.exclude_target_edges=true``: no block of a step joins one of the step's positive
    pairs, in either direction (without it, blocks do); ddp's unsalted ranks, each leaving out
    the whole step's pairs, still sum to ``single``'s step."""
    plain, excluding = (
        TaskConfig("link_prediction", exclude_target_edges=flag) for flag in (False, True)
    )
    steps = make_datamodule("single", plain).steps_per_epoch
    assert sum(
        _target_pairs_in_blocks(make_datamodule("single", plain), 0, s) for s in range(steps)
    )
    single = make_datamodule("single", excluding)
    assert all(_target_pairs_in_blocks(single, 0, s) == 0 for s in range(steps))
    ddp = make_datamodule("ddp", excluding)
    torch.manual_seed(0)
    net = BlockGNN("sage", 10, 16, 8, 2, dropout=0.0).double()
    loss, grad = _step_gradient(single, net, 0, 1)
    losses, grads = [], []
    for rank in range(2):
        ddp.rank, ddp.world_size = rank, 2
        rank_loss, rank_grad = _step_gradient(ddp, net, 0, 1)
        losses.append(rank_loss)
        grads.append(rank_grad)
    torch.testing.assert_close(sum(losses), loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(sum(grads), grad, rtol=1e-10, atol=1e-13)


def test_graphstorm_exclusion_is_refused_where_a_system_cannot_honour_it(tmp_path):
    """A strategy whose blocks do not leave out a step's targets refuses the setting before
    any rank starts, naming the strategies that do; a node task refuses it as any link
    setting."""
    able = sorted(n for n, s in SYSTEMS.items() if s.config_type.EXCLUDES_TARGET_EDGES)
    assert set(able) >= {"ddp", "single"}
    refusal = rf"strategy=single does not leave .* strategies that do: {re.escape(str(able))}"

    class SingleWithoutExclusion(type(SYSTEMS["single"].config_type())):
        EXCLUDES_TARGET_EDGES = False

    excluding = TaskConfig("link_prediction", exclude_target_edges=True)
    with pytest.raises(ConfigError, match=refusal):
        SingleWithoutExclusion().check_task(excluding)

    class SingleWithoutHead(type(SYSTEMS["single"].config_type())):
        TRAINS_TASK_HEAD = False

    with pytest.raises(ConfigError, match=r"task.decoder=mlp: strategy=single does not train"):
        SingleWithoutHead().check_task(TaskConfig("link_prediction", decoder="mlp"))
    SingleWithoutExclusion().check_task(TaskConfig("link_prediction"))
    settings = ["task=link_prediction", "task.exclude_target_edges=true"]
    for name in LINK_SYSTEMS:  # through train.py's config, before any rank starts
        if name not in able:
            with pytest.raises(ConfigError, match=f"strategy={name} does not leave"):
                run_config(make_cfg(tmp_path, f"strategy={name}", *settings))
    with pytest.raises(ConfigError, match="task.exclude_target_edges: link_prediction settings"):
        TaskConfig("node_classification", exclude_target_edges=True)


def test_the_mlp_decoder_trains_with_the_net_and_ddp_equals_single(tmp_path):
    """``task.decoder=mlp``: the decoder's weights are the module's (in the checkpoint, moved
    by the optimiser), and 2 ``ddp`` ranks (unsalted keys, float64) end with ``single``'s net
    and decoder: its gradients are synced with the net's."""
    from lightning_gnnscale.run import train
    from tests.systems.conformance import weights

    common = ["task=link_prediction", "task.decoder=mlp", "dtype=float64", "model.dropout=0.0"]
    common += ["trainer.max_epochs=2"]
    runs = {}
    for name, extra in (("single", []), ("ddp", ["strategy.salt_by_rank=false"])):
        metrics, objects = train(make_cfg(tmp_path / name, f"strategy={name}", *common, *extra))
        runs[name] = weights(Path(objects["output_dir"]))
        assert 0.0 < metrics["test_auc"] <= 1.0
    single, ddp = runs["single"], runs["ddp"]
    head = [key for key in single if key.startswith("head.")]
    assert len(head) == 4  # two linear layers: weight and bias each
    assert single.keys() == ddp.keys()
    for key in single:
        torch.testing.assert_close(ddp[key], single[key], rtol=0, atol=1e-9, msg=key)
    fresh = build_task(TaskConfig("link_prediction", decoder="mlp"))
    torch.manual_seed(0)
    init = fresh.trained_head().double().state_dict()
    assert not all(torch.equal(init[k[5:]], single[k]) for k in head)  # trained


def test_a_negative_equal_to_the_destination_ties_with_the_positive():
    """OGB's tie rule on the fixed negatives: a negative that is the positive's own
    destination scores exactly as the positive (one kernel for both), so it counts as half a
    better candidate whatever the embeddings' last bits (random float32 rows, where the
    decoder's pairwise sum and the candidates' product differ in the last bit)."""
    from lightning_gnnscale.tasks.link.metrics import ranking_statistics

    task = build_task(TaskConfig("link_prediction"))
    generator = torch.Generator().manual_seed(0)
    h_src = torch.randn(500, 64, generator=generator)
    h_cand = torch.randn(500, 20, 64, generator=generator)
    h_dst = h_cand[:, 3].clone()  # every positive's destination is also its 4th negative
    pos = task.pair_scores(h_src, h_dst)
    neg = task.decoder.score_candidates(h_src, h_cand)
    assert torch.equal(pos, neg[:, 3])
    assert (task.decoder(h_src, h_dst) != pos).any()  # the pairwise kernel would break ties
    stats = ranking_statistics(pos, neg)
    rank = 1 + (neg > pos.unsqueeze(1)).sum(1) + (neg == pos.unsqueeze(1)).sum(1) / 2
    assert stats[1] == pytest.approx(float((1 / rank.double()).sum()), rel=1e-12)
    assert bool((rank >= 1.5).all())  # the tie is half a place


def test_a_partition_directory_is_bound_to_its_edge_split():
    """Every system that trains from a partition directory records the split's settings in
    it (the task's ``partition_settings``), so a run with other fractions is refused."""
    names = [n for n in LINK_SYSTEMS if SYSTEMS[n].supports_partition_dir]
    assert len(names) >= 7
    for name in names:
        expected = [
            make_datamodule(
                name, TaskConfig("link_prediction", val_fraction=v)
            ).partition_expectation(2)
            for v in (0.05, 0.2)
        ]
        assert expected[0]["link_split"]["val_fraction"] == 0.05, name
        assert expected[0] != expected[1], name


def test_the_module_must_score_with_the_datamodules_decoder(tmp_path):
    """A module built on its own task (the same settings, another object) would train an MLP
    decoder that evaluation never sees: refused when the Trainer binds them; so is a module
    whose task settings differ."""
    import lightning as L

    task = TaskConfig("link_prediction", decoder="mlp")
    for module_task in (task, TaskConfig("link_prediction")):
        dm = make_datamodule("single", task)
        net = BlockGNN("sage", 10, 16, 8, 2, dropout=0.0).double()
        module = gs.GNNModule(net, task=module_task)
        trainer = L.Trainer(
            strategy="single",
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        with pytest.raises(ConfigError, match="the DataModule's"):
            trainer.fit(module, datamodule=dm)
