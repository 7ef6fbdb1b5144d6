"""``train.py`` from a partition directory against the same run in memory, and the launcher
checks a misfit directory meets; shared by the per-system partition-directory tests."""

from __future__ import annotations

from pathlib import Path

from lightning_gnnscale.run import train
from tests.helpers.config import make_cfg

NODES = "dataset.num_nodes=300"


def _silent(*_):
    return 0


def train_both_ways(tmp_path: Path, monkeypatch, common: list[str], keys=("val_acc",)):
    """Partition with ``common`` (300 nodes), train in memory, then from the directory with
    the dataset loader replaced by one that fails (so the launcher never loads it). Asserts
    the final weights equal bit for bit, each epoch's ``keys`` and the test accuracy equal;
    returns both runs' metrics."""
    import lightning_gnnscale.kit.datamodule as datamodule_module
    import lightning_gnnscale.run as run_module
    from lightning_gnnscale.partition import partition
    from tests.test_partition_dir import _assert_equal, _weights

    out = tmp_path / "parts"
    partition([NODES, *common], out, log=_silent)
    mem, _ = train(make_cfg(tmp_path / "mem", *common))

    def no_load(*args, **kwargs):
        raise AssertionError("the launcher loaded the dataset")

    monkeypatch.setattr(run_module, "load_dataset", no_load)
    monkeypatch.setattr(datamodule_module, "load_dataset", no_load)
    got, objects = train(make_cfg(tmp_path / "dir", *common, f"data.partition_dir={out}"))
    assert objects["graph"] is None
    _assert_equal(_weights(tmp_path / "mem" / "out"), _weights(tmp_path / "dir" / "out"))
    assert len(got["history"]) == len(mem["history"]) == 2  # trainer.max_epochs=2
    for key in keys:
        assert [h[key] for h in got["history"]] == [h[key] for h in mem["history"]], key
    assert got["test_acc"] == mem["test_acc"]
    return mem, got


def launcher_without_ranks(tmp_path: Path, monkeypatch, common: list[str]):
    """Partition with ``common`` (300 nodes) into ``tmp_path / "parts"``; return
    ``(out, run)``: ``run(*extra, parts=out)`` trains from a directory with starting a rank
    replaced by a failure, so what it raises was raised before any rank started."""
    import lightning_gnnscale.run as run_module
    from lightning_gnnscale.partition import partition

    def no_spawn(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(run_module, "launch_local", no_spawn)
    out = tmp_path / "parts"
    partition([NODES, *common], out, log=_silent)

    def run(*extra, parts=out):
        return train(make_cfg(tmp_path, *common, *extra, f"data.partition_dir={parts}"))

    return out, run


def float64_trainer(strategy, max_epochs: int):
    """The plain-Lightning trainer the directory tests compare under: 2 CPU ranks,
    ``precision="64-true"``, step-seeded, nothing logged, saved or sanity-checked."""
    import lightning as L

    import lightning_gnnscale as gs

    return L.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        max_epochs=max_epochs,
        precision="64-true",
        callbacks=[gs.StepSeed(0)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )


def resume_from_directory(tmp_path: Path, common: list[str], want: dict) -> None:
    """After :func:`train_both_ways`: one epoch from its directory, then that run's
    ``last.ckpt`` resumed from the directory for the rest; asserts the final weights equal
    the uninterrupted directory run's bit for bit, and its test accuracy (``want``'s)."""
    from tests.test_partition_dir import _assert_equal, _weights

    directory = [*common, f"data.partition_dir={tmp_path / 'parts'}"]
    train(make_cfg(tmp_path / "first", *directory, "trainer.max_epochs=1"))
    last = tmp_path / "first" / "out" / "checkpoints" / "last.ckpt"
    got, _ = train(make_cfg(tmp_path / "resumed", *directory, f"ckpt_path={last}"))
    _assert_equal(_weights(tmp_path / "dir" / "out"), _weights(tmp_path / "resumed" / "out"))
    assert got["test_acc"] == want["test_acc"]
