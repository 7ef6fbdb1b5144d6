"""The conformance suite's cases and runs (docs/testing.md, "The conformance suite").

Every registered name and each task its spec lists is one case. CI runs each system's default
preset (the name of its folder, ``spec.name == spec.system``) on its first two tasks (node
classification plus one other; the bad-value check on the first only); every other case is
marked ``conformance_full``.

A case's runs go through ``run.train`` on the tiny sbm job of ``tests/helpers/config.py`` in
float64 (2 epochs, ``spec.default_devices`` ranks, ``spec.run_settings``), and are made once
per test session (:class:`Runs`) so that the checks share them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_gnnscale.systems.registry import SYSTEMS, SystemSpec
from tests.helpers.config import make_cfg

CI_TASKS = 2  # node classification plus one other task
# How a run asks for a task (tasks register their own names; this table says how the suite
# spells each on the command line).
TASK_OVERRIDES: dict[str, tuple[str, ...]] = {
    "node_classification": (),
    "node_regression": ("task=node_regression",),
    "link_prediction": ("task=link_prediction",),
}
# A typed graph (docs/architecture.md, "Typed graphs") through every system that trains one:
# node classification with RGCN on the tiny typed_sbm graph, a "task" of the suite's cases.
TYPED = "typed_node_classification"
TASK_OVERRIDES[TYPED] = ("dataset=typed_sbm", "dataset.num_relations=3", "model=rgcn")
# Link prediction on the same typed graph (the default decoder), through every system
# that declares typed link prediction.
TYPED_LINK = "typed_link_prediction"
TASK_OVERRIDES[TYPED_LINK] = (*TASK_OVERRIDES[TYPED], "task=link_prediction")
# A typed graph with a featureless node type, whose input rows are learned (a sharded table
# and its sparse optimiser's state, checkpointed per rank), through every system that learns
# input rows.
TYPED_FEATURELESS = "typed_featureless"
TASK_OVERRIDES[TYPED_FEATURELESS] = (*TASK_OVERRIDES[TYPED], "dataset.featureless_node_types=1")
TYPED_CASES = {
    TYPED: "node_classification",
    TYPED_LINK: "link_prediction",
    TYPED_FEATURELESS: "node_classification",
}
EPOCHS = 2


def task_of(case_task: str) -> str:
    """The task a case trains (its typed-graph cases train node classification and link
    prediction)."""
    return TYPED_CASES.get(case_task, case_task)


def in_ci(spec: SystemSpec, task: str, ci_tasks: int = CI_TASKS) -> bool:
    if task in TYPED_CASES:  # CI runs each system's default preset on a typed graph
        return spec.name == spec.system
    return spec.name == spec.system and spec.tasks.index(task) < ci_tasks


def cases(
    applies=lambda spec: True, ci_tasks: int = CI_TASKS, typed: bool = False, tasks: bool = True
) -> list:
    """``pytest.param(name, task)`` for every registered name and task ``applies`` keeps
    (``tasks``), and (``typed``) the :data:`TYPED` case of every name that trains typed
    graphs, the :data:`TYPED_LINK` case of every name that predicts their links and the
    :data:`TYPED_FEATURELESS` case of every name that learns input rows; the ones CI leaves out are marked ``conformance_full``. CI runs a preset's first
    ``ci_tasks`` tasks: ``1`` for a check whose outcome the task cannot change (the strategy's
    settings). The typed cases live in their own test file (``test_conformance_typed.py``),
    so that pytest-xdist's ``loadfile`` runs them beside the rest, not after it."""
    return [
        pytest.param(
            name,
            task,
            id=f"{name}-{task}",
            marks=() if in_ci(spec, task, ci_tasks) else (pytest.mark.conformance_full,),
        )
        for name, spec in SYSTEMS.items()
        for task in (
            *(spec.tasks if tasks else ()),
            *((TYPED,) if typed and spec.config_type.TYPED_GRAPHS else ()),
            *((TYPED_LINK,) if typed and spec.config_type.TYPED_LINK_PREDICTION else ()),
            *((TYPED_FEATURELESS,) if typed and spec.config_type.LEARNED_INPUTS else ()),
        )
        if applies(spec)
    ]


def overrides(name: str, task: str, *extra: str) -> list[str]:
    """The case's ``train.py`` settings: float64, ``EPOCHS`` epochs, the name's devices and
    run settings, then ``extra``."""
    spec = SYSTEMS[name]
    if task not in TASK_OVERRIDES:
        raise KeyError(
            f"the conformance suite does not know task {task!r}: add it to TASK_OVERRIDES"
        )
    settings = [f"{key}={value}" for key, value in spec.run_settings]
    return [
        f"strategy={name}",
        "dtype=float64",
        f"trainer.devices={spec.default_devices}",
        *settings,
        f"trainer.max_epochs={EPOCHS}",
        *TASK_OVERRIDES[task],
        *extra,
    ]


def exact_settings(name: str) -> list[str]:
    """``strategy.<key>=<value>`` of the settings that make the name exact."""
    return [f"strategy.{k}={_hydra(v)}" for k, v in SYSTEMS[name].exact_settings]


def exact_batches(name: str, task: str) -> list[str]:
    """The data settings under which the name's steps take ``single``'s batches, for both
    runs: none, or full batches (``spec.exact_full_batch``) of the composed model's depth."""
    from lightning_gnnscale.config_types import run_config

    if not SYSTEMS[name].exact_full_batch:
        return []
    depth = run_config(make_cfg(Path("unused"), *overrides(name, task))).model.num_layers
    return ["data.batch_size=-1", f"data.fanouts=[{','.join(['-1'] * depth)}]"]


