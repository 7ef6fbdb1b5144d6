"""SANCUS / CAGNET under link prediction (docs/systems/sancus.md#link-prediction), float64 on
a tiny SBM, 2 ranks with scattered (random) row blocks and 3 uneven contiguous ones:

- exact: bound 0 (CAGNET) takes `single`'s steps (full neighbourhoods, the same positive and
  negative pairs), loss and weights after every step, over several steps of two epochs;
- staleness: SCS-A1 equals the single-process emulator on the same steps (flags, losses,
  weights) and its first step is `single`'s; it still skips hidden broadcasts, and moves
  fewer `activation` bytes than CAGNET on the same steps;
- leakage: no validation or test pair joins its endpoints in any rank's training row
  blocks, nor a test pair in the test stage's;
- evaluation: the ranks' summed statistics are `single`'s, each rank embedding its own rows.
"""

import functools

import pytest
import torch

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig, ModelConfig
from lightning_gnnscale.contract import ModuleRuntime, RankContext
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.kit.loaders import StepBatcher
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.systems.sancus import SancusConfig
from lightning_gnnscale.systems.sancus.datamodule import SancusDataModule
from lightning_gnnscale.systems.sancus.emulator import emulate
from lightning_gnnscale.systems.sancus.policy import StalenessPolicy
from lightning_gnnscale.systems.sancus.strategy import sum_gradients
from lightning_gnnscale.tasks import TaskConfig, build_task
from tests.helpers.dist import run_distributed

HIDDEN, LAYERS, LR, BATCH, EPOCHS = 6, 2, 0.05, 96, 2
TASK_CONFIG = TaskConfig("link_prediction", num_negatives=2, embedding_dim=4, eval_negatives=20)
MODEL = ModelConfig("gcn", hidden=HIDDEN, num_layers=LAYERS, dropout=0.0, lr=LR)
SETTINGS = {2: "random", 3: "contiguous"}  # world size -> row order


def dataset():
    return sbm(num_nodes=130, num_classes=3, avg_degree=6.0, num_features=5, seed=3).to(
        torch.float64
    )


def datamodule(world_size: int, policy: str, cache_dir: str) -> SancusDataModule:
    config = SancusConfig(policy=policy, rows=SETTINGS[world_size])
    return SancusDataModule(
        dataset(),
        config,
        DataConfig(batch_size=BATCH),
        task=build_task(TASK_CONFIG),
        cache_dir=cache_dir,
        dtype=torch.float64,
    )


def steps(dm) -> list[tuple[int, int]]:
    return [(e, s) for e in range(EPOCHS) for s in range(dm.steps_per_epoch)]


def _rank(rank, world_size, policy, cache_dir):
    """Every step of ``EPOCHS`` epochs on this rank: the summed losses, the weights after each
    step, the flags and bytes, the row blocks' original (dst, src) pairs and the statistics of
    an evaluation after training."""
    dm = datamodule(world_size, policy, cache_dir)
    comm = Comm.create()
    dm.setup_rank(RankContext(comm, torch.device("cpu")), dm.part_of(dm.prepare(world_size), rank))
    torch.manual_seed(0)
    net = dm.build_model(MODEL).double()
    net.configure_runtime(ModuleRuntime(RankContext(comm, torch.device("cpu"))))
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    losses, weights = [], []
    before = comm.meter.snapshot()
    for epoch, step in steps(dm):
        batch = dm.make_batch(epoch, step)
        optimizer.zero_grad()
        loss_sum = dm.task.loss_sum(net(batch.blocks, batch.x), batch.y)
        (loss_sum / batch.global_seed_count).backward()
        sum_gradients(comm, list(net.parameters()))
        losses.append(comm.all_reduce(loss_sum.detach().clone(), category="control"))
        optimizer.step()
        weights.append([p.detach().clone() for p in net.parameters()])
    moved = comm.meter.delta(before)["category_link_bytes"]
    new2old, lo = dm.links.part.new2old, dm.links.lo

    def original_edges(layout):
        out = []
        for j, block in enumerate(layout.blocks):
            crow, col = block.crow_indices(), block.col_indices()
            rows = torch.repeat_interleave(torch.arange(crow.numel() - 1), crow.diff())
            out.append(torch.stack([new2old[lo + rows], new2old[layout.offsets[j] + col]]))
        return torch.cat(out, 1)

    return {
        "losses": torch.stack(losses),
        "weights": weights,
        "forward_flags": net.runtime.forward_flags,
        "backward_flags": net.runtime.backward_flags,
        "activation": sum(moved["activation"].values()),
        "train_edges": original_edges(dm.layout),
        "test_edges": original_edges(dm.stage_layouts["test"]),
        "stats": dm.eval_statistics(net, ("val", "test")),
        "embeddings": {s: net.exact_logits(dm.x, dm.stage_layouts[s]) for s in ("train", "test")},
        "own_ids": dm.own_ids,
    }


