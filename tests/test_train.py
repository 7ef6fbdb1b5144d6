"""End to end through ``run.train`` and ``train.py``: real Lightning Trainer, real processes."""

import json
import os
import re

import pytest
import torch
from hydra.errors import ConfigCompositionException

from lightning_gnnscale.preflight import ConfigError, validate
from lightning_gnnscale.run import load_node_dataset, train
from lightning_gnnscale.systems.registry import SYSTEMS
from tests.helpers.config import REPO, make_cfg
from tests.helpers.scripts import run_script, start_script

SUMMARY_KEYS = {
    "strategy",
    "model",
    "dataset",
    "world_size",
    "epochs",
    "val_acc",
    "test_acc",
    "best_val_acc",
    "epoch_time_s",
    "train_time_s",
    "comm_bytes_per_epoch",
    "inter_server_bytes_per_epoch",
    "modeled_comm_time_s",
    "peak_rss_mb",
    "cpu_allocator",
    "config_hash",
}


def final_weights(output_dir):
    ckpt = torch.load(os.path.join(output_dir, "checkpoints", "last.ckpt"), weights_only=False)
    return ckpt["state_dict"]


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("strategy.name=nope", f"one of {sorted(SYSTEMS)}"),
        ("model.name=mlp", "valid: ['gcn', 'sage', 'gat', 'rgcn', 'rgat', 'custom']"),
        ("dataset.name=reddit", "valid:"),
        ("+dataset.colour=red", "dataset.colour is not a known setting; valid keys under dataset"),
        ("data.fanouts=[5]", "one fanout per layer"),
        ("data.fanouts=[5,0]", "must be > 0 or -1"),
        ("data.batch_size=0", "data.batch_size=0"),
        ("trainer.devices=0", "trainer.devices=0"),
        ("network=5g", "valid:"),
        ("dtype=float16", "valid: ['float32', 'float64']"),
        ("+logger._target_=lightning.pytorch.loggers.NoSuchLogger", "cannot be imported"),
        ("+logger.colour=red", "logger needs a _target_"),
        ("+callbacks.stop._target_=lightning.pytorch.callbacks.EarlyStoping", "cannot be imported"),
        ("+callbacks.stop.monitor=val/acc", "callbacks.stop needs a _target_"),
        ("topology.servers=3", "must divide the world size 2"),
        ("ckpt_path=/nonexistent.ckpt", "does not exist"),
        ("model.heads=5", "divisible by model.heads"),
        # quiet acceptances that used to fail only inside the ranks, or not at all
        ("trainer.limit_train_batches=0", "trainer.limit_train_batches=0"),
        ("trainer.limit_train_batches=2.5", "trainer.limit_train_batches=2.5"),
        # keys forced in with + get past Hydra's schema check, not past validation
        ("+foo=1", "foo is not a known setting"),
        ("+trainer.max_epoch=3", "trainer.max_epoch is not a known setting"),
        ("+strategy.salt_by_rnak=false", "strategy.salt_by_rnak is not a known setting"),
        ("launcher.timeout_s=-1", "launcher.timeout_s=-1.0 must be > 0"),
        ("launcher.collective_timeout_s=0", "launcher.collective_timeout_s=0.0 must be > 0"),
        (
            "model.optimizer=foo",
            "model.optimizer='foo' is unknown; valid: ['adam', 'adamw', 'sgd']",
        ),
        ("model.weight_decay=-0.1", "model.weight_decay=-0.1 must be >= 0"),
        ("trainer.check_val_every_n_epoch=0", "trainer.check_val_every_n_epoch=0 must be >= 1"),
    ],
)
def test_bad_values_are_rejected(tmp_path, override, message):
    cfg = make_cfg(tmp_path, "model=gat" if "heads" in override else "model=gcn", override)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate(cfg)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.max_epochs=1.5", "trainer.max_epochs"),
        ("model.hidden=1.5", "model.hidden"),
        ("seed=abc", "seed"),
        ("data.batch_size=2.5", "data.batch_size"),
        ("data.fanouts=[5,x]", "data.fanouts"),
        ("topology.servers=2.0", "topology.servers"),
        ("trainer.enable_progress_bar=maybe", "trainer.enable_progress_bar"),
        ("model.lr=abc", "model.lr"),
        ("trainer.typo=1", "trainer.typo"),
        ("strategy.salt_by_rnak=false", "strategy.salt_by_rnak"),
        # each dataset's schema (DatasetConfig subclass): its own keys, typed
        ("dataset.num_nodes=300.5", "dataset.num_nodes"),
        ("dataset.num_nodess=5", "dataset.num_nodess"),
        ("dataset=cora dataset.num_nodes=5", "dataset.num_nodes"),
        ("dataset=cora dataset.download=maybe", "dataset.download"),
    ],
)
def test_wrong_types_and_unknown_keys_fail_at_compose(tmp_path, override, key):
    with pytest.raises(ConfigCompositionException, match=re.escape(key)):
        make_cfg(tmp_path, *override.split(), tiny="cora" not in override)


