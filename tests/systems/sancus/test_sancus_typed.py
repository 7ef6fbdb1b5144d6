"""SANCUS / CAGNET on typed graphs (docs/systems/sancus.md#typed-graphs): RGCN over one row
block per relation, exact against ``single``'s ``BlockGNN("rgcn")`` under bound 0, and a stale
run against an independent dense oracle of the mixed-version forward and its backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.contract import ModuleRuntime, RankContext
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.book import PartitionBook, relabel_graph
from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.partition import partition
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.systems.sancus.config import SancusConfig
from lightning_gnnscale.systems.sancus.layout import every_row_block, row_blocks
from lightning_gnnscale.systems.sancus.policy import StalenessPolicy
from lightning_gnnscale.systems.sancus.runtime import SancusGCN
from lightning_gnnscale.systems.sancus.strategy import sum_gradients
from tests.helpers.dist import run_distributed

N, R, F_IN, HIDDEN, CLASSES, LAYERS, EPOCHS, LR = 90, 3, 5, 6, 3, 2, 3, 0.05
UNEVEN = {2: [0, 40, 90], 3: [0, 25, 55, 90]}
BASES = (0, 2)  # a weight per relation, and a basis of 2


def typed_graph() -> tuple[Graph, torch.Tensor, torch.Tensor]:
    """A float64 typed graph with one-way edges (no ``Â_r`` is symmetric), some nodes with
    no in-edge of a relation, labels and a training mask."""
    gen = torch.Generator().manual_seed(7)
    num_edges = 360
    src = torch.randint(N, (num_edges,), generator=gen)
    dst = torch.randint(N, (num_edges,), generator=gen)
    kind = torch.randint(R, (num_edges,), generator=gen)
    graph = Graph.from_edge_index(
        torch.stack([src, dst]),
        N,
        edge_type=kind,
        relations=("cites", "writes", "likes"),
        x=torch.randn(N, F_IN, generator=gen, dtype=torch.float64),
        name="typed-test",
    )
    y = torch.randint(CLASSES, (N,), generator=gen)
    train = torch.rand(N, generator=gen) < 0.5
    return graph, y, train


def ordered(world_size: int, rows: str):
    """The graph in row-block order (METIS, or uneven contiguous blocks), labels, mask, book."""
    graph, y, train = typed_graph()
    if rows == "metis":
        parts = partition(graph.without_types(), "metis", world_size)
    else:
        offsets = torch.tensor(UNEVEN[world_size])
        parts = torch.bucketize(torch.arange(N), offsets[1:], right=True)
    book = PartitionBook.from_parts(parts, world_size)
    return relabel_graph(graph, book), y[book.new2old], train[book.new2old], book


def make_params(num_bases: int) -> BlockGNN:
    torch.manual_seed(0)
    net = BlockGNN("rgcn", F_IN, HIDDEN, CLASSES, LAYERS, 0.0, num_relations=R, num_bases=num_bases)
    return net.double()


def dense_relations(graph: Graph) -> torch.Tensor:
    """``[R, N, N]``: every relation's mean adjacency, ``A_r[v, u] = 1 / |N_r(v)|``, built
    from the edge list without the layout's code."""
    dst, src, kind = graph.dst_of_edges(), graph.indices, graph.edge_type
    dense = torch.zeros(R, N, N, dtype=torch.float64)
    dense.index_put_(
        (kind, dst, src), torch.ones(dst.numel(), dtype=torch.float64), accumulate=True
    )
    return dense / dense.sum(2, keepdim=True).clamp(min=1)


def test_relation_blocks_rebuild_every_mean_adjacency_and_its_transpose():
    graph, _, train = typed_graph()
    offsets = torch.tensor(UNEVEN[3])
    dense = dense_relations(graph)
    for rank, layout in enumerate(every_row_block(graph, offsets, train)):
        lo, hi = int(offsets[rank]), int(offsets[rank + 1])
        assert layout.num_relations == R
        forward = torch.cat([b.to_dense() for b in layout.blocks], 1).view(R, hi - lo, N)
        backward = torch.cat([b.to_dense() for b in layout.transposed], 1).view(R, hi - lo, N)
        assert torch.equal(forward, dense[:, lo:hi])
        assert torch.equal(backward, dense.transpose(1, 2)[:, lo:hi])
        one = row_blocks(graph, offsets, rank, train)  # the one-rank builder agrees
        assert all(
            torch.equal(a.to_dense(), b.to_dense()) for a, b in zip(one.blocks, layout.blocks)
        )
    assert not torch.equal(dense, dense.transpose(1, 2))  # the transposed blocks matter here


