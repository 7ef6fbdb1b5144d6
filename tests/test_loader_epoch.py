"""The epoch a training loader runs is the DataModule's: the Trainer's public
``current_epoch`` when the loader starts an epoch, and on a resume the epoch the checkpoint's
DataModule state names (``state_dict`` / ``load_state_dict``), never Lightning's fit loop
(issue 36). The whole-run equality of a resume is ``tests/test_train.py``'s and
``tests/test_faults.py``'s."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_gnnscale as gs
from lightning_gnnscale.checkpoints import CHECKPOINT_KEY
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.kit.loaders import EpochSteps


def datamodule(tmp_path, trainer=None):
    _, DataModule, config = gs.system("single")
    dataset = gs.load_dataset("sbm", num_nodes=120, num_features=4)
    dm = DataModule(
        dataset, config, gs.DataConfig(batch_size=32, fanouts=[2, 2]), cache_dir=tmp_path
    )
    dm.trainer = trainer
    return dm


def fitting(current_epoch=0, is_last_batch=False):
    """What the DataModule reads of a Trainer (public properties only)."""
    return SimpleNamespace(current_epoch=current_epoch, is_last_batch=is_last_batch)


def epochs(sampler) -> set[int]:
    return {epoch for epoch, _ in sampler}


def test_the_loader_epoch_follows_the_trainer_and_travels_in_the_checkpoint(tmp_path):
    dm = datamodule(tmp_path, fitting())
    sampler = EpochSteps(dm)
    assert epochs(sampler) == {0} and len(list(sampler)) == dm.steps_per_epoch
    dm.trainer.current_epoch = 2  # the Trainer at the start of epoch 2
    assert epochs(sampler) == {2}
    assert dm.state_dict() == {"train_epoch": 2}  # mid-epoch: epoch 2 again
    dm.trainer.is_last_batch = True
    assert dm.state_dict() == {"train_epoch": 3}  # at its end: the next one

    # a resumed fit's first iterator is built while current_epoch still names the
    # checkpoint's epoch (2): the checkpoint's state says 3 comes next
    resumed = datamodule(tmp_path, fitting(current_epoch=2))
    resumed.load_state_dict(dm.state_dict())
    assert epochs(EpochSteps(resumed)) == {3}
    resumed.trainer.current_epoch = 4
    assert epochs(EpochSteps(resumed)) == {4}


def test_a_damaged_epoch_is_refused_and_an_older_state_is_read_for_evaluation(tmp_path):
    dm = datamodule(tmp_path, fitting())
    for bad in (-1, 2.0, "3", True, None):
        with pytest.raises(ConfigError, match="train_epoch=.*non-negative int"):
            dm.load_state_dict({"train_epoch": bad})
    dm.load_state_dict({})  # an older checkpoint's state, evaluated
    assert epochs(EpochSteps(dm)) == {0}


def test_an_older_checkpoint_resumes_at_the_epochs_it_recorded(tmp_path):
    """A checkpoint written before the DataModule kept its epoch: a train.py one carries
    ``epochs_done``, which becomes the resume's first epoch; one without it is refused for a
    resume (in plain words) and left alone for an evaluation."""
    dm = datamodule(tmp_path, fitting())
    dm.stage = "fit"  # what setup records: the strategy loads the checkpoint to resume a fit
    key = type(dm).__qualname__
    older = {"state_dict": {}, CHECKPOINT_KEY: {"epochs_done": 3}}
    dm.complete_checkpoint(older)
    assert older[key] == {"train_epoch": 3}
    dm.load_state_dict(older[key])
    assert epochs(EpochSteps(dm)) == {3}

    foreign = {"state_dict": {}}
    with pytest.raises(ConfigError, match="no SingleDataModule train_epoch.*weights alone"):
        dm.complete_checkpoint(foreign)
    dm.stage = "validate"
    dm.complete_checkpoint(foreign)
    assert foreign == {"state_dict": {}}
    dm.stage = "fit"
    current = {key: {"train_epoch": 1}, CHECKPOINT_KEY: {"epochs_done": 3}}
    dm.complete_checkpoint(current)
    assert current[key] == {"train_epoch": 1}  # the DataModule's own state wins


class _Wrapped:
    """A train loader Lightning cannot ``set_epoch`` (no sampler): a generator over the
    DataModule's own, as a prefetching wrapper is."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        yield from self.loader


class _Epochs(L.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 0:
            self.seen.append(batch.epoch)


def _trainer(tmp_path, max_epochs, callbacks=(), limit_val_batches=0):
    return L.Trainer(
        strategy="single",
        accelerator="cpu",
        max_epochs=max_epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=limit_val_batches,
        enable_checkpointing=any(isinstance(cb, ModelCheckpoint) for cb in callbacks),
        callbacks=list(callbacks),
        default_root_dir=tmp_path,
    )


def _module(dm):
    dm.train_dataloader = lambda loader=dm.train_dataloader: _Wrapped(loader())
    return gs.GNNModule(dm.build_model(gs.ModelConfig(hidden=8)))


def _fit(tmp_path, dm, max_epochs, ckpt_path=None, callbacks=()):
    module, seen = _module(dm), _Epochs()
    trainer = _trainer(tmp_path, max_epochs, [seen, *callbacks])
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return seen.seen


def test_a_wrapped_loader_runs_each_epoch_and_resumes_at_the_next(tmp_path):
    """Through Lightning: a loader Lightning never calls ``set_epoch`` on trains epochs
    0, 1, 2; resumed from the checkpoint of epoch 0's end, it trains 1, 2."""
    last = ModelCheckpoint(tmp_path / "ckpt", save_last=True, save_on_train_epoch_end=True)
    assert _fit(tmp_path, datamodule(tmp_path), 1, callbacks=[last]) == [0]
    assert _fit(tmp_path, datamodule(tmp_path), 3) == [0, 1, 2]
    resumed = _fit(tmp_path, datamodule(tmp_path), 3, ckpt_path=last.last_model_path)
    assert resumed == [1, 2]


def test_validating_a_checkpoint_then_fitting_starts_at_epoch_0(tmp_path):
    """Lightning restores the DataModule's state for ``validate(ckpt_path=...)`` too: the
    checkpoint's epoch (1, written at epoch 0's end) must not carry into a later ``fit`` of
    the same objects, which trains epochs 0, 1, 2 as a fresh one does."""
    last = ModelCheckpoint(tmp_path / "ckpt", save_last=True, save_on_train_epoch_end=True)
    assert _fit(tmp_path, datamodule(tmp_path), 1, callbacks=[last]) == [0]
    dm, seen = datamodule(tmp_path), _Epochs()
    module, trainer = _module(dm), _trainer(tmp_path, 3, [seen], limit_val_batches=1)
    trainer.validate(module, datamodule=dm, ckpt_path=last.last_model_path)
    assert dm.resumed_epoch == 1  # the evaluation read the checkpoint's state
    trainer.fit(module, datamodule=dm)
    assert seen.seen == [0, 1, 2]
