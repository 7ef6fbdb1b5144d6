"""The conformance suite: the same seven checks for every registered name and each task it
trains (docs/testing.md). A name gets them by registering; its spec says which apply
(``exact``/``exact_settings``/``exact_full_batch``, ``supports_partition_dir``, ``supports_predict``,
``tasks``).

CI runs each system's default preset on node classification plus one other task; the full
matrix is ``pytest -m conformance_full tests/systems/test_conformance.py``."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException

import lightning_gnnscale as gs
from lightning_gnnscale.config_types import run_config
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.systems.registry import SYSTEMS
from lightning_gnnscale.tasks import task_spec
from tests.helpers.config import TINY, make_cfg
from tests.systems.conformance import (
    EPOCHS,
    PLAIN_SBM,
    PREDICT_OUTPUTS,
    Runs,
    assert_equal,
    cases,
    exact_batches,
    exact_settings,
    overrides,
    task_of,
    weights,
)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("conformance"))


def _model_settings(settings: list[str], tmp_path: Path) -> list[str]:
    """The composed run's model as ``model.<field>=<value>`` overrides (for ``single``)."""
    model = run_config(make_cfg(tmp_path, *settings)).model
    out = [f"model={model.name}"]
    for field in dataclasses.fields(model):
        value = getattr(model, field.name)
        if field.name != "name" and isinstance(value, int | float | str):
            out.append(f"model.{field.name}={value}")
    return out


def results(history: list[dict]) -> list[dict]:
    """Each epoch's losses and metrics (its timings and bytes left out)."""
    return [
        {k: v for k, v in row.items() if not k.endswith("_s") and k != "comm_bytes"}
        for row in history
    ]


