"""Link-prediction building blocks (issue 38, first slice): the edge split, negatives, ranking
metrics and AUC, and the decoders. The oracles are Python sets, pairwise counts and loops, none
of them the kernels they check."""

from __future__ import annotations

import pytest
import torch

from lightning_gnnscale.graph.csc import csc_from_edges
from lightning_gnnscale.tasks.link.decoders import DotDecoder, MLPDecoder
from lightning_gnnscale.tasks.link.metrics import (
    auc,
    ranking_metrics,
    ranking_statistic_names,
    ranking_statistics,
)
from lightning_gnnscale.tasks.link.negatives import (
    evaluation_negatives,
    joint_negatives,
    uniform_negatives,
)
from lightning_gnnscale.tasks.link.split import EdgeLookup, random_link_split

N = 60


def _csc(num_nodes: int, num_edges: int, seed: int, undirected: bool = True):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(num_nodes, (num_edges,), generator=gen)
    dst = torch.randint(num_nodes, (num_edges,), generator=gen)
    return csc_from_edges(src, dst, num_nodes, undirected=undirected)


def _edges(indptr, indices) -> set[tuple[int, int]]:
    """The ``(src, dst)`` edges of a CSC, read segment by segment (the oracle's own walk)."""
    out = set()
    for v in range(indptr.numel() - 1):
        for u in indices[indptr[v] : indptr[v + 1]].tolist():
            out.add((u, v))
    return out


def _pairs(pos) -> list[tuple[int, int]]:
    return list(zip(pos[0].tolist(), pos[1].tolist()))


# ------------------------------------------------------------------------------------ split
def test_split_has_no_leakage_and_each_stage_passes_messages_over_its_edges():
    indptr, indices = _csc(N, 400, seed=1)
    split = random_link_split(indptr, indices, seed=7)
    train_edges = _edges(*split.structure("train"))
    assert _edges(*split.structure("val")) == train_edges
    for name in ("val", "test"):
        for s, d in _pairs(split.positives(name)):
            assert (s, d) not in train_edges and (d, s) not in train_edges, (name, s, d)
    val_both = {(s, d) for s, d in _pairs(split.val_pos)} | {
        (d, s) for s, d in _pairs(split.val_pos)
    }
    test_edges = _edges(*split.structure("test"))
    assert test_edges == train_edges | val_both
    for s, d in _pairs(split.test_pos):
        assert (s, d) not in test_edges and (d, s) not in test_edges
    # every pair of the graph lands in exactly one split, both directions together
    all_pairs = [p for name in ("train", "val", "test") for p in _pairs(split.positives(name))]
    assert len(all_pairs) == len(set(all_pairs))
    assert all(s <= d for s, d in all_pairs)
    graph = _edges(indptr, indices)
    assert {(s, d) for s, d in all_pairs} | {(d, s) for s, d in all_pairs} == graph
    assert {(s, d) for s, d in _pairs(split.train_pos)} | {
        (d, s) for s, d in _pairs(split.train_pos)
    } == train_edges


def test_split_sizes_are_random_link_splits_and_pairs_keep_both_directions_together():
    indptr, indices = _csc(N, 400, seed=2)
    split = random_link_split(indptr, indices, seed=0, val=0.05, test=0.1)
    src, dst = indices, torch.repeat_interleave(torch.arange(N), indptr.diff())
    pairs = int((src < dst).sum())  # csc_from_edges drops self-loops
    assert split.val_pos.shape[1] == int(0.05 * pairs)
    assert split.test_pos.shape[1] == int(0.1 * pairs)
    assert split.train_pos.shape[1] == pairs - int(0.05 * pairs) - int(0.1 * pairs)
    label = {(u, v): int(s) for u, v, s in zip(src.tolist(), dst.tolist(), split.edge_split)}
    assert all(label[(u, v)] == label[(v, u)] for u, v in label)


