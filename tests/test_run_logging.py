"""What a run leaves for its user: one complete W&B run, ``train.log`` with every line,
``metrics.csv`` with whole lines only, no lock file, no empty folders (issue 37, 1/2/10)."""

import errno
import logging
import os
import warnings

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lightning_gnnscale.callbacks.summary import EPOCH_LOG, report_epoch
from lightning_gnnscale.run import progress_bar
from lightning_gnnscale.run_folder import FAILED_FILE, claimed, settle_failed_run
from tests.helpers.config import REPO
from tests.helpers.scripts import run_script
from tests.helpers.wandb_records import read_records

EPOCHS = 3


@pytest.fixture(scope="module")
def ddp_wandb_run(tmp_path_factory):
    """``python train.py logger=wandb task=link_prediction`` with the default ``ddp`` (2
    ranks), offline, all of W&B's files under the test's folder; its output is not a
    terminal. (A node task's W&B run: tests/test_train.py.)"""
    tmp = tmp_path_factory.mktemp("ddp_wandb")
    out = tmp / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "GNNSCALE_WARM": "0"}
    env |= {f"WANDB_{d}_DIR": str(tmp / "wandb_home" / d) for d in ("CACHE", "CONFIG", "DATA")}
    proc = run_script(
        "train.py",
        "logger=wandb",
        "task=link_prediction",
        f"trainer.max_epochs={EPOCHS}",
        "dataset.num_nodes=300",
        "dataset.num_features=8",
        "data.batch_size=64",
        "launcher.timeout_s=240",
        f"paths.cache_dir={tmp / 'cache'}",
        f"hydra.run.dir={out}",
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_a_multi_rank_run_is_one_wandb_run_with_every_epoch_and_an_exit_record(ddp_wandb_run):
    out, _ = ddp_wandb_run
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs  # rank 0's alone
    (log,) = runs[0].glob("run-*.wandb")
    records = read_records(log)
    kinds = [r.WhichOneof("record_type") for r in records]
    epochs = set()
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {"/".join(i.nested_key) or i.key: i.value_json for i in record.history.item}
            if "train/loss" in items:
                epochs.add(int(items["epoch"]))
    assert epochs == set(range(EPOCHS))
    assert "summary" in kinds and kinds.count("exit") == 1
    assert records[kinds.index("exit")].exit.exit_code == 0


def _history(log) -> list[dict]:
    """The history records of a W&B log, each as ``{key: JSON value}``."""
    rows = []
    for record in read_records(log):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {"/".join(i.nested_key) or i.key: i.value_json for i in record.history.item}
            )
    return rows


def test_a_two_rank_link_prediction_run_logs_its_metrics_to_wandb(ddp_wandb_run):
    """The run's history holds every epoch's validation AUC, MRR and Hits@K (summed over both
    ranks' edges) and its summary the test metrics."""
    out, _ = ddp_wandb_run
    (run,) = sorted((out / "wandb").glob("offline-run-*"))
    (log,) = run.glob("run-*.wandb")
    names = ("val/auc", "val/mrr", "val/hits@1", "val/hits@3", "val/hits@10")
    epochs = {int(row["epoch"]) for row in _history(log) if all(n in row for n in names)}
    assert epochs == set(range(EPOCHS))
    summaries = [r for r in read_records(log) if r.WhichOneof("record_type") == "summary"]
    keys = {"/".join(i.nested_key) or i.key for r in summaries for i in r.summary.update}
    assert {"test/auc", "test/mrr"} <= keys


def test_train_log_holds_the_epoch_lines_and_lightnings_lines_of_every_rank(ddp_wandb_run):
    out, _ = ddp_wandb_run
    log = (out / "train.log").read_text()
    for epoch in range(1, EPOCHS + 1):
        assert f"[epoch {epoch}/{EPOCHS}] loss" in log
    assert "`Trainer.fit` stopped" in log  # Lightning's rank-zero lines
    assert "GLOBAL_RANK: 0" in log and "GLOBAL_RANK: 1" in log  # both ranks log


def test_no_progress_bar_and_no_lock_file_and_no_logs_directory_warning(ddp_wandb_run):
    out, proc = ddp_wandb_run
    assert "it/s" not in proc.stderr + proc.stdout  # not a terminal: the epoch lines alone
    assert not list(out.glob(".run.lock*"))
    assert "exists and is not empty" not in proc.stderr


def test_progress_bar_by_default_only_on_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: False)
    assert progress_bar(None) is False and progress_bar(True) is True
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert progress_bar(None) is True and progress_bar(False) is False


def test_epoch_lines_reach_the_configured_log_file(tmp_path, monkeypatch):
    """``strategy=single`` runs in the launcher, whose logging Hydra configured."""
    # a test that ran train.py with hydra/job_logging=disabled disabled the existing loggers
    monkeypatch.setattr(EPOCH_LOG, "disabled", False)
    handler = logging.FileHandler(tmp_path / "train.log")
    logging.getLogger().addHandler(handler)
    try:
        report_epoch("[epoch 1/1] loss 1.0")
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert "[epoch 1/1] loss 1.0" in (tmp_path / "train.log").read_text()


