"""SANCUS / CAGNET end to end through ``train(cfg)``: a clean audit, the cache formula, the
exact baseline against `single`, and config errors raised before any process starts."""

import pytest


@pytest.mark.e2e
def test_sancus_trains_end_to_end_with_a_clean_audit(tmp_path):
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg

    metrics, _ = train(
        make_cfg(
            tmp_path,
            "strategy=sancus",
            "strategy.policy=epoch_fixed",
            "trainer.max_epochs=4",
            "audit=true",
        )
    )
    assert metrics["strategy"] == "sancus" and metrics["audited_collectives"] > 0
    per_epoch = metrics["comm_bytes_per_epoch"]
    assert per_epoch["activation"] > 0 and per_epoch["activation_grad"] > 0
    assert per_epoch["gradient"] > 0 and per_epoch["structure"] == 0
    history = metrics["history"]
    assert history[0]["comm_bytes"]["feature"] > 0  # X is broadcast at epoch 0 only
    assert all(row["comm_bytes"]["feature"] == 0 for row in history[1:])
    system = metrics["system"]
    assert system["forward_active_share_by_layer"] == [0.25, 0.5]  # ε_E = 1: every other epoch
    assert system["hidden_skip_ratio"] == 0.5
    assert system["cache_bytes_by_rank"] == system["cache_bytes_formula_by_rank"]


@pytest.mark.e2e
def test_cagnet_equals_single_full_graph_training(tmp_path):
    """Bound 0 through the whole stack (Lightning, GNNModule, Adam) in float64."""
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg

    common = ("dtype=float64", "model.dropout=0.0", "trainer.max_epochs=3", "data.batch_size=-1")
    single, _ = train(
        make_cfg(tmp_path / "single", "strategy=single", "data.fanouts=[-1,-1]", *common)
    )
    cagnet, _ = train(make_cfg(tmp_path / "cagnet", "strategy=cagnet", *common))
    for ref, got in zip(single["history"], cagnet["history"], strict=True):
        assert got["train_loss"] == pytest.approx(ref["train_loss"], abs=1e-10)
        assert got["val_acc"] == ref["val_acc"]
    assert cagnet["system"]["hidden_skip_ratio"] == 0.0
    assert cagnet["test_acc"] == single["test_acc"]


def test_default_policy_matches_the_code_and_skips_in_a_short_run(tmp_path):
    """`strategy=sancus` without a policy override builds the code's default policy, and in the
    embedded default run's length (20 epochs, 2 ranks) that policy already leaves at least 35 %
    of the hidden blocks unsent: the paper's lower bound, from the first epochs on. Checked on
    the emulator over a small SBM with the default run's widths (no processes)."""
    import torch

    from lightning_gnnscale.config_types import run_config
    from lightning_gnnscale.graph.generators import sbm
    from lightning_gnnscale.models.gnn import BlockGNN
    from lightning_gnnscale.systems.sancus.emulator import emulate
    from lightning_gnnscale.systems.sancus.policy import StalenessPolicy
    from lightning_gnnscale.tasks import build_task
    from tests.helpers.config import make_cfg

    cfg = make_cfg(tmp_path, "strategy=sancus", tiny=False)
    policy = StalenessPolicy.of(run_config(cfg).strategy)
    assert policy == StalenessPolicy()
    d, m, ranks = cfg.dataset, cfg.model, int(cfg.trainer.devices)
    dataset = sbm(num_nodes=400, num_classes=d.num_classes, num_features=d.num_features, seed=0)
    graph, targets, task = dataset.graph, dataset.targets, build_task("node_classification")
    torch.manual_seed(0)
    net = BlockGNN("gcn", d.num_features, m.hidden, d.num_classes, m.num_layers, dropout=0.0)
    params = [(layer.lin.weight, layer.bias) for layer in net.layers]
    offsets = torch.linspace(0, graph.num_nodes, ranks + 1).long()
    epochs = int(cfg.trainer.max_epochs)
    trace = emulate(
        graph, targets, task, offsets, params, policy, epochs, lr=m.lr, weight_decay=m.weight_decay
    )
    hidden = torch.stack([f for (_, layer), f in trace.forward_flags.items() if layer > 0])
    assert 1 - hidden.double().mean() >= 0.35


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model=sage", "GCN only"),
        ("model=custom", "cannot run model=custom"),
        ("model.dropout=0.5", "without dropout"),
        ("strategy.policy=lru", "valid:"),
        ("strategy.rows=spectral", "valid:"),
        ("strategy.input_policy=never", "valid:"),
        ("strategy.epoch_bound=-1", ">= 0"),
        ("data.num_workers=1", "data.num_workers=0"),
    ],
)
def test_sancus_config_errors(tmp_path, override, message):
    from lightning_gnnscale.errors import ConfigError
    from lightning_gnnscale.preflight import validate
    from tests.helpers.config import make_cfg

    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(tmp_path, "strategy=sancus", override))


