"""GraNNDIS graph expansion: k-hop BFS, EAS, CoB-SAGE and co-batches (spec §4.3–§4.5, §7)."""

import pytest
import torch

from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.node_targets import NodeDataset
from lightning_gnnscale.systems.granndis.analysis import (
    boundary_share,
    e4_compare,
    one_hop_sizes,
    redundancy,
)
from lightning_gnnscale.systems.granndis.expand import (
    FANOUT_SCOPES,
    FRONTIERS,
    SELECTIONS,
    cobatches,
    eas_expand,
    in_edges,
    khop_levels,
    num_cobatches,
    sage_expand,
)

VARIANTS = [(s, c, f) for s in SELECTIONS for c in FANOUT_SCOPES for f in FRONTIERS]


def make_graph(src, dst, num_nodes, *, undirected=True):
    """A Graph over the given edges with dummy features."""
    edges = torch.tensor([src, dst], dtype=torch.int64).reshape(2, -1)
    return Graph.from_edge_index(
        edges,
        num_nodes,
        undirected=undirected,
        x=torch.zeros(num_nodes, 1),
    )


def random_graph(num_nodes, num_edges, seed, *, undirected=False):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=g)
    return make_graph(src.tolist(), dst.tolist(), num_nodes, undirected=undirected)


def path_graph(n=8):
    return make_graph(list(range(n - 1)), list(range(1, n)), n)


def star_graph(leaves=6):
    return make_graph([0] * leaves, list(range(1, leaves + 1)), leaves + 1)


def two_cliques_bridge(size=4):
    """Cliques ``0..size-1`` and ``size..2size-1`` joined by the edge ``size-1 -- size``."""
    src, dst = [], []
    for base in (0, size):
        for a in range(size):
            for b in range(a + 1, size):
                src.append(base + a)
                dst.append(base + b)
    src.append(size - 1)
    dst.append(size)
    return make_graph(src, dst, 2 * size)


def in_nbrs(graph):
    """Python dict v -> set of in-neighbours (message sources)."""
    ip, ind = graph.indptr.tolist(), graph.indices.tolist()
    return {v: set(ind[ip[v] : ip[v + 1]]) for v in range(graph.num_nodes)}


def bfs_oracle(graph, inner, hops):
    """Set-based BFS over reversed edges: dict vertex -> distance."""
    nbrs = in_nbrs(graph)
    dist = {v: 0 for v in inner}
    frontier = set(inner)
    for d in range(1, hops + 1):
        nxt = set()
        for v in frontier:
            nxt |= nbrs[v]
        frontier = nxt - dist.keys()
        for u in frontier:
            dist[u] = d
    return dist


def as_dict(vertices, level):
    return dict(zip(vertices.tolist(), level.tolist()))


def test_in_edges_grouped_by_destination_position():
    graph = random_graph(30, 120, 9)
    nbrs = in_nbrs(graph)
    dst = torch.tensor([7, 0, 29, 7, 13])  # order kept, repeats allowed
    src, pos = in_edges(graph, dst)
    assert torch.all(pos[1:] >= pos[:-1])
    for i, v in enumerate(dst.tolist()):
        mine = src[pos == i].tolist()
        assert mine == sorted(nbrs[v])
    empty = in_edges(graph, torch.empty(0, dtype=torch.int64))
    assert empty[0].numel() == 0 and empty[1].numel() == 0


# ----------------------------------------------------------------------------- khop_levels
HAND_CASES = [
    (path_graph(), [0, 1, 2, 3], 2),
    (path_graph(), [7], 7),
    (star_graph(), [3], 1),
    (star_graph(), [3], 3),
    (star_graph(), [0], 1),
    (two_cliques_bridge(), [0], 1),
    (two_cliques_bridge(), [0, 1], 3),
    (two_cliques_bridge(), [5], 2),
]


@pytest.mark.parametrize("graph,inner,hops", HAND_CASES)
def test_khop_levels_hand_graphs(graph, inner, hops):
    vertices, level = khop_levels(graph, torch.tensor(inner), hops)
    assert vertices.dtype == torch.int64 and level.dtype == torch.int64
    assert torch.all(vertices[1:] > vertices[:-1])
    assert as_dict(vertices, level) == bfs_oracle(graph, inner, hops)


