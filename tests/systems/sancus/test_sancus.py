"""SANCUS: bound 0 equals `single`; the distributed run equals the single-process staleness
emulator for every policy; flags agree; replicas agree; bytes and cache memory match the
formulas of docs/systems/sancus.md (communication per epoch, cache memory)."""

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm, ring_allreduce_bytes
from lightning_gnnscale.contract import ModuleRuntime, RankContext
from lightning_gnnscale.graph.book import PartitionBook, relabel_graph
from lightning_gnnscale.graph.csc import csc_from_edges
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.node_targets import NodeDataset
from lightning_gnnscale.graph.partition import partition
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.systems.sancus.emulator import emulate
from lightning_gnnscale.systems.sancus.layout import check_symmetric, every_row_block, row_blocks
from lightning_gnnscale.systems.sancus.policy import (
    NEVER,
    StalenessPolicy,
    adaptive_flags,
    epoch_fixed_flags,
    variation_flag,
)
from lightning_gnnscale.systems.sancus.runtime import SancusGCN, cache_bytes_formula
from lightning_gnnscale.systems.sancus.strategy import sum_gradients
from lightning_gnnscale.tasks import build_task
from tests.helpers.dist import run_distributed

HIDDEN, LAYERS, EPOCHS, LR, CLASSES = 6, 3, 6, 0.05, 3
TASK = build_task("node_classification")
UNEVEN = {2: [0, 55, 130], 3: [0, 30, 75, 130]}
GAP = 0.3  # checked below to lie >= 1e-6 away from every distance the emulator sees
POLICIES = [
    StalenessPolicy("none"),
    StalenessPolicy("none", input_policy="same_as_hidden"),
    StalenessPolicy("epoch_fixed", epoch_bound=2),
    StalenessPolicy("adaptive", epoch_bound=1),
    StalenessPolicy("variation", variation_gap=GAP),
    StalenessPolicy("skipg", epoch_bound=1),
    StalenessPolicy("epoch_fixed", epoch_bound=0),  # broadcasts every read block every epoch
    StalenessPolicy("adaptive", epoch_bound=0),
]
POLICY_IDS = [f"{p.name}-{p.epoch_bound}-{p.input_policy}" for p in POLICIES]
# Policies under which no hidden block is ever read stale, so none is kept: X alone is cached.
KEEP_X_ONLY = {
    "none-1-once",
    "none-1-same_as_hidden",
    "skipg-1-once",
    "epoch_fixed-0-once",
    "adaptive-0-once",
}


def original_dataset() -> NodeDataset:
    dataset = sbm(num_nodes=130, num_classes=CLASSES, avg_degree=5.0, num_features=5, seed=3)
    return dataset.to(torch.float64)


def setup_graph(world_size, rows):
    """A tiny float64 SBM in row-block order (uneven contiguous blocks, or METIS), its targets
    in that order and its book."""
    dataset = original_dataset()
    graph, targets = dataset.graph, dataset.targets
    if rows == "metis":
        book = PartitionBook.from_parts(partition(graph, "metis", world_size), world_size)
    else:
        n = graph.num_nodes
        offsets = torch.tensor(UNEVEN[world_size])
        parts = torch.bucketize(torch.arange(n), offsets[1:], right=True)
        book = PartitionBook.from_parts(parts, world_size)
    return relabel_graph(graph, book), targets.rows(book.new2old), book


def make_params(graph):
    torch.manual_seed(0)
    net = BlockGNN("gcn", graph.num_features, HIDDEN, CLASSES, LAYERS, dropout=0.0)
    return net.double()


def sancus_net(graph, policy, comm):
    """A float64 ``SancusGCN`` with ``make_params``' weights, broadcasting through ``comm``."""
    net = SancusGCN(graph.num_features, HIDDEN, CLASSES, LAYERS, policy).double()
    net.load_state_dict(make_params(graph).state_dict())
    net.configure_runtime(ModuleRuntime(RankContext(comm, torch.device("cpu"))))
    return net


