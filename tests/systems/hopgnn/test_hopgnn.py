"""HopGNN's planner, golden toy example and config (pure; no processes)."""

from __future__ import annotations

import pytest
import torch
from hydra.errors import ConfigCompositionException

from lightning_gnnscale.config_types import run_config
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.partition import partition
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.preflight import validate
from lightning_gnnscale.systems.hopgnn import HopGNNConfig, micrograph_plan, model_centric_plan
from lightning_gnnscale.systems.hopgnn.costmodel import (
    CostParams,
    gcn_param_count,
    iteration_rows,
    naive_bytes,
    p3_bytes,
    table,
)
from lightning_gnnscale.systems.hopgnn.merging import MergeController, modeled_epoch_seconds
from lightning_gnnscale.systems.hopgnn.planner import remote_row_counts, sample_steps
from tests.helpers.config import make_cfg

# ------------------------------------------------------------------ golden toy (spec §4.6)
IN_NEIGHBOURS = {0: [2, 3], 1: [0], 2: [3], 3: [2, 4], 4: [0, 5], 5: [1, 7], 6: [5, 7], 7: [6]}
TOY_PART = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0])  # 0-3 on server 1, 4-7 on server 0
TOY_SEEDS = torch.tensor([6, 3, 5, 0])  # B_0 = {6, 3}, B_1 = {5, 0}


def toy_graph() -> Graph:
    edges = torch.tensor([[u, v] for v, us in IN_NEIGHBOURS.items() for u in us]).T
    n = 8
    return Graph.from_edge_index(
        edges,
        n,
        x=torch.eye(n),
    )


def toy_sampler() -> NeighborSampler:
    g = toy_graph()
    return NeighborSampler(g.indptr, g.indices, [2, 2], seed=0)


def test_golden_toy_remote_rows():
    """Model-centric 8 remote rows; HopGNN 6 without pre-gathering (server 0: 3), 4 with it
    (server 0: 2)."""
    sampler = toy_sampler()
    mc = model_centric_plan(TOY_SEEDS, 2)
    hop = micrograph_plan(TOY_SEEDS, TOY_PART, 2)
    assert remote_row_counts(mc, sampler, TOY_PART, 0, 0, pregather=False).tolist() == [4, 4]
    assert remote_row_counts(mc, sampler, TOY_PART, 0, 0, pregather=True).tolist() == [4, 4]
    assert remote_row_counts(hop, sampler, TOY_PART, 0, 0, pregather=False).tolist() == [3, 3]
    assert remote_row_counts(hop, sampler, TOY_PART, 0, 0, pregather=True).tolist() == [2, 2]


def test_golden_toy_micrographs_and_schedule():
    """Step 0: server 0 trains root 6 with m0, server 1 root 0 with m1; step 1: server 0 root 5
    with m1, server 1 root 3 with m0; each micrograph is the spec's vertex set."""
    sampler = toy_sampler()
    plan = micrograph_plan(TOY_SEEDS, TOY_PART, 2)
    assert plan.hosted.tolist() == [[0, 1], [1, 0]]
    assert [[r.tolist() for r in row] for row in plan.roots] == [[[6], [0]], [[5], [3]]]
    expected = {6: {6, 5, 7, 1}, 3: {3, 2, 4, 0, 5}, 5: {5, 1, 7, 0, 6}, 0: {0, 2, 3, 4}}
    for root, vertices in expected.items():
        assert set(sampler.sample(torch.tensor([root]))[0].src_ids.tolist()) == vertices
    steps = {rank: sample_steps(plan, rank, sampler, 0, 0) for rank in range(2)}
    assert set(steps[0][1][0].src_ids.tolist()) == expected[5]
    assert plan.hop(1, 0) == (1, 1) and plan.hop(1, 1) == (0, 0)


