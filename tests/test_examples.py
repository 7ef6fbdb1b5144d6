"""The example scripts: plain Lightning (no Hydra, Lightning's own launcher, torchrun) gives
what ``train.py`` gives with the same settings, weight for weight.

The GSplit example starts as users start it, with Lightning's own launcher and with the real
``torchrun``; the others run on 2 ranks forked from the warm rank server, as torchrun starts
them (``tests/helpers/scripts.py``), which saves each rank its imports."""

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from lightning_gnnscale import ModelConfig, build_model, load_dataset
from lightning_gnnscale.run import train
from tests.helpers.config import REPO, make_cfg
from tests.helpers.scripts import run_script
from tests.test_plain_lightning import full_neighbourhood

NUM_NODES, EPOCHS = 2000, 2
TIMEOUT_S = 400


def example_args(script: str, out) -> list[str]:
    """The command line of ``examples/<script>``, writing into ``out``."""
    args = [f"examples/{script}", "--epochs", str(EPOCHS), "--num-nodes", str(NUM_NODES)]
    return [*args, "--out", str(out), "--cache-dir", str(out / "cache")]


def example_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OMP_NUM_THREADS", None)
    for var in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        env.pop(var, None)
    return env


def example_result(proc: subprocess.CompletedProcess, out) -> dict:
    """A finished example's metrics and final weights."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = json.loads((out / "metrics.json").read_text())
    return {"metrics": metrics, "weights": torch.load(out / "weights.pt", weights_only=True)}


def run_example(script: str, out) -> dict:
    """``examples/<script>`` on 2 ranks forked from the warm rank server, as torchrun starts
    them; its metrics and final weights."""
    script, *args = example_args(script, out)
    proc = run_script(script, *args, cwd=REPO, env=example_env(), nproc=2, timeout=TIMEOUT_S)
    return example_result(proc, out)


def start_example(script: str, out, launcher: list[str]) -> subprocess.Popen:
    """``examples/<script>`` started by ``launcher`` in a fresh interpreter and a session of
    its own (its ranks included), its output in ``out``."""
    out.mkdir(parents=True)
    with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
        return subprocess.Popen(
            [*launcher, *example_args(script, out)],
            cwd=REPO,
            env=example_env(),
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )


def finish_example(process: subprocess.Popen, out) -> dict:
    code = process.wait(timeout=TIMEOUT_S)
    proc = subprocess.CompletedProcess(process.args, code, "", (out / "stderr").read_text())
    return example_result(proc, out)


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
    """Lightning's own launcher (``python examples/...``, which re-executes the script for
    rank 1) and the real ``torchrun``, started together (each pays the imports of a fresh
    interpreter per process) while the reference trains here."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    launches = {}
    try:
        for out, launcher in (
            (tmp_path / "lightning", [sys.executable]),
            (tmp_path / "torchrun", torchrun),
        ):
            launches[out] = start_example("gsplit_gat_sbm.py", out, launcher)
        reference = run_train_py(tmp_path / "train", "gsplit", "gat")
        for out, process in launches.items():
            assert_same_run(finish_example(process, out), reference)
    finally:  # a failed launch leaves no rank behind
        for process in launches.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


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
    dataset = load_dataset("sbm", num_nodes=NUM_NODES)
    graph = dataset.graph
    assert saved["node_ids"].tolist() == list(range(graph.num_nodes))
    model = ModelConfig(name="sage", hidden=32)
    net = build_model(model, graph.num_features, dataset.num_classes)
    net.load_state_dict({k[len("net.") :]: v for k, v in example["weights"].items()})
    expected = full_neighbourhood(graph, net, layers=1)  # the last layer's input
    torch.testing.assert_close(saved["embeddings"], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.e2e
def test_link_prediction_example_matches_train_py(tmp_path):
    """A plain script's ``TaskConfig("link_prediction")`` and Glorot weights give the weights
    and link metrics of ``train.py strategy=ddp task=link_prediction``."""
    reference = run_train_py(tmp_path / "train", "ddp", "gcn", "task=link_prediction")
    example = run_example("link_prediction_ddp.py", tmp_path / "lightning")
    last = reference["summary"]["history"][-1]
    for name in ("auc", "mrr", "hits@10"):
        for split in ("val", "test"):
            got = example["metrics"][f"{split}/{name}"]
            assert got == pytest.approx(last[f"{split}_{name}"], abs=1e-6), (split, name)
    assert example["weights"].keys() == reference["weights"].keys()
    for name, value in reference["weights"].items():
        torch.testing.assert_close(example["weights"][name], value, rtol=0, atol=0, msg=name)