def _train(graph, targets, book, rank, comm, policy) -> dict:
    """``EPOCHS`` full-graph steps of ``policy`` on this rank's row block, and what they did."""
    layout = row_blocks(graph, book.node_offsets, rank, targets.train)
    lo, hi = int(book.node_offsets[rank]), int(book.node_offsets[rank + 1])
    x, y = graph.x[lo:hi], targets.target[lo:hi]
    n_train = int(targets.train.sum())
    net = sancus_net(graph, policy, comm)
    runtime = net.runtime
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    before = comm.meter.snapshot()
    losses, logits0, grads0 = [], None, None
    for _ in range(EPOCHS):
        optimizer.zero_grad()
        logits = net([layout], x)
        loss_sum = F.cross_entropy(logits, y[layout.seed_rows], reduction="sum")
        (loss_sum / n_train).backward()
        sum_gradients(comm, list(net.parameters()))
        losses.append(comm.all_reduce(loss_sum.detach().clone(), category="control"))
        if logits0 is None:
            logits0 = logits.detach()
            grads0 = [p.grad.clone() for p in net.parameters()]
        optimizer.step()
    training_bytes = comm.meter.delta(before)
    return {
        "losses": torch.stack(losses),
        "logits0": logits0,
        "grads0": grads0,
        "params": [p.detach().clone() for p in net.parameters()],
        "forward_flags": runtime.forward_flags,
        "backward_flags": runtime.backward_flags,
        "bytes": {
            c: sum(links.values()) for c, links in training_bytes["category_link_bytes"].items()
        },
        "cache_bytes": runtime.cache_bytes(),
        "eval_logits": net.exact_logits(x, layout),
        "consumer": layout.consumer,
    }


def _train_rank(rank, world_size, rows):
    graph, targets, book = setup_graph(world_size, rows)
    comm = Comm.create()
    return [_train(graph, targets, book, rank, comm, policy) for policy in POLICIES]


def reference(dataset, epochs):
    """`single`'s full-graph GCN: per-epoch losses, epoch-0 logits and gradients, final params."""
    graph, targets = dataset.graph, dataset.targets
    net = make_params(graph)
    train = targets.train.nonzero().flatten()
    blocks = NeighborSampler(graph.indptr, graph.indices, [-1] * LAYERS, 0).sample(train, 0, 0)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    losses = []
    for epoch in range(epochs):
        optimizer.zero_grad()
        logits = net(blocks, graph.x[blocks[0].src_ids])
        loss = F.cross_entropy(logits, targets.target[train], reduction="sum")
        (loss / train.numel()).backward()
        if epoch == 0:
            first = (train, logits.detach(), [p.grad.clone() for p in net.parameters()])
        losses.append(loss.detach())
        optimizer.step()
    return torch.stack(losses), first, [p.detach() for p in net.parameters()]


@pytest.fixture(scope="module", params=[(2, "metis"), (3, "contiguous")], ids=["p2-metis", "p3"])
def runs(request):
    world_size, rows = request.param
    results = run_distributed(_train_rank, world_size, rows, timeout_s=120)
    return world_size, rows, results