def _net(num_bases: int, policy: StalenessPolicy, comm: Comm) -> SancusGCN:
    net = SancusGCN(
        F_IN, HIDDEN, CLASSES, LAYERS, policy, kind="rgcn", num_relations=R, num_bases=num_bases
    ).double()
    net.load_state_dict(make_params(num_bases).state_dict())
    net.configure_runtime(ModuleRuntime(RankContext(comm, torch.device("cpu"))))
    return net


def _train(graph, y, train, book, rank, comm, policy, num_bases) -> dict:
    """``EPOCHS`` full-graph steps on this rank's row blocks: losses, every epoch's own logits,
    the parameters before every step and the summed gradients of every step."""
    layout = row_blocks(graph, book.node_offsets, rank, train)
    lo, hi = int(book.node_offsets[rank]), int(book.node_offsets[rank + 1])
    x, target = graph.x[lo:hi], y[lo:hi][layout.seed_rows]
    n_train = int(train.sum())
    net = _net(num_bases, policy, comm)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    before = comm.meter.snapshot()
    out = {"losses": [], "logits": [], "params": [], "grads": []}
    for _ in range(EPOCHS):
        out["params"].append([p.detach().clone() for p in net.parameters()])
        optimizer.zero_grad()
        logits = net([layout], x)
        loss_sum = F.cross_entropy(logits, target, reduction="sum")
        (loss_sum / n_train).backward()
        sum_gradients(comm, list(net.parameters()))
        out["losses"].append(comm.all_reduce(loss_sum.detach().clone(), category="control"))
        out["logits"].append(logits.detach())
        out["grads"].append([p.grad.clone() for p in net.parameters()])
        optimizer.step()
    delta = comm.meter.delta(before)["category_link_bytes"]
    out["bytes"] = {c: sum(links.values()) for c, links in delta.items()}
    out["forward_flags"] = net.runtime.forward_flags
    out["final"] = [p.detach().clone() for p in net.parameters()]
    out["eval"] = net.exact_logits(x, layout)
    return out


POLICIES = {
    "none": StalenessPolicy("none"),
    "none-x-every-epoch": StalenessPolicy("none", input_policy="same_as_hidden"),
    "epoch_fixed-1": StalenessPolicy("epoch_fixed", epoch_bound=1),
}


def _train_rank(rank, world_size, rows):
    graph, y, train, book = ordered(world_size, rows)
    comm = Comm.create()
    return {
        (name, bases): _train(graph, y, train, book, rank, comm, policy, bases)
        for name, policy in POLICIES.items()
        for bases in BASES
    }


@pytest.fixture(scope="module", params=[(2, "metis"), (3, "contiguous")], ids=["p2-metis", "p3"])
def runs(request):
    world_size, rows = request.param
    return world_size, rows, run_distributed(_train_rank, world_size, rows, timeout_s=120)


def single_reference(num_bases: int):
    """``single``'s full-graph RGCN on the original order: losses, logits, gradients per epoch,
    the final parameters and the full-graph logits with them."""
    graph, y, train = typed_graph()
    net = make_params(num_bases)
    seeds = train.nonzero().flatten()
    sampler = NeighborSampler(
        graph.indptr, graph.indices, [-1] * LAYERS, 0, edge_type=graph.edge_type, num_relations=R
    )
    blocks = sampler.sample(seeds, 0, 0)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    out = {"losses": [], "logits": [], "grads": []}
    for _ in range(EPOCHS):
        optimizer.zero_grad()
        logits = net(blocks, graph.x[blocks[0].src_ids])
        loss = F.cross_entropy(logits, y[seeds], reduction="sum")
        (loss / seeds.numel()).backward()
        out["losses"].append(loss.detach())
        out["logits"].append(logits.detach())
        out["grads"].append([p.grad.clone() for p in net.parameters()])
        optimizer.step()
    out["final"] = [p.detach() for p in net.parameters()]
    full = sampler.sample(torch.arange(N), 0, 0)
    out["eval"] = net(full, graph.x[full[0].src_ids]).detach()
    return seeds, out