# ------------------------------------------------------------------ planner invariants
def _random_case(seed: int, n: int, size: int = 37, nodes: int = 200):
    gen = torch.Generator().manual_seed(seed)
    part = torch.randint(0, n, (nodes,), generator=gen)
    seeds = torch.randperm(nodes, generator=gen)[:size]
    return seeds, part


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("policy", ["model", "home"])
@pytest.mark.parametrize("direction", [1, -1])
def test_every_root_trained_once_and_schedule_is_a_permutation(n, policy, direction):
    for seed in range(5):
        seeds, part = _random_case(seed, n)
        batches = torch.tensor_split(seeds, n)
        model_of = {int(v): d for d, b in enumerate(batches) for v in b}
        for t in range(1, n + 1):
            plan = micrograph_plan(seeds, part, n, t, policy=policy, direction=direction)
            assert plan.num_steps == t and len(plan.kept) == t
            trained = torch.cat([r for row in plan.roots for r in row])
            assert sorted(trained.tolist()) == sorted(seeds.tolist())  # once each, none lost
            for j in range(t):
                assert sorted(plan.hosted[j].tolist()) == list(range(n))  # a bijection
                for s in range(n):
                    roots, owners = plan.roots[j][s], plan.owner_model[j][s]
                    assert [model_of[int(v)] for v in roots] == owners.tolist()
                    if policy == "model":
                        assert bool((owners == plan.hosted[j, s]).all())
                    if policy == "home" or t == n:
                        assert bool((part[roots] == s).all())  # trained on its home server
            assert plan.load().sum() == seeds.numel()
        full = micrograph_plan(seeds, part, n, direction=direction)
        # Latin square: over N steps every model visits every server once
        assert all(sorted(full.hosted[:, s].tolist()) == list(range(n)) for s in range(n))


def test_merge_drops_the_least_loaded_step_and_splits_evenly():
    """N=3: the step with the smallest root total goes (ties: smallest index); a model's
    dropped roots are split into near-equal chunks, larger first (the spec's Fig. 10)."""
    n = 3
    part = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 1, 2])
    # B_0 = [0, 1, 3] (server 0: 2 roots, server 1: 1), B_1 = [4, 5, 6, 9], B_2 = [7, 10, 11, 8]
    seeds = torch.tensor([0, 1, 3, 4, 5, 6, 9, 7, 10, 11, 8])
    full = micrograph_plan(seeds, part, n)
    load = full.load().sum(1)
    kmin = int(torch.argmin(load))
    merged = micrograph_plan(seeds, part, n, 2)
    assert kmin not in merged.kept and len(merged.kept) == 2
    for d in range(n):
        dropped = full.roots[kmin][(d + kmin) % n]
        before = [full.roots[k][(d + k) % n].numel() for k in merged.kept]
        after = [merged.roots[j][(d + k) % n].numel() for j, k in enumerate(merged.kept)]
        extra = [a - b for a, b in zip(after, before)]
        assert sum(extra) == dropped.numel() and max(extra) - min(extra) <= 1
        assert extra == sorted(extra, reverse=True)


def _seeds_with_counts(counts):
    """Seeds whose model ``d`` has ``counts[d][s]`` roots homed on server ``s``, and the
    partition (one fresh node per root)."""
    seeds, part = [], []
    for row in counts:
        for s, c in enumerate(row):
            seeds += range(len(part), len(part) + c)
            part += [s] * c
    return torch.tensor(seeds), torch.tensor(part)


def test_min_roots_score_drops_another_step_than_sum_roots():
    """Loads per step (servers): k0 [1, 1, 1], k1 [4, 0, 0], k2 [6, 1, 6]; the paper's sum
    drops k0, the artifact's minimum over servers drops k1."""
    seeds, part = _seeds_with_counts([[1, 0, 6], [6, 1, 0], [4, 1, 1]])
    full = micrograph_plan(seeds, part, 3)
    assert full.load().tolist() == [[1, 1, 1], [4, 0, 0], [6, 1, 6]]
    assert micrograph_plan(seeds, part, 3, 2, score="sum_roots").kept == (1, 2)
    assert micrograph_plan(seeds, part, 3, 2, score="min_roots").kept == (0, 2)


def test_home_policy_fills_kept_steps_up_to_the_average():
    """``policy=home``: dropped roots stay on their server, filling the kept steps in
    increasing order up to ``total // T + 1`` roots."""
    seeds, part = _seeds_with_counts([[1, 0, 6], [6, 1, 0], [4, 1, 1]])
    plan = micrograph_plan(seeds, part, 3, 2, policy="home")
    assert plan.kept == (1, 2)
    # server 0: k0 (1 root) dropped, k1 has 4, k2 has 6: cap = 11 // 2 + 1 = 6 -> 5, 6
    assert plan.load()[:, 0].tolist() == [5, 6]