@pytest.mark.dist
def test_bound_zero_equals_single(runs):
    """Against `single` on the ORIGINAL node order, the relabelling mapped back."""
    world_size, rows, results = runs
    graph, targets, book = setup_graph(world_size, rows)
    original = original_dataset().graph
    ref_losses, (train, ref_logits, ref_grads), ref_params = reference(original_dataset(), EPOCHS)
    own_train = targets.train.nonzero().flatten()  # gids of the ranks' seeds, in rank order
    position = torch.searchsorted(train, book.new2old[own_train])
    for k in (0, 1):  # policy none, with X cached once or re-broadcast every epoch
        got = [r[k] for r in results]
        torch.testing.assert_close(got[0]["losses"], ref_losses, atol=1e-10, rtol=0)
        logits = torch.cat([g["logits0"] for g in got])
        torch.testing.assert_close(logits, ref_logits[position], atol=1e-10, rtol=0)
        for g, ref in zip(got[0]["grads0"], ref_grads, strict=True):
            torch.testing.assert_close(g, ref, atol=1e-10, rtol=0)
        for p, ref in zip(got[0]["params"], ref_params, strict=True):
            torch.testing.assert_close(p, ref, atol=1e-10, rtol=0)
    assert torch.equal(results[0][0]["losses"], results[0][1]["losses"])  # X caching is exact
    for k in range(len(POLICIES)):  # epoch 0 is exact under every policy: all blocks are sent
        torch.testing.assert_close(results[0][k]["losses"][0], ref_losses[0], atol=1e-10, rtol=0)
        torch.testing.assert_close(
            torch.cat([r[k]["logits0"] for r in results]), ref_logits[position], atol=1e-10, rtol=0
        )
    # The exact stateless evaluation, here after a stale (epoch_fixed) run, equals single's
    # full-graph logits with the same weights.
    net = make_params(original)
    net.load_state_dict(dict(zip(net.state_dict(), results[0][2]["params"], strict=True)))
    full = NeighborSampler(original.indptr, original.indices, [-1] * LAYERS, 0).sample(
        torch.arange(original.num_nodes), 0, 0
    )
    ref_eval = net(full, original.x[full[0].src_ids]).detach()
    got_eval = torch.cat([r[2]["eval_logits"] for r in results])
    torch.testing.assert_close(got_eval, ref_eval[book.new2old], atol=1e-10, rtol=0)


@pytest.mark.dist
@pytest.mark.parametrize("k", range(len(POLICIES)), ids=POLICY_IDS)
def test_distributed_run_equals_the_emulator(runs, k):
    world_size, rows, results = runs
    graph, targets, book = setup_graph(world_size, rows)
    policy = POLICIES[k]
    params = [(layer.lin.weight, layer.bias) for layer in make_params(graph).layers]
    trace = emulate(graph, targets, TASK, book.node_offsets, params, policy, EPOCHS, lr=LR)
    for rank, r in enumerate(results):  # the same flag matrix on every rank (consensus)
        assert r[k]["forward_flags"].keys() == trace.forward_flags.keys()
        for key, flags in trace.forward_flags.items():
            assert torch.equal(r[k]["forward_flags"][key], flags), (rank, key)
        assert r[k]["backward_flags"].keys() == trace.backward_flags.keys()
        for key, flags in trace.backward_flags.items():
            assert torch.equal(r[k]["backward_flags"][key], flags), (rank, key)
        torch.testing.assert_close(
            r[k]["losses"], torch.tensor(trace.losses, dtype=torch.float64), atol=1e-10, rtol=0
        )
        ref_params = [t for weight, bias in trace.params for t in (bias, weight)]  # module order
        for p, ref in zip(r[k]["params"], ref_params, strict=True):
            torch.testing.assert_close(p, ref, atol=1e-10, rtol=0)  # and replicas agree
    if policy.name == "variation":
        distances = torch.cat([d for d in trace.distances.values()])
        finite = distances[distances.isfinite()]
        assert float((finite - GAP).abs().min()) >= 1e-6
        # Every block used stale was within the gap when its root decided.
        stale = ~torch.stack([f for (_, layer), f in trace.forward_flags.items() if layer > 0])
        hidden_d = torch.stack([d for (_, layer), d in trace.distances.items() if layer > 0])
        assert bool((hidden_d[stale] <= GAP).all())
    hidden = [f for (_, layer), f in trace.forward_flags.items() if layer > 0]
    skipped = any(not bool(f.all()) for f in [*hidden, *trace.backward_flags.values()])
    # every staleness policy really skips here, except CAGNET's schedule (none, or bound 0)
    cagnet_schedule = policy.name == "none" or (
        policy.name in ("epoch_fixed", "adaptive") and policy.epoch_bound == 0
    )
    assert skipped == (not cagnet_schedule)


def one_way_graph():
    """The 2-block contiguous SBM without its edges from block 1 into block 0: block 0's rows
    read nothing of block 1, so nobody consumes block 1."""
    graph, targets, book = setup_graph(2, "contiguous")
    src, dst = graph.edge_index()
    cut = int(book.node_offsets[1])
    keep = ~((dst < cut) & (src >= cut))
    one_way = graph.with_structure(*csc_from_edges(src[keep], dst[keep], graph.num_nodes))
    return one_way, targets, book


