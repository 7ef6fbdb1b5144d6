"""Grappa, multi-process: the scaled all-reduce (M1), gradient-only audit with a negative
control (M4), comm hook = loss scale (M2), reduction to ddp (M3), phase-parallel and full-graph
step counts (M6, M8), end to end with audits (M7), resume, presets and Grappa-50S."""

import re

import pytest
import torch
import torch.nn.functional as F
from hydra.errors import ConfigCompositionException
from torch.nn.parallel import DistributedDataParallel

from lightning_gnnscale.comm import CollectiveRecorder, Comm, GradientHookState
from lightning_gnnscale.comm.hooks import register_metered_ddp_hook
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.preflight import validate
from lightning_gnnscale.run import train
from lightning_gnnscale.systems.grappa.callbacks import gradient_only_problems
from tests.helpers.config import make_cfg
from tests.helpers.dist import run_distributed, start_process, warm_context
from tests.systems.grappa.test_grappa import chunk_store, make_dm, small_dataset

ESTIMATOR = "resampling"
F_SEED, ALPHA = 3, 1.0  # make_dm's seed-hop fanout; the default smoothing


def resampling_factor(graph, owned, seeds):
    """The ``resampling`` estimator from its definition, independently of the package: per seed
    ``v``, ``D`` = its in-degree in ``graph``, ``ell`` = its in-neighbours in ``owned`` (global
    ids), ``s = min(f_seed, ell)``, ``kappa = (ell + alpha) / (D + alpha)``; the expected global
    draws rejected to get ``s + alpha`` local ones are ``(1/kappa - 1)(s + alpha)``, and
    ``c = 1 / (1 + their mean over the batch)``."""
    owned = set(owned.tolist())
    rejections = []
    for v in seeds.tolist():
        neighbours = graph.indices[graph.indptr[v] : graph.indptr[v + 1]].tolist()
        ell = sum(u in owned for u in neighbours)
        k = (ell + ALPHA) / (len(neighbours) + ALPHA)
        rejections.append((1 / k - 1) * (min(F_SEED, ell) + ALPHA))
    return 1 / (1 + sum(rejections) / len(rejections))


def make_net(kind):
    torch.manual_seed(0)
    return BlockGNN(kind, 6, 16, 4, num_layers=2, dropout=0.0).double()


def _scaled_step_rank(rank, world_size, store, kinds):
    return {kind: _scaled_steps(rank, world_size, store, kind) for kind in kinds}


def _scaled_steps(rank, world_size, store, kind):
    comm = Comm.create()
    dm = make_dm(store, world_size, rank, k=2, comm=comm, estimator=ESTIMATOR)
    ddp = DistributedDataParallel(make_net(kind))
    state = register_metered_ddp_hook(ddp, GradientHookState(comm.with_group(ddp.process_group)))
    out = {}
    for step, inject in ((0, False), (1, True)):
        batch = dm.make_batch(0, step)
        batch.x, batch.blocks = batch.x.double(), batch.blocks
        c = batch.coverage
        state.scale = c / world_size  # what GrappaStrategy.training_step sets
        ddp.zero_grad()
        before = comm.meter.snapshot()
        with CollectiveRecorder() as recorder:
            loss = F.cross_entropy(ddp(batch.blocks, batch.x), batch.y, reduction="sum")
            (loss / batch.global_seed_count).backward()
            if inject:  # negative control: a feature gather inside a training step
                comm.all_gather_tensor(batch.x[:2].contiguous(), category="feature")
        problems = gradient_only_problems(recorder.calls, comm.meter.delta(before))
        grad = torch.cat([p.grad.flatten() for p in ddp.parameters()])
        part = dm.partition(dm.locate(step)[0])
        gids = (part.local2global[batch.blocks[-1].dst_ids], part.local2global[: part.num_core])
        out[step] = (batch, c, grad, problems, [call.numel for call in recorder.calls], gids)
    return out