def test_recount_compares_the_loads_after_the_moved_roots():
    """``recount`` (policy=model): step loads 9, 10, 7; k2 goes first either way; its roots
    join k0 and k1 (larger chunks first), after which k0 outweighs k1: recounting drops k1,
    the artifact's original loads drop k0 (issue 22 item 10: the setting did not exist)."""
    seeds, part = _seeds_with_counts([[4, 4, 4], [2, 3, 0], [4, 3, 2]])
    assert micrograph_plan(seeds, part, 3).load().sum(1).tolist() == [9, 10, 7]
    assert micrograph_plan(seeds, part, 3, 1, recount=True).kept == (0,)
    assert micrograph_plan(seeds, part, 3, 1, recount=False).kept == (1,)
    assert micrograph_plan(seeds, part, 3, 1).kept == (0,)  # policy=model recounts by default
    with pytest.raises(ValueError, match="recount"):
        micrograph_plan(seeds, part, 3, 1, policy="home", recount=True)


# ------------------------------------------------------------------ config
def test_presets_equal_their_yaml(tmp_path):
    for name in ("hopgnn", "hopgnn_mc"):
        run = run_config(make_cfg(tmp_path, f"strategy={name}"))
        assert run.strategy == HopGNNConfig.preset(name)
    assert HopGNNConfig.preset("hopgnn_mc").mode == "model_centric"
    assert HopGNNConfig.preset("hopgnn").kept_steps(4) == 4
    assert HopGNNConfig.preset("hopgnn_mc").kept_steps(4) == 1
    # merging on by default, as the spec (issue 22 item 10); the baseline has one step
    assert HopGNNConfig.preset("hopgnn").merge_adaptive
    assert not HopGNNConfig.preset("hopgnn_mc").merge_adaptive
    assert HopGNNConfig().recount and not HopGNNConfig(merge_policy="home").recount


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("model=custom",), "cannot run model=custom"),
        (("data.num_workers=1",), "data.num_workers=0"),
        (("strategy.steps=3",), "strategy.steps=3 must be <= the world size 2"),
        (("strategy.steps=0",), "strategy.steps=0 must be >= 1"),
        (("strategy.payload=activations",), "strategy.payload='activations' is unknown"),
        (("strategy.merge_policy=random",), "strategy.merge_policy='random' is unknown"),
        (("strategy.direction=2",), "strategy.direction=2 is unknown"),
        (("strategy.partition.method=spectral",), "strategy.partition.method='spectral'"),
        (
            ("strategy.mode=model_centric", "strategy.merge_adaptive=false", "strategy.steps=2"),
            "trains one step per iteration",
        ),
        (("strategy.mode=model_centric",), "set strategy.merge_adaptive=false"),
        (("strategy.merge_start_epoch=0",), "merge_start_epoch=0 must be >= 1"),
        (("strategy.merge_min_steps=3",), "merge_min_steps=3 must be <= the world size 2"),
        (("strategy.steps=1", "strategy.merge_min_steps=2"), "merge_min_steps=2 must be <="),
        (
            ("strategy.merge_policy=home", "strategy.merge_recount=true"),
            "merge_recount=true needs strategy.merge_policy=model",
        ),
    ],
)
def test_config_errors_name_their_key(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(tmp_path, "strategy=hopgnn", *overrides))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("strategy.pregatherr=false", "pregatherr"),
        ("strategy.partition.metod=metis", "metod"),
        ("strategy.steps=1.5", "steps"),
        ("strategy.pregather=maybe", "pregather"),
    ],
)
def test_unknown_keys_and_wrong_types_fail_at_compose_time(tmp_path, override, key):
    with pytest.raises(ConfigCompositionException) as err:
        make_cfg(tmp_path, "strategy=hopgnn", override)
    assert key in str(err.value) + str(err.value.__cause__)


# ------------------------------------------------------------------ merging controller
@pytest.mark.parametrize(
    ("times", "trajectory", "frozen_at"),
    [
        ([10, 8, 7, 7.5], [4, 3, 2, 1, 2, 2], 2),  # improves to T=1, worse: back to 2, frozen
        ([10, 11], [4, 3, 4, 4], 4),  # the first merge does not pay: back to 4, frozen
        ([10, 9, 8, 7], [4, 3, 2, 1, 1, 1], 1),  # always better: ends at T=1, frozen
    ],
)
def test_merge_controller_trajectory(times, trajectory, frozen_at):
    ctl = MergeController(4)
    for epoch in range(len(trajectory)):
        ctl.begin_epoch()
        if epoch < len(times):
            ctl.end_epoch(times[epoch])
    assert ctl.trajectory == trajectory
    assert not ctl.adjusting and ctl.steps == frozen_at
    restored = MergeController(4)
    restored.load_state_dict(ctl.state_dict())
    assert restored == ctl