def test_khop_levels_path_worked_example():
    # spec §7 worked vector: server 0 of the path owns {0..3}; k=2 reaches 4 (level 1), 5 (level 2)
    vertices, level = khop_levels(path_graph(), torch.tensor([3, 1, 0, 2]), 2)
    assert vertices.tolist() == [0, 1, 2, 3, 4, 5]
    assert level.tolist() == [0, 0, 0, 0, 1, 2]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("hops", [0, 1, 2, 4])
def test_khop_levels_random_directed(seed, hops):
    graph = random_graph(60, 150, seed)
    g = torch.Generator().manual_seed(100 + seed)
    inner = torch.randperm(60, generator=g)[: 1 + seed].tolist()
    vertices, level = khop_levels(graph, torch.tensor(inner), hops)
    assert as_dict(vertices, level) == bfs_oracle(graph, inner, hops)


def test_khop_levels_empty_and_errors():
    graph = path_graph()
    vertices, level = khop_levels(graph, torch.empty(0, dtype=torch.int64), 3)
    assert vertices.numel() == 0 and level.numel() == 0
    with pytest.raises(ValueError, match="outside"):
        khop_levels(graph, torch.tensor([8]), 1)
    with pytest.raises(ValueError, match="hops"):
        khop_levels(graph, torch.tensor([0]), -1)
    with pytest.raises(ValueError, match="integer"):
        khop_levels(graph, torch.tensor([0.0]), 1)


# ------------------------------------------------------------------------------ eas_expand
def eas(graph, inner, variant=("uniform", "external", "new"), **kw):
    sel, scope, front = variant
    return eas_expand(
        graph, torch.tensor(inner), selection=sel, fanout_scope=scope, frontier=front, **kw
    )


def check_reached_through_edges(graph, vertices, level, frontier):
    """Level-d vertices are in-neighbours of level d-1 ("new") or of level < d ("all")."""
    nbrs = in_nbrs(graph)
    lv = as_dict(vertices, level)
    for u, d in lv.items():
        if d == 0:
            continue
        sources = [v for v, dv in lv.items() if (dv == d - 1 if frontier == "new" else dv < d)]
        assert any(u in nbrs[v] for v in sources), (u, d)


@pytest.mark.parametrize("variant", VARIANTS)
def test_eas_zero_hops_is_inner_only(variant):
    graph = random_graph(80, 400, 3, undirected=True)
    vertices, level = eas(graph, [5, 1, 40], variant, hops=0, fanout=2)
    assert vertices.tolist() == [1, 5, 40] and level.tolist() == [0, 0, 0]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seed", range(3))
def test_eas_unlimited_fanout_equals_bfs(variant, seed):
    graph = random_graph(70, 200, seed)
    inner = list(range(0, 70, 9))
    vertices, level = eas(graph, inner, variant, hops=3, fanout=-1, seed=seed)
    assert as_dict(vertices, level) == bfs_oracle(graph, inner, 3)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seed", range(3))
def test_eas_structure_on_random_graphs(variant, seed):
    graph = random_graph(120, 900, seed, undirected=True)
    inner = list(range(0, 120, 4))
    fanout, hops = 2, 3
    vertices, level = eas(graph, inner, variant, hops=hops, fanout=fanout, seed=seed)
    lv = as_dict(vertices, level)
    bfs = bfs_oracle(graph, inner, hops)
    assert {v for v, d in lv.items() if d == 0} == set(inner)
    assert set(lv) <= set(bfs)  # nothing farther than h hops
    assert all(d >= bfs[v] for v, d in lv.items())
    check_reached_through_edges(graph, vertices, level, variant[2])
    # each frontier vertex adds at most f new vertices per hop
    for d in range(1, hops + 1):
        n_new = sum(1 for x in lv.values() if x == d)
        n_front = sum(1 for x in lv.values() if (x == d - 1 if variant[2] == "new" else x < d))
        assert n_new <= fanout * n_front
    # all edges among inner vertices survive in the induced server graph
    sub = graph.induced_subgraph(vertices)
    pos = {v: i for i, v in enumerate(vertices.tolist())}
    nbrs, sub_nbrs = in_nbrs(graph), in_nbrs(sub)
    for v in inner:
        assert {pos[u] for u in nbrs[v] if u in inner} <= sub_nbrs[pos[v]]
    # no larger than unsampled preloading to the same depth
    assert vertices.numel() <= khop_levels(graph, torch.tensor(inner), hops)[0].numel()