def test_split_sizes_and_message_passing_edges_match_pygs_random_link_split():
    from torch_geometric.data import Data
    from torch_geometric.transforms import RandomLinkSplit

    indptr, indices = _csc(N, 400, seed=8)
    data = Data(
        edge_index=torch.stack([indices, torch.repeat_interleave(torch.arange(N), indptr.diff())]),
        num_nodes=N,
    )
    pyg = RandomLinkSplit(0.05, 0.1, is_undirected=True, add_negative_train_samples=False)(data)
    ours = random_link_split(indptr, indices, seed=0)
    for stage, part in zip(("train", "val", "test"), pyg):
        # PyG's val and test labels hold as many negatives as positives
        positives = int(part.edge_label.sum())
        assert ours.positives(stage).shape[1] == positives, stage
        assert ours.structure(stage)[1].numel() == part.edge_index.shape[1], stage


def test_split_is_reproducible_per_seed_and_differs_across_seeds():
    indptr, indices = _csc(N, 400, seed=3)
    a, b = (random_link_split(indptr, indices, seed=5) for _ in range(2))
    c = random_link_split(indptr, indices, seed=6)
    assert torch.equal(a.edge_split, b.edge_split) and torch.equal(a.test_pos, b.test_pos)
    assert not torch.equal(a.edge_split, c.edge_split)


def test_directed_split_splits_edges_and_undirected_refuses_an_asymmetric_graph():
    indptr, indices = _csc(N, 300, seed=4, undirected=False)
    with pytest.raises(ValueError, match="symmetric graph: .* lack their reverse; pass undirected"):
        random_link_split(indptr, indices, seed=0)
    split = random_link_split(indptr, indices, seed=0, undirected=False, val=0.1, test=0.2)
    train_edges = _edges(*split.structure("train"))
    for s, d in _pairs(split.val_pos) + _pairs(split.test_pos):
        assert (s, d) not in train_edges
    sizes = [split.positives(n).shape[1] for n in ("train", "val", "test")]
    assert sum(sizes) == indices.numel() and sizes[1] == int(0.1 * indices.numel())


@pytest.mark.parametrize(
    ("val", "test", "message"),
    [
        (1.0, 0.0, r"val=1.0 must be in \[0, 1\)"),
        (-0.1, 0.1, r"val=-0.1 must be in \[0, 1\)"),
        (0.1, 1.5, r"test=1.5 must be in \[0, 1\)"),
        (0.5, 0.5, "must sum to less than 1"),
    ],
)
def test_split_refuses_bad_fractions(val, test, message):
    indptr, indices = _csc(N, 100, seed=0)
    with pytest.raises(ValueError, match=message):
        random_link_split(indptr, indices, seed=0, val=val, test=test)


def test_split_refuses_a_split_with_no_training_pair_and_unknown_stage_names():
    # int(val * P) + int(test * P) < P for val + test < 1: only a graph without edges is refused
    with pytest.raises(ValueError, match="no training pair: 0 pairs"):
        random_link_split(
            torch.zeros(4, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), seed=0
        )
    indptr, indices = csc_from_edges(torch.tensor([0]), torch.tensor([1]), 3, undirected=True)
    split = random_link_split(indptr, indices, seed=0, val=0.3, test=0.6)
    assert split.train_pos.tolist() == [[0], [1]]
    with pytest.raises(ValueError, match=r"unknown split 'valid'; valid: \['train', 'val'"):
        split.structure("valid")


def test_edge_lookup_refuses_unsorted_segments():
    with pytest.raises(ValueError, match="sorted by source"):
        EdgeLookup(torch.tensor([0, 2]), torch.tensor([0, 0]))