# ----------------------------------------------------------------------------- metrics.csv
def _csv_logger(tmp_path):
    """``logger=csv`` as conf/logger/csv.yaml builds it."""
    node = OmegaConf.load(REPO / "conf" / "logger" / "csv.yaml")
    return instantiate({"_target_": node["_target_"]}, save_dir=str(tmp_path))


def test_csv_logger_in_a_fresh_run_folder_warns_nothing(tmp_path):
    (tmp_path / ".hydra").mkdir()  # what Hydra writes first
    (tmp_path / "train.log").write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logger = _csv_logger(tmp_path)
        logger.log_hyperparams({"lr": 0.1})
        logger.log_metrics({"train/loss": 1.0, "epoch": 0}, step=0)
        logger.save()
        logger.finalize("success")
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "epoch,step,train/loss",
        "0,0,1.0",
    ]


def test_a_failed_metrics_write_leaves_whole_lines_only(tmp_path, monkeypatch):
    logger = _csv_logger(tmp_path)
    logger.log_metrics({"train/loss": 1.0, "epoch": 0}, step=0)
    logger.log_metrics({"train/loss": 0.5, "epoch": 1}, step=1)
    before = (tmp_path / "metrics.csv").read_bytes()
    real_write = os.write

    def disk_fills(fd, data):  # a few bytes fit, then the disk is full
        if len(data) > 3:
            return real_write(fd, data[:3])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_fills)
    with pytest.raises(OSError, match="No space left"):  # the rows' append
        logger.log_metrics({"train/loss": 0.25, "epoch": 2}, step=2)
    monkeypatch.undo()

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):  # a new column: the file rewritten
        logger.log_metrics({"val/acc": 0.9, "epoch": 2}, step=2)
    monkeypatch.undo()
    assert (tmp_path / "metrics.csv").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".metrics")]  # no temp file
    logger.log_metrics({"val/acc": 0.9, "epoch": 2}, step=2)  # space again: all rows, one header
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines == ["epoch,step,train/loss,val/acc", "0,0,1.0,", "1,1,0.5,", "2,2,,0.9"]


# ------------------------------------------------------------------------------ the folder
def test_a_lock_file_does_not_outlive_its_run(tmp_path):
    with claimed(tmp_path):
        assert list(tmp_path.glob(".run.lock*"))
    assert not list(tmp_path.glob(".run.lock*"))


def test_a_run_that_fails_before_writing_anything_leaves_no_folder(tmp_path):
    from tests.test_faults import _hydra_main

    out = tmp_path / "run"
    assert _hydra_main("data.fanouts=[5]", f"hydra.run.dir={out}") == 1
    assert not out.exists()


def test_a_failed_run_with_results_is_marked_and_another_runs_folder_left_alone(tmp_path):
    import fcntl

    ran = tmp_path / "ran"
    (ran / ".hydra").mkdir(parents=True)
    (ran / "checkpoints").mkdir()
    assert not settle_failed_run(ran, MemoryError("out of memory"), "train.log")
    assert (ran / FAILED_FILE).read_text() == "MemoryError: out of memory\n"
    assert (ran / "checkpoints").is_dir()
    busy = tmp_path / "busy"
    (busy / ".hydra").mkdir(parents=True)
    with open(busy / ".run.lock.node0", "a+") as other_run:
        fcntl.flock(other_run, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert not settle_failed_run(busy, ValueError("x"), "train.log")
    assert sorted(p.name for p in busy.iterdir()) == [".hydra", ".run.lock.node0"]


def test_two_runs_into_one_folder_keep_both_runs_rows(tmp_path):
    """A resumed run (or any second run into the same ``hydra.run.dir``) continues the earlier
    run's ``metrics.csv``, under its header, and rewrites it whole when a metric is new."""
    first = _csv_logger(tmp_path)
    first.log_hyperparams({"lr": 0.1})
    first.log_metrics({"train/loss": 1.0, "epoch": 0}, step=0)
    first.log_metrics({"train/loss": 0.5, "val/acc": 0.6, "epoch": 1}, step=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = _csv_logger(tmp_path)
        second.log_hyperparams({"lr": 0.1})
        second.log_metrics({"train/loss": 0.25, "epoch": 2}, step=2)  # appended: known columns
        second.log_metrics({"test/acc": 0.7, "epoch": 2}, step=2)  # a new column: rewritten
        second.log_metrics({"train/loss": 0.125, "epoch": 3}, step=3)
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "epoch,step,test/acc,train/loss,val/acc",
        "0,0,,1.0,",
        "1,1,,0.5,0.6",
        "2,2,,0.25,",
        "2,2,0.7,,",
        "3,3,,0.125,",
    ]


def test_an_earlier_metrics_file_cut_mid_line_or_unreadable_loses_no_row(tmp_path):
    (tmp_path / "metrics.csv").write_text("epoch,step,train/loss\n0,0,1.0\n1,1,0.")  # a full disk
    logger = _csv_logger(tmp_path)
    logger.log_metrics({"train/loss": 0.25, "epoch": 2}, step=2)
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "epoch,step,train/loss",
        "0,0,1.0",
        "1,1,0.",
        "2,2,0.25",
    ]
    (tmp_path / "metrics.csv").write_text("epoch,step\n0,0,1.0\n")  # more values than columns
    with pytest.raises(ValueError, match=r"metrics.csv line 2 has more values than its header"):
        _csv_logger(tmp_path).log_hyperparams({"lr": 0.1})  # before fit: no epoch is lost
    assert (tmp_path / "metrics.csv").read_text() == "epoch,step\n0,0,1.0\n"