def test_gpu_without_a_gpu_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="trainer.accelerator=gpu but .* sees no CUDA GPU"):
        validate(make_cfg(tmp_path, "trainer.accelerator=gpu"))


def test_single_rejects_several_devices(tmp_path):
    with pytest.raises(ConfigError, match="strategy=single runs one process"):
        validate(make_cfg(tmp_path, "strategy=single", "trainer.devices=2"))


def test_cli_errors_before_spawning(tmp_path):
    """Bad values fail in the main process, before any rank or output exists."""
    out = tmp_path / "run"
    proc = run_script("train.py", "data.fanouts=[5]", f"hydra.run.dir={out}", cwd=REPO, timeout=120)
    assert proc.returncode != 0
    assert "one fanout per layer" in proc.stderr
    assert not (out / "summary.json").exists()
    proc = run_script("train.py", "strategy=nope", f"hydra.run.dir={out}", cwd=REPO, timeout=120)
    assert proc.returncode != 0 and "ddp" in proc.stderr and "single" in proc.stderr


# ------------------------------------------------------------------------------- runs
@pytest.mark.e2e
def test_default_ddp_run_summary_and_gradient_bytes(tmp_path):
    cfg = make_cfg(tmp_path, "audit=true")
    metrics, objects = train(cfg)
    assert set(metrics) >= SUMMARY_KEYS
    on_disk = json.loads((objects["output_dir"] / "summary.json").read_text())
    assert on_disk["config_hash"] == metrics["config_hash"]
    assert metrics["strategy"] == "ddp" and metrics["world_size"] == 2
    assert metrics["audited_collectives"] > 0  # the audit saw calls and found all metered
    # Hand count: 2 ranks, ring all-reduce of every float32 parameter once per step: each rank
    # sends 2 (P-1) / P * param_bytes = param_bytes, so both ranks together send 2 * param_bytes.
    targets = load_node_dataset(validate(cfg)).targets  # the run's labels and splits
    hidden, classes, feats = 64, targets.out_dim, objects["graph"].num_features
    param_bytes = 4 * (feats * hidden + hidden + hidden * classes + classes)  # GCN: W and b
    steps = -(-int(targets.train.sum()) // 64)
    assert metrics["comm_bytes_per_epoch"]["gradient"] == steps * 2 * param_bytes
    # Lightning's per-step SIGTERM flag broadcast (one int64 per step) is reported, not metered
    framework = metrics["unmetered_framework_calls"]
    assert framework["calls"] == steps * metrics["epochs"]
    assert framework["bytes"] == 8 * framework["calls"]


@pytest.mark.e2e
def test_ddp_training_equals_single_float64(tmp_path):
    """Through the real Trainer: same weights after 2 epochs of Adam (unsalted keys)."""
    common = ("dtype=float64", "model.dropout=0.0", "strategy.salt_by_rank=false")
    single_cfg = make_cfg(tmp_path / "single", "strategy=single", *common[:2])
    ddp_cfg = make_cfg(tmp_path / "ddp", "strategy=ddp", *common)
    _, single = train(single_cfg)
    _, ddp = train(ddp_cfg)
    ref, got = final_weights(single["output_dir"]), final_weights(ddp["output_dir"])
    assert ref.keys() == got.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-10)


def test_resume_continues_to_the_same_result(tmp_path):
    """4 epochs straight == 2 epochs, then resume from last.ckpt to 4 (dropout on).

    float64: BLAS results depend on buffer alignment, so two identical float32 runs in different
    processes already differ in the last bits; a broken resume (optimiser state, epoch, dropout
    stream) is off by far more than the tolerance.
    """
    run = ("strategy=single", "dtype=float64")
    _, straight = train(make_cfg(tmp_path / "a", *run, "trainer.max_epochs=4"))
    _, first = train(make_cfg(tmp_path / "b", *run, "trainer.max_epochs=2"))
    ckpt = first["output_dir"] / "checkpoints" / "last.ckpt"
    old = torch.load(ckpt, weights_only=True)
    assert old.pop("SingleDataModule") == {"train_epoch": 2}  # its only state
    torch.save(old, tmp_path / "old.ckpt")
    metrics, resumed = train(
        make_cfg(tmp_path / "b", *run, "trainer.max_epochs=4", f"ckpt_path={ckpt}")
    )
    # the summary covers the whole run, not only the resumed part
    assert metrics["epochs"] == 4 and [r["epoch"] for r in metrics["history"]] == [0, 1, 2, 3]
    ref, got = final_weights(straight["output_dir"]), final_weights(resumed["output_dir"])
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-10)

    # a checkpoint written before the DataModule kept its loader's epoch (issue 36) resumes
    # alike, at the epochs its suite record says were done
    _, from_old = train(
        make_cfg(tmp_path / "c", *run, "trainer.max_epochs=4", f"ckpt_path={tmp_path / 'old.ckpt'}")
    )
    got = final_weights(from_old["output_dir"])
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-10)


def test_logger_kwargs_are_checked_against_the_class(tmp_path):
    with pytest.raises(ConfigError, match=r"CSVLogger takes no argument \['colour'\]"):
        validate(make_cfg(tmp_path, "logger=csv", "+logger.colour=red"))