@pytest.mark.parametrize(("strategy", "refused"), [("sancus", True), ("cagnet", False)])
def test_resume_is_refused_while_staleness_state_is_not_checkpointed(tmp_path, strategy, refused):
    """Each rank's last broadcasts and cached blocks are not in the checkpoint: a stateful
    policy would diverge after a resume, so it is refused; bound 0 (CAGNET) holds no state."""
    import torch
    from omegaconf import OmegaConf

    from lightning_gnnscale.checkpoints import CHECKPOINT_KEY
    from lightning_gnnscale.config_types import run_identity
    from lightning_gnnscale.errors import ConfigError
    from lightning_gnnscale.preflight import validate
    from tests.helpers.config import make_cfg

    ckpt = tmp_path / "run.ckpt"
    cfg = make_cfg(tmp_path, f"strategy={strategy}", "trainer.max_epochs=4", f"ckpt_path={ckpt}")
    block = {"identity": run_identity(OmegaConf.to_container(cfg, resolve=True)), "epochs_done": 2}
    torch.save({"state_dict": {}, CHECKPOINT_KEY: block}, ckpt)
    if refused:
        with pytest.raises(ConfigError, match="cannot resume from ckpt_path"):
            validate(cfg)
    else:
        validate(cfg)


@pytest.mark.parametrize("strategy", ["sancus", "cagnet"])
def test_sancus_settings_are_checked_at_compose_and_validate(tmp_path, strategy):
    """An unknown key and a value of the wrong type under ``strategy.`` fail while Hydra
    composes; a bad value fails in ``validate``; every message names the key."""
    import re

    from hydra.errors import ConfigCompositionException

    from lightning_gnnscale.errors import ConfigError
    from lightning_gnnscale.preflight import validate
    from tests.helpers.config import make_cfg

    with pytest.raises(ConfigCompositionException, match=re.escape("strategy.epoch_bund")):
        make_cfg(tmp_path, f"strategy={strategy}", "strategy.epoch_bund=1")
    with pytest.raises(ConfigCompositionException, match=re.escape("strategy.epoch_bound")):
        make_cfg(tmp_path, f"strategy={strategy}", "strategy.epoch_bound=abc")
    with pytest.raises(ConfigCompositionException, match=re.escape("strategy.variation_gap")):
        make_cfg(tmp_path, f"strategy={strategy}", "strategy.variation_gap=wide")
    with pytest.raises(ConfigError, match=re.escape("strategy.variation_gap=-0.5 must be >= 0")):
        validate(make_cfg(tmp_path, f"strategy={strategy}", "strategy.variation_gap=-0.5"))


def test_cagnet_rejects_a_staleness_policy(tmp_path):
    from lightning_gnnscale.errors import ConfigError
    from lightning_gnnscale.preflight import validate
    from tests.helpers.config import make_cfg

    with pytest.raises(ConfigError, match="cagnet is defined by policy=.none."):
        validate(make_cfg(tmp_path, "strategy=cagnet", "strategy.policy=epoch_fixed"))


def test_bench_sancus_rejects_a_bad_override_before_training(tmp_path, capsys):
    from lightning_gnnscale.bench.cli import main

    with pytest.raises(SystemExit):
        main(["sancus", "--out", str(tmp_path), "--override", "strategy.rows=spectral"])
    assert "strategy.rows='spectral' is unknown" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_bench_sancus_table_splits_x_hidden_and_delta_savings():
    from lightning_gnnscale.bench.sancus import BASELINE, sancus_markdown

    def summary(feature, activation, grad, test_acc):
        return {
            "dataset": "sbm",
            "epochs": 3,
            "world_size": 2,
            "comm_bytes_per_epoch": {
                "feature": feature,
                "activation": activation,
                "activation_grad": grad,
                "gradient": 5e6,
            },
            "best_val_acc": 0.5,
            "test_acc": test_acc,
            "system": {
                "hidden_skip_ratio": 0.0,
                "cache_bytes_by_rank": [2e6],
                "cache_bytes_formula_by_rank": [2e6],
            },
        }

    text = sancus_markdown(
        {
            "cagnet, X every epoch": summary(6e6, 2e6, 2e6, 0.8),
            BASELINE: summary(0.0, 2e6, 2e6, 0.8),
            "SCS-E1": summary(0.0, 1e6, 2e6, 0.79),
        },
        "cmd",
        {
            "date": "d",
            "hostname": "h",
            "platform": "p",
            "cpu_count": 2,
            "python": "3",
            "torch": "t",
        },
    )
    row = next(line for line in text.splitlines() if line.startswith("| SCS-E1"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # hidden saved 50%, broadcast saved 25% vs bound 0 and 70% vs X every epoch; with the
    # 5 MB of weight gradients: 9 -> 8 MB, 11.1% saved; accuracy -0.01
    assert cells[5:8] == ["50.0%", "25.0%", "70.0%"]
    assert cells[8:12] == ["8", "11.1%", "0.79", "-0.0100"]