def _hydra(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def weights(output_dir: Path) -> dict:
    """The run's ``last.ckpt`` weights and DataModule state, with every rank's shard of it
    (learned input rows and their optimiser state)."""
    from lightning_gnnscale.checkpoints import checkpoint_shards

    path = output_dir / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, weights_only=True)
    state = dict(ckpt["state_dict"])
    for key, value in ckpt.items():
        if key.endswith("DataModule"):
            state.update({f"dm.{k}": v for k, v in value.items()})
    ids, tables = [], {}
    for shards in checkpoint_shards(path):  # every rank's rows, in original node-id order
        for shard in shards.values():
            ids.append(shard["orig_ids"])
            for name, rows in shard.items():
                if name != "orig_ids":
                    tables.setdefault(name, []).append(rows)
    if ids:
        order = torch.argsort(torch.cat(ids))
        state.update({f"dm.{name}": torch.cat(rows)[order] for name, rows in tables.items()})
    return state


def assert_equal(a: dict, b: dict) -> None:
    """Equal bit for bit (tensors with atol 0)."""
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


class Runs:
    """``train`` runs by their settings, each made once per session under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple[str, ...], tuple[dict, Path]] = {}

    def train(self, *settings: str) -> tuple[dict, Path]:
        """``(metrics, output_dir)`` of the run with ``settings``."""
        from lightning_gnnscale.run import train

        if settings not in self.done:
            folder = self.root / f"run{len(self.done)}"
            metrics, objects = train(make_cfg(folder, *settings))
            self.done[settings] = metrics, Path(objects["output_dir"])
        return self.done[settings]


PLAIN_SBM = {"num_nodes": 300, "num_features": 8}  # the plain script's graph
PREDICT_OUTPUTS = ("logits", "embeddings")  # what a plain run predicts, of every node


def plain_datamodule(
    name: str,
    task: str,
    cache_dir: Path,
    partition_dir: Path | None = None,
    dtype=torch.float32,
):
    """The name's DataModule for ``task`` with its default config on the tiny sbm graph in
    ``dtype``, or given only ``partition_dir`` (no dataset: the directory's)."""
    import lightning_gnnscale as gs

    _, DataModule, config = gs.system(name)
    if partition_dir is not None:
        data = gs.DataConfig(batch_size=64, fanouts=[5, 5], partition_dir=str(partition_dir))
        return DataModule(None, config, data, task=task)
    dataset = gs.load_dataset("sbm", **PLAIN_SBM).to(dtype)
    data = gs.DataConfig(batch_size=64, fanouts=[5, 5])
    return DataModule(dataset, config, data, cache_dir=cache_dir, dtype=dtype, task=task)


def write_plain_partition_dir(name: str, task: str, out: Path) -> None:
    """``out / "parts"``: :func:`plain_datamodule`'s partition directory for the name's
    devices on one server (as ``train.py`` knows it before any rank starts), in float32 (a
    float64 rank casts it on load), or in float64 where the system's partition settings pin
    the features' dtype (SANCUS: ``Â``'s values are computed in it)."""
    from lightning_gnnscale.comm import Topology

    devices = SYSTEMS[name].default_devices
    dm = plain_datamodule(name, task, out)
    if "feature_dtype" in dm.partition_settings():
        dm = plain_datamodule(name, task, out, dtype=torch.float64)
    dm.launch_topology = Topology.from_launch(devices)
    dm.write_partition_dir(out / "parts", devices, log=lambda *_: 0)


def plain_lightning_ranks(name: str, task: str, out: Path) -> None:
    """One rank of a plain Lightning script: the name's DataModule for ``task`` with its default config,
    ``L.Trainer(strategy=<name>)`` (the registry's string) in ``precision="64-true"`` for one
    epoch, then ``trainer.predict`` of every node's ``PREDICT_OUTPUTS``; the same again from
    the partition directory ``out / "parts"`` where the parent wrote one
    (:func:`write_plain_partition_dir`). Writes ``rank<r>.pt``: ``{"memory": result}``, and
    ``"directory"``."""
    overrides(name, task)  # a task the suite knows
    parts = out / "parts"
    rank, result = _plain_fit(name, plain_datamodule(name, task, out))
    results = {"memory": result}
    if parts.exists():
        results["directory"] = _plain_fit(name, plain_datamodule(name, task, out, parts))[1]
    torch.save(results, out / f"rank{rank}.pt")


def _plain_fit(name: str, dm) -> tuple[int, dict]:
    """``(rank, result)`` of :func:`plain_lightning_ranks`'s epoch and predictions on ``dm``:
    the weights before and after, the DataModule's state, the steps, the last step's loss,
    and (where the spec supports predict) ``{output: this rank's share}``."""
    import lightning as L

    import lightning_gnnscale as gs

    spec = SYSTEMS[name]
    L.seed_everything(0, verbose=False)
    module = gs.GNNModule.from_config(gs.system(name)[2].model_config(hidden=8), dm)
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    trainer = L.Trainer(
        strategy=spec.registered_as,
        accelerator="cpu",
        devices=spec.default_devices,
        max_epochs=1,
        precision="64-true",
        callbacks=[gs.StepSeed(0)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=dm)
    result = {
        "before": before,
        "after": {k: v.detach().clone() for k, v in module.state_dict().items()},
        "dm": dm.state_dict(),
        "steps": trainer.global_step,
        "loss": float(trainer.callback_metrics["train/step_loss"]),
    }
    if spec.supports_predict:
        result["predictions"] = {
            output: trainer.predict(module, datamodule=dm.predict_on(output=output))[0]
            for output in PREDICT_OUTPUTS
        }
    return trainer.global_rank, result
