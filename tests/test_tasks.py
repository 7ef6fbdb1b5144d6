"""The task seam (lightning_gnnscale.tasks): statistics that sum across ranks, metrics from the
sums, the synthetic regression target, the ``task`` setting, and node regression through every
system folder."""

from __future__ import annotations

import math

import pytest
import torch
from hydra.utils import instantiate

from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.datasets import load_dataset
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.node_targets import NodeTargets
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.module import GNNModule
from lightning_gnnscale.preflight import check_config
from lightning_gnnscale.run import train
from lightning_gnnscale.systems.single import SingleConfig, SingleDataModule
from lightning_gnnscale.tasks import TASKS, build_task
from lightning_gnnscale.tasks.base import split_statistics
from lightning_gnnscale.tasks.node_regression import NOISE, synthetic_targets
from tests.helpers.config import make_cfg

# one name per system folder: node regression must run through each without task code there
SYSTEM_FOLDERS = (
    "single",
    "ddp",
    "distdgl",
    "bytegnn",
    "gsplit",
    "sancus",
    "grappa",
    "hopgnn",
    "granndis",
)


def test_classification_statistics_sum_to_the_whole_and_give_accuracy():
    task = build_task("node_classification")
    gen = torch.Generator().manual_seed(0)
    out, target = torch.randn(50, 4, generator=gen), torch.randint(4, (50,), generator=gen)
    rows = {"val": torch.arange(50) % 3 == 0, "test": torch.arange(50) % 3 == 1}
    targets = NodeTargets(target, torch.zeros(50, dtype=torch.bool), rows["val"], rows["test"], 4)
    whole = split_statistics(task, out, targets, ("val", "test"))
    halves = [  # two ranks' rows: the sums are the whole's
        split_statistics(task, out[part], targets.rows(part), ("val", "test"))
        for part in (slice(0, 23), slice(23, 50))
    ]
    assert torch.equal(halves[0] + halves[1], whole)
    mask = rows["val"]
    expected = sum(int(out[i].argmax()) == int(target[i]) for i in range(50) if mask[i]) / int(
        mask.sum()
    )
    assert task.metric_values(whole[0]) == {"acc": pytest.approx(expected)}


def test_regression_statistics_give_rmse_and_mae():
    task = build_task("node_regression")
    gen = torch.Generator().manual_seed(1)
    out, target = torch.randn(40, 2, generator=gen), torch.randn(40, 2, generator=gen)
    rows = {"val": torch.arange(40) < 25}
    none = torch.zeros(40, dtype=torch.bool)
    targets = NodeTargets(target, none, rows["val"], none, 2)
    parts = [slice(0, 10), slice(10, 40)]
    summed = sum(split_statistics(task, out[p], targets.rows(p), ("val",)) for p in parts)
    err = [float(out[i, j] - target[i, j]) for i in range(40) if rows["val"][i] for j in range(2)]
    values = task.metric_values(summed[0])
    assert values["rmse"] == pytest.approx(math.sqrt(sum(e * e for e in err) / len(err)))
    assert values["mae"] == pytest.approx(sum(abs(e) for e in err) / len(err))
    loss = task.loss_sum(out, target, torch.full((40,), 2.0))
    assert float(loss) == pytest.approx(2 * sum(float(v) ** 2 for v in (out - target).flatten()))


def test_the_synthetic_target_is_deterministic_and_learnable():
    dataset = sbm(num_nodes=400, num_classes=5, num_features=12, seed=3)
    graph, labels = dataset.graph, dataset.targets.target
    target = synthetic_targets(dataset, seed=7)
    assert target.shape == (400, 1) and target.dtype == torch.float32
    assert torch.equal(target, synthetic_targets(dataset, seed=7))
    assert not torch.equal(target, synthetic_targets(dataset, seed=8))
    # least squares on what a GNN sees (the neighbourhood mean feature, the community) leaves
    # the noise alone: far below the target's spread
    x = graph.x.double()
    mean = x.clone().index_add_(0, graph.dst_of_edges(), x[graph.indices])
    mean /= (graph.in_degree() + 1).unsqueeze(1)
    design = torch.cat([mean, torch.nn.functional.one_hot(labels, 5).double()], 1)
    fit = torch.linalg.lstsq(design, target.double()).solution
    residual = float((design @ fit - target).square().mean().sqrt())
    assert residual < 1.5 * NOISE < 0.5 * float(target.std())


