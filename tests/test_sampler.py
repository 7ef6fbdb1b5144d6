"""The hash-keyed neighbour sampler: determinism, split invariance, fanout and uniformity."""

import numpy as np
import pytest
import torch

from lightning_gnnscale.graph.block import blocks_to_subgraph
from lightning_gnnscale.graph.csc import csc_from_edges
from lightning_gnnscale.graph.sampler import NeighborSampler, SampleKey, splitmix64


def random_csc(num_nodes=300, num_edges=3000, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    # skewed destinations so some nodes have degree far above the fanout, some zero
    dst = (torch.rand(num_edges, generator=g) ** 2 * num_nodes).long()
    return csc_from_edges(src, dst, num_nodes)


def global_edges(blocks):
    """Every sampled edge as a set of (hop, src id, dst id)."""
    out = set()
    for hop, b in enumerate(reversed(blocks)):
        s, d = b.src_ids[b.edge_index[0]], b.src_ids[b.edge_index[1]]
        out |= {(hop, int(a), int(c)) for a, c in zip(s, d)}
    return out


def test_splitmix64_matches_uint64_reference():
    x = torch.randint(-(2**63), 2**63 - 1, (500,), dtype=torch.int64)
    u = x.numpy().astype(np.uint64)
    with np.errstate(over="ignore"):
        z = u + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    assert np.array_equal(splitmix64(x).numpy().astype(np.uint64), z)


def test_blocks_are_well_formed():
    indptr, indices = random_csc()
    sampler = NeighborSampler(indptr, indices, [5, 3], seed=1)
    seeds = torch.tensor([7, 3, 250, 0, 99])
    blocks = sampler.sample(seeds, epoch=2, step=4)
    assert torch.equal(blocks[-1].dst_ids, seeds)
    assert torch.equal(blocks[0].dst_ids, blocks[1].src_ids)  # nested frontiers
    for b in blocks:
        assert b.src_ids.unique().numel() == b.num_src  # sources deduplicated
        new = b.src_ids[b.num_dst :]
        assert torch.all(new[1:] > new[:-1])  # new sources in increasing id order
        assert torch.equal(b.src_deg, indptr[b.src_ids + 1] - indptr[b.src_ids])
        s, d = b.src_ids[b.edge_index[0]], b.src_ids[b.edge_index[1]]
        for a, c in zip(s.tolist(), d.tolist()):  # every edge exists in the graph
            assert a in indices[indptr[c] : indptr[c + 1]].tolist()
        key = b.edge_index[1] * 1000 + b.src_ids[b.edge_index[0]]
        assert torch.all(key[1:] > key[:-1])  # sorted by (dst, src id), no duplicates


@pytest.mark.parametrize("fanout", [1, 4, 10])
def test_fanout_and_without_replacement(fanout):
    indptr, indices = random_csc()
    deg = indptr[1:] - indptr[:-1]
    sampler = NeighborSampler(indptr, indices, [fanout], seed=3)
    seeds = torch.arange(300)
    (block,) = sampler.sample(seeds)
    per_dst = torch.bincount(block.edge_index[1], minlength=300)
    assert torch.equal(per_dst, torch.clamp(deg, max=fanout))


def test_full_neighbourhood():
    indptr, indices = random_csc()
    (block,) = NeighborSampler(indptr, indices, [-1]).sample(torch.arange(300))
    assert block.num_edges == indices.numel()
    assert torch.equal(block.src_ids[block.edge_index[0]], indices)


def test_same_keys_same_sample_other_keys_differ():
    indptr, indices = random_csc()
    sampler = NeighborSampler(indptr, indices, [4, 4], seed=5)
    seeds = torch.arange(0, 300, 7)
    a = global_edges(sampler.sample(seeds, 1, 2))
    assert a == global_edges(sampler.sample(seeds, 1, 2))
    assert a != global_edges(sampler.sample(seeds, 1, 3))
    assert a != global_edges(sampler.sample(seeds, 1, 2, salt=1))
    assert a != global_edges(NeighborSampler(indptr, indices, [4, 4], seed=6).sample(seeds, 1, 2))


def test_split_invariance():
    """Sampling the seeds in two halves gives exactly the edges of sampling them together."""
    indptr, indices = random_csc(seed=1)
    sampler = NeighborSampler(indptr, indices, [6, 3, 2], seed=11)
    seeds = torch.randperm(300, generator=torch.Generator().manual_seed(0))[:64]
    whole = global_edges(sampler.sample(seeds, 3, 9))
    halves = global_edges(sampler.sample(seeds[:20], 3, 9)) | global_edges(
        sampler.sample(seeds[20:], 3, 9)
    )
    assert whole == halves


def test_draws_are_uniform_without_replacement():
    """Each neighbour of a high-degree node is kept with probability k/d over many keys."""
    d, k, trials = 12, 3, 4000
    indptr = torch.tensor([0, d] + [d] * d)
    indices = torch.arange(1, d + 1)
    sampler = NeighborSampler(indptr, indices, [k], seed=0)
    counts = torch.zeros(d + 1)
    for step in range(trials):
        (b,) = sampler.sample(torch.tensor([0]), step=step)
        chosen = b.src_ids[b.edge_index[0]]
        assert chosen.unique().numel() == k
        counts.index_add_(0, chosen, torch.ones(k))
    freq = counts[1:] / trials
    expected = k / d
    sd = (expected * (1 - expected) / trials) ** 0.5
    assert torch.all((freq - expected).abs() < 5 * sd), freq


def test_hop_keys_distinct():
    key = SampleKey(seed=0, epoch=1, step=2)
    assert len({key.hop_key(h) for h in range(10)}) == 10


def test_subgraph_of_blocks_indexes_input_nodes():
    indptr, indices = random_csc()
    blocks = NeighborSampler(indptr, indices, [3, 3]).sample(torch.tensor([1, 2, 3]))
    ei = blocks_to_subgraph(blocks)
    assert int(ei.max()) < blocks[0].num_src
    assert ei.shape[1] == torch.cat([b.edge_index for b in blocks], 1).unique(dim=1).shape[1]


def test_bad_fanouts_rejected():
    indptr, indices = random_csc()
    with pytest.raises(ValueError, match="fanouts"):
        NeighborSampler(indptr, indices, [5, 0])
    with pytest.raises(ValueError, match="fanouts"):
        NeighborSampler(indptr, indices, [])