def _train_one_way(rank, world_size):
    graph, targets, book = one_way_graph()
    comm = Comm.create()
    policies = (StalenessPolicy("none"), StalenessPolicy("adaptive", epoch_bound=0))
    return [_train(graph, targets, book, rank, comm, policy) for policy in policies]


@pytest.mark.dist
def test_a_block_nobody_reads_is_neither_sent_nor_kept():
    """SCS-A with bound 0 sends every read block every epoch and keeps none; a block nobody
    reads is never sent, and its readers' absence must not make a rank look it up."""
    graph, _, book = one_way_graph()
    (none0, adaptive0), (none1, adaptive1) = run_distributed(_train_one_way, 2, timeout_s=120)
    assert not bool(none0["consumer"][0, 1]) and bool(none1["consumer"][1, 0])  # the setting
    for rank, (none, adaptive) in enumerate(((none0, adaptive0), (none1, adaptive1))):
        torch.testing.assert_close(adaptive["losses"], none["losses"], atol=1e-12, rtol=0)
        for (_, layer), flags in adaptive["forward_flags"].items():
            if layer > 0:
                assert flags.tolist() == [True, False], (rank, layer)
        x_rows = graph.num_nodes - int(book.node_offsets[rank + 1] - book.node_offsets[rank])
        assert adaptive["cache_bytes"]["embedding_cache"] == x_rows * graph.num_features * 8


# --------------------------------------------------------- independent flag oracle


def oracle_consumers(graph, offsets) -> list[list[bool]]:
    """``consumer[k][j]``: some row of block ``k`` has a neighbour in block ``j`` (``k != j``),
    read edge by edge from the graph, without the implementation's row blocks."""
    bounds = [int(o) for o in offsets]
    p = len(bounds) - 1

    def owner(node: int) -> int:
        return next(r for r in range(p) if bounds[r] <= node < bounds[r + 1])

    consumer = [[False] * p for _ in range(p)]
    indptr, indices = graph.indptr.tolist(), graph.indices.tolist()
    for dst in range(graph.num_nodes):
        for src in indices[indptr[dst] : indptr[dst + 1]]:
            k, j = owner(dst), owner(src)
            if k != j:
                consumer[k][j] = True
    return consumer


def oracle_flags(name, bound, input_once, consumer, epochs, layers):
    """The forward and backward flag matrices of a policy, simulated in plain Python from the
    paper's definitions (docs/systems/sancus.md#policies), with every receiver keeping its own version table.

    Forward, layer input ``l``: X under ``input_once`` goes out at epoch 0 only (it never
    changes); ``none`` and ``skipg`` send every block every epoch; ``epoch_fixed`` (Def. 1)
    sends root ``j`` when the copy the other ranks hold of it is more than ``bound`` epochs old
    (or missing); ``adaptive`` (Def. 2, Alg. 5) sends ``j`` when at least one receiver that
    reads ``j`` holds a copy more than ``bound`` epochs old (or none). Backward, layers
    ``1..L-1`` (layer 0 needs no δ): SkipG sends root ``j``'s δ when the receivers' copy of it
    is more than ``bound`` epochs old (or missing); every other policy sends every δ."""
    p = len(consumer)
    held = [[[None] * p for _ in range(p)] for _ in range(layers)]  # [l][receiver][root]
    held_grad = [[[None] * p for _ in range(p)] for _ in range(layers)]

    def too_old(copy, epoch):
        return copy is None or epoch - copy > bound

    forward, backward = {}, {}
    for epoch in range(epochs):
        for layer in range(layers):
            seen = held[layer]
            if layer == 0 and input_once:
                flags = [epoch == 0] * p
            elif name in ("none", "skipg"):
                flags = [True] * p
            elif name == "epoch_fixed":
                flags = [
                    any(too_old(seen[k][j], epoch) for k in range(p) if k != j) for j in range(p)
                ]
            elif name == "adaptive":
                flags = [
                    any(consumer[k][j] and too_old(seen[k][j], epoch) for k in range(p))
                    for j in range(p)
                ]
            else:
                raise ValueError(name)
            for j in range(p):
                if flags[j]:
                    for k in range(p):
                        if k != j:
                            seen[k][j] = epoch
            forward[(epoch, layer)] = flags
        for layer in reversed(range(1, layers)):
            seen = held_grad[layer]
            if name == "skipg":
                flags = [
                    any(too_old(seen[k][j], epoch) for k in range(p) if k != j) for j in range(p)
                ]
            else:
                flags = [True] * p
            for j in range(p):
                if flags[j]:
                    for k in range(p):
                        if k != j:
                            seen[k][j] = epoch
            backward[(epoch, layer)] = flags
    return forward, backward