def test_the_task_setting_is_checked_and_monitored(tmp_path):
    with pytest.raises(ConfigError, match="node_classification.*node_regression"):
        check_config(make_cfg(tmp_path, "task.name=node_ranking"))
    cfg = make_cfg(tmp_path, "task=node_regression", "callbacks=early_stopping")
    stopping = instantiate(check_config(cfg).callbacks["early_stopping"])
    assert (stopping.monitor, stopping.mode) == ("val/rmse", "min")
    cfg = make_cfg(tmp_path, "callbacks=early_stopping")
    stopping = instantiate(check_config(cfg).callbacks["early_stopping"])
    assert (stopping.monitor, stopping.mode) == ("val/acc", "max")
    assert sorted(TASKS) == ["link_prediction", "node_classification", "node_regression"]
    cfg = make_cfg(tmp_path, "task=link_prediction", "callbacks=early_stopping")
    stopping = instantiate(check_config(cfg).callbacks["early_stopping"])
    assert (stopping.monitor, stopping.mode) == ("val/mrr", "max")


def test_a_task_its_system_does_not_list_is_refused_before_spawn(tmp_path, monkeypatch):
    from lightning_gnnscale.systems import registry
    from lightning_gnnscale.systems.ddp import DataParallelConfig

    monkeypatch.setattr(DataParallelConfig, "TASKS", ("node_classification",))
    assert registry.SYSTEMS["ddp"].tasks == ("node_classification",)  # the spec's is the config's
    check_config(make_cfg(tmp_path, "strategy=ddp"))
    with pytest.raises(ConfigError, match="task=node_regression is not supported by strategy=ddp"):
        check_config(make_cfg(tmp_path, "strategy=ddp", "task=node_regression"))


def test_a_plain_script_is_held_to_the_systems_tasks(monkeypatch):
    """The same rule (``SystemConfig.check_task``) for a DataModule a plain script builds:
    refused at construction, before any Trainer or process exists."""
    from lightning_gnnscale.systems.ddp import DataParallelConfig, DataParallelDataModule

    monkeypatch.setattr(DataParallelConfig, "TASKS", ("node_classification",))
    graph = sbm(num_nodes=120, num_features=6, seed=0)
    DataParallelDataModule(graph, DataParallelConfig(name="ddp"))
    with pytest.raises(ConfigError, match="task=node_regression is not supported by strategy=ddp"):
        DataParallelDataModule(graph, DataParallelConfig(name="ddp"), task="node_regression")


def test_a_module_of_another_task_is_refused():
    import lightning as L

    graph = sbm(num_nodes=120, num_features=6, seed=0)
    dm = SingleDataModule(graph, SingleConfig(), task="node_regression")
    module = GNNModule(BlockGNN("sage", 6, 8, 8, 2), task="node_classification")
    trainer = L.Trainer(strategy="single", max_epochs=1, logger=False, enable_progress_bar=False)
    with pytest.raises(ConfigError, match="task is 'node_classification'.*'node_regression'"):
        trainer.fit(module, datamodule=dm)
    assert (
        dm.out_dim == 1
        and GNNModule.from_config(SingleConfig().model_config(), dm).task.name == "node_regression"
    )


