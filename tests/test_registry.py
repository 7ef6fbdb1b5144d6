"""Every registered strategy name trains from a plain ``L.Trainer(strategy=<name>)``."""

import json
import os
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import StrategyRegistry

import lightning_gnnscale as gs
from tests.helpers.config import REPO
from tests.helpers.scripts import run_script

# One process (forked from the warm rank server) runs every name in turn, once by name and once
# with the strategy object built by hand, one rank each: the point is the name, the DataModule
# and the strategy meeting through the registry (2-rank runs are in test_examples.py and the
# systems' own tests).
SCRIPT = r"""
import json, sys
import lightning as L
import torch
import lightning_gnnscale as gs

def fit(spec, strategy, graph, cache_dir):
    L.seed_everything(0, verbose=False)
    data = gs.DataConfig(batch_size=64, fanouts=[5, 5])
    dm = spec.datamodule(graph, spec.default_config(), data, cache_dir=cache_dir)
    module = gs.GNNModule(dm.build_model(gs.ModelConfig(name="gcn", dropout=0.0)))
    initial = [p.detach().clone() for p in module.parameters()]
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=1,
                        use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    moved = any(not torch.equal(a, b) for a, b in zip(initial, module.parameters()))
    return trainer.strategy, list(module.parameters()), moved

results = {}
graph = gs.load_dataset("sbm", num_nodes=300, num_features=8)
for name, spec in sorted(gs.SYSTEMS.items()):
    strategy, weights, moved = fit(spec, spec.registered_as, graph, sys.argv[1])
    _, reference, _ = fit(spec, spec.strategy(spec.default_config()), graph, sys.argv[1])
    results[name] = {
        "strategy": type(strategy).__name__,
        "adopted_config": strategy.system_config == spec.default_config(),
        "trained": moved,
        "same_as_object": all(torch.equal(a, b) for a, b in zip(weights, reference)),
    }
print("RESULTS " + json.dumps(results))
"""


def test_every_name_is_in_lightnings_registry():
    for name, spec in gs.SYSTEMS.items():
        assert spec.registered_as in StrategyRegistry
        # the entry is a factory that imports the system on use: it builds the system's class
        strategy = StrategyRegistry.get(spec.registered_as)
        assert type(strategy) is spec.strategy
        assert strategy.system_name == name
    assert "metered_ddp" in StrategyRegistry and "ddp" in gs.SYSTEMS


@pytest.mark.e2e
def test_every_registered_name_trains_from_a_plain_trainer(tmp_path):
    # one thread: float sums in the same order in both runs of a name (bitwise comparison)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    script = tmp_path / "every_name.py"
    script.write_text(SCRIPT)
    proc = run_script(script, str(tmp_path / "cache"), cwd=tmp_path, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(s for s in proc.stdout.splitlines() if s.startswith("RESULTS "))
    results = json.loads(line.removeprefix("RESULTS "))
    assert sorted(results) == sorted(gs.SYSTEMS)
    for name, result in results.items():
        assert result["strategy"] == gs.SYSTEMS[name].strategy.__name__, name
        assert result["adopted_config"], name  # the strategy took the DataModule's config
        assert result["trained"], name  # the weights moved
        assert result["same_as_object"], name  # by name == the strategy object built by hand


def test_single_by_name_follows_the_accelerator():
    """A ``single`` strategy created by name runs on the GPU under a GPU accelerator."""
    from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

    by_name, pinned = gs.SingleStrategy(), gs.SingleStrategy(device="cpu")
    by_name.accelerator = pinned.accelerator = CUDAAccelerator()
    assert by_name.root_device == torch.device("cuda", 0)
    assert pinned.root_device == torch.device("cpu")
    by_name.accelerator = CPUAccelerator()
    assert by_name.root_device == torch.device("cpu")


def _trainer(strategy) -> L.Trainer:
    return L.Trainer(
        strategy=strategy,
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def test_a_datamodule_refuses_another_systems_strategy(tmp_path):
    """The strategy and the DataModule must belong to the same system (no silent mismatch)."""
    graph = gs.load_dataset("sbm", num_nodes=200, num_features=8)
    dm = gs.GSplitDataModule(graph, cache_dir=tmp_path)
    module = gs.GNNModule(dm.build_model(gs.ModelConfig()))
    with pytest.raises(TypeError, match="SingleStrategy runs SingleConfig systems"):
        _trainer(gs.SingleStrategy()).fit(module, datamodule=dm)


def test_a_trainer_with_another_strategy_is_told_every_suite_name():
    """The contract imports no registry: the registry hands it the names Lightning knows."""
    trainer = SimpleNamespace(strategy=L.pytorch.strategies.SingleDeviceStrategy())
    with pytest.raises(TypeError) as error:
        gs.rank_context(trainer)
    names = sorted(spec.registered_as for spec in gs.SYSTEMS.values())
    assert (
        f"the Trainer runs SingleDeviceStrategy; pass strategy=<name> with a name from {names}"
        in str(error.value)
    )


def test_a_datamodule_set_up_for_one_trainer_refuses_another(tmp_path):
    """Its stores and samplers hold the first strategy's comm: reusing it would meter the
    second run's traffic on the first run's meter."""
    graph = gs.load_dataset("sbm", num_nodes=200, num_features=8)
    dm = gs.SingleDataModule(graph, data=gs.DataConfig(batch_size=64), cache_dir=tmp_path)
    module = gs.GNNModule(dm.build_model(gs.ModelConfig()))
    _trainer("single").fit(module, datamodule=dm)
    with pytest.raises(RuntimeError, match="build a new DataModule for each Trainer"):
        _trainer("single").fit(module, datamodule=dm)


def test_plain_datamodules_check_the_data_rules():
    """Rules a RunConfig checks also hold for a DataModule built in a plain script."""
    graph = gs.load_dataset("sbm", num_nodes=200, num_features=8)
    with pytest.raises(gs.ConfigError, match="data.num_workers=2; set data.num_workers=0"):
        gs.GSplitDataModule(graph, data=gs.DataConfig(num_workers=2))
    gs.SingleDataModule(graph, data=gs.DataConfig(num_workers=2))  # samples in workers
    dm = gs.SingleDataModule(graph, data=gs.DataConfig(fanouts=[5, 5, 5]))
    with pytest.raises(gs.ConfigError, match="one fanout per layer"):
        dm.build_model(gs.ModelConfig(num_layers=2))