def test_run_files_get_the_umask_mode_not_mkstemps(tmp_path):
    """Checkpoints, summary.json, hparams.yaml, metrics.csv: readable to the group and others
    under umask 022, as Lightning's own writes were; a replaced file keeps its mode."""
    from lightning_gnnscale.files import atomic_write, current_umask

    mask = os.umask(0o022)
    try:
        assert current_umask() == 0o022
        atomic_write(tmp_path / "summary.json", lambda file: file.write(b"{}"))
        logger = _csv_logger(tmp_path)
        logger.log_hyperparams({"lr": 0.1})
        logger.log_metrics({"train/loss": 1.0, "epoch": 0}, step=0)
        for name in ("summary.json", "hparams.yaml", "metrics.csv"):
            assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name
        (tmp_path / "summary.json").chmod(0o640)
        atomic_write(tmp_path / "summary.json", lambda file: file.write(b"[]"))
        assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o640
        os.umask(0o027)
        assert current_umask() == 0o027
        atomic_write(tmp_path / "new.json", lambda file: file.write(b"{}"))
        assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(mask)


# ----------------------------------------------------------------------------------- W&B
def test_a_wandb_run_is_not_started_only_to_be_finished(tmp_path, monkeypatch):
    """fit failed before the logger started its run: there is nothing to finish."""
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    from lightning_gnnscale.loggers import finish_wandb_runs

    def init(*args, **kwargs):
        raise AssertionError("wandb.init was called")

    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.setattr(wandb, "run", None)
    logger = WandbLogger(offline=True, save_dir=str(tmp_path))
    finish_wandb_runs([logger], exit_code=1)
    finish_wandb_runs([logger], exit_code=0)
    assert not (tmp_path / "wandb").exists()


class _Run:
    """The part of a ``wandb.Run`` that finishing it uses."""

    def __init__(self, run_id: str, error: Exception | None = None):
        self.id, self.error, self.finished = run_id, error, []

    def finish(self, exit_code: int) -> None:
        self.finished.append(exit_code)
        if self.error is not None:
            raise self.error


def test_a_failed_finish_does_not_hide_the_runs_own_error(tmp_path, monkeypatch, caplog):
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    from lightning_gnnscale import loggers
    from lightning_gnnscale.loggers import finish_wandb_runs

    # a test that ran train.py with hydra/job_logging=disabled disabled the existing loggers
    monkeypatch.setattr(loggers._log, "disabled", False)
    run = _Run("run1", RuntimeError("wandb service gone"))
    monkeypatch.setattr(wandb, "run", run)
    logger = WandbLogger(offline=True, id="run1", save_dir=str(tmp_path))
    with caplog.at_level(logging.ERROR, logger="lightning_gnnscale.loggers"):
        finish_wandb_runs([logger], exit_code=1)  # in the failure path: logged, not raised
    assert run.finished == [1]
    assert "wandb service gone" in caplog.text
    with pytest.raises(RuntimeError, match="wandb service gone"):  # nothing else failed
        finish_wandb_runs([logger], exit_code=0)
    someone_elses = _Run("other")
    monkeypatch.setattr(wandb, "run", someone_elses)
    finish_wandb_runs([logger], exit_code=1)
    assert someone_elses.finished == []  # not this logger's run: left to its owner


def test_a_failed_run_that_logged_what_it_did_keeps_its_log(tmp_path):
    """Only a log holding nothing but the error counts as empty: partitioning or epoch lines
    are the run's record, kept in a folder marked FAILED."""
    error = OSError("rank 1 stopped: disk full")
    said = tmp_path / "said"
    (said / ".hydra").mkdir(parents=True)
    (said / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (said / "train.log").write_text(
        "[12:00:00][lightning_gnnscale.partition][INFO] - 4 parts, edge cut 0.12\n"
        f"[12:00:09][__main__][ERROR] - {error}\n"
    )
    assert not settle_failed_run(said, error, "train.log")
    assert "edge cut" in (said / "train.log").read_text()
    assert (said / FAILED_FILE).read_text() == f"OSError: {error}\n"
    only_the_error = tmp_path / "only_the_error"
    (only_the_error / ".hydra").mkdir(parents=True)
    (only_the_error / "train.log").write_text(f"\n[12:00:09][__main__][ERROR] - {error}\n")
    assert settle_failed_run(only_the_error, error, "train.log")
    assert not only_the_error.exists()