@pytest.mark.dist
@pytest.mark.parametrize("bases", BASES)
@pytest.mark.parametrize("policy", ["none", "none-x-every-epoch"])
def test_bound_zero_rgcn_equals_single(runs, policy, bases):
    """CAGNET's schedule on a typed graph: every epoch's loss, logits and summed gradients,
    the final weights and the exact evaluation equal ``single``'s ``BlockGNN("rgcn")`` with
    full fanouts (float64, 1e-10), in the original node order."""
    world_size, rows, results = runs
    _, _, train, book = ordered(world_size, rows)
    seeds, ref = single_reference(bases)
    position = torch.searchsorted(seeds, book.new2old[train.nonzero().flatten()])
    got = [r[policy, bases] for r in results]
    close = dict(atol=1e-10, rtol=0)
    torch.testing.assert_close(torch.stack(got[0]["losses"]), torch.stack(ref["losses"]), **close)
    for epoch in range(EPOCHS):
        logits = torch.cat([g["logits"][epoch] for g in got])
        torch.testing.assert_close(logits, ref["logits"][epoch][position], **close)
        for mine, want in zip(got[0]["grads"][epoch], ref["grads"][epoch], strict=True):
            torch.testing.assert_close(mine, want, **close)
    for mine, want in zip(got[0]["final"], ref["final"], strict=True):
        torch.testing.assert_close(mine, want, **close)
    evaluated = torch.cat([g["eval"] for g in got])
    torch.testing.assert_close(evaluated, ref["eval"][book.new2old], **close)


def stale_oracle(graph, y, train, offsets, params, stale_rows, num_bases):
    """One epoch of the mixed-version forward and SANCUS's backward, dense and independent of
    the runtime: rank ``i`` reads its own rows of every layer input fresh and root ``j``'s rows
    of hidden layer input ``l`` as ``stale_rows[l][R_j]`` in value, with the gradient passed
    straight through to ``j``'s fresh rows. Returns the loss sum, the own logits in rank order
    and the gradients of ``params`` (``single``'s parameter order)."""
    net = make_params(num_bases)
    net.load_state_dict(dict(zip(net.state_dict(), params, strict=True)))
    dense = dense_relations(graph)
    p = offsets.numel() - 1
    h = graph.x
    for index, layer in enumerate(net.layers):
        weights = layer.relation_weights()
        own = []
        for i in range(p):
            lo, hi = int(offsets[i]), int(offsets[i + 1])
            read = h
            if index > 0 and stale_rows[index] is not None:
                mine = torch.zeros(N, 1, dtype=torch.bool)
                mine[lo:hi] = True
                straight = stale_rows[index] + (h - h.detach())
                read = torch.where(mine, h, straight)
            z = layer.root(h[lo:hi]) + layer.bias
            z = z + torch.einsum("rvu,uf,rfo->vo", dense[:, lo:hi], read, weights)
            own.append(F.relu(z) if index < LAYERS - 1 else z)
        h = torch.cat(own)
    loss = F.cross_entropy(h[train], y[train], reduction="sum")
    (loss / int(train.sum())).backward()
    return loss.detach(), h[train].detach(), [q.grad for q in net.parameters()]


@pytest.mark.dist
@pytest.mark.parametrize("bases", BASES)
def test_a_stale_epoch_matches_the_mixed_version_oracle_and_skips_its_broadcasts(runs, bases):
    """``epoch_fixed`` with bound 1 on a typed graph: epoch 0 and 2 broadcast every hidden
    block, epoch 1 none (each rank reads the others' epoch-0 rows); each epoch's loss, logits and
    summed gradients equal the dense oracle's (exact forward, or mixed with epoch 0's hidden
    rows), and the run sends a third fewer hidden-row bytes than CAGNET's schedule."""
    world_size, rows, results = runs
    graph, y, train, book = ordered(world_size, rows)
    offsets = book.node_offsets
    got = [r["epoch_fixed-1", bases] for r in results]
    for epoch in range(EPOCHS):
        flags = got[0]["forward_flags"][(epoch, 1)]
        assert torch.equal(flags, torch.full((world_size,), epoch != 1))
        params = got[0]["params"][epoch]
        if epoch == 1:  # the hidden rows every rank holds: epoch 0's, of epoch 0's weights
            stale = exact_hidden(graph, got[0]["params"][0], bases)
            hidden = {1: stale}
        else:
            hidden = {1: None}
        loss, logits, grads = stale_oracle(graph, y, train, offsets, params, hidden, bases)
        close = dict(atol=1e-10, rtol=0)
        torch.testing.assert_close(got[0]["losses"][epoch], loss, **close)
        torch.testing.assert_close(torch.cat([g["logits"][epoch] for g in got]), logits, **close)
        for mine, want in zip(got[0]["grads"][epoch], grads, strict=True):
            torch.testing.assert_close(mine, want, **close)
    # hidden rows broadcast in 2 of the 3 epochs (the gradients, "activation_grad", in all)
    cagnet = results[0]["none", bases]["bytes"]
    assert got[0]["bytes"]["activation"] * 3 == cagnet["activation"] * 2 > 0
    assert got[0]["bytes"]["activation_grad"] == cagnet["activation_grad"] > 0


