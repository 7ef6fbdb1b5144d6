"""GraNNDIS set-up in one process (issue 22 items 2-4, 6, 7; issue 24 item 7): settings that
would take no effect fail before any rank starts, plans are built once and cached per rank,
a plan's memory is flat in the number of layers, co-batch counts are bounded, the intra-server
split balances the loss rows, and GCN uses whole-graph degrees in every mode."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor

from lightning_gnnscale.comm import Topology
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.node_targets import NodeDataset
from lightning_gnnscale.systems.granndis import GraNNDISConfig, GraNNDISDataModule, build_layout
from lightning_gnnscale.systems.granndis.config import CoBConfig, EASConfig

TOPOLOGY = Topology(4, 2)  # 2 servers x 2 workers


def dataset_of(num_nodes=400, seed=3) -> NodeDataset:
    return sbm(num_nodes=num_nodes, num_classes=4, avg_degree=6.0, num_features=4, seed=seed)


def module(config, layers=2, dataset=None, cache_dir=None):
    data = DataConfig(batch_size=-1, fanouts=[-1] * layers)
    dataset = dataset if dataset is not None else dataset_of()
    return GraNNDISDataModule(dataset, config, data, seed=0, cache_dir=cache_dir)


def held_bytes(value) -> int:
    """Bytes of every tensor reachable from ``value`` (dataclass fields, tuples, lists)."""
    if isinstance(value, Tensor):
        return value.nbytes
    if dataclasses.is_dataclass(value):
        return sum(held_bytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, (tuple, list)):
        return sum(held_bytes(v) for v in value)
    return 0


def test_settings_without_effect_fail_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="strategy.memory_budget_mb=100.*preload_auto"):
        GraNNDISConfig(mode="flx", memory_budget_mb=100.0)
    with pytest.raises(
        ConfigError, match="strategy.mode='fb_base': granndis_flx is defined by mode='flx'"
    ):
        dataclasses.replace(GraNNDISConfig.preset("granndis_flx"), mode="fb_base")
    GraNNDISConfig(mode="fb_base")  # strategy=granndis strategy.mode=...: the generic form
    with pytest.raises(ConfigError, match="strategy.eas.hops=3 must be <= model.num_layers=2"):
        module(GraNNDISConfig(eas=EASConfig(hops=3)))
    with pytest.raises(ConfigError, match="strategy.cob.hops=3 must be <= model.num_layers=2"):
        module(GraNNDISConfig(mode="cob", cob=CoBConfig(hops=3)))
    module(GraNNDISConfig(mode="flx", eas=EASConfig(hops=3)))  # FLX does not use EAS


def test_a_budget_no_depth_can_meet_fails_before_spawn(tmp_path):
    """Issue 24 item 7: the launcher's ``prepare`` (before any rank starts) refuses it."""
    config = GraNNDISConfig(mode="flx", preload_auto=True, memory_budget_mb=0.0001)
    dm = module(config, cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="strategy.memory_budget_mb=0.0001 is below"):
        dm.prepare(4)


def test_cobatch_count_is_bounded_by_the_targets(tmp_path):
    dataset = dataset_of()
    num_train = int(dataset.targets.train.sum())
    too_many = GraNNDISConfig(mode="cob", cob=CoBConfig(num_per_epoch=num_train + 1))
    with pytest.raises(ConfigError, match="strategy.cob.num_per_epoch=.*exceeds the"):
        module(too_many, dataset=dataset, cache_dir=tmp_path).prepare(4)
    # fewer than the training nodes, more than the largest server's: empty on every server
    servers = module(GraNNDISConfig(mode="cob"), dataset=dataset, cache_dir=tmp_path)
    most = max(t.numel() for t in servers.server_targets(TOPOLOGY))
    config = GraNNDISConfig(mode="cob", cob=CoBConfig(num_per_epoch=most + 1, sampler="none"))
    dm = module(config, dataset=dataset, cache_dir=tmp_path)
    dm.prepare(4)
    with pytest.raises(ConfigError, match=f"exceeds the {most} training nodes of the largest"):
        dm.build_all_plans(TOPOLOGY)