@functools.cache
def single_reference():
    """``single``'s steps (full neighbourhoods over the training edges, one process) on the
    same pairs: losses and weights after every step, and the net."""
    dm = datamodule(2, "none", "unused")  # its targets and seeds: the task's, unrelabelled
    task, targets = dm.task, dm.targets
    batcher = StepBatcher.on_graph(
        dm.graph, targets, task, [-1] * LAYERS, dm.train_ids, BATCH, dm.seed, 0, 1, False
    )
    torch.manual_seed(0)
    net = BlockGNN("gcn", 5, HIDDEN, TASK_CONFIG.embedding_dim, LAYERS, 0.0, init="glorot")
    net = net.double()
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    losses, weights = [], []
    for epoch, step in steps(dm):
        batch = batcher[(epoch, step)]
        optimizer.zero_grad()
        loss_sum = task.loss_sum(net(batch.blocks, batch.x), batch.y)
        (loss_sum / batch.global_seed_count).backward()
        optimizer.step()
        losses.append(loss_sum.detach())
        weights.append([p.detach().clone() for p in net.parameters()])
    return torch.stack(losses), weights, net, dm


@pytest.fixture(scope="module", params=[2, 3], ids=["p2-random", "p3-contiguous"])
def runs(request, tmp_path_factory):
    world_size = request.param
    cache = str(tmp_path_factory.mktemp("sancus-lp-cache"))
    results = {
        policy: run_distributed(_rank, world_size, policy, cache, timeout_s=180)
        for policy in ("none", "adaptive")
    }
    return world_size, cache, results


@pytest.mark.dist
def test_cagnet_takes_singles_steps_exactly(runs):
    world_size, cache, results = runs
    ref_losses, ref_weights, _, _ = single_reference()
    assert len(ref_losses) > EPOCHS  # several steps per epoch
    for r in results["none"]:
        torch.testing.assert_close(r["losses"], ref_losses, rtol=0, atol=1e-10)
        for got, want in zip(r["weights"], ref_weights, strict=True):
            for p, q in zip(got, want, strict=True):
                torch.testing.assert_close(p, q, rtol=0, atol=1e-10)


def _emulator_steps(world_size: int, cache: str, policy: StalenessPolicy):
    """The emulator on the same steps: the step's loss from every row's output, the pairs of
    the task's ``step_rows`` over the whole step (one process draws the same negatives)."""
    dm = datamodule(world_size, policy.name, cache)
    prepared, task, targets = dm.prepare(world_size), dm.task, dm.targets
    old2new = torch.empty_like(prepared.new2old)
    old2new[prepared.new2old] = torch.arange(old2new.numel())
    order = steps(dm)

    def step_loss(k: int, out: torch.Tensor):
        epoch, step = order[k]
        seeds = dm.order.step(epoch, step, BATCH)
        nodes, y = task.step_rows(
            targets, seeds, torch.arange(seeds.numel()), epoch=epoch, step=step
        )
        return task.loss_sum(out[old2new[nodes]], y), task.loss_terms(seeds.numel())

    torch.manual_seed(0)
    net = BlockGNN("gcn", 5, HIDDEN, TASK_CONFIG.embedding_dim, LAYERS, 0.0, init="glorot")
    params = [(layer.lin.weight, layer.bias) for layer in net.double().layers]
    return emulate(
        prepared.graph,
        None,
        task,
        prepared.offsets,
        params,
        policy,
        len(order),
        lr=LR,
        step_loss=step_loss,
    )