def exact_hidden(graph, params, num_bases) -> torch.Tensor:
    """The exact first-layer output ``[N, hidden]`` of ``params`` (dense, no runtime)."""
    net = make_params(num_bases)
    net.load_state_dict(dict(zip(net.state_dict(), params, strict=True)))
    layer = net.layers[0]
    dense = dense_relations(graph)
    z = layer.root(graph.x) + layer.bias
    z = z + torch.einsum("rvu,uf,rfo->vo", dense, graph.x, layer.relation_weights())
    return F.relu(z).detach()


def test_the_model_must_match_the_graph():
    """RGCN on a typed graph's blocks per relation, GCN on a homogeneous graph's ``Â``:
    the other pairings, and models SANCUS does not train, are refused with the fix."""
    config = SancusConfig()
    config.check_graph("rgcn", typed=True)
    config.check_graph("gcn", typed=False)
    with pytest.raises(ConfigError, match="model=gcn: the dataset is a typed graph"):
        config.check_graph("gcn", typed=True)
    with pytest.raises(ConfigError, match="model=rgcn: .*this dataset is homogeneous"):
        config.check_graph("rgcn", typed=False)
    with pytest.raises(
        ConfigError, match="model=sage: strategy=sancus trains GCN only, RGCN on typed graphs"
    ):
        config.check_model(config.model_config(name="sage"))
    graph, _, train = typed_graph()
    layout = row_blocks(graph, torch.tensor([0, N]), 0, train)
    gcn = SancusGCN(F_IN, HIDDEN, CLASSES, LAYERS, StalenessPolicy("none"))
    with pytest.raises(ValueError, match="given row blocks of 3 relations' blocks"):
        gcn.check_layout(layout)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (("dataset=typed_sbm", "model=gcn"), "model=gcn: the dataset is a typed graph"),
        (("model=rgcn",), "model=rgcn: strategy=cagnet trains RGCN over a typed graph"),
    ],
    ids=["gcn-on-typed", "rgcn-on-homogeneous"],
)
def test_a_model_that_does_not_fit_the_graph_fails_before_spawn(
    tmp_path, monkeypatch, settings, message
):
    import lightning_gnnscale.run as run_module
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg

    def no_spawn(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(run_module, "launch_local", no_spawn)
    with pytest.raises(ConfigError, match=message):
        train(make_cfg(tmp_path, "strategy=cagnet", "trainer.devices=2", *settings))


def test_a_typed_partition_directory_holds_the_in_memory_blocks_and_is_checked(tmp_path):
    """A typed graph's part holds the stacked and transposed blocks of the in-memory part, its
    metadata the relations; a ``relations`` entry that is not a list of names, or that
    disagrees with the blocks' row count, is refused when the directory is opened."""
    import json

    from lightning_gnnscale.config_types import DataConfig
    from lightning_gnnscale.graph.partition_dir import METADATA, PartitionDirError, metadata_digest
    from lightning_gnnscale.systems.sancus import SancusDataModule

    def datamodule(partition_dir=None):
        return SancusDataModule(
            "typed_sbm",
            SancusConfig.preset("cagnet"),
            DataConfig(batch_size=-1, fanouts=[-1, -1], partition_dir=partition_dir),
            cache_dir=tmp_path / "cache",
            dtype=torch.float64,
            dataset_options={"num_nodes": 120, "num_relations": 3, "num_features": 4},
        )

    memory = datamodule()
    out = tmp_path / "parts"
    memory.write_partition_dir(out, 2, log=lambda *_: 0)
    assert json.loads((out / METADATA).read_text())["relations"] == ["rel_0", "rel_1", "rel_2"]
    for rank in range(2):
        want = memory.part_of(memory.prepare(2), rank).layout
        got = datamodule(str(out))
        got = got.load_part(got.prepare(2), rank).layout
        assert got.num_relations == want.num_relations == 3
        for a, b in zip(got.blocks + got.transposed, want.blocks + want.transposed, strict=True):
            assert torch.equal(a.to_dense(), b.to_dense())
    assert datamodule(str(out)).num_relations == 3

    good = json.loads((out / METADATA).read_text())
    for relations, message in [
        ("rel_0", "'relations' is not a list of distinct relation names"),
        (["rel_0", "rel_1"], r"a0_crow.* part 0's 'nodes' times the relations"),
    ]:
        meta = {**good, "relations": relations}
        meta["blake2b"] = metadata_digest(meta)
        (out / METADATA).write_text(json.dumps(meta))
        with pytest.raises(PartitionDirError, match=message):
            datamodule(str(out)).prepare(2, [0])