def assert_flags_match_oracle(got_forward, got_backward, policy, consumer, epochs):
    forward, backward = oracle_flags(
        policy.name,
        policy.epoch_bound,
        policy.input_policy == "once",
        consumer,
        epochs,
        LAYERS,
    )
    for got, want in ((got_forward, forward), (got_backward, backward)):
        assert set(got) == set(want)
        for key, flags in want.items():
            assert got[key].tolist() == flags, key


ORACLE_POLICIES = [k for k, policy in enumerate(POLICIES) if policy.name != "variation"]


@pytest.mark.dist
@pytest.mark.parametrize("k", ORACLE_POLICIES, ids=[POLICIES[k].name for k in ORACLE_POLICIES])
def test_flag_matrices_match_an_independent_oracle(runs, k):
    """The distributed ranks' and the emulator's flags equal the plain-Python oracle (the
    emulator shares the implementation's flag functions, so it cannot catch a wrong rule)."""
    world_size, rows, results = runs
    graph, targets, book = setup_graph(world_size, rows)
    policy = POLICIES[k]
    consumer = oracle_consumers(graph, book.node_offsets)
    for r in results:
        assert_flags_match_oracle(
            r[k]["forward_flags"], r[k]["backward_flags"], policy, consumer, EPOCHS
        )
    params = [(layer.lin.weight, layer.bias) for layer in make_params(graph).layers]
    trace = emulate(graph, targets, TASK, book.node_offsets, params, policy, EPOCHS, lr=LR)
    assert_flags_match_oracle(trace.forward_flags, trace.backward_flags, policy, consumer, EPOCHS)


@pytest.mark.parametrize(
    "policy",
    [
        StalenessPolicy("epoch_fixed", epoch_bound=1, input_policy="same_as_hidden"),
        StalenessPolicy("epoch_fixed", epoch_bound=3),
        StalenessPolicy("adaptive", epoch_bound=1, input_policy="same_as_hidden"),
        StalenessPolicy("adaptive", epoch_bound=2),
        StalenessPolicy("skipg", epoch_bound=1),
        StalenessPolicy("skipg", epoch_bound=2, input_policy="same_as_hidden"),
    ],
    ids=lambda p: f"{p.name}{p.epoch_bound}-{p.input_policy}",
)
def test_emulator_flags_match_the_oracle_with_a_block_nobody_reads(policy):
    """Longer runs and other bounds, on a graph where block 2 reads and is read by nobody."""
    (graph, targets), offsets, epochs = two_components(), torch.tensor([0, 30, 60, 90]), 9
    consumer = oracle_consumers(graph, offsets)
    assert not any(consumer[k][2] or consumer[2][k] for k in range(3))
    params = [(layer.lin.weight, layer.bias) for layer in make_params(graph).layers]
    trace = emulate(graph, targets, TASK, offsets, params, policy, epochs, lr=LR)
    assert_flags_match_oracle(trace.forward_flags, trace.backward_flags, policy, consumer, epochs)