def _no_spawn(monkeypatch) -> None:
    import lightning_gnnscale.run as run_module

    def no_spawn(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(run_module, "launch_local", no_spawn)


# ------------------------------------------------------------------ 1. exact against single
@pytest.mark.e2e
@pytest.mark.parametrize(
    ("name", "task"),
    cases(lambda spec: spec.name != "single" and (spec.exact or bool(spec.exact_settings))),
)
def test_an_exact_setting_equals_single_in_float64(runs, tmp_path, name, task):
    """The name (in its declared exact settings, no dropout) trains the weights and losses of
    ``single`` with the same model on the same batches (float64, to 1e-9): single's, or full
    batches for both where its steps seed otherwise (``exact_full_batch``)."""
    batches = exact_batches(name, task)
    settings = overrides(name, task, *exact_settings(name), "model.dropout=0.0", *batches)
    got, got_out = runs.train(*settings)
    single = overrides("single", task, *_model_settings(settings, tmp_path), *batches)
    want, want_out = runs.train(*single)
    assert got["world_size"] == SYSTEMS[name].default_devices
    ref, mine = weights(want_out), weights(got_out)
    for key in ref:
        torch.testing.assert_close(mine[key], ref[key], rtol=0, atol=1e-9, msg=key)
    losses = [[row["train_loss"] for row in m["history"]] for m in (want, got)]
    assert len(losses[1]) == EPOCHS
    assert losses[1] == pytest.approx(losses[0], rel=0, abs=1e-9)


# ----------------------------------------------------------------------- 2. the comm audit
@pytest.mark.e2e
@pytest.mark.parametrize(("name", "task"), cases())
def test_the_comm_audit_passes(runs, name, task):
    """``audit=true``: every ``torch.distributed`` call of each epoch was metered, with the
    bytes its category counted (the audit fails the run otherwise); a multi-rank run made
    some."""
    metrics, _ = runs.train(*overrides(name, task, "audit=true"))
    assert (metrics["audited_collectives"] > 0) == (metrics["world_size"] > 1)
    assert all(v >= 0 for v in metrics["comm_bytes_per_epoch"].values())


# ------------------------------------------------------- 3. a partition directory, bit for bit
@pytest.mark.e2e
@pytest.mark.parametrize(("name", "task"), cases(lambda spec: spec.supports_partition_dir))
def test_a_partition_directory_run_equals_the_in_memory_run(
    runs, tmp_path, monkeypatch, name, task
):
    """The run from ``python -m lightning_gnnscale.partition``'s directory, with the
    launcher's dataset loader replaced by a failure, ends with the in-memory run's weights
    and DataModule state bit for bit, and its losses and test metrics (the task's)."""
    import lightning_gnnscale.kit.datamodule as datamodule_module
    import lightning_gnnscale.run as run_module
    from lightning_gnnscale.partition import partition
    from lightning_gnnscale.run import train

    settings = overrides(name, task, "audit=true")
    mem, mem_out = runs.train(*settings)
    parts = tmp_path / "parts"
    partition([*TINY, f"paths.root={tmp_path}", *settings], parts, log=lambda *_: 0)

    def no_load(*args, **kwargs):
        raise AssertionError("the launcher loaded the dataset")

    monkeypatch.setattr(run_module, "load_dataset", no_load)
    monkeypatch.setattr(datamodule_module, "load_dataset", no_load)
    got, objects = train(make_cfg(tmp_path / "dir", *settings, f"data.partition_dir={parts}"))
    assert objects["graph"] is None
    assert_equal(weights(mem_out), weights(Path(objects["output_dir"])))
    assert results(got["history"]) == results(mem["history"])
    for metric in task_spec(task_of(task)).metrics:
        assert got[f"test_{metric}"] == mem[f"test_{metric}"], metric


# ------------------------------------------------------------------------------ 4. resume
@pytest.mark.e2e
@pytest.mark.parametrize(("name", "task"), cases())
def test_a_resumed_run_equals_the_uninterrupted_run(runs, tmp_path, name, task):
    """One epoch, then its ``last.ckpt`` resumed for the second: the weights and DataModule
    state equal the uninterrupted run's bit for bit, and so do the losses and metrics. A name
    whose default settings refuse to resume (SANCUS's staleness state) says so before any
    rank starts, and resumes in its exact settings."""
    from lightning_gnnscale.run import train

    settings = overrides(name, task, "audit=true")
    try:
        run_config(make_cfg(tmp_path / "check", *settings, f"ckpt_path={tmp_path / 'x.ckpt'}"))
    except ConfigError as err:  # refused where the launcher checks the run
        assert "cannot resume" in str(err)
        assert SYSTEMS[name].exact_settings, "it refuses to resume in every setting it declares"
        settings = overrides(name, task, "audit=true", *exact_settings(name))
    want, want_out = runs.train(*settings)
    first, first_out = runs.train(*settings, "trainer.max_epochs=1")
    last = first_out / "checkpoints" / "last.ckpt"
    got, objects = train(make_cfg(tmp_path / "resumed", *settings, f"ckpt_path={last}"))
    assert_equal(weights(want_out), weights(Path(objects["output_dir"])))
    assert results(got["history"]) == results(want["history"])


# ------------------ 5 and 6. plain Lightning (in memory and from a directory), and predict
@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory):
    """``name, task, directory=False -> the ranks' results`` of :func:`plain_lightning_ranks`
    (``{"memory": ...}``, and ``"directory"`` where asked: the parent writes the directory
    first), each made once: a run with the directory also serves a request without."""
    from lightning_gnnscale.launch import launch_local
    from tests.systems.conformance import plain_lightning_ranks, write_plain_partition_dir

    done: dict[tuple[str, str], list[dict]] = {}

    def ranks(name: str, task: str, directory: bool = False) -> list[dict]:
        if (name, task) not in done or (directory and "directory" not in done[name, task][0]):
            out = tmp_path_factory.mktemp(f"plain-{name}")
            devices = SYSTEMS[name].default_devices
            if directory:
                write_plain_partition_dir(name, task, out)
            launch_local(plain_lightning_ranks, (name, task, out), devices, 1, timeout_s=500)
            done[name, task] = [
                torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(devices)
            ]
        return done[name, task]

    return ranks


def _gathered(ranks: list[dict], output: str, num_nodes: int) -> torch.Tensor:
    """The ranks' ``output`` shares as one ``[num_nodes, d]`` table (each node exactly once)."""
    from tests.helpers.predictions import gather

    return gather([r["predictions"] for r in ranks], output, num_nodes)