def test_plans_are_built_once_and_each_rank_loads_its_own(tmp_path, monkeypatch):
    config = GraNNDISConfig(mode="flx")
    first = module(config, cache_dir=tmp_path)
    first.prepare_layouts(TOPOLOGY)
    built = first.build_all_plans(TOPOLOGY)
    assert len(list(tmp_path.glob("granndis-plans-*.pt"))) == TOPOLOGY.world_size

    def refuse(*args, **kwargs):
        raise AssertionError("a rank rebuilt the plans")

    second = module(config, cache_dir=tmp_path)
    monkeypatch.setattr(second, "build_all_plans", refuse)
    for rank in range(TOPOLOGY.world_size):
        plans, summary = second.rank_plans(TOPOLOGY, rank, config.preload_depth(2))
        want, want_summary = built[rank]
        assert summary == want_summary
        assert [p.state().keys() for p in plans] == [p.state().keys() for p in want]
        for got, exp in zip(plans, want, strict=True):
            assert torch.equal(got.final.owned, exp.final.owned)
            assert torch.equal(got.final.edge_src, exp.final.edge_src)
            assert got.final.send_splits == exp.final.send_splits


def test_prepare_data_lays_out_the_given_topology_without_asking_the_strategy(tmp_path):
    """``prepare_data`` takes the servers x workers from the DataModule (its ``topology``, else
    one server per Trainer node), never from the strategy; a strategy that runs other servers
    is refused on every rank, naming the setting to pass."""
    from types import SimpleNamespace

    from lightning_gnnscale.graph.cache import artifact_path
    from lightning_gnnscale.systems.granndis.datamodule import PLAN_PREFIX

    config = GraNNDISConfig(mode="flx")
    trainer = SimpleNamespace(world_size=4, num_nodes=1, num_devices=4, node_rank=0)
    trainer.precision = "32-true"  # no strategy: reaching for one fails
    one_per_node = Topology(4, 4)
    for given, laid_out in ((TOPOLOGY, TOPOLOGY), (None, one_per_node)):
        dm = GraNNDISDataModule(
            dataset_of(), config, DataConfig(-1, [-1, -1]), cache_dir=tmp_path, topology=given
        )
        dm.trainer = trainer
        dm.prepare_data()
        k = config.preload_depth(2)
        keys = [dm.layout_key(laid_out, k, rank) for rank in range(4)]
        assert all(artifact_path(key, tmp_path, prefix=PLAN_PREFIX).exists() for key in keys)
    laid_out = dm.part_of(dm.prepare(4), 0).topology  # the part records its layout's
    assert laid_out == one_per_node
    running = SimpleNamespace(topology=TOPOLOGY)
    with pytest.raises(ConfigError, match=r"pass topology=Topology\(4, 2\) to GraNNDISDataModule"):
        dm.check_layout_topology(laid_out, running)  # one server per node, runs 2 servers
    dm.check_layout_topology(laid_out, SimpleNamespace(topology=one_per_node))


def test_a_plan_holds_one_structure_whatever_the_depth():
    """FB_base's layout is the same at every depth: what its plans hold must not grow with L
    (one static one-hop graph plus the rows' levels, no per-layer copy of the edges)."""
    dataset = dataset_of()
    graph = dataset.graph
    vertices = torch.arange(graph.num_nodes)
    owner = vertices % 4
    level = torch.zeros_like(vertices)

    def plan_bytes(layers):
        plans = build_layout(
            graph, vertices, level, owner, range(4), 4, layers,
            is_target=dataset.targets.train, masking=False,
        )  # fmt: skip
        return sum(held_bytes(p) for p in plans.values())

    assert plan_bytes(8) == plan_bytes(2)