@pytest.mark.dist
@pytest.mark.parametrize("k", range(len(POLICIES)), ids=POLICY_IDS)
def test_meter_and_cache_match_the_formulas(runs, k):
    """Bytes each rank sends = docs/systems/sancus.md's per-epoch formulas for the recorded
    flags; cache bytes = Σ es (N - n_i) F_l."""
    world_size, rows, results = runs
    graph, _, book = setup_graph(world_size, rows)
    policy = POLICIES[k]
    widths = [graph.num_features] + [HIDDEN] * (LAYERS - 1)
    outs = [HIDDEN] * (LAYERS - 1) + [CLASSES]
    sizes = (book.node_offsets[1:] - book.node_offsets[:-1]).tolist()
    n_params = sum(w * o + o for w, o in zip(widths, outs))
    es, peers = 8, world_size - 1
    for rank, r in enumerate(results):
        res = r[k]
        expected = {"feature": 0, "activation": 0, "activation_grad": 0, "control": 0}
        for (_, layer), flags in res["forward_flags"].items():
            sent = sizes[rank] * widths[layer] * es * peers * int(flags[rank])
            expected["feature" if layer == 0 else "activation"] += sent
            if policy.root_decides(layer):
                expected["control"] += peers  # one uint8 flag to every peer
        for (_, layer), flags in res["backward_flags"].items():
            expected["activation_grad"] += sizes[rank] * outs[layer] * es * peers * int(flags[rank])
        expected["gradient"] = EPOCHS * ring_allreduce_bytes(n_params * es, world_size)
        expected["control"] += EPOCHS * ring_allreduce_bytes(es, world_size)  # the loss
        for category, nbytes in expected.items():
            assert res["bytes"][category] == nbytes, (rank, category)
        formula = cache_bytes_formula(graph.num_nodes, sizes[rank], widths, es, policy)
        cache = res["cache_bytes"]
        assert cache["embedding_cache"] + cache["own_last"] == formula
        if POLICY_IDS[k] in KEEP_X_ONLY:  # every hidden block read is broadcast: X alone kept
            x_rows = (graph.num_nodes - sizes[rank]) * widths[0] * es
            assert cache["embedding_cache"] == x_rows
        assert (cache["gradient_cache"] > 0) == (policy.name == "skipg")


# ------------------------------------------------------------------------ pure policies


def test_epoch_fixed_schedule_and_age():
    for bound, epochs in ((1, 9), (2, 10), (0, 4)):
        last = torch.tensor([NEVER, NEVER])
        sent, ages = [], []
        for epoch in range(epochs):
            flags = epoch_fixed_flags(epoch, last, bound)
            last = torch.where(flags, torch.tensor(epoch), last)
            sent.append(bool(flags[0]))
            ages.append(int(epoch - last[0]))
        assert [e for e, s in enumerate(sent) if s] == list(range(0, epochs, bound + 1))
        assert sum(sent) == math.ceil(epochs / (bound + 1))
        assert max(ages) <= bound


def test_adaptive_never_broadcasts_a_block_nobody_consumes():
    consumer = torch.tensor([[False, True, False], [True, False, False], [True, True, False]])
    last = torch.full((3,), NEVER)
    for epoch in range(5):
        flags = adaptive_flags(epoch, last, 1, consumer)
        assert not bool(flags[2])
        last = torch.where(flags, torch.tensor(epoch), last)
    assert int(last[2]) == NEVER and int(last[0]) == 4


def test_variation_gap_monotone_and_infinite_gap():
    gen = torch.Generator().manual_seed(0)
    sequence = [torch.randn(6, 4, generator=gen)]
    for _ in range(12):
        sequence.append(sequence[-1] + 0.05 * torch.randn(6, 4, generator=gen))

    def broadcasts(gap):
        last, count = None, 0
        for h in sequence:
            active, distance = variation_flag(h, last, gap)
            if active:
                last, count = h.clone(), count + 1
            else:
                assert distance <= gap
        return count

    counts = [broadcasts(g) for g in (0.0, 0.01, 0.05, 0.1, 0.3)]
    assert counts == sorted(counts, reverse=True) and counts[0] == len(sequence)
    assert broadcasts(float("inf")) == 1