def test_merge_controller_start_epoch_and_min_steps():
    """``start_epoch=3``: epochs 0-1 are warm-up (not measured, however slow), epoch 2 the
    baseline, the first cut at epoch 3; ``min_steps=2``: an improvement at T = 2 freezes it
    (issue 22 item 10: neither setting existed)."""
    late = MergeController(4, start_epoch=3)
    for seconds in (100, 50, 10, 8, 7):
        late.begin_epoch()
        late.end_epoch(seconds)
    late.begin_epoch()
    assert late.trajectory == [4, 4, 4, 3, 2, 1] and late.best == 7
    floor = MergeController(4, min_steps=2)
    for seconds in (10, 9, 8, 7):
        floor.begin_epoch()
        floor.end_epoch(seconds)
    floor.begin_epoch()
    assert floor.trajectory == [4, 3, 2, 2, 2] and not floor.adjusting and floor.steps == 2
    restored = MergeController(1)
    restored.load_state_dict(floor.state_dict())
    assert restored == floor


def test_modeled_epoch_time_counts_training_bytes_and_steps():
    delta = {"feature": 1000, "structure": 200, "parameter": 300, "gradient": 500, "control": 7}
    assert modeled_epoch_seconds(delta, 10, 3, 1000.0, 0.01) == pytest.approx(2.0 + 0.3)


# ------------------------------------------------------------------ cost model
def test_cost_model_on_the_toy_and_on_sbm():
    """Toy: per-server rows 4/4 (MC), 3/3 (HopGNN), 2/2 (pre-gathered); P³ and naive bytes
    follow their formulas. sbm + METIS, N = 2: MC miss ~ 1/2 > HopGNN's, PG < no PG,
    migration bytes far below the feature bytes saved."""
    sampler = toy_sampler()
    mc_rows, mc_pg, mc_blocks = iteration_rows(
        model_centric_plan(TOY_SEEDS, 2), sampler, TOY_PART, 0, 0
    )
    hop_rows, hop_pg, _ = iteration_rows(
        micrograph_plan(TOY_SEEDS, TOY_PART, 2), sampler, TOY_PART, 0, 0
    )
    assert mc_rows.tolist() == mc_pg.tolist() == [4, 4]
    assert hop_rows.tolist() == [3, 3] and hop_pg.tolist() == [2, 2]
    cost = CostParams(8, 4, 2, 2, gcn_param_count(8, 4, 2, 2))
    assert cost.model_params == 8 * 4 + 4 + 4 * 2 + 2
    blocks = [b[0] for b in mc_blocks]
    # P³: both mini-batches' layer-1 dst rows travel there and back to the other server
    v1 = [b[0].num_dst for b in blocks]
    e1 = [b[0].num_edges for b in blocks]
    rest = cost.model_params - (8 * 4 + 4)
    assert p3_bytes(blocks, 2, cost) == sum(2 * 4 * v * 4 + e * 16 for v, e in zip(v1, e1)) + 2 * (
        rest * 4
    )
    assert naive_bytes(blocks, TOY_PART, cost) > 0

    dataset = sbm(num_nodes=1500, num_classes=4, avg_degree=10.0, num_features=32, seed=0)
    graph, train = dataset.graph, dataset.targets.train.nonzero().flatten()
    part = partition(graph, "metis", 2, seed=0)
    cost = CostParams(32, 16, 4, 2, gcn_param_count(32, 16, 4, 2))
    row = table(graph, train, part, 2, 256, [5, 5], cost, iterations=2)
    assert 0.4 < row["mc_miss_rate"] < 0.6 and row["hop_miss_rate"] < 0.75 * row["mc_miss_rate"]
    assert row["hop_pg_remote_rows"] < row["hop_remote_rows"] < row["mc_remote_rows"]
    assert row["migration_bytes"] < 0.2 * row["feature_bytes_saved"]


