"""Every registered strategy name trains from a plain ``L.Trainer(strategy=<name>)``."""

import json
import os
import re
from pathlib import Path
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

def fit(spec, strategy, dataset, cache_dir):
    L.seed_everything(0, verbose=False)
    data = gs.DataConfig(batch_size=64, fanouts=[5, 5])
    dm = spec.datamodule(dataset, spec.default_config(), data, cache_dir=cache_dir)
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
dataset = gs.load_dataset("sbm", num_nodes=300, num_features=8)
for name, spec in sorted(gs.SYSTEMS.items()):
    strategy, weights, moved = fit(spec, spec.registered_as, dataset, sys.argv[1])
    _, reference, _ = fit(spec, spec.strategy(spec.default_config()), dataset, sys.argv[1])
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
    assert "data_parallel" in StrategyRegistry and "ddp" in gs.SYSTEMS


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
    dataset = gs.load_dataset("sbm", num_nodes=200, num_features=8)
    dm = gs.GSplitDataModule(dataset, cache_dir=tmp_path)
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
    dataset = gs.load_dataset("sbm", num_nodes=200, num_features=8)
    dm = gs.SingleDataModule(dataset, data=gs.DataConfig(batch_size=64), cache_dir=tmp_path)
    module = gs.GNNModule(dm.build_model(gs.ModelConfig()))
    _trainer("single").fit(module, datamodule=dm)
    with pytest.raises(RuntimeError, match="build a new DataModule for each Trainer"):
        _trainer("single").fit(module, datamodule=dm)


def test_plain_datamodules_check_the_data_rules():
    """Rules a RunConfig checks also hold for a DataModule built in a plain script."""
    dataset = gs.load_dataset("sbm", num_nodes=200, num_features=8)
    with pytest.raises(gs.ConfigError, match="data.num_workers=2; set data.num_workers=0"):
        gs.GSplitDataModule(dataset, data=gs.DataConfig(num_workers=2))
    gs.SingleDataModule(dataset, data=gs.DataConfig(num_workers=2))  # samples in workers
    dm = gs.SingleDataModule(dataset, data=gs.DataConfig(fanouts=[5, 5, 5]))
    with pytest.raises(gs.ConfigError, match="one fanout per layer"):
        dm.build_model(gs.ModelConfig(num_layers=2))


# ------------------------------------------------------------------ discovery and specs
def test_every_system_folder_declares_its_names_and_discovery_finds_exactly_them():
    """Each system folder under ``systems/`` (one with a ``config.py``) declares ``SYSTEM``;
    the registry is those specs (no entry points are installed here), sorted by name."""
    from lightning_gnnscale import systems
    from lightning_gnnscale.systems import registry

    root = Path(systems.__file__).parent
    folders = sorted(p.parent.name for p in root.glob("*/config.py"))
    sources = registry.in_tree_sources()
    assert [source for source, _ in sources] == [
        f"lightning_gnnscale.systems.{folder}.SYSTEM" for folder in folders
    ]
    assert registry.entry_point_sources() == []
    assert registry.discover(sources) == gs.SYSTEMS
    assert list(gs.SYSTEMS) == sorted(gs.SYSTEMS) and len(gs.SYSTEMS) == 19
    for name, spec in gs.SYSTEMS.items():
        assert spec.name == name and spec.package == f"lightning_gnnscale.systems.{spec.system}"


def test_a_name_declared_twice_is_refused_naming_both_sources():
    from lightning_gnnscale.systems.registry import discover

    ddp = gs.SYSTEMS["ddp"]
    clash = SimpleNamespace(**vars(ddp))  # not a spec: refused as such
    with pytest.raises(gs.ConfigError, match="entry point 'x' .* must give a SystemSpec"):
        discover([("entry point 'x' (pkg:SYSTEM)", clash)])
    with pytest.raises(gs.ConfigError, match=r"'ddp' is declared twice: by in-tree and by ext"):
        discover([("in-tree", ddp), ("ext", (gs.SYSTEMS["single"], ddp))])
    from dataclasses import replace

    lightning_twin = replace(ddp, name="other", lightning_name="data_parallel")
    with pytest.raises(gs.ConfigError, match="'data_parallel' is declared twice: by a and by b"):
        discover([("a", ddp), ("b", lightning_twin)])


def test_unknown_strategy_names_list_the_valid_ones(tmp_path):
    from hydra.errors import MissingConfigException

    from lightning_gnnscale.config_types import run_config
    from tests.helpers.config import make_cfg

    with pytest.raises(MissingConfigException) as error:
        make_cfg(tmp_path, "strategy=nope")
    assert all(f"\t{name}\n" in f"{error.value}\n" for name in gs.SYSTEMS)
    cfg = make_cfg(tmp_path)
    cfg.strategy = {"name": "nope"}  # untyped: not composed from a registered name
    with pytest.raises(gs.ConfigError, match=re.escape(f"valid: {list(gs.SYSTEMS)}")):
        run_config(cfg)


def test_each_name_composes_its_specs_run_defaults(tmp_path):
    """``strategy=<name>`` (Hydra's ConfigStore node, built from the spec) sets the default
    config, the config's model settings, ``trainer.devices`` and the spec's other run settings,
    over the dataset's recipe (sbm for every name; Cora, whose recipe sets the epochs and the
    model, for the names that set those); any key can still be overridden."""
    from lightning_gnnscale.config_types import run_config
    from tests.helpers.config import make_cfg

    runs = [(name, "sbm") for name in gs.SYSTEMS]
    runs += [(name, "cora") for name in ("granndis_cob", "grappa", "sancus", "single")]
    for name, dataset in runs:
        spec = gs.SYSTEMS[name]
        run = run_config(make_cfg(tmp_path, f"strategy={name}", f"dataset={dataset}", tiny=False))
        assert run.strategy == spec.default_config(), name
        assert run.trainer.devices == spec.default_devices, name
        for key, value in {
            **{f"model.{k}": v for k, v in spec.config_type.MODEL_SETTINGS.items()},
            **dict(spec.run_settings),
        }.items():
            section, field = key.split(".")
            assert getattr(getattr(run, section), field) == value, (name, dataset, key)
    run = run_config(make_cfg(tmp_path, "strategy=granndis", "trainer.max_epochs=3"))
    assert run.trainer.max_epochs == 3 and run.topology.servers == 2


def test_the_package_exports_every_system_packages_public_names():
    """``gs.<name>`` for every name of each system package's ``__all__`` (loaded on use), and
    ``gs.__all__`` lists them."""
    from importlib import import_module

    for spec in gs.SYSTEMS.values():
        package = import_module(spec.package)
        for name in package.__all__:
            assert name in gs.__all__, (spec.package, name)
            assert getattr(gs, name) is getattr(package, name), name
        assert {spec.strategy_class, spec.datamodule_class} <= set(package.__all__)
        assert spec.config_type.__name__ in package.__all__
    assert gs.ByteGNNPartitionConfig is not gs.DistDGLPartitionConfig


def test_an_entry_point_that_does_not_load_is_named(monkeypatch):
    from importlib.metadata import EntryPoint

    from lightning_gnnscale.systems import registry

    broken = EntryPoint("broken", "no_such_package_here:SYSTEM", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [broken] if group else [])
    with pytest.raises(gs.ConfigError, match=r"entry point 'broken' \(no_such_package_here"):
        registry.entry_point_sources()
