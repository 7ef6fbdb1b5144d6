"""Checkpoints that survive a full disk and cannot be turned against the user: the suite's
CheckpointIO saves atomically and loads weights-only for every path (also a URL, whoever calls
it); a resumed checkpoint's paths are never acted on (docs/configuration.md, "Checkpoints")."""

from __future__ import annotations

import builtins
import dataclasses
import errno
import functools
import http.server
import io
import os
import shutil
import socket
import threading
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import StrategyRegistry

import lightning_gnnscale.run as run_module
from lightning_gnnscale import checkpoints
from lightning_gnnscale.checkpoints import (
    BestCheckpoint,
    CheckpointIdentity,
    LastCheckpoint,
    SuiteCheckpointIO,
    read_checkpoint,
)
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.files import UnsafeFileError
from lightning_gnnscale.preflight import check_config
from lightning_gnnscale.systems.registry import SYSTEMS
from tests.helpers.config import make_cfg
from tests.test_untrusted import _payload_checkpoint


# ------------------------------------------------------------------------------ full disk
class _FullDisk:
    """The disk of ``folder`` fills ``room`` bytes into the ``fail_at``-th file opened for
    writing in it (ENOSPC), and the process's temporary folder is on another device (a rename
    from it into ``folder`` fails with EXDEV, so a writer that stages there must copy)."""

    def __init__(self, folder: Path, fail_at: int, room: int = 4096):
        self.folder, self.fail_at, self.room, self.opened = folder.resolve(), fail_at, room, 0

    def _inside(self, path) -> bool:
        try:
            return Path(os.path.realpath(path)).parent == self.folder
        except (TypeError, ValueError):
            return False

    def _limit(self, raw: io.FileIO) -> io.BufferedWriter:
        self.opened += 1
        if self.opened != self.fail_at:
            return io.BufferedWriter(raw)
        room = self.room

        class Filling(io.RawIOBase):
            def writable(self):
                return True

            def fileno(self):
                return raw.fileno()

            def write(self, data):
                nonlocal room
                if room <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written = raw.write(bytes(data[:room]))
                room -= written
                return written

            def close(self):
                raw.close()
                super().close()

        return io.BufferedWriter(Filling())

    def install(self, monkeypatch) -> None:
        real_open, real_fdopen, real_rename = builtins.open, os.fdopen, os.rename

        def open_(file, mode="r", *args, **kwargs):
            if ("w" in mode or "+" in mode) and "b" in mode and self._inside(file):
                return self._limit(io.FileIO(file, mode.replace("b", "")))
            return real_open(file, mode, *args, **kwargs)

        def fdopen(fd, mode="r", *args, **kwargs):
            if ("w" in mode or "+" in mode) and "b" in mode and self._inside(f"/proc/self/fd/{fd}"):
                return self._limit(io.FileIO(fd, mode.replace("b", "")))
            return real_fdopen(fd, mode, *args, **kwargs)

        def rename(src, dst, *args, **kwargs):
            if self._inside(dst) and not self._inside(src):
                raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), src, dst)
            return real_rename(src, dst, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", open_)
        monkeypatch.setattr(os, "fdopen", fdopen)
        monkeypatch.setattr(os, "rename", rename)
        monkeypatch.setattr(shutil, "_USE_CP_SENDFILE", False)  # copies write through open()


def test_a_full_disk_keeps_the_last_good_checkpoint_and_stops_the_run(
    tmp_path, monkeypatch, capsys
):
    """Epoch 0 writes best.ckpt and last.ckpt; the disk fills during epoch 1's last.ckpt
    (accuracy does not move, so there is no new best). The previous last.ckpt still loads, no
    temporary file is left, and ``train.py``'s job stops with status 1 saying the save failed."""
    cfg = make_cfg(tmp_path, "strategy=single", "model.lr=1e-12", "trainer.max_epochs=2")
    folder = Path(cfg.paths.output_dir) / "checkpoints"
    folder.mkdir(parents=True)
    disk = _FullDisk(folder, fail_at=3)
    disk.install(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        run_module.run_from_command_line(cfg, check_config(cfg))
    monkeypatch.undo()
    assert disk.opened == 3
    assert read_checkpoint(folder / "last.ckpt")["epoch"] == 0
    assert sorted(p.name for p in folder.iterdir()) == ["best.ckpt", "last.ckpt"]
    err = capsys.readouterr().err
    assert stop.value.code == 1
    assert f"saving checkpoint {folder / 'last.ckpt'} failed (No space left on device)" in err


# ------------------------------------------------------------------- every suite strategy
@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_every_suite_strategy_has_the_suite_checkpoint_io(name):
    by_class = SYSTEMS[name].strategy()
    by_name = StrategyRegistry.get(SYSTEMS[name].registered_as)
    for strategy in (by_class, by_name):
        assert isinstance(strategy.checkpoint_io, SuiteCheckpointIO)
    with pytest.raises(ConfigError, match="checkpoint_io=TorchCheckpointIO.*SuiteCheckpointIO"):
        by_class.checkpoint_io = TorchCheckpointIO()  # what Trainer(plugins=[...]) does


def test_a_trainer_plugin_that_would_load_in_full_is_refused():
    with pytest.raises(ConfigError, match="subclass SuiteCheckpointIO"):
        L.Trainer(strategy="single", plugins=[TorchCheckpointIO()], logger=False)


# -------------------------------------------------------------------- weights-only loads
@pytest.fixture
def served(tmp_path):
    """A URL prefix under which an HTTP server on 127.0.0.1 serves the files of ``tmp_path``."""
    handler = functools.partial(_QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.mark.parametrize("form", ["path", "file_url", "http_url"])
def test_the_strategy_loads_a_checkpoint_weights_only_whatever_its_path(tmp_path, served, form):
    """``Trainer.fit(ckpt_path=...)`` loads through ``strategy.load_checkpoint`` with
    ``weights_only=None``: Lightning alone unpickles a URL in full (its payload runs)."""
    path, marker = _payload_checkpoint(tmp_path)
    given = {"path": str(path), "file_url": path.as_uri(), "http_url": f"{served}/{path.name}"}
    strategy = SYSTEMS["single"].strategy()
    with pytest.raises(UnsafeFileError, match="was refused.*GLOBAL exec") as refused:
        strategy.load_checkpoint(given[form])
    assert "add_safe_globals" not in str(refused.value)  # never advise allowing exec
    assert not marker.exists(), "the checkpoint's payload ran"


def test_a_safe_checkpoint_loads_from_a_url_and_weights_only_false_is_refused(tmp_path, served):
    path = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"w": torch.arange(3.0)}, "epoch": 2}, path)
    io_ = SuiteCheckpointIO()
    loaded = io_.load_checkpoint(f"{served}/good.ckpt")
    assert loaded["epoch"] == 2 and torch.equal(loaded["state_dict"]["w"], torch.arange(3.0))
    with pytest.raises(ValueError, match="weights_only=False.*add_safe_globals"):
        io_.load_checkpoint(path, weights_only=False)