@pytest.mark.parametrize("selection", SELECTIONS)
def test_eas_fanout_per_frontier_vertex_exact(selection):
    # inner vertices 0..4 form a clique; vertex i also has a private set of 2i+1 external
    # in-neighbours, so who picked what is unambiguous
    src, dst, nxt = [], [], 5
    for i in range(5):
        for j in range(i + 1, 5):
            src.append(i)
            dst.append(j)
        for _ in range(2 * i + 1):
            src.append(nxt)
            dst.append(i)
            nxt += 1
    graph = make_graph(src, dst, nxt)
    nbrs = in_nbrs(graph)
    for fanout in (1, 3, -1):
        vertices, level = eas_expand(
            graph, torch.arange(5), hops=1, fanout=fanout, selection=selection, seed=7
        )
        picked = set(vertices[level == 1].tolist())
        for i in range(5):
            private = nbrs[i] - set(range(5))
            want = len(private) if fanout < 0 else min(fanout, len(private))
            assert len(picked & private) == want


def test_eas_deterministic_and_seeded():
    graph = random_graph(300, 3000, 11, undirected=True)
    inner = torch.arange(0, 300, 10)
    runs = {}
    for variant in VARIANTS:
        sel, scope, front = variant
        kw = dict(hops=2, fanout=2, selection=sel, fanout_scope=scope, frontier=front)
        a = eas_expand(graph, inner, seed=1, **kw)
        b = eas_expand(graph, inner, seed=1, **kw)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        runs[variant] = a
        c = eas_expand(graph, inner, seed=2, **kw)
        if sel != "degree_topk":  # top-k moves only through ties
            assert not torch.equal(a[0], c[0])
    salted = eas_expand(graph, inner, hops=2, fanout=2, seed=1, salt=1)
    assert not torch.equal(salted[0], runs[VARIANTS[0]][0])


def scored_fan():
    """Inner vertex 0 with external in-neighbours 1..5; neighbour i has i-1 further ones.

    Scores |N_in(u) minus selected| at hop 1: vertex i has i-1 leaves plus vertex 0, which
    is selected, so score(i) = i - 1; vertex 5 and a twin 6 both score 4 (a tie).
    """
    src, dst, nxt = [], [], 7
    for i in range(1, 7):
        src.append(i)
        dst.append(0)
        for _ in range(min(i, 5) - 1):
            src.append(nxt)
            dst.append(i)
            nxt += 1
    return make_graph(src, dst, nxt)


def test_eas_degree_topk_picks_highest_scores_ties_seeded():
    graph = scored_fan()
    seen_top = set()
    for seed in range(20):
        vertices, level = eas_expand(
            graph, torch.tensor([0]), hops=1, fanout=3, selection="degree_topk", seed=seed
        )
        picked = set(vertices[level == 1].tolist())
        assert picked == {4, 5, 6}
        vertices, level = eas_expand(
            graph, torch.tensor([0]), hops=1, fanout=1, selection="degree_topk", seed=seed
        )
        picked = vertices[level == 1].tolist()
        assert picked in ([5], [6])
        seen_top.add(picked[0])
    assert seen_top == {5, 6}  # the tie is broken by the seed, not always the same way


def test_eas_degree_topk_scores_only_unselected_neighbours():
    # candidates 4 and 5 of inner vertex 0: 4 has three in-neighbours, all inner (score 0);
    # 5 has two, both outside (score 2). Raw in-degree would prefer 4, the score prefers 5.
    src = [4, 5, 1, 2, 3, 6, 7, 1, 2]
    dst = [0, 0, 4, 4, 4, 5, 5, 2, 3]
    graph = make_graph(src, dst, 8, undirected=False)
    for seed in range(5):
        vertices, level = eas_expand(
            graph, torch.arange(4), hops=1, fanout=1, selection="degree_topk", seed=seed
        )
        assert vertices[level == 1].tolist() == [5]