@pytest.mark.parametrize("name", SYSTEM_FOLDERS)
def test_node_regression_trains_through_every_system(tmp_path, name):
    """No system has regression code: each trains on the task's targets and its RMSE ends
    below predicting the training targets' mean."""
    devices = ["trainer.devices=1"] if name == "single" else []
    metrics, objects = train(
        make_cfg(
            tmp_path,
            f"strategy={name}",
            "task=node_regression",
            "trainer.max_epochs=4",
            "model.lr=0.03",
            *devices,
        )
    )
    targets = objects["targets"]
    assert targets.target.is_floating_point()
    train_mean = targets.target[targets.train].mean(0)
    val = targets.target[targets.val]
    baseline = float((val - train_mean).square().mean().sqrt())
    assert math.isfinite(metrics["val_rmse"]) and math.isfinite(metrics["val_mae"])
    assert metrics["best_val_rmse"] == min(r["val_rmse"] for r in metrics["history"])
    assert metrics["val_rmse"] < baseline, (metrics["val_rmse"], baseline)
    assert "val_acc" not in metrics


def test_load_dataset_labels_feed_regression_unchanged_for_classification():
    """Node classification keeps the dataset's targets object itself (its results unchanged);
    regression replaces the targets and keeps the splits."""
    dataset = load_dataset("sbm", num_nodes=100, num_features=4)
    assert build_task("node_classification").prepare(dataset, 0) is dataset.targets
    regression = build_task("node_regression").prepare(dataset, 0)
    assert regression.target.shape == (100, 1) and regression.out_dim == 1
    assert torch.equal(regression.split_matrix(), dataset.targets.split_matrix())


def test_sizing_a_head_from_a_directory_of_another_task_is_refused(tmp_path):
    """A plain script sizes its head from ``partition_meta`` (``dm.out_dim``): a directory
    written for node classification refuses a regression DataModule, naming both tasks and the
    format version, instead of a head as wide as the class count."""
    from lightning_gnnscale.config_types import DataConfig
    from lightning_gnnscale.graph.partition_dir import FORMAT_VERSION, PartitionDirError
    from lightning_gnnscale.systems.distdgl import DistDGLConfig, DistDGLDataModule

    def datamodule(task, partition_dir=None):
        data = DataConfig(batch_size=32, fanouts=[2, 2], partition_dir=partition_dir)
        options = dict(num_nodes=120, num_features=6, num_classes=4)
        return DistDGLDataModule(
            "sbm", DistDGLConfig(), data, cache_dir=tmp_path, dataset_options=options, task=task
        )

    out = tmp_path / "parts"
    datamodule("node_classification").write_partition_dir(out, 2, log=lambda *_: 0)
    assert datamodule("node_classification", str(out)).out_dim == 4
    with pytest.raises(
        PartitionDirError,
        match=rf"written for task 'node_classification' \(format version {FORMAT_VERSION}\) "
        r"but this run has task='node_regression'",
    ):
        _ = datamodule("node_regression", str(out)).out_dim


def test_a_regression_module_loads_from_its_checkpoint_as_regression(tmp_path):
    """The task travels in the checkpoint's hyperparameters as its name (weights-only
    loadable), so ``load_from_checkpoint`` rebuilds it; a passed task still wins."""
    import lightning as L

    from lightning_gnnscale.checkpoints import SuiteCheckpointIO

    module = GNNModule(BlockGNN("sage", 6, 8, 1, 2), lr=0.02, task="node_regression")
    trainer = L.Trainer(max_epochs=0, logger=False, enable_progress_bar=False)
    trainer.strategy.connect(module)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    assert (
        SuiteCheckpointIO().load_checkpoint(path)["hyper_parameters"]["task"] == "node_regression"
    )
    loaded = GNNModule.load_from_checkpoint(path, net=BlockGNN("sage", 6, 8, 1, 2))
    assert loaded.task.name == "node_regression" and loaded.lr == 0.02
    passed = GNNModule.load_from_checkpoint(
        path, net=BlockGNN("sage", 6, 8, 1, 2), task="node_classification"
    )
    assert passed.task.name == "node_classification"
