"""The epoch a training loader runs is the DataModule's own state, kept in checkpoints
(``state_dict`` / ``load_state_dict``), not read from Lightning's fit loop (issue 36). The
whole-run equality of a resume is ``tests/test_train.py``'s and ``tests/test_faults.py``'s."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import lightning_gnnscale as gs
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.systems.base import EpochSteps


def datamodule(trainer=None):
    _, DataModule, config = gs.system("single")
    graph = gs.load_dataset("sbm", num_nodes=120, num_features=4)
    dm = DataModule(graph, config, gs.DataConfig(batch_size=32, fanouts=[2]))
    dm.trainer = trainer
    return dm


def fitting(ckpt_path=None, is_last_batch=False):
    """What the DataModule reads of a fitting Trainer (public properties only)."""
    return SimpleNamespace(
        ckpt_path=ckpt_path, is_last_batch=is_last_batch, state=SimpleNamespace(fn="fit")
    )


def epochs(sampler) -> set[int]:
    return {epoch for epoch, _ in sampler}


def test_the_loader_epoch_is_set_by_lightning_and_travels_in_the_checkpoint():
    dm = datamodule(fitting())
    sampler = EpochSteps(dm)
    assert epochs(sampler) == {0} and len(list(sampler)) == dm.steps_per_epoch
    sampler.set_epoch(2)  # Lightning, at the start of epoch 2
    assert epochs(sampler) == {2} and dm.train_epoch == 2
    assert dm.state_dict() == {"train_epoch": 2}  # mid-epoch: epoch 2 again
    dm.trainer.is_last_batch = True
    assert dm.state_dict() == {"train_epoch": 3}  # at its end: the next one

    resumed = datamodule(fitting(ckpt_path="last.ckpt"))
    resumed.load_state_dict(dm.state_dict())
    assert epochs(EpochSteps(resumed)) == {3}  # the first iterator, before any set_epoch


def test_a_checkpoint_without_the_epoch_is_refused_for_a_resume_and_read_for_evaluation():
    old = datamodule(fitting(ckpt_path="old.ckpt"))  # Lightning found no state to load
    with pytest.raises(ConfigError, match="no SingleDataModule train_epoch.*weights_from"):
        list(EpochSteps(old))
    with pytest.raises(ConfigError, match="no SingleDataModule train_epoch"):
        old.load_state_dict({})  # a subclass's older state without the key
    for bad in (-1, 2.0, "3", True):
        with pytest.raises(ConfigError, match="train_epoch=.*non-negative int"):
            old.load_state_dict({"train_epoch": bad})
    evaluating = datamodule(SimpleNamespace(state=SimpleNamespace(fn="test")))
    evaluating.load_state_dict({})  # trainer.test(ckpt_path=<older checkpoint>): no resume
    assert evaluating.train_epoch == 0