@pytest.mark.dist
def test_sancus_equals_the_emulator_and_still_skips(runs):
    """SCS-A1 under link prediction: the emulator's flags, losses and weights on every rank
    (consensus), its first step exact (every block fresh), hidden blocks skipped, and fewer
    `activation` bytes than CAGNET on the same steps (the endpoint rows are the same)."""
    world_size, cache, results = runs
    trace = _emulator_steps(world_size, cache, StalenessPolicy("adaptive", epoch_bound=1))
    ref_losses, _, _, _ = single_reference()
    final = [t for weight, bias in trace.params for t in (bias, weight)]  # module order
    for r in results["adaptive"]:
        assert r["forward_flags"].keys() == trace.forward_flags.keys()
        for key, flags in trace.forward_flags.items():
            assert torch.equal(r["forward_flags"][key], flags), key
        for key, flags in trace.backward_flags.items():
            assert torch.equal(r["backward_flags"][key], flags), key
        want = torch.tensor(trace.losses, dtype=torch.float64)
        torch.testing.assert_close(r["losses"], want, rtol=0, atol=1e-10)
        for p, q in zip(r["weights"][-1], final, strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-10)
        torch.testing.assert_close(r["losses"][0], ref_losses[0], rtol=0, atol=1e-10)
    hidden = [f for (_, layer), f in trace.forward_flags.items() if layer > 0]
    assert not all(bool(f.all()) for f in hidden)  # SANCUS skips under link prediction
    for none, adaptive in zip(results["none"], results["adaptive"], strict=True):
        assert all(bool(f.all()) for (_, layer), f in none["forward_flags"].items() if layer > 0)
        assert adaptive["activation"] < none["activation"]


def _pair_keys(pairs: torch.Tensor, n: int) -> torch.Tensor:
    """Both directions of ``pairs [2, m]`` as keys ``a * n + b``."""
    return torch.cat([pairs[0] * n + pairs[1], pairs[1] * n + pairs[0]])