@pytest.mark.dist
def test_aggregate_is_mean_of_coverage_scaled_rank_gradients_and_gradient_only(tmp_path):
    """M1: the all-reduced gradient equals (1/W) sum_w c_w g_w replayed in one process (float64);
    M4: a step issues only gradient all-reduces of all parameters, and an injected feature
    gather is caught."""
    data = small_dataset()
    store = chunk_store(data.to(torch.float64), 4, "random", 0, str(tmp_path))
    by_kind = run_distributed(_scaled_step_rank, 2, store, ("gcn", "gat"), timeout_s=120)
    for kind in ("gcn", "gat"):
        _check_scaled_steps(kind, [r[kind] for r in by_kind], data.graph)


def _check_scaled_steps(kind, results, graph):
    """The reference factor is computed from the graph (``resampling_factor``), not by the
    package, so a wrong ``batch_factor`` / ``GrappaBatch.coverage`` / coverage fails here."""
    n_params = sum(p.numel() for p in make_net(kind).parameters())
    expected = 0
    cs = []
    for r in results:
        batch, _, _, problems, numels, (seeds, owned) = r[0]
        assert problems == [] and sum(numels) == n_params
        assert seeds.numel() == batch.num_seeds and bool(torch.isin(seeds, owned).all())
        c = resampling_factor(graph, owned, seeds)
        net = make_net(kind)
        loss = F.cross_entropy(net(batch.blocks, batch.x), batch.y, reduction="mean")
        loss.backward()
        expected = expected + c * torch.cat([p.grad.flatten() for p in net.parameters()])
        cs.append(c)
    assert all(0 < c < 1 for c in cs)  # 4 chunks: coverage really below 1
    for r in results:
        torch.testing.assert_close(r[0][2], expected / 2, rtol=0, atol=1e-12)
        problems = r[1][3]
        assert any("all_gather" in p for p in problems) and any("feature" in p for p in problems)


# ------------------------------------------------------------------------------ end to end
def grappa_cfg(tmp_path, *overrides):
    return make_cfg(
        tmp_path,
        "strategy=grappa",
        "model=sage",
        "dataset.num_nodes=400",
        "dataset.num_features=8",
        "strategy.partitions_per_rank=2",
        *overrides,
    )


def _train_job(cfg, results):
    metrics, objects = train(cfg)
    results.put((metrics, objects["output_dir"]))


def train_one_rank(cfg, timeout_s=120):
    """``train(cfg)`` for ``trainer.devices=1`` in a started process: Lightning would otherwise
    initialise a one-rank process group in the test process, which later multi-rank runs
    would inherit."""
    results = warm_context().Queue()
    process = start_process(_train_job, cfg, results)
    try:
        metrics, output_dir = results.get(timeout=timeout_s)
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
    return metrics, {"output_dir": output_dir}


def final_params(output_dir):
    ckpt = torch.load(output_dir / "checkpoints" / "last.ckpt", weights_only=False)
    return ckpt


def assert_same_final_params(expected_dir, actual_dir):
    """The two runs' ``last.ckpt`` weights are equal to 1e-12 (float64 runs)."""
    a = final_params(expected_dir)["state_dict"]
    b = final_params(actual_dir)["state_dict"]
    for name, value in a.items():
        torch.testing.assert_close(b[name], value, rtol=0, atol=1e-12)


