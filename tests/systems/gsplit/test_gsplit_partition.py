"""GSplit's probabilistic partitioning: pre-sampling counts, METIS input, methods, cache."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.node_targets import NodeDataset, NodeTargets
from lightning_gnnscale.graph.order import epoch_permutation
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.systems.gsplit import partition as gsplit_partition
from lightning_gnnscale.systems.gsplit.partition import (
    PARTITION_METHODS,
    PresampleCounts,
    cached_probabilistic_partition,
    cross_split_fraction,
    edge_balance_weights,
    expected_cross_fraction,
    gsplit_metis_input,
    integer_edge_weights,
    integer_vertex_weights,
    presample,
    probabilistic_partition,
    symmetric_pair_weights,
    vertex_weight_scale,
)


def tiny_dataset(seed: int = 0, num_nodes: int = 14, self_loop: bool = False) -> NodeDataset:
    """Random directed graph: a hub (node 0, in-degree > fanouts), two isolated nodes; six
    training nodes, the rest test nodes."""
    gen = torch.Generator().manual_seed(seed)
    connected = num_nodes - 2
    src = torch.randint(connected, (30,), generator=gen)
    dst = torch.randint(connected, (30,), generator=gen)
    src = torch.cat([src, torch.arange(1, connected)])
    dst = torch.cat([dst, torch.zeros(connected - 1, dtype=torch.int64)])
    if self_loop:
        src, dst = torch.cat([src, torch.tensor([3])]), torch.cat([dst, torch.tensor([3])])
    train_mask = torch.zeros(num_nodes, dtype=torch.bool)
    train_mask[torch.tensor([0, 2, 5, 7, 9, num_nodes - 1])] = True
    graph = Graph.from_edge_index(
        torch.stack([src, dst]),
        num_nodes,
        remove_self_loops=not self_loop,
        x=torch.zeros(num_nodes, 1),
    )
    none = torch.zeros(num_nodes, dtype=torch.bool)
    targets = NodeTargets(
        torch.zeros(num_nodes, dtype=torch.int64), train_mask, none, ~train_mask, 1
    )
    return NodeDataset(graph, targets)


def train_ids_of(targets: NodeTargets) -> torch.Tensor:
    return targets.train.nonzero().flatten()


def cached_parts(graph: Graph, num_parts: int, targets: NodeTargets, **options):
    """:func:`cached_probabilistic_partition` with ``targets`` and their training rows as the
    seeds."""
    return cached_probabilistic_partition(
        graph, num_parts, targets=targets, is_train=targets.train, **options
    )


def schedule_blocks(graph, train_ids, fanouts, batch_size, seed, epochs):
    """The training schedule's blocks on seeds ``train_ids``, step by step (what presample
    must count)."""
    sampler = NeighborSampler(graph.indptr, graph.indices, fanouts, seed)
    steps = -(-train_ids.numel() // batch_size)
    for epoch in epochs:
        order = epoch_permutation(train_ids, seed, epoch)
        for step in range(steps):
            seeds = order[step * batch_size : (step + 1) * batch_size]
            yield sampler.sample(seeds, epoch, step)


def brute_force_counts(graph, train_ids, fanouts, batch_size, seed, epochs) -> PresampleCounts:
    """k_v, k_e, k0_v by plain Python loops over nodes and edges."""
    indptr, indices = graph.indptr.tolist(), graph.indices.tolist()
    k_v, k0_v = [0] * graph.num_nodes, [0] * graph.num_nodes
    k_e = [0] * graph.num_edges
    num_batches = 0
    for blocks in schedule_blocks(graph, train_ids, fanouts, batch_size, seed, range(epochs)):
        num_batches += 1
        for v in set(blocks[0].src_ids.tolist()):
            k0_v[v] += 1
        for block in blocks:
            ids = block.src_ids.tolist()
            for v in set(ids[: block.num_dst]):
                k_v[v] += 1
            for s, d in block.edge_index.t().tolist():
                src, dst = ids[s], ids[d]
                (eid,) = [e for e in range(indptr[dst], indptr[dst + 1]) if indices[e] == src]
                k_e[eid] += 1
    as_tensor = torch.tensor
    return PresampleCounts(as_tensor(k_v), as_tensor(k_e), as_tensor(k0_v), num_batches)


@pytest.mark.parametrize("fanouts,batch_size", [([3, 2], 4), ([2, 2, 2], 5), ([1], -1)])
def test_presample_counts_equal_brute_force(fanouts, batch_size):
    data = tiny_dataset()
    graph, train_ids = data.graph, train_ids_of(data.targets)
    counts = presample(graph, train_ids, fanouts, batch_size, epochs=3, seed=7)
    size = train_ids.numel() if batch_size == -1 else batch_size
    expected = brute_force_counts(graph, train_ids, fanouts, size, seed=7, epochs=3)
    assert counts.num_batches == expected.num_batches
    for name in ("k_v", "k_e", "k0_v"):
        assert torch.equal(getattr(counts, name), getattr(expected, name)), name


def test_presample_closed_form_when_sampling_is_deterministic():
    """Fanouts >= max in-degree and one batch: k_v/N = L - dist, k_e/N = L - dist(dst)."""
    data = tiny_dataset(seed=3)
    graph, num_layers = data.graph, 3
    max_degree = int(graph.in_degree().max())
    train_ids = train_ids_of(data.targets)
    counts = presample(graph, train_ids, [max_degree] * num_layers, -1, epochs=2, seed=1)
    indptr, indices = graph.indptr.tolist(), graph.indices.tolist()
    dist = dict.fromkeys(train_ids.tolist(), 0)
    frontier = list(dist)
    for hop in range(1, num_layers + 1):
        frontier = [
            u for v in frontier for u in indices[indptr[v] : indptr[v + 1]] if u not in dist
        ]
        dist.update(dict.fromkeys(frontier, hop))
    layers_in = [max(0, num_layers - dist.get(v, num_layers)) for v in range(graph.num_nodes)]
    dst_of_edges = graph.dst_of_edges()
    assert counts.num_batches == 2
    assert torch.equal(counts.k_v, torch.tensor(layers_in) * 2)
    assert torch.equal(counts.k_e, torch.tensor(layers_in)[dst_of_edges] * 2)
    is_input = [int(dist.get(v, num_layers + 1) <= num_layers) for v in range(graph.num_nodes)]
    assert torch.equal(counts.k0_v, torch.tensor(is_input) * 2)


def test_presample_drop_last_and_bad_arguments(capsys, monkeypatch):
    data = tiny_dataset()
    graph, train_ids = data.graph, train_ids_of(data.targets)  # 6 training nodes
    monkeypatch.setattr(gsplit_partition, "PROGRESS_EVERY_S", 0.0)  # a line every step
    assert presample(graph, train_ids, [2], 4, epochs=2, seed=0).num_batches == 4
    assert "pre-sampling: epoch 2/2, mini-batch 2/2" in capsys.readouterr().out
    assert presample(graph, train_ids, [2], 4, epochs=2, seed=0, drop_last=True).num_batches == 2
    with pytest.raises(ValueError, match="drop_last"):
        presample(graph, train_ids, [2], 8, epochs=1, seed=0, drop_last=True)
    with pytest.raises(ValueError, match="epochs"):
        presample(graph, train_ids, [2], 4, epochs=0, seed=0)
    with pytest.raises(ValueError, match="no training nodes"):
        presample(graph, train_ids[:0], [2], 4, epochs=1, seed=0)


def test_expectation_identities_on_the_presampled_batches():
    """Mean cross edges and per-split loads over the pre-sampled batches equal the weights."""
    data = tiny_dataset(seed=1)
    graph, train_ids = data.graph, train_ids_of(data.targets)
    fanouts, batch_size, seed = [3, 2], 3, 5
    counts = presample(graph, train_ids, fanouts, batch_size, epochs=4, seed=seed)
    parts = probabilistic_partition(graph, 3, counts, method="gsplit")
    cross = total = 0
    loads = torch.zeros(3, dtype=torch.int64)
    for blocks in schedule_blocks(graph, train_ids, fanouts, batch_size, seed, range(4)):
        batch_cross, batch_total = cross_split_fraction(blocks, parts)
        cross, total = cross + batch_cross, total + batch_total
        for block in blocks:
            loads.index_add_(0, parts[block.dst_ids], torch.ones(block.num_dst, dtype=torch.int64))
    assert total == int(counts.k_e.sum())
    assert cross / total == expected_cross_fraction(graph, parts, counts.k_e)
    assert torch.equal(loads, torch.zeros(3, dtype=torch.int64).index_add_(0, parts, counts.k_v))


def test_vertex_weight_scale_rules():
    # Enough samples: s is the average degree.
    assert vertex_weight_scale(torch.full((10,), 100), num_edges=50) == 5
    assert vertex_weight_scale(torch.full((10,), 100), num_edges=5) == 1
    # Few samples: s rises until the +1 offsets are <= 1% of sum(k_v) * s.
    k_v = torch.tensor([1, 2, 0, 0, 0, 0, 0, 0, 0, 0])
    scale = vertex_weight_scale(k_v, num_edges=30)
    assert scale == 334 and 0.01 * int(k_v.sum()) * scale >= k_v.numel()
    # Nothing sampled: every vertex weighs 1.
    assert torch.equal(
        integer_vertex_weights(torch.zeros(4, dtype=torch.int64), 8),
        torch.ones(4, dtype=torch.int64),
    )
    assert torch.equal(integer_vertex_weights(k_v, 30), k_v * 334 + 1)


def test_integer_edge_weights_zero_edge_policy():
    rarely_sampled = torch.tensor([0, 0, 0, 5])  # 25% of pairs sampled
    often_sampled = torch.tensor([0, 3, 4, 5])  # 75%
    keep, weights = integer_edge_weights(rarely_sampled, "auto")
    assert keep.tolist() == [False, False, False, True] and weights.tolist() == [5]
    keep, weights = integer_edge_weights(often_sampled, "auto")
    assert keep.all() and weights.tolist() == [1, 31, 41, 51]
    keep, weights = integer_edge_weights(torch.tensor([0, 0, 1, 2]), "auto")  # exactly half
    assert keep.all() and weights.tolist() == [1, 1, 11, 21]
    keep, weights = integer_edge_weights(often_sampled, "drop")
    assert keep.tolist() == [False, True, True, True] and weights.tolist() == [3, 4, 5]
    keep, weights = integer_edge_weights(rarely_sampled, "epsilon")
    assert keep.all() and weights.tolist() == [1, 1, 1, 51]
    with pytest.raises(ValueError, match="auto"):
        integer_edge_weights(often_sampled, "zero")


def test_metis_input_is_symmetric_and_sums_both_directions():
    graph = tiny_dataset(seed=2, self_loop=True).graph
    gen = torch.Generator().manual_seed(0)
    k_e = torch.randint(0, 4, (graph.num_edges,), generator=gen)
    xadj, adjncy, pair_weights = symmetric_pair_weights(graph, k_e)
    rows = torch.repeat_interleave(torch.arange(graph.num_nodes), xadj[1:] - xadj[:-1])
    src, dst = graph.edge_index()
    directed = {(s, d): int(k) for s, d, k in zip(src.tolist(), dst.tolist(), k_e.tolist())}
    expected = {}
    for (s, d), k in directed.items():
        if s != d:
            for pair in ((s, d), (d, s)):
                expected[pair] = expected.get(pair, 0) + k
    entries = list(zip(rows.tolist(), adjncy.tolist()))
    assert len(entries) == len(set(entries)) == len(expected)
    assert dict(zip(entries, pair_weights.tolist())) == expected
    assert entries == sorted(entries)

    counts = PresampleCounts(torch.arange(graph.num_nodes), k_e, k_e.new_zeros(0), 1)
    xadj, adjncy, vweights, eweights = gsplit_metis_input(graph, counts, "drop")
    kept_rows = torch.repeat_interleave(torch.arange(graph.num_nodes), xadj[1:] - xadj[:-1])
    kept = dict(zip(zip(kept_rows.tolist(), adjncy.tolist()), eweights.tolist()))
    assert kept == {pair: w for pair, w in expected.items() if w > 0}
    assert int(vweights.min()) > 0 and vweights.shape == (graph.num_nodes,)


@pytest.fixture(scope="module")
def small_sbm():
    """The graph, its pre-sampled counts and its targets."""
    dataset = sbm(num_nodes=600, num_classes=4, train_frac=0.2, seed=1)
    graph, targets = dataset.graph, dataset.targets
    return graph, presample(graph, train_ids_of(targets), [5, 5], 32, epochs=3, seed=0), targets


@pytest.mark.parametrize("method", PARTITION_METHODS)
@pytest.mark.parametrize("num_parts", [1, 3])
def test_every_method_assigns_every_node_deterministically(small_sbm, method, num_parts):
    graph, counts, targets = small_sbm
    is_train = targets.train
    parts = probabilistic_partition(
        graph, num_parts, counts, method=method, is_train=is_train, seed=4
    )
    assert parts.dtype == torch.int64 and parts.shape == (graph.num_nodes,)
    assert int(parts.min()) >= 0 and int(parts.max()) < num_parts
    assert torch.equal(
        parts,
        probabilistic_partition(graph, num_parts, counts, method=method, is_train=is_train, seed=4),
    )
    if num_parts > 1:
        assert torch.bincount(parts, minlength=num_parts).min() > 0


def test_bad_method_and_missing_counts(small_sbm):
    graph, counts, _ = small_sbm
    with pytest.raises(ValueError, match="gsplit.*node.*edge.*naive.*random"):
        probabilistic_partition(graph, 2, counts, method="metis")
    with pytest.raises(ValueError, match="counts"):
        probabilistic_partition(graph, 2, None, method="gsplit")
    with pytest.raises(ValueError, match="'edge' needs is_train"):
        probabilistic_partition(graph, 2, None, method="edge")
    with pytest.raises(ValueError, match="zero_edge_policy"):
        probabilistic_partition(graph, 2, counts, zero_edge_policy="never")
    assert probabilistic_partition(graph, 2, None, method="naive").shape == (graph.num_nodes,)


@pytest.fixture(scope="module")
def sbm3k():
    return sbm(num_nodes=3000, train_frac=0.1, seed=0)


@pytest.mark.parametrize("num_parts", [2, 4])
def test_gsplit_cuts_fewer_sampled_edges_than_random(sbm3k, num_parts):
    graph, fanouts, batch_size, seed = sbm3k.graph, [10, 5], 64, 0
    train_ids = train_ids_of(sbm3k.targets)
    counts = presample(graph, train_ids, fanouts, batch_size, epochs=10, seed=seed)
    measured, predicted, balance = {}, {}, {}
    for method in ("gsplit", "node", "edge", "naive", "random"):
        is_train = sbm3k.targets.train
        parts = probabilistic_partition(graph, num_parts, counts, method=method, is_train=is_train)
        cross = total = 0
        for blocks in schedule_blocks(graph, train_ids, fanouts, batch_size, seed, range(10, 15)):
            batch_cross, batch_total = cross_split_fraction(blocks, parts)
            cross, total = cross + batch_cross, total + batch_total
        measured[method] = cross / total
        predicted[method] = expected_cross_fraction(graph, parts, counts.k_e)
        loads = torch.zeros(num_parts, dtype=torch.int64).index_add_(0, parts, counts.k_v)
        balance[method] = float(loads.max()) * num_parts / float(loads.sum())
        print(
            f"P={num_parts} {method:7s} measured {measured[method]:.3f} "
            f"predicted {predicted[method]:.3f} k_v balance {balance[method]:.3f}"
        )
    assert measured["gsplit"] < measured["random"] - 0.2
    assert abs(measured["random"] - (1 - 1 / num_parts)) < 0.1
    for method in measured:
        assert abs(measured[method] - predicted[method]) < 0.03, method
    assert balance["gsplit"] < 1.1


def count_presample_calls(monkeypatch) -> list:
    """Patch the pre-sampler to record each call (its arguments) in the returned list."""
    calls: list = []
    real_presample = gsplit_partition.presample

    def counting_presample(*args, **kwargs):
        calls.append(args)
        return real_presample(*args, **kwargs)

    monkeypatch.setattr(gsplit_partition, "presample", counting_presample)
    return calls


def test_cache_returns_the_same_parts_without_recomputing(tmp_path, monkeypatch):
    data = tiny_dataset()
    graph, targets = data.graph, data.targets
    real_presample = gsplit_partition.presample
    calls = count_presample_calls(monkeypatch)
    options = dict(fanouts=[3, 2], batch_size=4, presample_epochs=2, seed=3, cache_dir=tmp_path)
    first = cached_parts(graph, 2, targets, method="gsplit", **options)
    second = cached_parts(graph, 2, targets, method="gsplit", **options)
    assert len(calls) == 1
    assert set(first) == {
        "parts",
        "k_v",
        "k0_v",
        "num_batches",
        "expected_cross_fraction",
        "method",
    }
    for key in ("parts", "k_v", "k0_v"):
        assert torch.equal(first[key], second[key])
    assert first["num_batches"] == second["num_batches"] == 4
    assert first["expected_cross_fraction"] == second["expected_cross_fraction"]
    assert second["method"] == "gsplit"
    counts = real_presample(graph, train_ids_of(targets), [3, 2], 4, 2, 3)
    assert torch.equal(first["parts"], probabilistic_partition(graph, 2, counts))

    cached_parts(graph, 2, targets, method="random", **options)
    cached_parts(graph, 2, targets, method="gsplit", ufactor=100, **options)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="valid"):
        cached_parts(graph, 2, targets, method="hash", **options)


def test_the_task_seeds_are_what_is_presampled_and_balanced(tmp_path):
    """The artifact and the ``edge`` weights come from the given targets and training seeds
    (the graph carries structure and features only)."""
    data = tiny_dataset()
    graph, targets = data.graph, data.targets
    options = dict(fanouts=[3, 2], batch_size=4, presample_epochs=2, seed=3, cache_dir=tmp_path)
    got = cached_parts(graph, 2, targets, method="gsplit", **options)
    counts = presample(graph, train_ids_of(targets), [3, 2], 4, 2, 3)
    assert torch.equal(got["k_v"], counts.k_v) and torch.equal(got["k0_v"], counts.k0_v)
    is_train = targets.train.to(torch.int64)
    n_train = int(is_train.sum())
    assert torch.equal(
        edge_balance_weights(graph, targets.train),
        graph.in_degree() * n_train + graph.num_edges * is_train,
    )


def test_gsplit_with_no_sampled_edges_still_partitions(small_sbm):
    """``auto`` drops every edge when none was sampled; METIS then balances ``k_v`` alone."""
    graph, counts, _ = small_sbm
    unsampled = PresampleCounts(counts.k_v, torch.zeros_like(counts.k_e), counts.k0_v, 1)
    xadj, adjncy, _, _ = gsplit_metis_input(graph, unsampled)
    assert adjncy.numel() == 0 and int(xadj[-1]) == 0
    parts = probabilistic_partition(graph, 2, unsampled)
    assert torch.bincount(parts, minlength=2).min() > 0


KEY_BASE = dict(
    method="gsplit",
    fanouts=[3, 2],
    batch_size=4,
    presample_epochs=2,
    seed=3,
    metis_seed=0,
    ufactor=30,
    zero_edge_policy="auto",
    drop_last=False,
)


def _moved_edge(graph: Graph) -> Graph:
    """``graph`` with one in-edge's source moved to another node (sizes unchanged)."""
    src, dst = graph.edge_index()
    existing = set(zip(src.tolist(), dst.tolist()))
    s, d = int(src[0]), int(dst[0])
    new = next(u for u in range(graph.num_nodes) if u not in (s, d) and (u, d) not in existing)
    src = src.clone()
    src[0] = new
    return Graph.from_edge_index(
        torch.stack([src, dst]),
        graph.num_nodes,
        x=graph.x,
    )


