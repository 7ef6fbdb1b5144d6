"""GraNNDIS's analytic models (spec §4.8): paper equations, memory estimator, planner, network."""

import math

import pytest
import torch

from lightning_gnnscale.systems.granndis.costmodel import (
    GRANNDIS_NETWORKS,
    ModePlan,
    choose_k,
    eas_in_regime,
    estimate_memory,
    estimate_mfg_memory,
    flx_threshold,
    flx_wins,
    m_preload,
    modelled_epoch_time,
    plan_mode,
    preload_per_gpu_ratio,
    preload_total_growth,
    replication_in_range,
    sage_num_params,
    synchronised_epoch_time,
    t_preload,
    t_prev,
    t_sampling,
)

# the paper's example: D^alpha = 2 with D = 10, so alpha = log 2 / log 10
ALPHA = math.log(2) / math.log(10)


def test_paper_example_threshold_is_one_half():
    assert flx_threshold(10, ALPHA, 3) == pytest.approx(0.5, abs=1e-12)
    assert flx_wins(0.51, 1.0, 10, ALPHA, 3)
    assert not flx_wins(0.49, 1.0, 10, ALPHA, 3)


def test_t_prev_and_t_preload_by_hand():
    # V=1000, E=10000, 2x2 cluster, C=100, B_intra=1000, B_inter=10 (vertices/s)
    # eq.1: 1000/400 + 10000/4 * ((1/4)/1000 + (1/2)/10) = 2.5 + 2500 * 0.05025
    assert t_prev(1000, 10000, 2, 2, 100, 1000, 10) == pytest.approx(2.5 + 125.625)
    # eq.2 with D^a = 2, L = 3: 1000*6/400 + 10000*6/4 * (1/2)/1000
    assert t_preload(1000, 10000, 2, 2, 100, 1000, 2, 3) == pytest.approx(15 + 7.5)


def test_t_sampling_keeps_printed_bracket():
    # m^alpha = 16^0.5 = 4, h = 1: 1000*4/400 + 10000*4/4 * (2*2 - 1)/1000
    assert t_sampling(1000, 10000, 2, 2, 100, 1000, 16, 0.5, 1) == pytest.approx(10 + 30)


@pytest.mark.parametrize("ratio", [0.05, 0.3, 0.45, 0.55, 0.8, 2.0, 10.0])
def test_eq5_matches_eq1_vs_eq2_in_the_approximation_regime(ratio):
    # 1/B_intra ~ 0 (one GPU per server: no intra term at all), 1/N_s ~ 0, E = D V
    D, L, V, b_inter = 10, 3, 1e6, 1e4
    C = ratio * b_inter
    ns = 10**9
    prev = t_prev(V, D * V, ns, 1, C, 1.0, b_inter)
    pre = t_preload(V, D * V, ns, 1, C, 1.0, D**ALPHA, L)
    assert (pre < prev) == flx_wins(C, b_inter, D, ALPHA, L)


def test_slower_inter_link_gives_larger_flx_speedup():
    speedups = []
    for b_inter in (1e5, 1e4, 1e3, 1e2):  # paper cluster -> 10GbE -> 1GbE style
        prev = t_prev(1e6, 1e7, 4, 4, 1e5, 1e7, b_inter)
        pre = t_preload(1e6, 1e7, 4, 4, 1e5, 1e7, 2.0, 3)
        speedups.append(prev / pre)
    assert all(b > a for a, b in zip(speedups, speedups[1:]))


def test_eq3_and_eq7_ranges():
    assert not replication_in_range(2, 3, 2, 2)  # 6 > 4 workers
    assert replication_in_range(2, 3, 4, 4)
    assert not replication_in_range(0.3, 3, 4, 4)  # 0.9 <= 1
    assert eas_in_regime(4, 0.5, 1, 10, 3, 4, 4)  # 1 < 2 < 6 <= 16
    assert not eas_in_regime(100, 0.5, 1, 10, 3, 4, 4)  # 10 > 6