@pytest.mark.e2e
def test_grappa_end_to_end_gradient_only_and_loss_scale_equivalence(tmp_path):
    """M7 (+M4 through the Trainer): two ranks x two phases, audits on, every training byte is
    a gradient all-reduce of every parameter; bytes per epoch = steps x ring bytes x ranks.
    M2: the same run with ``scaling_impl=loss_scale`` ends with identical parameters."""
    exact = (
        "dtype=float64",
        "model.dropout=0",
        "trainer.max_epochs=3",
        "strategy.super_epoch_len=1",
    )
    metrics, objects = train(
        grappa_cfg(tmp_path / "hook", *exact, "strategy.audit_collectives=true", "audit=true")
    )
    assert metrics["strategy"] == "grappa" and metrics["world_size"] == 2
    per_epoch = metrics["comm_bytes_per_epoch"]
    assert per_epoch["feature"] == per_epoch["activation"] == per_epoch["structure"] == 0
    system = metrics["system"]
    n_params = sum(p.numel() for p in BlockGNN("sage", 8, 64, 8, 2).parameters())
    assert system["grappa_allreduced_numel_per_step"] == [n_params]
    steps = system["grappa_audited_steps"] // 3  # per rank per epoch (rank 0's count)
    assert per_epoch["gradient"] == steps * 2 * (2 * 1 * n_params * 8 // 2)  # float64
    assert system["grappa_super_epoch_switches"] == 3
    assert 0 < system["grappa_mean_c_rank0"] < 1
    assert metrics["best_val_acc"] > 1.5 / 8  # above chance (8 classes)
    _, scaled = train(grappa_cfg(tmp_path / "loss", *exact, "strategy.scaling_impl=loss_scale"))
    assert_same_final_params(objects["output_dir"], scaled["output_dir"])


TYPED_DISTMULT = (
    "dataset=typed_sbm",
    "dataset.num_nodes=300",
    "dataset.num_relations=3",
    "model=rgcn",
    "task=link_prediction",
    "task.undirected=false",
    "task.decoder=distmult",
)


@pytest.mark.e2e
@pytest.mark.parametrize("task", [("model=gcn",), TYPED_DISTMULT], ids=["node", "typed_distmult"])
def test_single_chunk_without_correction_equals_ddp(tmp_path, task):
    """M3: one rank, one chunk, estimator=none samples the same batches as ddp and ends with the
    same parameters and losses. Typed link prediction with a DistMult head (RGCN over the
    inverse relations): the head is trained and synced with the net, and ends as ddp's."""
    common = (
        "trainer.devices=1",
        "dtype=float64",
        *task,
        "model.weight_decay=0",  # grappa's default; ddp's is 5e-4
        "trainer.max_epochs=2",
    )
    m_ddp, o_ddp = train_one_rank(make_cfg(tmp_path / "ddp", "strategy=ddp", *common))
    m_g, o_g = train_one_rank(
        make_cfg(
            tmp_path / "grappa",
            "strategy=grappa",
            "strategy.estimator=none",
            "strategy.partitions_per_rank=1",  # one chunk: the whole graph, warned about
            "trainer.devices=1",
            *common[1:],
        )
    )
    assert_same_final_params(o_ddp["output_dir"], o_g["output_dir"])
    for x, y in zip(m_ddp["history"], m_g["history"]):
        assert x["train_loss"] == pytest.approx(y["train_loss"], rel=1e-12)
    if task[0] != "model=gcn":  # one DistMult diagonal per relation of the pairs, trained
        head = final_params(o_g["output_dir"])["state_dict"]["head.weight"]
        assert head.shape == (3, 64) and not torch.equal(head, torch.ones_like(head))


@pytest.mark.e2e
def test_phase_parallel_one_rank_four_partitions_full_graph(tmp_path):
    """M6/M8: one process trains 4 partitions in sequence (isolated evaluation, so the rank
    never holds the whole graph), one full-graph step per phase: Adam's step counter is
    exactly 4 per epoch."""
    mode = "fullgraph"
    metrics, objects = train_one_rank(
        grappa_cfg(
            tmp_path,
            "trainer.devices=1",
            "strategy.partitions_per_rank=4",
            f"strategy.mode={mode}",
            "strategy.eval_mode=isolated",
        )
    )
    ckpt = final_params(objects["output_dir"])
    adam_steps = {int(s["step"]) for s in ckpt["optimizer_states"][0]["state"].values()}
    assert adam_steps == {2 * 4}  # 2 epochs x 4 phases
    assert metrics["comm_bytes_per_epoch"]["gradient"] == 0  # one rank: nothing on the wire
    assert metrics["val_acc"] is not None and metrics["val_acc"] > 0


@pytest.mark.e2e
def test_resume_rebuilds_the_same_partitions(tmp_path):
    """P12 through Lightning checkpoints: 2 epochs + resume for 2 more (super-epoch switches in
    between) ends with the same parameters as 4 uninterrupted epochs."""
    base = ("trainer.devices=1", "dtype=float64", "strategy.super_epoch_len=1")
    base = (*base, "strategy.partitions_per_rank=1")  # the old default: one phase per epoch
    _, full = train_one_rank(grappa_cfg(tmp_path / "full", *base, "trainer.max_epochs=4"))
    _, first = train_one_rank(grappa_cfg(tmp_path / "a", *base, "trainer.max_epochs=2"))
    ckpt = first["output_dir"] / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=False)["GrappaDataModule"]
    assert (saved["t"], saved["e_in"]) == (2, 0)  # two super-epoch switches so far
    _, resumed = train_one_rank(
        grappa_cfg(tmp_path / "b", *base, "trainer.max_epochs=4", f"ckpt_path={ckpt}")
    )
    assert_same_final_params(full["output_dir"], resumed["output_dir"])