def test_every_row_block_gives_each_ranks_row_blocks():
    """The partition step's one pass over Â equals building each rank's blocks on its own."""
    graph, targets, book = setup_graph(3, "contiguous")
    offsets = book.node_offsets
    together = list(every_row_block(graph, offsets, targets.train))
    assert [layout.rank for layout in together] == [0, 1, 2]
    for rank, layout in enumerate(together):
        alone = row_blocks(graph, offsets, rank, targets.train)
        assert torch.equal(layout.consumer, alone.consumer)
        assert torch.equal(layout.seed_rows, alone.seed_rows)
        for got, expected in zip(layout.blocks, alone.blocks, strict=True):
            assert torch.equal(got.to_dense(), expected.to_dense())


def test_row_blocks_rebuild_the_normalised_adjacency_and_reject_directed_graphs():
    graph, targets, book = setup_graph(3, "contiguous")
    offsets = book.node_offsets
    dense = torch.cat(
        [
            torch.cat(
                [b.to_dense() for b in row_blocks(graph, offsets, i, targets.train).blocks], 1
            )
            for i in range(3)
        ]
    )
    torch.testing.assert_close(dense, dense.t())  # Â symmetric
    deg = graph.in_degree().double() + 1
    torch.testing.assert_close(dense.diagonal(), 1 / deg)
    directed = graph.with_structure(torch.tensor([0, 0, 1] + [1] * 128), torch.tensor([2]))
    with pytest.raises(ValueError, match="undirected"):
        check_symmetric(directed)
    v = int((graph.in_degree() > 0).nonzero()[0])  # store one of v's in-edges twice
    start = int(graph.indptr[v])
    indices = torch.cat([graph.indices[: start + 1], graph.indices[start:]])
    indptr = graph.indptr + (torch.arange(graph.num_nodes + 1) > v).long()
    with pytest.raises(ValueError, match="multiplicities"):
        check_symmetric(graph.with_structure(indptr, indices))


def two_components():
    """90 nodes: rows 0-59 and 60-89 are separate components, so with row blocks
    [0, 30, 60, 90] nobody reads block 2 and block 2 reads nobody; with its targets."""
    base = sbm(num_nodes=90, num_classes=CLASSES, avg_degree=4.0, num_features=5, seed=5)
    src, dst = base.graph.indices, base.graph.dst_of_edges()
    keep = (src < 60) == (dst < 60)
    indptr, indices = csc_from_edges(src[keep], dst[keep], 90, undirected=True)
    return base.graph.with_structure(indptr, indices).to(torch.float64), base.targets


def _adaptive_then_evaluate(rank, world_size):
    (graph, targets), offsets = two_components(), torch.tensor([0, 30, 60, 90])
    comm = Comm.create()
    layout = row_blocks(graph, offsets, rank, targets.train)
    lo, hi = int(offsets[rank]), int(offsets[rank + 1])
    net = sancus_net(graph, StalenessPolicy("adaptive", 1, input_policy="same_as_hidden"), comm)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    for _ in range(2):
        optimizer.zero_grad()
        logits = net([layout], graph.x[lo:hi])
        seed_targets = targets.target[lo:hi][layout.seed_rows]
        F.cross_entropy(logits, seed_targets, reduction="sum").backward()
        sum_gradients(comm, list(net.parameters()))
        optimizer.step()
    return (
        net.runtime.last_bcast[0].clone(),
        net.exact_logits(graph.x[lo:hi], layout),
        net.state_dict(),
    )


@pytest.mark.dist
def test_exact_evaluation_after_a_block_nobody_consumes():
    """Regression: a root whose X nobody cached (SCS-A skips blocks without consumers) must be
    broadcast for evaluation by every rank alike, or the ranks' collectives diverge."""
    results = run_distributed(_adaptive_then_evaluate, 3, timeout_s=120)
    assert int(results[0][0][2]) == NEVER  # block 2's X was never broadcast in training
    graph, _ = two_components()
    net = make_params(graph)
    net.load_state_dict(results[0][2])
    blocks = NeighborSampler(graph.indptr, graph.indices, [-1] * LAYERS, 0).sample(
        torch.arange(90), 0, 0
    )
    expected = torch.empty(90, CLASSES, dtype=torch.float64)
    expected[blocks[-1].dst_ids] = net(blocks, graph.x[blocks[0].src_ids]).detach()
    logits = torch.cat([r[1] for r in results])
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-10)