@pytest.mark.parametrize("seed", range(4))
def test_eas_degree_topk_on_random_graphs(seed):
    # one hop, external scope: v's candidates are its in-neighbours outside I, scored by
    # |N_in(u) minus I|. Each v's candidates above its f-th best score must all be picked,
    # and every picked u must reach the f-th best score of some v that has it as a candidate.
    graph = random_graph(150, 900, seed)
    nbrs = in_nbrs(graph)
    inner = set(range(0, 150, 3))
    fanout = 2
    vertices, level = eas_expand(
        graph, torch.tensor(sorted(inner)), hops=1, fanout=fanout, selection="degree_topk",
        seed=seed,
    )  # fmt: skip
    picked = set(vertices[level == 1].tolist())
    score = {u: len(nbrs[u] - inner) for u in range(150)}
    cut = {}
    for v in inner:
        cand = nbrs[v] - inner
        if cand:
            cut[v] = sorted((score[u] for u in cand), reverse=True)[:fanout][-1]
            assert {u for u in cand if score[u] > cut[v]} <= picked
            assert len(cand & picked) >= min(fanout, len(cand))
    for u in picked:
        assert any(u in nbrs[v] and score[u] >= c for v, c in cut.items()), u


@pytest.mark.parametrize("selection", ["uniform", "degree_prob"])
def test_eas_random_selection_frequencies(selection):
    graph = scored_fan()
    counts = torch.zeros(7)
    trials = 600
    for seed in range(trials):
        vertices, level = eas_expand(
            graph, torch.tensor([0]), hops=1, fanout=1, selection=selection, seed=seed
        )
        counts[vertices[level == 1]] += 1
    freq = counts[1:] / trials
    score = torch.tensor([0.0, 1, 2, 3, 4, 4])
    want = torch.full((6,), 1 / 6) if selection == "uniform" else (score + 1) / (score + 1).sum()
    assert torch.allclose(freq, want, atol=0.06), (freq, want)
    # the +1 in score + 1: a candidate with score 0 is still drawn (expected 1/6 or 1/20)
    assert freq[0] > 0.02, freq


def test_eas_fanout_scope_counts_selected_neighbours_only_with_all():
    # vertex 0 (inner) has 8 inner in-neighbours (1..8) and one external one (9); f = 1
    src = list(range(1, 10)) + [1, 2, 3]
    dst = [0] * 9 + [2, 3, 4]
    graph = make_graph(src, dst, 10)
    inner = torch.arange(9)
    hits = {"external": 0, "all": 0}
    for seed in range(30):
        for scope in hits:
            vertices, _ = eas_expand(graph, inner, hops=1, fanout=1, fanout_scope=scope, seed=seed)
            hits[scope] += int(9 in vertices.tolist())
    assert hits["external"] == 30  # the only external candidate is always taken
    assert 0 < hits["all"] < 15  # one draw among 9 in-neighbours: mostly an inner one


def test_eas_frontier_new_versus_all():
    # centre 0 (inner) with leaves 1..5, each leaf i with a private tail 5+i; f = 1, h = 2
    src = [0] * 5 + list(range(1, 6))
    dst = list(range(1, 6)) + list(range(6, 11))
    graph = make_graph(src, dst, 11)
    for seed in range(5):
        v_new, l_new = eas_expand(graph, torch.tensor([0]), hops=2, fanout=1, seed=seed)
        v_all, l_all = eas_expand(
            graph, torch.tensor([0]), hops=2, fanout=1, frontier="all", seed=seed
        )
        # "new": hop 2 expands only the hop-1 leaf, which adds its tail
        leaf = v_new[l_new == 1].item()
        assert sorted(v_new[l_new == 2].tolist()) == [leaf + 5]
        # "all": the centre expands again and adds a second leaf at level 2
        assert v_all[l_all == 1].tolist() == [leaf]
        lvl2 = sorted(v_all[l_all == 2].tolist())
        assert len(lvl2) == 2 and leaf + 5 in lvl2 and sum(1 <= u <= 5 for u in lvl2) == 1