def test_a_url_that_never_answers_or_sends_too_much_fails_naming_it(tmp_path, served, monkeypatch):
    """A fetch is bounded: a server that accepts and never answers times out (it does not hang
    every rank), and a body larger than the room beside the download is refused."""
    silent = socket.create_server(("127.0.0.1", 0))  # listens, never accepts: no answer comes
    with silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/x.ckpt"
        with pytest.raises(OSError, match=f"fetching checkpoint {url} failed.*timed out"):
            checkpoints.fetch_url(url, tmp_path / "fetched", timeout_s=0.2)
    (tmp_path / "big.ckpt").write_bytes(bytes(4096))
    usage = shutil.disk_usage(tmp_path)  # a disk with 1000 bytes of room beyond what stays free
    room = usage._replace(free=checkpoints.URL_KEEP_FREE_BYTES + 1000)
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda path: room)
    with pytest.raises(OSError, match="announces 4096 bytes, .* fit beside"):
        checkpoints.fetch_url(f"{served}/big.ckpt", tmp_path / "fetched")


@dataclasses.dataclass
class _Custom:
    """A user's own class in a checkpoint (plain pickling: no code of its own runs)."""

    value: int


def test_a_class_of_the_users_is_named_with_how_to_allow_it(tmp_path):
    path = tmp_path / "custom.ckpt"
    torch.save({"state_dict": {}, "extra": _Custom(3)}, path)
    name = f"{__name__}._Custom"
    with pytest.raises(UnsafeFileError, match=rf"add_safe_globals\(\[{name}\]\)"):
        SuiteCheckpointIO().load_checkpoint(path)
    with torch.serialization.safe_globals([_Custom]):
        assert SuiteCheckpointIO().load_checkpoint(path)["extra"] == _Custom(3)


