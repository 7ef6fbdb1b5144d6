"""A plain Lightning script (``L.Trainer``, no Hydra, no ``train.py``) is held to what
``train.py`` guarantees (issue 23): it cannot train on re-wrapped loaders, the config rules
that involve the model, data or world size are checked, ``precision="64-true"`` works,
Lightning gets the right batch size, predictions come out, names lead to their classes.

The multi-rank checks share one 2-rank launch (:func:`rank_scenarios`) to keep CI time low.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import StrategyRegistry

import lightning_gnnscale as gs
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.launch import launch_local

SBM = {"num_nodes": 300, "num_features": 8}


def datamodule(name: str, cache: Path, config=None, dataset=None):
    Strategy, DataModule, default = gs.system(name)
    dm = DataModule(
        dataset if dataset is not None else gs.load_dataset("sbm", **SBM),
        config if config is not None else default,
        gs.DataConfig(batch_size=64, fanouts=[5, 5]),
        cache_dir=cache,
    )
    return Strategy, dm


def trainer(strategy, devices: int = 1, **kwargs) -> L.Trainer:
    kwargs.setdefault("enable_checkpointing", False)
    return L.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=devices,
        max_epochs=kwargs.pop("max_epochs", 1),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


def weights(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ------------------------------------------------------------------------ in one process
def test_config_fields_are_type_checked_and_presets_come_from_a_constructor():
    with pytest.raises(gs.ConfigError, match="partitions_per_rank=2.5 is a float"):
        gs.GrappaConfig(partitions_per_rank=2.5)
    with pytest.raises(gs.ConfigError, match="cache=.* is a dict, expected FeatureCacheConfig"):
        gs.GSplitConfig(cache={"fraction": 0.5})
    with pytest.raises(gs.ConfigError, match=r"GrappaConfig.preset\('grappa_uw'\)"):
        gs.GrappaConfig(name="grappa_uw")  # plain Grappa under the ablation's name
    with pytest.raises(gs.ConfigError, match="fanouts"):
        gs.DataConfig(fanouts=[2.5, 5])
    assert gs.GrappaConfig.preset("grappa_uw").estimator == "none"
    assert gs.GSplitConfig(cache=gs.FeatureCacheConfig(fraction=0.5)).cache.fraction == 0.5


def test_every_name_leads_to_its_strategy_datamodule_and_config():
    for name, spec in gs.SYSTEMS.items():
        for alias in {name, spec.registered_as}:
            Strategy, DataModule, config = gs.system(alias)
            assert (Strategy, DataModule) == (spec.strategy, spec.datamodule)
            assert isinstance(config, Strategy.config_type) and config.name == name
            assert type(StrategyRegistry.get(spec.registered_as)) is Strategy  # lazy factory
    assert gs.system("data_parallel")[2] == gs.system("ddp")[2]
    with pytest.raises(KeyError, match="valid"):
        gs.system("dpp")
    nested = ["GSplitPartitionConfig", "FeatureCacheConfig", "EarlyTriggerConfig", "DagConfig"]
    nested += ["SchedulerConfig", "ByteGNNPartitionConfig", "DistDGLPartitionConfig"]
    nested += ["GraNNDISPartitionConfig", "EASConfig", "CoBConfig"]
    assert all(hasattr(gs, n) and n in gs.__all__ for n in nested)
    assert gs.layerwise_inference is not None


def test_gnn_module_from_config_carries_the_training_settings(tmp_path):
    _, dm = datamodule("single", tmp_path)
    model = gs.ModelConfig(name="sage", hidden=16, optimizer="sgd", lr=0.2, weight_decay=0.0)
    module = gs.GNNModule.from_config(model, dm)
    assert (module.optimizer_name, module.lr, module.weight_decay) == ("sgd", 0.2, 0.0)
    assert module.model_config == model
    assert isinstance(module.configure_optimizers(), torch.optim.SGD)


def test_sancus_model_rules_apply_to_a_plain_module(tmp_path):
    """The same refusal as ``train.py strategy=sancus model.dropout=0.5``, for a module that
    states its settings (``from_config`` checks them against the system's rules)."""
    _, dm = datamodule("sancus", tmp_path)
    with pytest.raises(gs.ConfigError, match="model.dropout=0.5"):
        gs.GNNModule.from_config(gs.ModelConfig(dropout=0.5), dm)
    assert gs.system("sancus")[2].model_config().dropout == 0.0


def test_single_refuses_two_devices(tmp_path):
    Strategy, dm = datamodule("single", tmp_path)
    module = gs.GNNModule(dm.build_model(gs.ModelConfig(hidden=8)))
    with pytest.raises(gs.ConfigError, match="strategy=single runs one process"):
        trainer("single", devices=2).fit(module, datamodule=dm)


def test_precision_64_true_trains_what_float64_data_and_weights_train(tmp_path):
    """``precision="64-true"`` (the DataModule follows it) equals the float64 run train.py
    makes: a float64 graph and a float64 net under the default precision."""
    dataset = gs.load_dataset("sbm", **SBM)
    runs = []
    for precision, dtype in (("64-true", torch.float32), ("32-true", torch.float64)):
        L.seed_everything(0, verbose=False)
        Strategy, dm = datamodule("single", tmp_path / precision, dataset=dataset.to(dtype))
        module = gs.GNNModule(dm.build_model(gs.ModelConfig(hidden=8)).to(dtype))
        trainer("single", precision=precision, callbacks=[gs.StepSeed(0)]).fit(module, dm)
        runs.append(weights(module))
    assert all(v.dtype == torch.float64 for v in runs[0].values())
    for key, value in runs[1].items():
        torch.testing.assert_close(runs[0][key], value, rtol=0, atol=0)


def test_predict_gives_every_nodes_rows_in_one_process(tmp_path):
    _, dm = datamodule("single", tmp_path)
    module = gs.GNNModule(dm.build_model(gs.ModelConfig(hidden=8)))
    t = trainer("single")
    (out,) = t.predict(module, datamodule=dm.predict_on(torch.tensor([5, 1, 7]), "logits"))
    assert out["node_ids"].tolist() == [5, 1, 7]
    assert torch.allclose(out["logits"], full_neighbourhood(dm.graph, module.net)[[5, 1, 7]])


# --------------------------------------------------------------------- on two ranks
def full_neighbourhood(graph, net, layers: int | None = None) -> torch.Tensor:
    """Oracle: the net's sampled forward with full fanouts over every node (no layer-wise
    inference)."""
    net.eval()
    sampler = NeighborSampler(graph.indptr, graph.indices, [-1] * net.num_layers, 0)
    blocks = sampler.sample(torch.arange(graph.num_nodes), epoch=0, step=0, salt=0)
    layers = net.num_layers if layers is None else layers
    with torch.no_grad():
        h = graph.x.index_select(0, blocks[0].src_ids).to(next(net.parameters()).dtype)
        for i in range(layers):
            h = net.layer_output(i, blocks[i], h)
    order = blocks[layers - 1].dst_ids if layers else blocks[0].src_ids
    if layers < net.num_layers:  # the rows are the next block's sources: keep the seeds
        h, order = h[: graph.num_nodes], blocks[layers].src_ids[: graph.num_nodes]
    out = torch.empty_like(h)
    out[order] = h
    return out


class LogsItsOwnLoss(gs.GNNModule):
    """A user's subclass logging an epoch mean the way Lightning's docs show."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("my_train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss


class UsersOwnModule(L.LightningModule):
    """A user's own module (not a GNNModule) logging an epoch mean without ``batch_size``; it
    records what it logged and the roots of each Lightning batch (``on_train_batch_start``
    sees HopGNN's iteration batch, ``training_step`` each time step's)."""

    def __init__(self, net):
        super().__init__()
        self.net = net
        self.logged: list[tuple[float, int]] = []  # (loss, roots of its Lightning batch)

    def on_train_batch_start(self, batch, batch_idx):
        self.roots = batch.num_seeds

    def training_step(self, batch, batch_idx):
        logits = self.net(batch.blocks, batch.x)
        loss = F.cross_entropy(logits, batch.y, reduction="sum") / batch.global_seed_count
        self.log("loss", loss, on_epoch=True)
        self.logged.append((float(loss), self.roots))
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.net.parameters())


class IgnoresTheLayerHook(L.LightningModule):
    """Takes the runtime but never calls ``runtime.layer_hook``."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def configure_runtime(self, runtime) -> None:
        self.runtime = runtime

    def training_step(self, batch, batch_idx):
        logits = self.net(batch.blocks, batch.x)
        return F.cross_entropy(logits, batch.y, reduction="sum") / batch.global_seed_count

    def configure_optimizers(self):
        return torch.optim.Adam(self.net.parameters())


def expect_error(results: dict, key: str, fit) -> None:
    try:
        fit()
        results[key] = None
    except Exception as err:  # recorded; the test asserts on it
        results[key] = f"{type(err).__name__}: {err}"


def rank_scenarios(out: Path) -> None:
    """Every 2-rank check, in one launch; each rank writes ``rank<r>.pt``."""
    dataset = gs.load_dataset("sbm", **SBM)
    results: dict = {}
    model = gs.ModelConfig(hidden=8)

    # 1, 4, 10b: without use_distributed_sampler=False, in float64 through Lightning
    runs = []
    for flag in ({}, {"use_distributed_sampler": False}):
        L.seed_everything(0, verbose=False)
        Strategy, dm = datamodule("data_parallel", out / "cache", dataset=dataset)
        module = gs.GNNModule.from_config(model, dm)
        t = trainer(Strategy(dm.config), 2, precision="64-true", callbacks=[gs.StepSeed(0)], **flag)
        with warnings.catch_warnings(record=True) as caught:
            t.fit(module, datamodule=dm)
        runs.append(weights(module))
        results.setdefault("steps", []).append((t.global_step, dm.steps_per_epoch))
        results.setdefault("warnings", []).extend(str(w.message) for w in caught)
    results["weights"] = runs

    # 7: predictions, each rank its share
    shares = t.predict(module, datamodule=dm.predict_on(output="embeddings"))
    ids = torch.tensor([3, 290, 150, 0, 149])
    shares += t.predict(module, datamodule=dm.predict_on(ids, "logits"))
    results["predictions"] = shares
    results["net"] = module.net.state_dict()

    # 5: a user's epoch log under HopGNN
    L.seed_everything(0, verbose=False)
    Strategy, dm = datamodule("hopgnn", out / "cache", dataset=dataset)
    module = LogsItsOwnLoss.from_config(model, dm)
    t = trainer(Strategy(dm.config), 2)
    with warnings.catch_warnings(record=True) as caught:
        t.fit(module, datamodule=dm)
    results["hopgnn_epoch_loss"] = float(t.callback_metrics["my_train_loss"])
    results["hopgnn_warnings"] = [str(w.message) for w in caught]
    # 5b: a user's own module, no batch_size given
    L.seed_everything(0, verbose=False)
    Strategy, dm = datamodule("hopgnn", out / "cache", dataset=dataset)
    module = UsersOwnModule(dm.build_model(model))
    t = trainer(Strategy(dm.config), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice to pass batch_size, and sync_dist
        t.fit(module, datamodule=dm)
    results["own_module_epoch_loss"] = float(t.callback_metrics["loss_epoch"])
    results["own_module_logged"] = module.logged

    # 6: SANCUS evaluates its best checkpoint; a resume is refused in a plain script's words
    Strategy, dm = datamodule("sancus", out / "cache", dataset=dataset)
    module = gs.GNNModule.from_config(dm.config.model_config(hidden=8), dm)
    best = ModelCheckpoint(dirpath=out / "ckpt", monitor="val/acc", mode="max")
    t = trainer(Strategy(dm.config), 2, callbacks=[best], enable_checkpointing=True)
    t.fit(module, datamodule=dm)
    expect_error(results, "sancus_test", lambda: t.test(module, datamodule=dm, ckpt_path="best"))
    path = best.best_model_path
    Strategy, dm = datamodule("sancus", out / "cache", dataset=dataset)
    t = trainer(Strategy(dm.config), 2, max_epochs=2)
    expect_error(results, "sancus_resume", lambda: t.fit(module, datamodule=dm, ckpt_path=path))

    # 2: rules involving the world size and the model, checked before any step
    hop = gs.HopGNNConfig(steps=5)
    Strategy, dm = datamodule("hopgnn", out / "cache", config=hop, dataset=dataset)
    t = trainer(Strategy(hop), 2)
    expect_error(results, "hopgnn_steps", lambda: t.fit(gs.GNNModule.from_config(model, dm), dm))
    results["hopgnn_steps_taken"] = t.global_step
    flx = gs.GraNNDISConfig(mode="flx", preload_k=3)  # refused where the DataModule is made
    expect_error(
        results,
        "granndis_k",
        lambda: datamodule("granndis", out / "cache", config=flx, dataset=dataset),
    )

    # 10c: a module that takes the runtime but never calls the layer hook
    Strategy, dm = datamodule("gsplit", out / "cache", dataset=dataset)
    module = IgnoresTheLayerHook(dm.build_model(model))
    t = trainer(Strategy(dm.config, timeout_s=30), 2)  # the other rank may wait in a collective
    expect_error(results, "unused_hook", lambda: t.fit(module, datamodule=dm))
    torch.save(results, out / f"rank{t.global_rank}.pt")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("plain")
    launch_local(rank_scenarios, (out,), devices=2, num_nodes=1, timeout_s=550)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.dist
@pytest.mark.timeout(600)  # the first one runs the shared 2-rank launch
def test_leaving_use_distributed_sampler_on_trains_the_same_steps(two_ranks):
    for results in two_ranks:
        (steps, per_epoch), (steps_off, _) = results["steps"]
        assert steps == steps_off == per_epoch  # re-wrapped loaders ran every other step
        plain, reference = results["weights"]
        for key, value in reference.items():
            assert value.dtype == torch.float64
            torch.testing.assert_close(plain[key], value, rtol=0, atol=0, msg=key)


@pytest.mark.dist
@pytest.mark.timeout(600)  # the first one runs the shared 2-rank launch
def test_gnn_module_logs_nothing_lightning_warns_about(two_ranks):
    for results in two_ranks:
        logged = results["warnings"] + results["hopgnn_warnings"]
        assert not [w for w in logged if "sync_dist=True" in w], logged
        assert not [w for w in logged if "batch size we found" in w], logged


@pytest.mark.dist
@pytest.mark.timeout(600)  # the first one runs the shared 2-rank launch
def test_a_users_epoch_log_under_hopgnn_is_a_number(two_ranks):
    for results in two_ranks:
        assert math.isfinite(results["hopgnn_epoch_loss"]) and results["hopgnn_epoch_loss"] > 0


@pytest.mark.dist
@pytest.mark.timeout(600)  # the first one runs the shared 2-rank launch
def test_a_users_own_module_logs_the_root_weighted_epoch_mean_under_hopgnn(two_ranks):
    """``self.log("loss", loss, on_epoch=True)`` without ``batch_size``: Lightning weighs each
    call by the roots of its iteration (HopGNN's batch), so the epoch value is the mean of the
    logged losses weighted by those roots, on each rank (no ``sync_dist``)."""
    for results in two_ranks:
        logged = results["own_module_logged"]
        assert logged and sum(roots for _, roots in logged) > 0, logged
        expected = sum(loss * roots for loss, roots in logged) / sum(r for _, r in logged)
        assert results["own_module_epoch_loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.dist
@pytest.mark.timeout(600)  # the first one runs the shared 2-rank launch
def test_predictions_are_every_nodes_rows_split_over_ranks(two_ranks):
    dataset = gs.load_dataset("sbm", **SBM).to(torch.float64)
    graph = dataset.graph
    net = gs.build_model(gs.ModelConfig(hidden=8), graph.num_features, dataset.num_classes)
    net.load_state_dict(two_ranks[0]["net"])
    net = net.double()
    embeddings = [r["predictions"][0] for r in two_ranks]
    ids = torch.cat([e["node_ids"] for e in embeddings])
    assert sorted(ids.tolist()) == list(range(graph.num_nodes))  # a partition of the nodes
    assert all(e["node_ids"].numel() < graph.num_nodes for e in embeddings)  # each a share
    rows = torch.cat([e["embeddings"] for e in embeddings])
    torch.testing.assert_close(rows, full_neighbourhood(graph, net, layers=1)[ids])
    logits = [r["predictions"][1] for r in two_ranks]
    ids = torch.cat([p["node_ids"] for p in logits])
    assert sorted(ids.tolist()) == [0, 3, 149, 150, 290]
    rows = torch.cat([p["logits"] for p in logits])
    torch.testing.assert_close(rows, full_neighbourhood(graph, net)[ids])


@pytest.mark.dist
@pytest.mark.timeout(600)  # the first one runs the shared 2-rank launch
def test_sancus_evaluates_a_checkpoint_and_refuses_a_resume_in_plain_words(two_ranks):
    for results in two_ranks:
        assert results["sancus_test"] is None
        refusal = results["sancus_resume"]
        assert refusal is not None and "cannot resume" in refusal
        assert "weights_from" not in refusal and "load_from_checkpoint" in refusal


@pytest.mark.dist
@pytest.mark.timeout(600)  # the first one runs the shared 2-rank launch
def test_config_rules_are_checked_before_any_step(two_ranks):
    for results in two_ranks:
        assert "strategy.steps=5 must be <= the world size 2" in results["hopgnn_steps"]
        assert results["hopgnn_steps_taken"] == 0
        assert "preload_k=3 must be <= model.num_layers=2" in results["granndis_k"]


@pytest.mark.dist
@pytest.mark.timeout(600)  # the first one runs the shared 2-rank launch
def test_a_module_that_ignores_the_layer_hook_is_told_so(two_ranks):
    errors = [results["unused_hook"] or "" for results in two_ranks]
    assert any("never called runtime.layer_hook(batch)" in e for e in errors), errors
    assert not [e for e in errors if e.startswith("IndexError")], errors


def test_quickstart_lists_every_strategy_with_its_classes():
    """The quickstart names every strategy with its DataModule and config."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "quickstart.md").read_text()
    for name, spec in gs.SYSTEMS.items():
        assert f"`{spec.registered_as}`" in text, name
        assert spec.datamodule.__name__ in text and spec.config_type.__name__ in text
    assert "use_distributed_sampler" in text and "64-true" in text
