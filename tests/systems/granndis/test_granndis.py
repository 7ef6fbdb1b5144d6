"""GraNNDIS in one process: configs, the one-hop plan builder on the spec's worked example
(path graph, 2 servers x 2 workers), the mask rule and the masked normaliser."""

from __future__ import annotations

import pytest
import torch

from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.csc import Graph, csc_from_edges
from lightning_gnnscale.systems.granndis import GraNNDISConfig, build_layout
from lightning_gnnscale.systems.granndis.config import CoBConfig, EASConfig
from lightning_gnnscale.systems.granndis.expand import khop_levels
from lightning_gnnscale.systems.granndis.plan import keep_mask


def path_graph(n: int = 8) -> Graph:
    """Undirected path 0-1-...-(n-1) with self-loops."""
    ids = torch.arange(n - 1)
    loops = torch.arange(n)
    src = torch.cat([ids, ids + 1, loops])
    dst = torch.cat([ids + 1, ids, loops])
    indptr, indices = csc_from_edges(src, dst, n, remove_self_loops=False)
    return Graph(
        indptr,
        indices,
        torch.arange(n, dtype=torch.float64).unsqueeze(1),
    )


def neighbours(graph: Graph, v: int) -> set[int]:
    return set(graph.indices[graph.indptr[v] : graph.indptr[v + 1]].tolist())


def test_presets_and_bad_values():
    assert GraNNDISConfig().mode == "flx_eas"
    assert {GraNNDISConfig.preset(n).mode for n in GraNNDISConfig.NAMES} == {
        "flx_eas",
        "flx",
        "cob",
        "fb_base",
        "mb_base",
    }
    with pytest.raises(ConfigError, match="strategy.mode='pipe' is unknown; valid"):
        GraNNDISConfig(mode="pipe")
    with pytest.raises(ConfigError, match="strategy.eas.fanout=0"):
        EASConfig(fanout=0)
    with pytest.raises(ConfigError, match="strategy.cob.sampler='saint' is unknown"):
        CoBConfig(sampler="saint")
    with pytest.raises(ConfigError, match="is not a name of GraNNDISConfig"):
        GraNNDISConfig(name="gsplit")