# ------------------------------------------------------------- a plain Lightning script


def _plain_lightning_rank(rank, world_size, cache_dir):
    """One rank of a plain Lightning script: no ``train()``, no preparation before the ranks
    (each rank's ``setup`` prepares, the row partition cached in ``cache_dir``), the strategy
    created by name, no report callbacks."""
    import os

    import lightning as L

    from lightning_gnnscale.config_types import ModelConfig
    from lightning_gnnscale.models.module import GNNModule
    from lightning_gnnscale.systems.sancus import SancusConfig, SancusDataModule

    os.environ.update(
        LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1"
    )
    dataset = original_dataset()
    config = SancusConfig(name="cagnet", policy="none", rows="random")
    dm = SancusDataModule(dataset, config, cache_dir=cache_dir)
    net = dm.build_model(ModelConfig(hidden=HIDDEN, num_layers=LAYERS, dropout=0.0)).double()
    net.load_state_dict(make_params(dataset.graph).state_dict())
    trainer = L.Trainer(
        strategy="cagnet",
        devices=world_size,
        accelerator="cpu",
        use_distributed_sampler=False,
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=cache_dir,
    )
    trainer.fit(GNNModule(net, "adam", lr=LR, weight_decay=0.0), datamodule=dm)
    params = [p.detach().clone() for p in net.parameters()]
    return params, float(trainer.callback_metrics["val/acc"])


@pytest.mark.dist
def test_a_plain_lightning_script_trains_cagnet_exactly(tmp_path):
    """``L.Trainer(strategy="cagnet")`` on a ``SancusDataModule`` prepared in the ranks: the
    weights after training equal `single`'s full-graph run, and so does validation."""
    results = run_distributed(_plain_lightning_rank, 2, str(tmp_path), timeout_s=240)
    assert list(tmp_path.glob("partition-*.pt"))  # the row order was cached on disk
    dataset = original_dataset()
    graph, targets = dataset.graph, dataset.targets
    _, _, ref_params = reference(dataset, EPOCHS)
    for params, _ in results:
        for p, ref in zip(params, ref_params, strict=True):
            torch.testing.assert_close(p, ref, atol=1e-10, rtol=0)
    net = make_params(graph)
    net.load_state_dict(dict(zip(net.state_dict(), ref_params, strict=True)))
    full = NeighborSampler(graph.indptr, graph.indices, [-1] * LAYERS, 0).sample(
        torch.arange(graph.num_nodes), 0, 0
    )
    pred = net(full, graph.x[full[0].src_ids]).argmax(1)  # dst_ids = every node, in order
    val = targets.val
    expected = float((pred[val] == targets.target[val]).double().mean())
    # logged as float32; accuracies differ by >= 1 / len(val)
    assert [acc for _, acc in results] == pytest.approx([expected, expected], abs=1e-6)


def test_a_plain_lightning_resume_is_refused_unless_policy_none():
    """Lightning restores a DataModule's state on ``fit(ckpt_path=...)``: SANCUS refuses it there
    too (not only through ``validate``), since the staleness state is not in the checkpoint."""
    from lightning_gnnscale.errors import ConfigError
    from lightning_gnnscale.graph.generators import sbm
    from lightning_gnnscale.systems.sancus import SancusConfig, SancusDataModule

    dataset = sbm(num_nodes=60, num_classes=3, num_features=4, seed=1)
    stale = SancusDataModule(dataset, SancusConfig(policy="adaptive"))
    with pytest.raises(ConfigError, match="cannot resume from ckpt_path"):
        stale.load_state_dict(stale.state_dict())
    exact = SancusDataModule(dataset, SancusConfig(name="cagnet", policy="none"))
    exact.load_state_dict(exact.state_dict())  # CAGNET's state is all in the weights