def test_eas_artifact_preset_redraws_every_hop():
    # (uniform, all, all): the centre of a star is in every hop's frontier and draws afresh
    # each hop among all its in-neighbours, so later hops add leaves (as DGL's ShaDow sampler)
    graph = star_graph(12)
    later = 0
    for seed in range(5):
        vertices, level = eas_expand(
            graph, torch.tensor([0]), hops=3, fanout=3, fanout_scope="all", frontier="all",
            seed=seed,
        )  # fmt: skip
        assert all(level.tolist().count(d) <= 3 for d in (1, 2, 3))
        later += level.tolist().count(2) + level.tolist().count(3)
    assert later > 0


def self_loop_graph():
    """Self-loops on 0 and 1; edges 2 -> 0, 3 -> 0, 4 -> 1 (built directly: ``from_edge_index``
    drops self-loops)."""
    graph = make_graph([], [], 5)
    return graph.with_structure(torch.tensor([0, 3, 5, 5, 5, 5]), torch.tensor([0, 2, 3, 1, 4]))


@pytest.mark.parametrize("selection", SELECTIONS)
def test_eas_self_loops_and_duplicate_inner_ids(selection):
    graph = self_loop_graph()
    inner = torch.tensor([0, 1, 0, 1])  # duplicates count once
    vertices, level = khop_levels(graph, inner, 5)  # hops beyond the diameter
    assert as_dict(vertices, level) == {0: 0, 1: 0, 2: 1, 3: 1, 4: 1}
    for seed in range(4):
        # external scope: a self-loop is never a candidate, so f = 1 always adds one new
        # vertex per inner vertex
        vertices, level = eas_expand(graph, inner, hops=3, fanout=1, selection=selection, seed=seed)
        lv = as_dict(vertices, level)
        assert lv[0] == lv[1] == 0 and lv[4] == 1
        assert sum(lv.get(u) == 1 for u in (2, 3)) == 1 and len(lv) == 4


def test_eas_spec_worked_vector():
    # spec §7: path 0..7, server 0 owns {0..3}; h=1, f=1, external scope -> V_0 = {0..4}
    vertices, level = eas_expand(path_graph(), torch.arange(4), hops=1, fanout=1)
    assert vertices.tolist() == [0, 1, 2, 3, 4] and level.tolist() == [0, 0, 0, 0, 1]


def test_eas_bad_arguments():
    graph = path_graph()
    inner = torch.tensor([0])
    for kw, match in [
        (dict(selection="topk"), r"selection 'topk'; valid: \['uniform'"),
        (dict(fanout_scope="inner"), "fanout_scope"),
        (dict(frontier="some"), "frontier"),
        (dict(fanout=0), "fanout"),
        (dict(fanout=-2), "fanout"),
        (dict(hops=-1), "hops"),
    ]:
        with pytest.raises(ValueError, match=match):
            eas_expand(graph, inner, **kw)


# ----------------------------------------------------------------------------- sage_expand
@pytest.mark.parametrize("seed", range(4))
def test_sage_expand_structure(seed):
    graph = random_graph(150, 1500, seed, undirected=True)
    inner = list(range(0, 150, 15))
    fanout, hops = 2, 3
    vertices, level = sage_expand(graph, torch.tensor(inner), fanout=fanout, hops=hops, seed=seed)
    lv = as_dict(vertices, level)
    bfs = bfs_oracle(graph, inner, hops)
    assert {v for v, d in lv.items() if d == 0} == set(inner)
    assert set(lv) <= set(bfs) and all(d >= bfs[v] for v, d in lv.items())
    check_reached_through_edges(graph, vertices, level, "all")
    for d in range(1, hops + 1):  # every collected vertex adds at most f per hop
        n_new = sum(1 for x in lv.values() if x == d)
        assert n_new <= fanout * sum(1 for x in lv.values() if x < d)
    assert vertices.numel() < len(bfs)  # it did sample


def test_sage_expand_star_resamples_collected_vertices():
    graph = star_graph(12)
    later = 0
    for seed in range(5):
        vertices, level = sage_expand(graph, torch.tensor([0]), fanout=3, hops=1, seed=seed)
        assert level.tolist().count(1) == 3
        vertices, level = sage_expand(graph, torch.tensor([0]), fanout=3, hops=3, seed=seed)
        # the centre re-samples 3 leaves each hop; leaves only lead back to the centre
        assert all(level.tolist().count(d) <= 3 for d in (1, 2, 3))
        later += level.tolist().count(2) + level.tolist().count(3)
    assert later > 0  # "frontier = all": level-0 vertices keep expanding after hop 1


