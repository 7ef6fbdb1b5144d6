"""Every registered strategy name trains from a plain ``L.Trainer(strategy=<name>)``."""

import json
import os
import subprocess
import sys

import pytest
from lightning.pytorch.strategies import StrategyRegistry

import lightning_gnnscale as gs
from tests.helpers.config import REPO

# One process runs every name in turn (one rank each: the point is the name, the DataModule
# and the strategy meeting through the registry; 2-rank runs are in test_examples.py and the
# systems' own tests).
SCRIPT = r"""
import json, sys
import lightning as L
import torch
import lightning_gnnscale as gs

results = {}
graph = gs.load_dataset("sbm", num_nodes=300, num_features=8)
for name, spec in sorted(gs.SYSTEMS.items()):
    L.seed_everything(0, verbose=False)
    dm = spec.datamodule(graph, spec.default_config(), gs.DataConfig(batch_size=64, fanouts=[5, 5]),
                         cache_dir=sys.argv[1])
    model = gs.ModelConfig(name="gcn", dropout=0.0)
    module = gs.GNNModule(dm.build_model(model))
    trainer = L.Trainer(strategy=spec.registered_as, accelerator="cpu", devices=1, max_epochs=1,
                        use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    results[name] = {"strategy": type(trainer.strategy).__name__,
                     "val_acc": float(trainer.callback_metrics["val/acc"])}
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
print("RESULTS " + json.dumps(results))
"""


def test_every_name_is_in_lightnings_registry():
    for spec in gs.SYSTEMS.values():
        assert spec.registered_as in StrategyRegistry
        assert StrategyRegistry[spec.registered_as]["strategy"] is spec.strategy
    assert "metered_ddp" in StrategyRegistry and "ddp" in gs.SYSTEMS


@pytest.mark.e2e
def test_every_registered_name_trains_from_a_plain_trainer(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "cache")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(s for s in proc.stdout.splitlines() if s.startswith("RESULTS "))
    results = json.loads(line.removeprefix("RESULTS "))
    assert sorted(results) == sorted(gs.SYSTEMS)
    for name, result in results.items():
        assert result["strategy"] == gs.SYSTEMS[name].strategy.__name__, name
        assert 0.0 <= result["val_acc"] <= 1.0


def test_a_datamodule_refuses_another_systems_strategy(tmp_path):
    """The strategy and the DataModule must belong to the same system (no silent mismatch)."""
    import lightning as L

    graph = gs.load_dataset("sbm", num_nodes=200, num_features=8)
    dm = gs.GSplitDataModule(graph, cache_dir=tmp_path)
    module = gs.GNNModule(dm.build_model(gs.ModelConfig()))
    trainer = L.Trainer(
        strategy=gs.SingleStrategy(),
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    with pytest.raises(TypeError, match="SingleStrategy runs SingleConfig systems"):
        trainer.fit(module, datamodule=dm)