def _flipped_train(targets: NodeTargets) -> NodeTargets:
    """``targets`` with one more training row."""
    train = targets.train.clone()
    train[int((~train).nonzero()[0])] = True
    return dataclasses.replace(targets, train=train)


@pytest.mark.parametrize(
    "change",
    [
        "graph structure",
        "train mask",
        "training seeds",
        "num_parts",
        "method",
        "fanouts",
        "number of hops",
        "batch_size",
        "presample_epochs",
        "seed",
        "metis_seed",
        "ufactor",
        "zero_edge_policy",
        "drop_last",
    ],
)
def test_cache_key_covers_every_input(tmp_path, monkeypatch, change):
    """Changing any one input of the artifact writes (and builds) a new one; the unchanged
    inputs hit the cache."""
    builds = count_presample_calls(monkeypatch)
    data = tiny_dataset()
    graph, targets = data.graph, data.targets
    base = cached_parts(graph, 2, targets, cache_dir=tmp_path, **KEY_BASE)
    cached_parts(graph, 2, targets, cache_dir=tmp_path, **KEY_BASE)
    assert len(builds) == 1 and len(list(tmp_path.glob("gsplit-partition-*.pt"))) == 1

    options, num_parts, is_train = dict(KEY_BASE), 2, targets.train
    changes = {
        "method": ("method", "node"),
        "fanouts": ("fanouts", [3, 3]),
        "number of hops": ("fanouts", [3, 2, 2]),
        "batch_size": ("batch_size", 3),
        "presample_epochs": ("presample_epochs", 3),
        "seed": ("seed", 4),
        "metis_seed": ("metis_seed", 1),
        "ufactor": ("ufactor", 31),
        "zero_edge_policy": ("zero_edge_policy", "drop"),
        "drop_last": ("drop_last", True),
    }
    if change == "graph structure":
        graph = _moved_edge(graph)
    elif change == "train mask":  # the targets' split and, with it, the seeds
        targets = _flipped_train(targets)
        is_train = targets.train
    elif change == "training seeds":  # the same targets, other seeds (a task's choice)
        is_train = _flipped_train(targets).train
    elif change == "num_parts":
        num_parts = 3
    else:
        name, value = changes[change]
        assert options[name] != value
        options[name] = value
    changed = cached_probabilistic_partition(
        graph, num_parts, targets=targets, is_train=is_train, cache_dir=tmp_path, **options
    )
    assert len(builds) == 2, f"changing {change} reused the cached artifact"
    assert len(list(tmp_path.glob("gsplit-partition-*.pt"))) == 2
    if change in (
        "train mask",
        "training seeds",
    ):  # the rebuilt artifact counts the new training node's batch
        assert changed["num_batches"] != base["num_batches"] or not torch.equal(
            changed["k_v"], base["k_v"]
        )