def test_without_pregathering_hopgnn_beats_model_centric_only_on_small_cones():
    """Without pre-gathering each (model, server) micrograph set is deduplicated on its own, so
    HopGNN fetches fewer rows than model-centric only while one rank's sets overlap little
    (small fanouts): on this sbm, fanouts [5, 5] give fewer rows, the suite's default [10, 10]
    more (as on the default 10k-node sbm at N = 2, 3: docs/systems/hopgnn.md, issue 22
    item 8). Pre-gathering (one union per iteration) is below model-centric in both."""
    dataset = sbm(num_nodes=1000, num_classes=4, avg_degree=10.0, num_features=4, seed=1)
    graph, train = dataset.graph, dataset.targets.train.nonzero().flatten()
    part = partition(graph, "metis", 2, seed=0)
    rows = {}
    for fanouts, batch in (([5, 5], 128), ([10, 10], 256)):
        sampler = NeighborSampler(graph.indptr, graph.indices, fanouts, 3)
        seeds = train[torch.randperm(train.numel(), generator=torch.Generator().manual_seed(3))]
        total = dict.fromkeys(("mc", "hop", "hop_pg"), 0)
        for step in range(2):
            batch_seeds = seeds[step * batch : (step + 1) * batch]
            mc, hop = model_centric_plan(batch_seeds, 2), micrograph_plan(batch_seeds, part, 2)
            total["mc"] += int(remote_row_counts(mc, sampler, part, 0, step, True).sum())
            total["hop"] += int(remote_row_counts(hop, sampler, part, 0, step, False).sum())
            total["hop_pg"] += int(remote_row_counts(hop, sampler, part, 0, step, True).sum())
        rows[fanouts[0]] = total
    assert rows[5]["hop_pg"] < rows[5]["hop"] < rows[5]["mc"], rows
    assert rows[10]["hop_pg"] < rows[10]["mc"] < rows[10]["hop"], rows


# ------------------------------------------------------------------ refused Trainer settings
def _fit_with(tmp_path, **trainer_kwargs):
    import os
    from unittest import mock

    import lightning as L

    from lightning_gnnscale import GNNModule, ModelConfig
    from lightning_gnnscale.config_types import DataConfig
    from lightning_gnnscale.systems.hopgnn import HopGNNDataModule
    from lightning_gnnscale.systems.hopgnn.strategy import HopGNNStrategy

    dataset = sbm(num_nodes=60, num_classes=3, avg_degree=4.0, num_features=4, seed=0)
    dm = HopGNNDataModule(dataset, HopGNNConfig(), DataConfig(16, [3, 3]), cache_dir=tmp_path)
    module = GNNModule(dm.build_model(ModelConfig(name="sage", hidden=8, dropout=0.0)))
    trainer = L.Trainer(
        strategy=HopGNNStrategy(),
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer_kwargs,
    )
    # Lightning's launch sets MASTER_PORT and friends: keep them out of later tests' processes
    with mock.patch.dict(os.environ):
        trainer.fit(module, datamodule=dm)


def test_gradient_accumulation_is_refused(tmp_path):
    """``accumulate_grad_batches=2`` would sum an already summed ``.grad`` again: refused
    before the process group starts, naming the setting."""
    with pytest.raises(ValueError, match=r"accumulate_grad_batches=2"):
        _fit_with(tmp_path, accumulate_grad_batches=2)
    assert not torch.distributed.is_initialized()