def test_sage_expand_unlimited_and_deterministic():
    graph = random_graph(90, 300, 5)
    inner = [0, 10, 20]
    vertices, level = sage_expand(graph, torch.tensor(inner), fanout=-1, hops=3)
    assert as_dict(vertices, level) == bfs_oracle(graph, inner, 3)
    graph = random_graph(300, 3000, 6, undirected=True)
    a = sage_expand(graph, torch.arange(10), fanout=3, hops=2, seed=4)
    b = sage_expand(graph, torch.arange(10), fanout=3, hops=2, seed=4)
    c = sage_expand(graph, torch.arange(10), fanout=3, hops=2, seed=5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
    with pytest.raises(ValueError, match="fanout"):
        sage_expand(graph, torch.arange(3), fanout=0, hops=1)


# ------------------------------------------------------------------------------- cobatches
@pytest.mark.parametrize("num", [1, 3, 7, 40])
@pytest.mark.parametrize("shuffle", [True, False])
def test_cobatches_partition_targets(num, shuffle):
    targets = torch.tensor([31, 4, 15, 9, 26, 5, 35, 8, 97, 93, 23, 84, 62, 64, 33])
    chunks = cobatches(targets, num, shuffle=shuffle, seed=3, epoch=1, server=2)
    assert len(chunks) == num
    flat = torch.cat(chunks)
    assert sorted(flat.tolist()) == sorted(targets.tolist())  # disjoint and complete
    sizes = [c.numel() for c in chunks]
    assert max(sizes) - min(sizes) <= 1
    assert all(c.tolist() == sorted(c.tolist()) for c in chunks)  # each chunk ascending
    if not shuffle:  # sorted contiguous chunks
        assert flat.tolist() == sorted(targets.tolist())


def test_cobatches_shuffle_seeded_per_epoch_and_server():
    targets = torch.arange(100, 200)

    def split(**kw):
        return [c.tolist() for c in cobatches(targets, 4, **kw)]

    assert split(seed=1, epoch=0) == split(seed=1, epoch=0)
    assert split(seed=1, epoch=0) != split(seed=1, epoch=1)
    assert split(seed=1, epoch=0) != split(seed=2, epoch=0)
    assert split(seed=1, epoch=0, server=0) != split(seed=1, epoch=0, server=1)
    assert split(shuffle=False, epoch=0) == split(shuffle=False, epoch=5)


def test_cobatches_same_count_on_all_servers():
    # servers with 0, 3 and 50 targets all get B chunks (empty ones included)
    b = num_cobatches(50, size_per_worker=4, workers_per_server=2)
    assert b == 7  # ceil(50 / 8)
    for t in (torch.empty(0, dtype=torch.int64), torch.arange(3), torch.arange(50)):
        chunks = cobatches(t, b, seed=0, server=int(t.numel()))
        assert len(chunks) == b and sum(c.numel() for c in chunks) == t.numel()


def test_num_cobatches_and_errors():
    assert num_cobatches(8, 4, 2) == 1
    assert num_cobatches(9, 4, 2) == 2
    assert num_cobatches(0, 4, 2) == 1
    with pytest.raises(ValueError, match="size_per_worker"):
        num_cobatches(8, 0, 2)
    with pytest.raises(ValueError, match="num_per_epoch"):
        cobatches(torch.arange(4), 0)
    with pytest.raises(ValueError, match="duplicate"):
        cobatches(torch.tensor([1, 1, 2]), 2)
    with pytest.raises(ValueError, match="integer"):  # a mask is not a list of ids
        cobatches(torch.tensor([True, False]), 2)


# -------------------------------------------------------------------------------- analysis
@pytest.mark.parametrize(
    "graph,inner,beta",
    [
        (path_graph(), [0, 1, 2, 3], 1 / 4),  # only 3 sees 4
        (path_graph(), [0, 7], 1.0),
        (two_cliques_bridge(), [0, 1, 2, 3], 1 / 4),  # only the bridge end 3
        (two_cliques_bridge(), [0, 1], 1.0),
        (two_cliques_bridge(), list(range(8)), 0.0),
        (star_graph(), [0], 1.0),
        (star_graph(), [1, 2, 3], 1.0),
        (make_graph([5], [0], 6, undirected=False), [5], 0.0),  # 5 has no in-neighbour
        (make_graph([5], [0], 6, undirected=False), [0, 1], 1 / 2),
    ],
)
def test_boundary_share_hand_graphs(graph, inner, beta):
    assert boundary_share(graph, torch.tensor(inner)) == pytest.approx(beta)


def test_boundary_share_and_redundancy_errors_and_worked_vector():
    with pytest.raises(ValueError, match="non-empty"):
        boundary_share(path_graph(), torch.empty(0, dtype=torch.int64))
    # spec §7: FLX k=2 on the path gives |V_0| = |V_1| = 6 of 8 vertices, rho = 1.5
    counts = [
        khop_levels(path_graph(), torch.arange(4 * s, 4 * s + 4), 2)[0].numel() for s in (0, 1)
    ]
    assert counts == [6, 6] and redundancy(counts, 8) == 1.5
    with pytest.raises(ValueError, match="num_nodes"):
        redundancy([1], 0)


def test_one_hop_sizes_against_sets():
    graph = random_graph(40, 160, 2)
    parts = torch.randint(0, 3, (40,), generator=torch.Generator().manual_seed(0))
    sizes = one_hop_sizes(graph, parts, 3).tolist()
    nbrs = in_nbrs(graph)
    for p in range(3):
        owned = {v for v in range(40) if parts[v] == p}
        halo = {u for v in owned for u in nbrs[v]} - owned
        edges = sum(len(nbrs[v]) for v in owned)
        assert sizes[p] == [len(owned), len(halo), edges]


def sbm_dataset(seed: int) -> NodeDataset:
    return sbm(2000, avg_degree=5, seed=seed)


def test_e4_cob_shares_dependencies_and_gap_grows_with_depth():
    dataset = sbm_dataset(0)
    graph, targets = dataset.graph, dataset.targets
    runs = {
        layers: e4_compare(
            graph,
            targets,
            num_layers=layers,
            num_servers=2,
            workers_per_server=2,
            batch_per_worker=4,
        )
        for layers in (3, 8)
    }
    gaps = {}
    for layers, r in runs.items():
        assert r["mb_base"]["targets"] == r["cob_sage"]["targets"] == r["cob_eas"]["targets"]
        assert r["cob_sage"]["vertices"] <= r["mb_base"]["vertices"]
        assert r["cob_eas"]["vertices"] <= r["cob_sage"]["vertices"]
        gaps[layers] = r["mb_base"]["vertices"] - r["cob_sage"]["vertices"]
    assert gaps[8] > gaps[3] > 0


def test_e4_same_targets_when_cobatches_are_not_full():
    # 600 training targets, ~300 per server: B = 2 co-batches of ~150 < N_g * 100
    dataset = sbm_dataset(1)
    r = e4_compare(
        dataset.graph,
        dataset.targets,
        num_layers=2,
        num_servers=2,
        workers_per_server=2,
        batch_per_worker=100,
    )
    assert r["setup"]["cobatches_per_epoch"] == 2
    assert r["mb_base"]["targets"] == r["cob_sage"]["targets"] < 4 * 100


def test_granndis_e4_bench_writes_its_report(tmp_path):
    import json

    from lightning_gnnscale.bench.granndis import run_granndis_e4_bench

    report = run_granndis_e4_bench(
        nodes=400,
        avg_degree=5,
        layers=[2, 3],
        servers=2,
        workers=2,
        batch_per_worker=8,
        fanout=3,
        hidden=8,
        eas_hops=1,
        eas_fanout=2,
        seed=0,
        out=tmp_path,
        argv=["granndis-e4", "--nodes", "400"],
    )
    saved = json.loads((tmp_path / "granndis_e4.json").read_text())
    assert [r["setup"]["num_layers"] for r in saved["results"]] == [2, 3]
    assert saved["results"][0]["mb_base"] == report["results"][0]["mb_base"]
    markdown = (tmp_path / "granndis_e4.md").read_text()
    assert "granndis-e4 --nodes 400" in markdown
    assert "| 3 | CoB-SAGE |" in markdown and "| 2 | MB_base |" in markdown