def _invisible_to_sampling(graph: Graph, targets: NodeTargets) -> tuple[Graph, NodeTargets]:
    """Two edits that keep every size and every array sum and change no entry whose position is
    a multiple of ``len // 4096`` (so hashing only strided samples and sums cannot see them): a
    source ``a`` -> ``a + 1`` in one in-edge list and ``a + 1`` -> ``a`` in another (both lists
    stay sorted and duplicate-free); a training flag moved from one node to another."""
    indptr, indices = graph.indptr, graph.indices
    edge_stride = max(1, indices.numel() // 4096)
    node_stride = max(1, graph.num_nodes // 4096)
    assert edge_stride > 1 and node_stride > 1, "graph too small for the edits to be off-grid"
    position = torch.arange(indices.numel())
    seg = torch.repeat_interleave(torch.arange(graph.num_nodes), indptr[1:] - indptr[:-1])
    first, end = indptr[seg], indptr[seg + 1]
    prev = torch.where(position > first, indices[(position - 1).clamp(min=0)], -2)
    nxt = torch.where(position + 1 < end, indices[(position + 1) % indices.numel()], 1 << 40)
    off_grid = position % edge_stride != 0
    up = off_grid & (nxt > indices + 1)  # indices[p] + 1 fits at p, keeping the list sorted
    down = off_grid & (prev < indices - 1)  # indices[q] - 1 fits at q
    edited = None
    for p in up.nonzero().flatten().tolist():
        a = int(indices[p])
        for q in (down & (indices == a + 1) & (seg != seg[p])).nonzero().flatten().tolist():
            edited = indices.clone()
            edited[p], edited[q] = a + 1, a
            break
        if edited is not None:
            break
    structure = dataclasses.replace(graph, indices=edited)
    mask = targets.train.clone()
    off_nodes = torch.arange(graph.num_nodes) % node_stride != 0
    on, off = (off_nodes & mask).nonzero().flatten(), (off_nodes & ~mask).nonzero().flatten()
    mask[on[0]], mask[off[0]] = False, True
    return structure, dataclasses.replace(targets, train=mask)


def test_cache_key_sees_edits_a_sampled_fingerprint_would_miss(tmp_path, monkeypatch):
    """On a graph large enough that hashing only every k-th entry plus sums would miss them,
    two sum-preserving edits (one of the structure, one of the train mask) each still build a
    new artifact. This needs a graph fingerprint over the whole structure and train mask."""
    builds = count_presample_calls(monkeypatch)
    dataset = sbm(num_nodes=10000, num_classes=4, avg_degree=4.0, train_frac=0.05, seed=2)
    graph, targets = dataset.graph, dataset.targets
    options = dict(KEY_BASE, fanouts=[2, 2], batch_size=256, presample_epochs=1)
    cached_parts(graph, 2, targets, cache_dir=tmp_path, **options)
    structure, train = _invisible_to_sampling(graph, targets)
    assert structure.num_edges == graph.num_edges
    assert int(structure.indices.sum()) == int(graph.indices.sum())
    assert not torch.equal(structure.indices, graph.indices)
    assert int(train.train.sum()) == int(targets.train.sum())
    assert not torch.equal(train.train, targets.train)
    cached_parts(structure, 2, targets, cache_dir=tmp_path, **options)
    assert len(builds) == 2, "an edit of the graph structure reused the cached artifact"
    cached_parts(graph, 2, train, cache_dir=tmp_path, **options)
    assert len(builds) == 3, "an edit of the train mask reused the cached artifact"