def test_callbacks_from_the_command_line(tmp_path):
    """`callbacks=early_stopping` (and any `+callbacks.<name>._target_=...`) joins the run: with
    a learning rate too small to move validation accuracy, training stops after patience + 1."""
    metrics, objects = train(
        make_cfg(
            tmp_path,
            "strategy=single",
            "model.lr=1e-12",
            "trainer.max_epochs=10",
            "callbacks=early_stopping",
            "callbacks.early_stopping.patience=2",
            "logger=csv",
            "+callbacks.lr._target_=lightning.pytorch.callbacks.LearningRateMonitor",
        )
    )
    assert metrics["epochs"] == 3
    logged = (objects["output_dir"] / "metrics.csv").read_text().splitlines()[0].split(",")
    assert any(column.startswith("lr-") for column in logged)  # the monitor ran


def test_custom_pyg_model_runs_under_single(tmp_path):
    metrics, _ = train(make_cfg(tmp_path, "strategy=single", "model=custom"))
    assert metrics["model"] == "custom" and metrics["best_val_acc"] > 0.3


@pytest.mark.e2e
def test_multirun_runs_each_job_once(tmp_path):
    """`-m` over a multi-process strategy: four jobs, each with its own summary, none re-run."""
    sweep = tmp_path / "sweep"
    proc = run_script(
        "train.py",
        "-m",
        "strategy=single,ddp",
        "model=gcn,sage",
        "dataset.num_nodes=300",
        "data.batch_size=64",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "logger=none",
        f"hydra.sweep.dir={sweep}",
        "launcher.timeout_s=240",
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]
    assert sorted((s["strategy"], s["model"]) for s in summaries) == [
        ("ddp", "gcn"),
        ("ddp", "sage"),
        ("single", "gcn"),
        ("single", "sage"),
    ]
    assert {s["world_size"] for s in summaries if s["strategy"] == "ddp"} == {2}
    assert proc.stdout.count("summary:") == 4  # the parent ran four jobs, no child re-ran one


@pytest.mark.e2e
def test_two_node_launch_on_loopback(tmp_path):
    """Two `train.py` processes as two nodes (NODE_RANK 0/1) of one run on 127.0.0.1."""
    from tests.helpers.dist import free_port

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    args = [
        "trainer.num_nodes=2",
        "trainer.devices=1",
        "dataset.num_nodes=300",
        "data.batch_size=64",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "logger=none",
        f"hydra.run.dir={tmp_path}",
    ]
    nodes = [
        start_script("train.py", *args, cwd=REPO, env={**env, "NODE_RANK": str(r)}) for r in (0, 1)
    ]
    outputs = [n.wait(timeout=300) for n in nodes]
    assert all(o.returncode == 0 for o in outputs), outputs[1].stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 2
    # one server per node: the gradient all-reduce crosses servers
    assert summary["inter_server_bytes_per_epoch"] > 0


def test_wandb_logger_offline(tmp_path):
    """`logger=wandb` works without a network: an offline run lands in the run's folder."""
    metrics, objects = train(
        make_cfg(
            tmp_path,
            "strategy=single",
            "logger=wandb",
            "logger.mode=offline",
            "trainer.max_epochs=1",
        )
    )
    runs = list((objects["output_dir"] / "wandb").glob("offline-run-*"))
    assert metrics["epochs"] == 1 and len(runs) == 1
    assert any(runs[0].glob("*.wandb"))  # the logged history, ready for `wandb sync`


def test_dataloader_workers_sample_the_same_batches(tmp_path):
    """Sampling in a DataLoader worker changes nothing: same weights as in-process sampling."""
    run = ("strategy=single", "dtype=float64")
    _, inline = train(make_cfg(tmp_path / "a", *run, "data.num_workers=0"))
    _, workers = train(make_cfg(tmp_path / "b", *run, "data.num_workers=1"))
    ref, got = final_weights(inline["output_dir"]), final_weights(workers["output_dir"])
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-10)


def test_multi_node_without_rendezvous_fails_before_launch(tmp_path, monkeypatch):
    for var in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="set MASTER_ADDR, MASTER_PORT, NODE_RANK"):
        validate(make_cfg(tmp_path, "trainer.num_nodes=2", "trainer.devices=1"))


def test_single_task_slurm_job_cannot_spawn_ranks(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "1")
    with pytest.raises(ConfigError, match="srun --ntasks-per-node=2"):
        validate(make_cfg(tmp_path))


def test_comm_wait_time_is_measured(tmp_path):
    """`time/comm_s`: blocking collectives take time in a 2-process run, none in one process."""
    ddp, _ = train(make_cfg(tmp_path / "ddp", "trainer.max_epochs=1"))
    single, _ = train(make_cfg(tmp_path / "single", "strategy=single", "trainer.max_epochs=1"))
    assert ddp["time_breakdown_s"]["comm_s"] > 0
    assert single["time_breakdown_s"]["comm_s"] == 0