def test_eas_memory_equations_are_consistent():
    V, H, L, a1, n, m, ns1, ng = 1e6, 64, 3, 1.2, 2, 4, 2, 4
    a2 = n * a1
    per_gpu_1 = m_preload(V, H, L, a1, ns1, ng)
    per_gpu_2 = m_preload(V, H, L, a2, m * ns1, ng)
    assert per_gpu_1 == pytest.approx(2 * V * H * L * a1 / (ns1 * ng))
    # eq.14 is the ratio of eq.12 at the two server counts, and equals n/m
    assert preload_per_gpu_ratio(ns1, m * ns1, a1, a2) == pytest.approx(per_gpu_2 / per_gpu_1)
    assert preload_per_gpu_ratio(ns1, m * ns1, a1, a2) == pytest.approx(n / m)
    # eq.13 is the growth of the cluster-wide total of eq.12
    growth = per_gpu_2 * m * ns1 * ng - per_gpu_1 * ns1 * ng
    assert preload_total_growth(V, H, L, a1, a2) == pytest.approx(growth)


def test_estimate_memory_by_hand():
    est = estimate_memory(n_owned=10, n_halo=5, num_edges=40, dims=[8, 4, 3], num_params=100)
    rows = 15
    assert est.features == rows * 8 * 4
    # inputs and their grads (rows x d_j, j < L) + 3 outputs per owned row (d_{j+1})
    assert est.activations == rows * (8 + 4) * 4 * 2 + 10 * (4 + 3) * 4 * 3
    assert est.graph == 40 * 16 and est.keep_masks == 2 * rows and est.parameters == 100 * 16
    assert est.total == 480 + 2280 + 640 + 30 + 1600
    typed = estimate_memory(
        n_owned=10, n_halo=5, num_edges=40, dims=[8, 4, 3], num_params=100, typed=True
    )
    assert typed.graph == 40 * 24  # a relation per edge besides its two ends
    with pytest.raises(ValueError, match="dims"):
        estimate_memory(n_owned=1, n_halo=0, num_edges=0, dims=[8], num_params=1)


def test_estimate_mfg_memory_by_hand_and_against_one_hop():
    est = estimate_mfg_memory(
        src_rows=[20, 8], dst_rows=[8, 2], num_edges=30, dims=[5, 4, 3], num_params=10
    )
    assert est.features == 20 * 5 * 4
    assert est.activations == (20 * 5 + 8 * 4) * 4 * 2 + (8 * 4 + 2 * 3) * 4 * 3
    assert (est.graph, est.keep_masks, est.parameters) == (480, 0, 160)
    # a one-hop graph is an MFG whose rows do not shrink (masks aside)
    one_hop = estimate_memory(
        n_owned=10, n_halo=5, num_edges=40, dims=[8, 4, 3], num_params=7, masked_layers=0
    )
    mfg = estimate_mfg_memory(
        src_rows=[15, 15], dst_rows=[10, 10], num_edges=40, dims=[8, 4, 3], num_params=7
    )
    assert one_hop == mfg
    with pytest.raises(ValueError, match="per layer"):
        estimate_mfg_memory(src_rows=[1], dst_rows=[1], num_edges=0, dims=[2, 2, 2], num_params=1)


def test_sage_num_params_by_hand():
    # F=4, H=3, C=2, L=2: conv = 2 biased linears + LayerNorm(3); then Linear(3, 2)
    assert sage_num_params(4, 3, 2, 2) == (2 * (4 * 3 + 3) + 6) + (2 * (3 * 3 + 3) + 6) + 8


def test_choose_k():
    mem = [10.0, 20.0, 30.0, 40.0]  # k = 0..3
    assert choose_k(mem, None) == 3
    assert choose_k(mem, 40) == 3
    assert choose_k(mem, 39.9) == 2
    assert choose_k(mem, 25) == 1
    assert choose_k(mem, 10) == 0
    assert choose_k(mem, 9) is None
    # monotone in the budget
    ks = [choose_k(mem, b) for b in range(0, 50, 5)]
    assert all((a or -1) <= (b or -1) for a, b in zip(ks, ks[1:]))