# before the check of 5 below, so that its runs (one launch each) serve that check too
@pytest.mark.dist
@pytest.mark.parametrize(
    ("name", "task"), cases(lambda spec: spec.supports_partition_dir, ci_tasks=1)
)
def test_a_plain_lightning_trainer_trains_from_a_partition_directory(plain_runs, name, task):
    """The plain script again with the DataModule given only ``DataConfig(partition_dir=...)``
    (no dataset; written in float32 where the system casts on load): every rank ends with
    the in-memory run's float64 weights, DataModule state, steps and loss bit for bit. Its
    predictions are the in-memory ones: bit for bit where a rank predicts the same nodes, to
    1e-12 where a rank holding only its part predicts its own (another kernel)."""
    ranks = plain_runs(name, task, directory=True)
    for rank in ranks:
        memory, directory = rank["memory"], rank["directory"]
        assert all(v.dtype == torch.float64 for v in directory["after"].values())
        assert_equal(memory["after"], directory["after"])
        assert_equal(memory["dm"], directory["dm"])
        assert (memory["steps"], memory["loss"]) == (directory["steps"], directory["loss"])
        for output, share in memory.get("predictions", {}).items():
            if torch.equal(share["node_ids"], directory["predictions"][output]["node_ids"]):
                assert_equal(share, directory["predictions"][output])
    for output in PREDICT_OUTPUTS if SYSTEMS[name].supports_predict else ():
        got, want = (
            _gathered([r[key] for r in ranks], output, PLAIN_SBM["num_nodes"])
            for key in ("directory", "memory")
        )
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.dist
@pytest.mark.parametrize(("name", "task"), cases())
def test_a_plain_lightning_trainer_trains(plain_runs, name, task):
    """``L.Trainer(strategy=<name>)`` with the name's DataModule fits an epoch: every rank
    took the same steps, the loss is finite, the weights moved and are one model."""
    ranks = [r["memory"] for r in plain_runs(name, task)]
    assert len({r["steps"] for r in ranks}) == 1 and ranks[0]["steps"] > 0
    for r in ranks:
        assert torch.isfinite(torch.tensor(r["loss"]))
        assert any(not torch.equal(r["before"][k], v) for k, v in r["after"].items())
        assert_equal(r["after"], ranks[0]["after"])  # every rank holds the same weights


@pytest.mark.dist
@pytest.mark.parametrize(("name", "task"), cases(lambda spec: spec.supports_predict))
def test_predict_covers_every_node_once(plain_runs, name, task):
    """``trainer.predict`` of every node: the ranks' ids together are each node once, and
    the rows are the trained net's full-neighbourhood logits and embeddings (the last layer's
    input), float64."""
    from tests.test_plain_lightning import full_neighbourhood

    ranks = [r["memory"] for r in plain_runs(name, task)]
    from lightning_gnnscale.tasks import build_task

    head = build_task(task)
    dataset = gs.load_dataset("sbm", **PLAIN_SBM).to(torch.float64)
    graph = dataset.graph
    config = gs.system(name)[2].model_config(hidden=8)
    net = gs.build_model(config, graph.num_features, head.prepare(dataset, 0).out_dim).double()
    net.load_state_dict({k.removeprefix("net."): v for k, v in ranks[0]["after"].items()})
    for output, layers in zip(PREDICT_OUTPUTS, (net.num_layers, net.num_layers - 1)):
        rows = _gathered(ranks, output, graph.num_nodes)  # asserts each node exactly once
        want = full_neighbourhood(graph, net, layers=layers)
        torch.testing.assert_close(rows, want, rtol=1e-10, atol=1e-12, msg=output)


# ----------------------------------------------------------------- 7. bad values, early
@pytest.mark.parametrize(("name", "task"), cases(ci_tasks=1))  # task checks nothing
def test_a_bad_value_fails_before_spawn(tmp_path, monkeypatch, name, task):
    """An unknown key and a value of the wrong type under ``strategy.`` fail while Hydra
    composes, naming the key; a setting forced in (``+strategy.<key>``) is refused by
    ``train`` before any rank starts, naming it."""
    from lightning_gnnscale.run import train

    settings = overrides(name, task)
    with pytest.raises(ConfigCompositionException, match=re.escape("strategy.no_such_key")):
        make_cfg(tmp_path, *settings, "strategy.no_such_key=1")
    hints = typing.get_type_hints(SYSTEMS[name].config_type)
    for field in dataclasses.fields(SYSTEMS[name].config_type):  # single has none
        if hints[field.name] in (int, float, bool):
            bad = "maybe" if hints[field.name] is bool else "abc"
            with pytest.raises(
                ConfigCompositionException, match=re.escape(f"strategy.{field.name}")
            ):
                make_cfg(tmp_path, *settings, f"strategy.{field.name}={bad}")
    _no_spawn(monkeypatch)
    with pytest.raises(ConfigError, match=r"strategy\.no_such_key.* is not a known setting"):
        train(make_cfg(tmp_path, *settings, "+strategy.no_such_key=1"))