# -------------------------------------------------------------------------------- negatives
def test_training_negatives_do_not_depend_on_how_a_steps_positives_are_split():
    src = torch.randint(N, (31,), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(31)
    indptr, indices = _csc(N, 400, seed=6)
    lookup = EdgeLookup(indptr, indices)
    for filter_by in (None, lookup):
        keys = dict(seed=3, epoch=2, step=5, k=4, filter_by=filter_by)
        whole = uniform_negatives(src, positions, N, **keys)
        assert whole.shape == (31, 4) and int(whole.min()) >= 0 and int(whole.max()) < N
        for chunks in (1, 2, 3):
            parts = [
                uniform_negatives(s, p, N, **keys)
                for s, p in zip(src.tensor_split(chunks), positions.tensor_split(chunks))
            ]
            assert torch.equal(torch.cat(parts), whole), chunks
        perm = torch.randperm(31, generator=torch.Generator().manual_seed(1))
        assert torch.equal(uniform_negatives(src[perm], positions[perm], N, **keys), whole[perm])
    other = [
        uniform_negatives(src, positions, N, seed=s, epoch=e, step=t, k=4)
        for s, e, t in ((3, 2, 5), (4, 2, 5), (3, 3, 5), (3, 2, 6))
    ]
    assert all(not torch.equal(other[0], o) for o in other[1:])


def test_filtered_negatives_redraw_only_true_edges_and_self_pairs():
    indptr, indices = _csc(20, 40, seed=7)  # dense: about a fifth of the pairs are edges
    graph = _edges(indptr, indices)
    src = torch.arange(20).repeat(6)
    positions = torch.arange(120)
    keys = dict(seed=0, epoch=0, step=0, k=5)
    plain = uniform_negatives(src, positions, 20, **keys)
    kept = uniform_negatives(src, positions, 20, filter_by=EdgeLookup(indptr, indices), **keys)
    true = torch.tensor(
        [[(s, d) in graph or s == d for d in row] for s, row in zip(src.tolist(), plain.tolist())]
    )
    assert true.any() and not true.all()
    assert torch.equal(kept[~true], plain[~true])  # a true negative is redrawn, others kept
    for s, row in zip(src.tolist(), kept.tolist()):
        assert all((s, d) not in graph and s != d for d in row)


def test_filtered_negatives_refuse_a_source_adjacent_to_every_node():
    n = 5
    src, dst = torch.arange(n).repeat_interleave(n), torch.arange(n).repeat(n)
    lookup = EdgeLookup(*csc_from_edges(src, dst, n))
    with pytest.raises(ValueError, match="still true edges after 16 redraws"):
        uniform_negatives(
            torch.tensor([0]), torch.tensor([0]), n, seed=0, epoch=0, step=0, filter_by=lookup
        )


def test_negatives_are_uniform_over_the_nodes():
    draws = uniform_negatives(
        torch.zeros(20_000, dtype=torch.int64),
        torch.arange(20_000),
        10,
        seed=1,
        epoch=0,
        step=0,
        k=5,
    )
    counts = torch.bincount(draws.flatten(), minlength=10)
    assert int((counts - 10_000).abs().max()) < 500  # 5 sigma = 5 * sqrt(1e5 * 0.1 * 0.9) = 474


def test_joint_negatives_are_one_set_per_step():
    a = joint_negatives(N, seed=0, epoch=1, step=2, k=8)
    assert a.shape == (8,) and torch.equal(a, joint_negatives(N, seed=0, epoch=1, step=2, k=8))
    assert not torch.equal(a, joint_negatives(N, seed=0, epoch=1, step=3, k=8))


def test_evaluation_negatives_are_fixed_per_split_and_edge_index():
    src = torch.randint(N, (40,), generator=torch.Generator().manual_seed(2))
    index = torch.arange(40)
    whole = evaluation_negatives(src, index, N, seed=0, split="val")
    assert whole.shape == (40, 100)
    for chunks in (2, 3):
        parts = [
            evaluation_negatives(s, i, N, seed=0, split="val")
            for s, i in zip(src.tensor_split(chunks), index.tensor_split(chunks))
        ]
        assert torch.equal(torch.cat(parts), whole)
    assert not torch.equal(whole, evaluation_negatives(src, index, N, seed=0, split="test"))
    assert evaluation_negatives(src, index, N, seed=0, split="test", m=1000).shape == (40, 1000)
    with pytest.raises(ValueError, match=r"unknown split 'dev'; valid: \['train', 'val', 'test'\]"):
        evaluation_negatives(src, index, N, seed=0, split="dev")


# ---------------------------------------------------------------------------------- metrics
def test_ranking_statistics_follow_ogbs_tie_rule_on_a_hand_computed_case():
    pos = torch.tensor([3.0, 1.0, 2.0, 0.0])
    neg = torch.tensor(
        [
            [3.0, 1.0, 0.0, 5.0],  # > 3: {5} = 1, >= 3: {3, 5} = 2 -> rank 1 + 3/2 = 2.5
            [1.0, 1.0, 1.0, 1.0],  # > 1: 0, >= 1: 4 -> rank 1 + 4/2 = 3
            [0.0, 0.0, 0.0, 0.0],  # > 2: 0, >= 2: 0 -> rank 1
            [1.0, 2.0, 0.0, -1.0],  # > 0: {1, 2} = 2, >= 0: 3 -> rank 1 + 5/2 = 3.5
        ]
    )
    stats = ranking_statistics(pos, neg, ks=(1, 3))
    # sum 1/rank = 1/2.5 + 1/3 + 1/1 + 1/3.5 = 0.4 + 0.333333 + 1 + 0.285714 = 2.019048
    # hits@1: rank <= 1 for row 3 only = 1; hits@3: 2.5, 3, 1 (not 3.5) = 3
    assert ranking_statistic_names((1, 3)) == ("count", "reciprocal_rank_sum", "hits@1", "hits@3")
    assert stats.dtype == torch.float64
    assert stats.tolist() == pytest.approx([4.0, 2.0190476190, 1.0, 3.0])
    metrics = ranking_metrics(stats, ks=(1, 3))
    # mrr = 2.019048 / 4 = 0.504762; hits@1 = 1/4; hits@3 = 3/4
    assert metrics == pytest.approx({"mrr": 0.5047619048, "hits@1": 0.25, "hits@3": 0.75})


def test_ranking_statistics_sum_over_chunks_to_the_whole():
    gen = torch.Generator().manual_seed(3)
    pos, neg = torch.randint(5, (50,), generator=gen), torch.randint(5, (50, 100), generator=gen)
    whole = ranking_statistics(pos.double(), neg.double())
    parts = sum(
        ranking_statistics(p.double(), q.double()) for p, q in zip(pos.split(17), neg.split(17))
    )
    assert torch.allclose(parts, whole)
    assert set(ranking_metrics(whole)) == {"mrr", "hits@1", "hits@3", "hits@10"}


def test_hits_at_k_needs_k_below_the_number_of_negatives():
    with pytest.raises(ValueError, match=r"1 <= K < m = 10 negatives per positive; got K=\[10\]"):
        ranking_statistics(torch.zeros(3), torch.zeros(3, 10))
    with pytest.raises(ValueError, match="no evaluation edge"):
        ranking_metrics(torch.zeros(5))
    with pytest.raises(ValueError, match="NaN"):
        ranking_statistics(torch.tensor([float("nan")]), torch.zeros(1, 20))


def test_auc_counts_ties_as_half_and_equals_a_pairwise_count():
    # pairs (pos, neg): (1, 1) tie 1/2, (1, 0) 1, (2, 1) 1, (2, 0) 1 -> 3.5 / 4
    assert auc(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 0.0])) == 0.875
    gen = torch.Generator().manual_seed(4)
    for _ in range(20):
        n, q = (int(v) for v in torch.randint(1, 30, (2,), generator=gen))
        pos = torch.randint(6, (n,), generator=gen).float()
        neg = torch.randint(6, (q,), generator=gen).float()
        wins = sum(1.0 if p > g else 0.5 if p == g else 0.0 for p in pos for g in neg)
        assert auc(pos, neg) == pytest.approx(wins / (n * q), abs=1e-12)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        auc(torch.zeros(0), torch.zeros(3))