def test_fb_base_halos_of_the_worked_example():
    """Spec §7: owners {0,1} {2,3} | {4,5} {6,7}: halos r0 {2}, r1 {1,4}, r2 {3,6}, r3 {5};
    cut 6, of which 2 cross servers; the send lists match the receivers' halos."""
    graph = path_graph()
    vertices = torch.arange(8)
    owner = vertices // 2
    plans = build_layout(
        graph, vertices, torch.zeros(8, dtype=torch.int64), owner, range(4), 4, 2,
        is_target=torch.ones(8, dtype=torch.bool), masking=False,
    )  # fmt: skip
    assert [plans[r].halo.tolist() for r in range(4)] == [[2], [1, 4], [3, 6], [5]]
    inter = sum(int((owner[plans[r].halo] // 2 != r // 2).sum()) for r in range(4))
    assert sum(plans[r].halo.numel() for r in range(4)) == 6 and inter == 2
    for r in range(4):
        plan = plans[r]
        assert plan.recv_splits[r] == plan.send_splits[r] == 0
        for q in range(4):
            sent = plan.owned[plan.send_index][sum(plan.send_splits[:q]) :][: plan.send_splits[q]]
            wanted = plans[q].halo[sum(plans[q].recv_splits[:r]) :][: plans[q].recv_splits[r]]
            assert sent.tolist() == wanted.tolist()
        # every in-edge of an owned vertex is local (first layer: nothing masked)
        block = plan.blocks[0]
        rows = plan.rows
        for i, v in enumerate(plan.owned.tolist()):
            srcs = block.edge_index[0][block.edge_index[1] == i]
            assert set(rows[srcs].tolist()) == neighbours(graph, v)


def test_flx_server_graphs_and_masks_of_the_worked_example():
    """Spec §7 FLX(k = L = 2): V_0 = {0..5}, V_1 = {2..7}; vertex 5 (server 0) and 2 (server
    1) are masked at layer 1 only; rho = 12 / 8."""
    graph = path_graph()
    sizes = 0
    for server, inner, far in ((0, torch.arange(4), 5), (1, torch.arange(4, 8), 2)):
        vertices, level = khop_levels(graph, inner, 2)
        sizes += vertices.numel()
        owner = server * 2 + (torch.arange(vertices.numel()) * 2 // vertices.numel())
        plans = build_layout(
            graph, vertices, level, owner, range(2 * server, 2 * server + 2), 4, 2,
            is_target=level == 0,
        )  # fmt: skip
        for plan in plans.values():
            assert plan.num_loss == int((plan.level[: plan.owned.numel()] == 0).sum())
            assert all(q // 2 == server for q in range(4) if plan.recv_splits[q])
            for j, block in enumerate(plan.blocks):
                sources = set(plan.rows[block.edge_index[0]].tolist())
                assert (far in sources) == (j == 0 and far in plan.rows.tolist())
    assert sizes / graph.num_nodes == 1.5


def test_mask_rule_and_the_unmasked_normaliser():
    """keep_j = level <= K - j; a destination at level <= K - j - 1 keeps every in-edge at
    layer j (exact), and a destination's edges at layer j are exactly its in-edges from kept
    rows (SAGE's mean then runs over the unmasked neighbours)."""
    level = torch.tensor([0, 1, 2, 3])
    assert keep_mask(level, 3, 0).tolist() == [True] * 4
    assert keep_mask(level, 3, 2).tolist() == [True, True, False, False]
    assert keep_mask(level, 3, 2, masking=False).all()
    graph = path_graph(10)
    vertices, level = khop_levels(graph, torch.tensor([4, 5]), 3)
    plan = build_layout(
        graph, vertices, level, torch.zeros_like(vertices), [0], 1, 3, is_target=level == 0
    )[0]
    rows, row_level = plan.rows, plan.level
    for j, block in enumerate(plan.blocks):
        kept = keep_mask(row_level, 3, j)
        for i in range(block.num_dst):
            srcs = set(rows[block.edge_index[0][block.edge_index[1] == i]].tolist())
            allowed = {u for u in neighbours(graph, int(rows[i])) if u in set(rows.tolist())}
            assert srcs == {u for u in allowed if kept[rows.tolist().index(u)]}
            if row_level[i] <= 3 - j - 1:
                assert srcs == neighbours(graph, int(rows[i]))
    assert plan.blocks[-1].num_dst == plan.num_loss == 2


def test_a_rank_without_vertices_gets_an_empty_plan():
    graph = path_graph()
    vertices = torch.arange(4)
    plans = build_layout(
        graph, vertices, torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64),
        [0, 1], 2, 2, is_target=torch.ones(4, dtype=torch.bool),
    )  # fmt: skip
    empty = plans[1]
    assert empty.owned.numel() == empty.halo.numel() == empty.num_loss == 0
    assert empty.send_splits == empty.recv_splits == (0, 0)
    assert all(b.num_src == 0 and b.num_edges == 0 for b in empty.blocks)


def _auto_module(budget_mb):
    from lightning_gnnscale.comm import Topology
    from lightning_gnnscale.config_types import DataConfig, ModelConfig
    from lightning_gnnscale.graph.generators import sbm
    from lightning_gnnscale.systems.granndis import GraNNDISDataModule

    dataset = sbm(num_nodes=200, num_classes=3, avg_degree=5.0, num_features=4, seed=1)
    config = GraNNDISConfig(mode="flx", preload_auto=True, memory_budget_mb=budget_mb)
    data = DataConfig(batch_size=-1, fanouts=[-1, -1, -1])
    dm = GraNNDISDataModule(dataset, config, data, topology=Topology.single())
    dm.build_model(ModelConfig(name="sage", hidden=16, num_layers=3))
    return dm


def _setup_one_process(dm):
    from lightning_gnnscale.comm import Comm
    from lightning_gnnscale.contract import RankContext

    context = RankContext(Comm.local(), torch.device("cpu"))
    dm.setup_rank(context, dm.rank_part(context))


def test_preload_auto_picks_the_largest_k_that_fits():
    """No budget: k = L. A budget equal to one k's estimate picks the largest k whose
    estimate fits it; one below every estimate fails naming CoB."""
    dm = _auto_module(None)
    _setup_one_process(dm)
    estimates = dm.memory_by_k
    assert dm.preload_depth == 3 and len(estimates) == 4
    assert all(m > 0 for m in estimates)
    for k in range(4):
        budget = estimates[k] / 2**20
        dm = _auto_module(budget)
        _setup_one_process(dm)
        assert dm.preload_depth == max(j for j in range(4) if estimates[j] <= estimates[k])
        assert dm.plans[0].preload_layers == (dm.preload_depth if dm.preload_depth < 3 else 0)
    dm = _auto_module(min(estimates) / 2**20 * 0.99)
    with pytest.raises(RuntimeError, match="no preload depth fits .* strategy.mode=cob"):
        _setup_one_process(dm)


def test_preload_auto_holds_the_plans_and_input_rows_of_its_depth_only():
    """Every depth is laid out for the choice; the rank then holds its depth's plans, and
    input rows of that depth only: the part's ``x`` is the graph's own, read by row ids."""
    from lightning_gnnscale.comm import Comm
    from lightning_gnnscale.contract import RankContext

    dm = _auto_module(None)
    context = RankContext(Comm.local(), torch.device("cpu"))
    part = dm.rank_part(context)
    every_depth = sum(b - a for layout in part.layouts.values() for a, b in layout.x_ranges)
    dm.setup_rank(context, part)
    assert list(dm.part.layouts) == [dm.preload_depth] and len(part.layouts) == 4
    assert dm.part.x.data_ptr() == dm.graph.x.data_ptr()  # no copy of any depth's rows
    held = sum(rows.shape[0] for rows in dm.inputs)
    assert held == sum(b - a for a, b in part.layouts[dm.preload_depth].x_ranges) < every_depth


def test_preload_auto_needs_flx_and_the_model_widths():
    with pytest.raises(ConfigError, match="preload_auto=true chooses k for strategy.mode=flx"):
        GraNNDISConfig(mode="flx_eas", preload_auto=True)
    dm = _auto_module(None)
    dm.model_dims = None
    with pytest.raises(RuntimeError, match="build the net with this DataModule's build_model"):
        _setup_one_process(dm)


def test_summary_inter_server_bytes_by_category():
    """``summary.json``'s ``inter_server_comm_bytes_per_epoch``: the per-category mean of the
    CommStats records' inter-server split; ``None`` when a record lacks it."""
    from lightning_gnnscale.callbacks.summary import inter_server_by_category

    records = [
        {"inter_server_category_bytes": {"feature": 10, "gradient": 4}},
        {"inter_server_category_bytes": {"feature": 30, "gradient": 8}},
    ]
    assert inter_server_by_category(records) == {"feature": 20.0, "gradient": 6.0}
    assert inter_server_by_category([*records, {"bytes": {}}]) is None


def test_the_printed_summary_shows_what_crossed_servers():
    """The end-of-run table splits the inter-server bytes into moved rows, gradients and the
    rest, and says nothing about servers when no byte crossed them (one server)."""
    from lightning_gnnscale.callbacks.summary import format_table

    summary = {
        "strategy": "granndis",
        "model": "sage",
        "dataset": "sbm",
        "world_size": 4,
        "epochs": 1,
        "best_val_acc": 0.5,
        "test_acc": 0.5,
        "epoch_time_s": 1.0,
        "train_time_s": 1.0,
        "comm_bytes_per_epoch": {"feature": 3e6, "gradient": 2e6},
        "network": "10gbe",
        "modeled_comm_time_s": 0.1,
        "peak_rss_mb": 1.0,
        "inter_server_comm_bytes_per_epoch": {
            "feature": 1e6,
            "activation": 2e6,
            "activation_grad": 0.5e6,
            "gradient": 4e6,
            "control": 96.0,
        },
    }
    line = [row for row in format_table(summary).splitlines() if "between servers" in row]
    assert len(line) == 1 and line[0].split()[-5:] == ["3.5", "/", "4", "/", "9.6e-05"]
    summary["inter_server_comm_bytes_per_epoch"] = dict.fromkeys(("feature", "gradient"), 0.0)
    assert "between servers" not in format_table(summary)
    summary["inter_server_comm_bytes_per_epoch"] = None  # older checkpoints: no split
    assert "between servers" not in format_table(summary)


def test_hierarchical_gradient_sync_refuses_gradient_accumulation():
    """``post_backward`` sums ``.grad`` over ranks after every backward; with accumulation the
    previous micro-batch's already summed gradient would be summed again, so the strategy
    refuses it before touching the weights."""
    from types import SimpleNamespace

    from lightning_gnnscale.systems.granndis import GraNNDISStrategy

    strategy = GraNNDISStrategy(GraNNDISConfig(grad_sync="hierarchical"))
    strategy._lightning_module = SimpleNamespace(trainer=SimpleNamespace(accumulate_grad_batches=2))
    with pytest.raises(ConfigError, match="does not support Trainer\\(accumulate_grad_batches=2"):
        strategy.configure_ddp()


def test_mb_base_batches_are_data_parallel_micro_batches():
    """MB_base (the paper's per-worker mini-batch baseline) samples each worker's share of a
    step as strategy=ddp does: same seeds, same rank-salted samples, same global seed count."""
    from lightning_gnnscale.config_types import DataConfig
    from lightning_gnnscale.graph.generators import sbm
    from lightning_gnnscale.systems.ddp import DataParallelDataModule
    from lightning_gnnscale.systems.granndis import GraNNDISDataModule

    dataset = sbm(num_nodes=300, num_classes=3, avg_degree=5.0, num_features=4, seed=2)
    data = DataConfig(batch_size=32, fanouts=[3, 2])
    mb_base = GraNNDISDataModule(dataset, GraNNDISConfig(mode="mb_base"), data)
    _setup_one_process(mb_base)
    ddp = DataParallelDataModule(dataset, data=data)
    assert mb_base.steps_per_epoch == ddp.steps_per_epoch > 1
    for step in range(mb_base.steps_per_epoch):
        got, want = mb_base.make_batch(1, step), ddp.make_batch(1, step)
        for ours, theirs in zip(got.blocks, want.blocks, strict=True):
            assert torch.equal(ours.src_ids, theirs.src_ids)
            assert torch.equal(ours.edge_index, theirs.edge_index)
        assert torch.equal(got.x, want.x) and torch.equal(got.y, want.y)
        assert got.global_seed_count == want.global_seed_count