def test_plan_mode():
    flx = [10.0, 20.0, 30.0, 40.0]
    cob = {1: 12.0, 2: 7.0, 4: 4.0}
    assert plan_mode(memory_flx_by_k=flx, budget=None) == ModePlan("flx", k=3)
    assert plan_mode(memory_flx_by_k=flx, budget=50) == ModePlan("flx", k=3)
    assert plan_mode(memory_flx_by_k=flx, budget=35, memory_eas=15) == ModePlan("flx_eas")
    assert plan_mode(
        memory_flx_by_k=flx, budget=35, memory_eas=15, allow_sampling=False
    ) == ModePlan("flx", k=2)
    assert plan_mode(memory_flx_by_k=flx, budget=12, memory_eas=15) == ModePlan("flx", k=0)
    plan = plan_mode(memory_flx_by_k=flx, budget=8, memory_eas=15, memory_cob_by_b=cob)
    assert plan == ModePlan("cob", num_cobatches=2)
    with pytest.raises(ValueError, match="no GraNNDIS mode fits"):
        plan_mode(memory_flx_by_k=flx, budget=3, memory_cob_by_b=cob)


def test_modelled_epoch_time_per_network():
    # one rank sent 112 GB inside its server and 4 GB across servers in the epoch
    out = modelled_epoch_time(1.0, {"intra_server": 112e9, "inter_server": 4e9})
    assert out["paper"] == pytest.approx(1 + 1 + 1)  # NVLink 112 GB/s, IB QDR 32 Gb/s
    assert out["paper_10gbe"] == pytest.approx(1 + 1 + 4e9 / 1.25e9)
    assert out["paper_1gbe"] == pytest.approx(1 + 1 + 4e9 / 0.125e9)
    with_msgs = modelled_epoch_time(
        1.0, {"inter_server": 0}, ["paper_10gbe"], messages_by_link={"inter_server": 1000}
    )
    assert with_msgs["paper_10gbe"] == pytest.approx(1 + 1000 * 20e-6)
    assert set(modelled_epoch_time(0.0, {}, ["10gbe"])) == {"10gbe"}  # the suite's profiles too
    with pytest.raises(ValueError, match="valid: .*paper_1gbe"):
        modelled_epoch_time(1.0, {}, ["infiniband"])
    with pytest.raises(ValueError, match="link classes"):
        modelled_epoch_time(1.0, {"inter": 1})


def _zeros(world, steps):
    return torch.zeros(world, steps, 2)


def test_synchronised_epoch_time_charges_the_slowest_rank_and_the_slowest_link():
    """Issue 22 item 1. Rank 0 computes 1 s and sends nothing across servers; rank 1 computes
    0.1 s and sends 1 MB of gradients to the other server. With barriers the step ends at
    1 s of compute plus 1 MB on the inter-server link, so the time grows as that link slows
    (the max over ranks of each rank's own compute plus own bytes gave 1 s at every network).
    Phases are maxed one by one: two ranks slow in different phases add up."""
    names = list(GRANNDIS_NETWORKS)
    grads = _zeros(2, 1)
    grads[1, 0, 1] = 1e6
    messages = _zeros(2, 1)
    messages[1, 0, 1] = 1
    phases = torch.tensor([[[0.0, 0.0, 1.0]], [[0.0, 0.0, 0.1]]])
    got = synchronised_epoch_time(
        phases, {"gradient": grads}, {"gradient": messages}, [0], spans_servers=True
    )
    for name in names:
        model = GRANNDIS_NETWORKS[name]
        assert got[name] == pytest.approx(1.0 + 1e6 / model.inter_bandwidth + model.inter_latency)
    assert got["paper"] < got["paper_10gbe"] < got["paper_1gbe"]
    skewed = torch.tensor([[[1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]]])
    none = {"gradient": _zeros(2, 1)}
    one_server = synchronised_epoch_time(skewed, none, none, [2], spans_servers=False)
    assert one_server["paper"] == pytest.approx(2.0 + GRANNDIS_NETWORKS["paper"].intra_latency)


def test_zero_byte_barriers_across_servers_cost_a_latency_each():
    """Two layers, nothing sent: the feature exchange, one activation exchange, its backward
    and the gradient sync are four barriers over all ranks, each at least one latency of the
    widest link spanned (inter-server when the ranks span servers)."""
    categories = ("feature", "activation", "activation_grad", "gradient")
    empty = {c: _zeros(4, 3) for c in categories}
    phases = torch.zeros(4, 3, 3)
    for spans, latency in ((True, "inter_latency"), (False, "intra_latency")):
        got = synchronised_epoch_time(phases, empty, empty, [2, 2, 2], spans_servers=spans)
        for name, model in GRANNDIS_NETWORKS.items():
            assert got[name] == pytest.approx(3 * 4 * getattr(model, latency))