# --------------------------------------------------------------------------------- decoders
@pytest.mark.parametrize("decoder", [DotDecoder(), MLPDecoder(8, 16, num_layers=3)])
def test_score_candidates_equals_a_loop_over_rows_and_candidates(decoder):
    decoder = decoder.double()
    gen = torch.Generator().manual_seed(5)
    h_src = torch.randn(6, 8, generator=gen, dtype=torch.float64)
    h_cand = torch.randn(6, 100, 8, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        scores = decoder.score_candidates(h_src, h_cand)
        loop = [
            [float(decoder(h_src[i : i + 1], h_cand[i, j : j + 1])) for j in range(100)]
            for i in range(6)
        ]
        pairs = decoder(h_src, h_cand[:, 0])
        swapped = decoder(h_cand[:, 0], h_src)
    assert scores.shape == (6, 100)
    assert torch.allclose(scores, torch.tensor(loop, dtype=torch.float64), atol=1e-12)
    assert pairs.shape == (6,) and torch.allclose(pairs, scores[:, 0], atol=1e-12)
    assert torch.allclose(swapped, pairs, atol=1e-12)  # symmetric


def test_mlp_decoder_refuses_no_layers():
    with pytest.raises(ValueError, match="num_layers >= 1"):
        MLPDecoder(8, 16, num_layers=0)
