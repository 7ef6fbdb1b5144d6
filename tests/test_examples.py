"""The example scripts: plain Lightning (no Hydra, Lightning's own launcher, torchrun) gives
what ``train.py`` gives with the same settings, weight for weight."""

import json
import os
import subprocess
import sys

import pytest
import torch

from lightning_gnnscale import ModelConfig, build_model, load_dataset
from lightning_gnnscale.run import train
from tests.helpers.config import REPO, make_cfg
from tests.test_plain_lightning import full_neighbourhood

NUM_NODES, EPOCHS = 2000, 2


def run_example(script: str, out, launcher: list[str] | None = None) -> dict:
    """Run ``examples/<script>`` on 2 CPU processes; its metrics and final weights."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OMP_NUM_THREADS", None)
    for var in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        env.pop(var, None)
    args = [f"examples/{script}", "--epochs", str(EPOCHS), "--num-nodes", str(NUM_NODES)]
    command = [*(launcher or [sys.executable]), *args, "--out", str(out)]
    command += ["--cache-dir", str(out / "cache")]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = json.loads((out / "metrics.json").read_text())
    return {"metrics": metrics, "weights": torch.load(out / "weights.pt", weights_only=True)}


def run_train_py(tmp_path, strategy: str, model: str, *overrides: str) -> dict:
    cfg = make_cfg(
        tmp_path,
        f"strategy={strategy}",
        f"model={model}",
        f"dataset.num_nodes={NUM_NODES}",
        f"trainer.max_epochs={EPOCHS}",
        "trainer.enable_progress_bar=false",
        "logger=none",
        *overrides,
        tiny=False,
    )
    metrics, objects = train(cfg)
    ckpt = torch.load(
        objects["output_dir"] / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu"
    )
    return {"summary": metrics, "weights": ckpt["state_dict"]}


def assert_same_run(example: dict, reference: dict) -> None:
    last = reference["summary"]["history"][-1]
    assert example["metrics"]["val/acc"] == pytest.approx(last["val_acc"], abs=1e-6)
    assert example["metrics"]["test/acc"] == pytest.approx(last["test_acc"], abs=1e-6)
    assert example["weights"].keys() == reference["weights"].keys()
    for name, value in reference["weights"].items():
        torch.testing.assert_close(example["weights"][name], value, rtol=0, atol=0, msg=name)


@pytest.mark.e2e
def test_gsplit_gat_example_matches_train_py(tmp_path):
    reference = run_train_py(tmp_path / "train", "gsplit", "gat")
    assert_same_run(run_example("gsplit_gat_sbm.py", tmp_path / "lightning"), reference)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    assert_same_run(
        run_example("gsplit_gat_sbm.py", tmp_path / "torchrun", launcher=torchrun), reference
    )


@pytest.mark.e2e
def test_own_module_under_distdgl_matches_train_py(tmp_path):
    reference = run_train_py(tmp_path / "train", "distdgl", "sage")
    example = run_example("distdgl_own_module.py", tmp_path / "lightning")
    # the user's module holds its BlockGNN as `net`, like GNNModule: the same parameter names
    assert_same_run(example, reference)


@pytest.mark.e2e
def test_float64_precision_example_matches_train_py_in_float64(tmp_path):
    """``L.Trainer(precision="64-true")``, without ``use_distributed_sampler=False``, gives the
    weights of ``train.py ... dtype=float64``."""
    reference = run_train_py(tmp_path / "train", "ddp", "gcn", "dtype=float64")
    example = run_example("ddp_float64.py", tmp_path / "lightning")
    assert all(v.dtype == torch.float64 for v in example["weights"].values())
    assert_same_run(example, reference)


@pytest.mark.e2e
def test_predict_example_saves_every_nodes_embedding(tmp_path):
    example = run_example("predict_embeddings.py", tmp_path / "predict")
    saved = torch.load(tmp_path / "predict" / "embeddings.pt", weights_only=True)
    graph = load_dataset("sbm", num_nodes=NUM_NODES)
    assert saved["node_ids"].tolist() == list(range(graph.num_nodes))
    net = build_model(ModelConfig(name="sage", hidden=32), graph.num_features, graph.num_classes)
    net.load_state_dict({k[len("net.") :]: v for k, v in example["weights"].items()})
    expected = full_neighbourhood(graph, net, layers=1)  # the last layer's input
    torch.testing.assert_close(saved["embeddings"], expected, rtol=1e-5, atol=1e-5)