@pytest.mark.e2e
def test_resume_with_more_epochs_keeps_the_auto_super_epoch_length(tmp_path):
    """``super_epoch_len: auto`` is ``max_epochs // (C - 1)``: 2 epochs (length 1) resumed to
    4 (auto would now say 2) keep length 1 and end as 4 uninterrupted epochs of length 1
    (3 chunks, so each switch changes the partitions)."""
    base = ("trainer.devices=1", "dtype=float64", "strategy.partitions_per_rank=3")
    _, full = train_one_rank(
        grappa_cfg(tmp_path / "full", *base, "trainer.max_epochs=4", "strategy.super_epoch_len=1")
    )
    _, first = train_one_rank(grappa_cfg(tmp_path / "a", *base, "trainer.max_epochs=2"))
    ckpt = first["output_dir"] / "checkpoints" / "last.ckpt"
    metrics, resumed = train_one_rank(
        grappa_cfg(tmp_path / "b", *base, "trainer.max_epochs=4", f"ckpt_path={ckpt}")
    )
    assert metrics["system"]["grappa_super_epoch_switches"] == 4
    a, b = final_params(full["output_dir"]), final_params(resumed["output_dir"])
    assert a["GrappaDataModule"] == b["GrappaDataModule"]
    for name, value in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][name], value, rtol=0, atol=1e-12)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("checkpoint", "saved_counters", "history"),
    [
        ("last", (1, 0), [0, 1, 2, 3]),  # both are written at epoch 1's end, after its
        ("best", (1, 0), [0, 1, 2, 3]),  # validation: the whole run is reported
    ],
)
def test_resume_with_validation_every_second_epoch_counts_each_epoch_end_once(
    tmp_path, checkpoint, saved_counters, history
):
    """With ``check_val_every_n_epoch=2`` both checkpoints are written at epoch 1's end, after
    its validation and the super-epoch advance: resuming from either, the advance happens
    exactly once, every epoch is recorded once, and the run ends as the uninterrupted one (3
    chunks, so the schedule really changes)."""
    base = (
        "trainer.devices=1",
        "dtype=float64",
        "strategy.partitions_per_rank=3",
        "strategy.super_epoch_len=2",
        "trainer.check_val_every_n_epoch=2",
    )
    _, full = train_one_rank(grappa_cfg(tmp_path / "full", *base, "trainer.max_epochs=4"))
    _, first = train_one_rank(grappa_cfg(tmp_path / "a", *base, "trainer.max_epochs=2"))
    ckpt = first["output_dir"] / "checkpoints" / f"{checkpoint}.ckpt"
    saved = torch.load(ckpt, weights_only=False)["GrappaDataModule"]
    assert (saved["t"], saved["e_in"]) == saved_counters
    metrics, resumed = train_one_rank(
        grappa_cfg(tmp_path / "b", *base, "trainer.max_epochs=4", f"ckpt_path={ckpt}")
    )
    assert [row["epoch"] for row in metrics["history"]] == history
    assert metrics["system"]["grappa_super_epoch_switches"] == 2  # after epochs 1 and 3
    a, b = final_params(full["output_dir"]), final_params(resumed["output_dir"])
    assert a["GrappaDataModule"] == b["GrappaDataModule"]
    for name, value in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][name], value, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("grappa_uw", {"estimator": "none", "schedule": "pinned_sweep"}),
        ("grappa_fp", {"estimator": "resampling", "schedule": "fixed"}),
        ("grappa_naive", {"estimator": "none", "schedule": "fixed"}),
        ("grappa_50s", {"remote_sample_frac": 0.5, "schedule": "pinned_sweep"}),
    ],
)
def test_presets_compose(tmp_path, preset, expected):
    cfg = make_cfg(tmp_path, f"strategy={preset}")
    validate(cfg)
    assert cfg.strategy.name == preset
    assert {k: cfg.strategy[k] for k in expected} == expected