# ------------------------------------------------------------------ paths in a checkpoint
class _Toy(L.LightningModule):
    """A linear model whose validation accuracy is fixed by ``acc``: enough for the
    checkpoint callbacks."""

    def __init__(self, acc: float = 0.5):
        super().__init__()
        self.net = torch.nn.Linear(2, 1)
        self.acc = acc

    def training_step(self, batch, _):
        return self.net(batch[0]).sum()

    def validation_step(self, batch, _):
        self.log("val/acc", self.acc)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(2, 2)))

    def val_dataloader(self):
        return self.train_dataloader()


def _fit(folder: Path, epochs: int, identity: dict, ckpt_path=None, acc: float = 0.5) -> Path:
    checkpoints = folder / "checkpoints"
    best = BestCheckpoint(
        dirpath=checkpoints, monitor="val/acc", mode="max", filename="best",
        save_on_train_epoch_end=True,
    )  # fmt: skip
    trainer = L.Trainer(
        max_epochs=epochs,
        callbacks=[CheckpointIdentity(identity), best, LastCheckpoint(checkpoints)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=folder,
        accelerator="cpu",
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|exists and is not empty)")
        trainer.fit(_Toy(acc), ckpt_path=ckpt_path, weights_only=True)
    return checkpoints


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory) -> Path:
    """A finished 1-epoch run: its checkpoints folder (best.ckpt, last.ckpt)."""
    return _fit(tmp_path_factory.mktemp("earlier"), 1, {"run": "a"})


def _with_best_state(source: Path, target: Path, **state) -> Path:
    """``source`` with its BestCheckpoint state changed as ``state`` says, saved to ``target``
    (what anyone can write: plain data)."""
    checkpoint = torch.load(source, weights_only=True)
    key = next(k for k in checkpoint["callbacks"] if k.startswith("BestCheckpoint"))
    checkpoint["callbacks"][key].update(state)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, target)
    return target


def test_a_best_model_path_in_a_checkpoint_copies_nothing_into_the_run(tmp_path, earlier_run):
    """``best_model_path=/etc/shadow`` in a resumed checkpoint: nothing is copied; with no
    best.ckpt beside the given ckpt_path the run says so and carries no best."""
    secret = tmp_path / "shadow"
    secret.write_text("root:secret")
    evil = _with_best_state(
        earlier_run / "last.ckpt",
        tmp_path / "evil" / "last.ckpt",
        best_model_path=str(secret),
        dirpath="/nonexistent",
    )
    with pytest.warns(UserWarning, match=r"best\.ckpt \(beside ckpt_path\) does not exist"):
        checkpoints = _fit(tmp_path / "new", 2, {"run": "a"}, ckpt_path=evil)
    assert not (checkpoints / "shadow").exists()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best.ckpt", "last.ckpt"]
    assert read_checkpoint(checkpoints / "best.ckpt")["epoch"] == 1  # the resumed epoch's


def test_the_best_beside_ckpt_path_is_carried_when_it_is_the_same_runs(tmp_path, earlier_run):
    checkpoints = _fit(
        tmp_path / "new", 2, {"run": "a"}, ckpt_path=earlier_run / "last.ckpt", acc=0.1
    )
    assert (checkpoints / "best.ckpt").read_bytes() == (earlier_run / "best.ckpt").read_bytes()


def test_a_best_from_another_run_beside_ckpt_path_is_refused(tmp_path, earlier_run):
    other = _fit(tmp_path / "other", 1, {"run": "b"}, acc=0.9)
    folder = tmp_path / "copied"
    folder.mkdir()
    shutil.copy(earlier_run / "last.ckpt", folder / "last.ckpt")
    shutil.copy(other / "best.ckpt", folder / "best.ckpt")
    with pytest.warns(UserWarning, match="best.ckpt was written by a different run"):
        checkpoints = _fit(tmp_path / "new", 2, {"run": "a"}, ckpt_path=folder / "last.ckpt")
    best = read_checkpoint(checkpoints / "best.ckpt")
    assert best["epoch"] == 1 and best["lightning_gnnscale"]["identity"] == {"run": "a"}