@pytest.mark.dist
def test_no_evaluation_pair_is_in_a_training_row_block(runs):
    """On every rank no validation or test pair (either direction) is an entry of ``Â``'s
    training row blocks, and no test pair one of the test stage's; the training and test
    structures' own edges are all there (self loops aside)."""
    world_size, cache, results = runs
    dm = datamodule(world_size, "none", cache)
    split, n = dm.targets.split, dm.graph.num_nodes
    held_out = {"val": _pair_keys(split.val_pos, n), "test": _pair_keys(split.test_pos, n)}
    assert held_out["val"].numel() > 0 and held_out["test"].numel() > 0
    train_keys, test_keys = [], []
    for r in results["none"]:
        train = r["train_edges"][0] * n + r["train_edges"][1]
        test = r["test_edges"][0] * n + r["test_edges"][1]
        assert not bool(torch.isin(train, held_out["val"]).any())
        assert not bool(torch.isin(train, held_out["test"]).any())
        assert not bool(torch.isin(test, held_out["test"]).any())
        assert bool(torch.isin(held_out["val"], test).any())  # validation edges pass in test
        train_keys.append(train)
        test_keys.append(test)
    for keys, stage in ((train_keys, "train"), (test_keys, "test")):
        indptr, indices = split.structure(stage)
        dst = torch.repeat_interleave(torch.arange(n), indptr.diff())
        want = dst * n + indices
        got = torch.cat(keys)
        assert torch.equal(torch.unique(got[got // n != got % n]), torch.unique(want))


@pytest.mark.dist
def test_evaluation_sums_to_singles_statistics(runs):
    """Each rank embeds its own rows per stage (exact, over the stage's row blocks) and
    scores its own pairs; the ranks' statistics sum to ``single``'s on the same weights, and
    the embeddings are ``single``'s full-neighbourhood ones."""
    world_size, cache, results = runs
    _, _, _, dm = single_reference()
    task, targets, graph = dm.task, dm.targets, dm.graph
    ranks = results["none"]
    net = BlockGNN("gcn", 5, HIDDEN, TASK_CONFIG.embedding_dim, LAYERS, 0.0).double()
    names = [name for name, _ in net.named_parameters()]
    net.load_state_dict(dict(zip(names, ranks[0]["weights"][-1], strict=True)))
    embedded = {}
    for stage in ("train", "test"):
        from lightning_gnnscale.models.inference import full_logits

        with torch.no_grad():
            full = full_logits(graph.with_structure(*targets.split.structure(stage)), net, 64)
        got = torch.zeros_like(full)
        for r in ranks:
            got[r["own_ids"]] = r["embeddings"][stage]
        torch.testing.assert_close(got, full, rtol=0, atol=1e-12)
        embedded[stage] = got

    want = task.link_statistics(
        lambda stage: embedded[stage],
        targets,
        ("val", "test"),
        0,
        1,
    )
    got = sum(r["stats"] for r in ranks)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_a_rank_draws_the_filtered_negatives_one_process_draws(tmp_path):
    """``task.filter_negatives``: a rank redraws against the training edges leaving its own
    nodes (the sources of its pairs), and gets the negatives one process gets from every
    training edge, for every rank's share of a step (no processes: the parts in memory)."""
    import dataclasses

    from lightning_gnnscale.systems.sancus.links import RankLinks

    config = dataclasses.replace(TASK_CONFIG, num_negatives=6, filter_negatives=True)
    dm = SancusDataModule(
        dataset(),
        SancusConfig(rows="random"),
        DataConfig(batch_size=-1),
        task=build_task(config),
        cache_dir=tmp_path,
        dtype=torch.float64,
    )
    prepared, task, targets = dm.prepare(3), dm.task, dm.targets
    seeds = dm.order(1)  # every training pair, epoch 1's order
    nodes_all, want = task.step_rows(targets, seeds, torch.arange(seeds.numel()), epoch=1, step=0)
    want_pairs = nodes_all[want[:, :2]]  # original ids of every (src, dst) pair
    got = torch.zeros_like(want_pairs)
    for rank in range(3):
        part = dm.part_of(prepared, rank)
        links = RankLinks(part.link, part.layout, config.embedding_dim, dm.seed, True)
        mine, positions = links.own_seeds(seeds)
        nodes, y = task.step_rows(links.targets, mine, positions, epoch=1, step=0)
        k = config.num_negatives
        n = positions.numel()
        rows = torch.cat(
            [positions, (positions[:, None] * k + torch.arange(k)).flatten() + seeds.numel()]
        )
        got[rows] = nodes[y[:, :2]]
        assert bool((links.owner(nodes[y[:, 0]]) == rank).all())  # it owns every source
        assert n == int((prepared.owner[targets.split.train_pos[0, seeds]] == rank).sum())
    assert torch.equal(got, want_pairs)
    lookup = targets.train_lookup  # and they were filtered: no negative is a training edge
    negative = want[:, 2] == 0
    assert bool((lookup.find(want_pairs[negative, 0], want_pairs[negative, 1]) < 0).all())


def test_a_one_way_split_is_refused(tmp_path):
    """``task.undirected=false`` splits the two directions of an edge apart, so ``Â`` over the
    training edges is not symmetric: refused when the DataModule prepares (before any rank)."""
    import dataclasses

    from lightning_gnnscale.errors import ConfigError

    config = dataclasses.replace(TASK_CONFIG, undirected=False)
    dm = SancusDataModule(
        dataset(), SancusConfig(), DataConfig(), task=build_task(config), cache_dir=tmp_path
    )
    with pytest.raises(ConfigError, match="task.undirected=false"):
        dm.prepare(2)