def test_intra_server_split_balances_the_loss_rows(tmp_path):
    """FLX's server graph is its targets plus their L-hop closure: a split by vertices alone
    can leave one worker without targets. Each server's workers get loss rows within 5%."""
    dataset = dataset_of(num_nodes=1200)
    for intra in ("metis", "contiguous", "random"):
        config = GraNNDISConfig(mode="flx", partition=dataclasses.replace(
            GraNNDISConfig().partition, intra=intra))  # fmt: skip
        built = module(config, dataset=dataset, cache_dir=tmp_path).build_all_plans(TOPOLOGY)
        loss = [plans[0].final.num_loss for plans, _ in built]
        for a, b in ((loss[0], loss[1]), (loss[2], loss[3])):
            assert abs(a - b) <= 0.05 * max(a, b), (intra, loss)


def test_gcn_degrees_are_the_whole_graph_s_in_every_mode(tmp_path):
    """CoB-SAGE with a fanout above every degree samples nothing: its plans must equal CoB
    without sampling (the exact mode the distributed test checks against ``single``), GCN
    degrees included, on a graph with one-way edges."""
    dataset = dataset_of()
    graph = dataset.graph
    src, dst = graph.edge_index()
    one_way = src < dst  # drop every edge from a higher id: a directed graph
    from lightning_gnnscale.graph.csc import csc_from_edges

    indptr, indices = csc_from_edges(src[one_way], dst[one_way], graph.num_nodes)
    graph = graph.with_structure(indptr, indices)
    dataset = NodeDataset(graph, dataset.targets)
    exact = GraNNDISConfig(mode="cob", cob=CoBConfig(num_per_epoch=2, sampler="none"))
    nothing_sampled = GraNNDISConfig(mode="cob", cob=CoBConfig(num_per_epoch=2, fanout=10**6))
    want = module(exact, dataset=dataset, cache_dir=tmp_path).build_all_plans(TOPOLOGY)
    got = module(nothing_sampled, dataset=dataset, cache_dir=tmp_path).build_all_plans(TOPOLOGY)
    for (plans, _), (exact_plans, _) in zip(got, want, strict=True):
        for step, exact_step in zip(plans, exact_plans, strict=True):
            for name, value in step.final.state().items():
                expected = exact_step.final.state()[name]
                same = torch.equal(value, expected) if isinstance(value, Tensor) else (
                    value == expected)  # fmt: skip
                assert same, name
            assert torch.equal(step.final.degree, graph.in_degree()[step.final.rows])


def test_a_prepare_that_knew_no_topology_lays_out_the_rank_s_when_it_takes_its_part(tmp_path):
    """A ``prepare`` with no topology and no Trainer (a manual ``prepare_data``, a launcher
    that knows none) lays nothing out; the part is then laid out for the Trainer's."""
    from types import SimpleNamespace

    config, data = GraNNDISConfig(mode="flx"), DataConfig(-1, [-1, -1])
    dm = GraNNDISDataModule(dataset_of(), config, data, cache_dir=tmp_path / "a")
    assert dm.prepare(4) is None
    with pytest.raises(ConfigError, match="no servers x workers are known"):
        dm.part_of(dm.prepare(4), 1)
    dm.trainer = SimpleNamespace(world_size=4, num_nodes=2, num_devices=2, node_rank=0)
    got = dm.part_of(dm.prepare(4), 1)
    given = GraNNDISDataModule(
        dataset_of(), config, data, cache_dir=tmp_path / "b", topology=TOPOLOGY
    )
    want = given.part_of(given.prepare(4), 1)
    assert got.topology == want.topology == TOPOLOGY
    assert torch.equal(got.x_ids, want.x_ids)
    for k, layout in want.layouts.items():
        assert got.layouts[k].x_ranges == layout.x_ranges
        assert all(map(torch.equal, got.layouts[k].targets, layout.targets))