def test_a_grad_scaler_is_refused(tmp_path):
    """``16-mixed`` (a ``GradScaler``) would scale only the last time step's gradient: refused,
    through a Trainer (the plugin builds on CPU) and through the check itself."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    from lightning_gnnscale.systems.hopgnn.strategy import check_trainer_settings

    plugin = MixedPrecision("16-mixed", "cpu")
    assert plugin.scaler is not None
    with pytest.raises(ValueError, match=r"gradient scaler .*16-mixed"):
        check_trainer_settings(1, plugin)
    check_trainer_settings(1, MixedPrecision("bf16-mixed", "cpu"))  # no scaler: accepted
    with pytest.raises(ValueError, match=r"gradient scaler"):
        _fit_with(tmp_path, plugins=[plugin])
    assert not torch.distributed.is_initialized()


def _one_rank_dm(config, world_size=1):
    """A set-up one-process DataModule on a 60-node sbm (every node on server 0)."""
    from lightning_gnnscale.comm import Comm
    from lightning_gnnscale.config_types import DataConfig
    from lightning_gnnscale.contract import RankContext
    from lightning_gnnscale.systems.hopgnn import HopGNNDataModule, HopGNNPrepared

    dataset = sbm(num_nodes=60, num_classes=3, avg_degree=4.0, num_features=4, seed=0)
    dm = HopGNNDataModule(dataset, config, DataConfig(8, [3, 3]))
    part = torch.zeros(dataset.graph.num_nodes, dtype=torch.int64)
    dm.setup_rank(
        RankContext(Comm.create(), torch.device("cpu")), dm.part_of(HopGNNPrepared(part, {}), 0)
    )
    return dm


def test_mid_epoch_state_dict_is_refused_with_the_controller():
    """The merging controller's in-epoch measurement is not saved: ``state_dict`` raises while
    the step the Trainer last ran (Lightning's public ``on_after_batch_transfer`` hook) is not
    the epoch's last, and closes the window after it. No Lightning loop internals are read
    (issue 22 item 10: the old code read ``trainer.fit_loop.epoch_loop.batch_progress``,
    which this fake Trainer lacks)."""
    from types import SimpleNamespace

    dm = _one_rank_dm(HopGNNConfig(merge_adaptive=True))
    n = dm.steps_per_epoch
    assert n > 2
    dm.trainer = SimpleNamespace(state=SimpleNamespace(fn="fit"), num_training_batches=n)
    dm.trainer.is_last_batch = False  # read by the base's train_epoch (not decisive here)
    dm.on_after_batch_transfer(dm.make_batch(0, 0), 0)  # opens epoch 0's window
    with pytest.raises(RuntimeError, match="mid-epoch"):
        dm.state_dict()
    dm.trainer.num_training_batches = 1  # limit_train_batches=1: step 0 ends the epoch
    assert dm.state_dict()["merge"]["window"]  # the epoch's time is recorded
    dm.on_after_batch_transfer(dm.make_batch(1, 0), 0)
    dm.trainer.num_training_batches = n
    with pytest.raises(RuntimeError, match="mid-epoch"):
        dm.state_dict()
    dm.on_after_batch_transfer(dm.make_batch(1, n - 1), 0)
    assert dm.state_dict()["merge"]["trajectory"] == [1, 1]


def test_time_step_trajectory_is_checkpointed_without_the_controller():
    """Without the controller the ``T`` of every epoch is DataModule state too, so a resumed
    run reports the whole trajectory (issue 22 item 10: it was the callback's, lost on
    resume); an epoch resumed mid-way is not counted twice."""
    config = HopGNNConfig(merge_adaptive=False)
    first = _one_rank_dm(config)
    first.make_batch(0, 0)
    first.make_batch(1, 0)
    state = first.state_dict()
    resumed = _one_rank_dm(config)
    resumed.load_state_dict(state)
    resumed.make_batch(1, 1)  # the rest of epoch 1
    resumed.make_batch(2, 0)
    assert resumed.trajectory == [1, 1, 1]
    (stats,) = resumed.callbacks()
    assert stats.summary_stats()["time_step_trajectory"] == [1, 1, 1]


def test_steps_above_the_world_size_are_refused_without_a_run_config():
    """A plain Lightning script (no ``RunConfig``, so no ``check_run``): ``steps > N`` and
    ``merge_min_steps > N`` fail when the DataModule sets up on each rank, naming the key,
    instead of being clamped to ``N`` (issue 22 item 10). Not in ``preprocess``: it runs on
    one rank per node, and a refusal there left the other ranks in Lightning's barrier."""
    with pytest.raises(ConfigError, match="strategy.steps=2 must be <= the world size 1"):
        _one_rank_dm(HopGNNConfig(steps=2))
    with pytest.raises(ConfigError, match="merge_min_steps=2 must be <= the world size 1"):
        _one_rank_dm(HopGNNConfig(merge_min_steps=2))


def test_hopgnn_imports_no_other_system():
    """Systems never import each other: HopGNN's shared partition settings come from
    ``graph/partition_config.py``, not from DistDGL (issue 22 item 10)."""
    import ast
    from pathlib import Path

    import lightning_gnnscale.systems as systems

    root = Path(systems.__file__).parent
    names = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    found = []
    for path in (root / "hopgnn").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                dotted = node.level == 2 and parts[0] in names
                absolute = "systems" in parts and bool(set(parts) & names)
                if (dotted or absolute) and "hopgnn" not in parts:
                    found.append(f"{path.name}: {node.module}")
    assert found == []