@pytest.mark.e2e
def test_naive_preset_trains(tmp_path):
    metrics, _ = train(make_cfg(tmp_path, "strategy=grappa_naive", "trainer.max_epochs=1"))
    assert metrics["strategy"] == "grappa_naive"
    assert metrics["system"]["grappa_mean_c_rank0"] == 1.0  # no correction
    assert metrics["comm_bytes_per_epoch"]["feature"] == 0


@pytest.mark.e2e
def test_50s_moves_feature_rows_and_fails_the_gradient_only_audit(tmp_path):
    """Grappa-50S (strict isolation, so remote draws reach rows the partition lacks): the audit
    stops the run at the first batch, whose building pulled `feature` rows and sent
    `structure` requests through comm, by design."""
    over = (
        "strategy=grappa_50s",
        "strategy.halo_hops=0",
        "trainer.devices=2",  # the default phases: 2 ranks x 2, chunk c served by rank c mod 2
        "model=sage",
        "trainer.max_epochs=1",
        "strategy.audit_collectives=true",
    )
    with pytest.raises(Exception, match="gradient-only audit failed") as failure:
        train(make_cfg(tmp_path, *over))
    assert re.search(r"feature: [1-9]\d* bytes between training steps", str(failure.value))
    assert "all_to_all_single (structure) between training steps" in str(failure.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("strategy.estimator=median",), "valid:"),
        (("strategy.schedule=spiral",), "valid:"),
        (("strategy.chunking=spectral",), "valid:"),
        (("strategy.num_chunks=3",), "partitions_per_rank x world"),
        (("strategy.halo_hops=2",), "valid:"),
        (("strategy.remote_sample_frac=0.5", "strategy.schedule=tournament"), "Grappa-50S"),
        (("strategy.partitions_per_rank=1",), "whole graph"),  # 2 ranks: 2 chunks
        (("strategy.num_chunks=2", "strategy.partitions_per_rank=1"), "whole graph"),
        (("data.num_workers=1",), "data.num_workers=0"),
        (("model=custom",), "custom"),
        (("strategy.super_epoch_len=0",), "super_epoch_len"),
        (("strategy.neighbor_weighting=gcn", "strategy.halo_hops=0"), "halo_hops=1"),
        (("strategy.early_trigger.window_steps=0",), "window_steps"),
        (("strategy.early_trigger.threshold=1.0",), "threshold"),
        (("strategy.early_trigger.threshold=-0.1",), "threshold"),
    ],
)
def test_grappa_config_errors(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(tmp_path, "strategy=grappa", *overrides))


@pytest.mark.parametrize(
    "override",
    [
        "strategy.estimater=none",
        "strategy.early_trigger.windw_steps=3",
        "strategy.partitions_per_rank=two",
        "strategy.early_trigger.enabled=maybe",
        "strategy.degree_smoothing=high",
    ],
)
def test_unknown_keys_and_wrong_types_fail_at_compose(tmp_path, override):
    with pytest.raises(ConfigCompositionException, match=override.split("=")[0]):
        make_cfg(tmp_path, "strategy=grappa", override)
