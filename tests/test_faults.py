"""Faults and bad inputs: runs never share a folder, checkpoints are what they claim, a stuck
or orphaned rank never hangs the job (docs/testing.md, "faults and bad inputs")."""

import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lightning_gnnscale.preflight import ConfigError, check_config, validate
from lightning_gnnscale.run import claimed, read_summary, train
from tests.helpers.config import REPO, make_cfg
from tests.helpers.scripts import ScriptRun, start_script

TINY_CLI = (
    "dataset.num_nodes=300",
    "dataset.num_features=8",
    "data.batch_size=64",
    "trainer.enable_progress_bar=false",
    "logger=none",
    "launcher.timeout_s=240",
)


def _ckpt(output_dir: Path, name: str = "last") -> dict:
    return torch.load(output_dir / "checkpoints" / f"{name}.ckpt", weights_only=False)


# ---------------------------------------------------------------------- output folders
@pytest.mark.e2e
def test_runs_started_together_get_their_own_folders(tmp_path):
    """Two `train.py` runs started in the same second: two folders, each with its own result
    (both forked warm, :func:`tests.helpers.scripts.start_script`: the folder is claimed by
    train.py's own code, whatever imported it)."""
    args = ["strategy=single", "trainer.max_epochs=1", *TINY_CLI]
    starts = [
        start_script(REPO / "train.py", *args, f"seed={seed}", cwd=tmp_path) for seed in (0, 1)
    ]
    done = [run.wait(timeout=300) for run in starts]
    outputs = [(d.stdout, d.stderr) for d in done]
    assert all(d.returncode == 0 for d in done), outputs[0][1][-2000:] + outputs[1][1][-2000:]
    summaries = sorted((tmp_path / "outputs").glob("*/*/summary.json"))
    assert len(summaries) == 2
    seeds = [OmegaConf.load(s.parent / ".hydra" / "config.yaml").seed for s in summaries]
    assert sorted(seeds) == [0, 1]
    assert len({json.loads(s.read_text())["run_id"] for s in summaries}) == 2
    printed = sorted(
        line.split()[-1]
        for out, _ in outputs
        for line in out.splitlines()
        if line.startswith("summary:")
    )
    assert printed == sorted(str(s) for s in summaries)  # each run reports its own file


def test_an_output_folder_in_use_is_refused(tmp_path):
    with (
        claimed(tmp_path),
        pytest.raises(ConfigError, match="in use by another run"),
        claimed(tmp_path),
    ):
        pass
    with claimed(tmp_path):  # released: a later run may reuse the folder (resume)
        pass


def _hydra_main(*overrides: str) -> int:
    """``python train.py <overrides>`` in this process (Hydra's real entry, callbacks and all);
    returns its exit code. Hydra's logging is left off so the test process keeps its own."""
    import runpy

    from hydra.core.global_hydra import GlobalHydra

    argv = sys.argv
    sys.argv = [
        "train.py",
        "hydra/hydra_logging=disabled",
        "hydra/job_logging=disabled",
        *overrides,
    ]
    try:
        runpy.run_path(str(REPO / "train.py"), run_name="__main__")
    except SystemExit as stop:
        return int(stop.code or 0)
    finally:
        sys.argv = argv
        GlobalHydra.instance().clear()
    return 0


def test_a_run_refused_for_a_busy_folder_leaves_that_folders_record_alone(tmp_path, capsys):
    """Another live run holds the folder: the refused run writes nothing into it (Hydra's
    `.hydra/` record and log file included), and says why in one line."""
    import fcntl

    busy = tmp_path / "busy"
    (busy / ".hydra").mkdir(parents=True)
    record = {name: f"{name}: the other run's" for name in ("config", "hydra", "overrides")}
    for name, text in record.items():
        (busy / ".hydra" / f"{name}.yaml").write_text(text)
    with open(busy / ".run.lock.node0", "a+") as other_run:
        fcntl.flock(other_run, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code = _hydra_main("strategy=single", "seed=5", f"hydra.run.dir={busy}")
    assert code == 1
    err = capsys.readouterr().err
    assert f"output folder {busy} is in use by another run" in err and "Traceback" not in err
    for name, text in record.items():
        assert (busy / ".hydra" / f"{name}.yaml").read_text() == text
    assert sorted(p.name for p in busy.iterdir()) == [".hydra", ".run.lock.node0"]


def test_an_unwritable_run_folder_is_named_before_anything_is_written(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code = _hydra_main("strategy=single", f"hydra.run.dir={blocker / 'run'}")
    err = capsys.readouterr().err
    assert code == 1
    assert f"run folder {blocker / 'run'} cannot be written" in err, err
    assert "Traceback" not in err and "Unable to configure handler" not in err
    cfg = make_cfg(tmp_path, "strategy=single", f"paths.output_dir={blocker / 'out'}")
    with pytest.raises(ConfigError, match=f"run folder {blocker / 'out'} cannot be written"):
        train(cfg)


@pytest.mark.parametrize(
    ("stop", "code", "what"),
    [
        (KeyboardInterrupt(), 130, "interrupted (Ctrl-C)"),
        (OSError(28, "No space left on device"), 1, "stopped by OSError"),
    ],
)
def test_a_stopped_run_says_what_happened_in_one_line(
    tmp_path, monkeypatch, capsys, stop, code, what
):
    import lightning_gnnscale.run as run_module

    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "last.ckpt").write_bytes(b"")

    def stopped(cfg, **kwargs):
        raise stop

    monkeypatch.setattr(run_module, "train", stopped)
    cfg = make_cfg(tmp_path, "strategy=single")
    with pytest.raises(SystemExit) as exit_info:
        run_module.run_from_command_line(cfg, check_config(cfg))
    assert exit_info.value.code == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert what in lines[0] and f"partial results in {out}" in lines[0]
    assert f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}" in lines[0]
    assert "run_from_command_line(cfg, run)" in (REPO / "train.py").read_text()


def test_a_summary_from_another_run_is_never_reported(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"run_id": "someone-else", "test_acc": 0.9}))
    with pytest.raises(RuntimeError, match="written by another run"):
        read_summary(path, "mine")
    path.write_text(json.dumps({"run_id": "mine", "test_acc": 0.5}))
    assert read_summary(path, "mine")["test_acc"] == 0.5


# ----------------------------------------------------------------------------- checkpoints
def test_last_checkpoint_is_the_last_epoch_and_resume_reports_the_whole_run(tmp_path):
    """`last.ckpt` holds the last completed epoch even when validation is every 2nd epoch and
    accuracy peaked earlier; resuming from it gives the uninterrupted run's summary."""
    run = ("strategy=single", "dtype=float64", "trainer.check_val_every_n_epoch=2")
    straight, _ = train(make_cfg(tmp_path / "a", *run, "trainer.max_epochs=5"))
    _, first = train(make_cfg(tmp_path / "b", *run, "trainer.max_epochs=3"))
    last = _ckpt(first["output_dir"])
    assert last["epoch"] == 2 and last["lightning_gnnscale"]["epochs_done"] == 3
    resumed, _ = train(
        make_cfg(
            tmp_path / "b",
            *run,
            "trainer.max_epochs=5",
            f"ckpt_path={first['output_dir'] / 'checkpoints' / 'last.ckpt'}",
        )
    )
    for key in ("epochs", "best_epoch", "best_val_acc", "test_acc", "val_acc", "train_loss"):
        assert resumed[key] == pytest.approx(straight[key], abs=1e-9), key
    strip = ("epoch_s", "elapsed_s")
    rows = [
        [{k: v for k, v in r.items() if k not in strip} for r in m["history"]]
        for m in (straight, resumed)
    ]
    assert len(rows[0]) == 5
    for a, b in zip(*rows):
        assert a.keys() == b.keys() and a["epoch"] == b["epoch"]
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-9)
        assert a["val_acc"] == b["val_acc"] and a["comm_bytes"] == b["comm_bytes"]


def test_best_checkpoint_stays_apart_from_last(tmp_path):
    """With a learning rate too small to move accuracy, the best epoch is the first; `last.ckpt`
    still moves on to the final epoch."""
    metrics, objects = train(
        make_cfg(tmp_path, "strategy=single", "model.lr=1e-12", "trainer.max_epochs=3")
    )
    assert metrics["best_epoch"] == 0
    assert _ckpt(objects["output_dir"], "best")["epoch"] == 0
    assert _ckpt(objects["output_dir"], "last")["epoch"] == 2


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("single")
    _, objects = train(make_cfg(tmp_path, "strategy=single", "trainer.max_epochs=2"))
    return objects["output_dir"] / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize(
    ("overrides", "differs"),
    [
        (("strategy=single", "model=sage"), "model.name"),
        (("strategy=single", "dataset.num_classes=4"), "dataset.num_classes"),
        (("strategy=single", "dtype=float64"), "dtype"),
        (("strategy=ddp",), "strategy.name"),
        (("strategy=single", "data.fanouts=[5,5]"), "data.fanouts"),
        (("strategy=single", "seed=3"), "seed"),
    ],
)
def test_a_checkpoint_from_another_run_is_refused(tmp_path, single_run, overrides, differs):
    cfg = make_cfg(tmp_path, *overrides, "trainer.max_epochs=4", f"ckpt_path={single_run}")
    with pytest.raises(ConfigError, match=f"different run.*{differs}: checkpoint"):
        validate(cfg)


def test_best_checkpoint_survives_a_resume_into_a_new_folder(tmp_path):
    """Every run has its own folder; the resumed run's `best.ckpt` is still the whole run's best
    (Lightning alone forgets the score when the folder changes)."""
    run = ("strategy=single", "model.lr=1e-12")
    _, first = train(make_cfg(tmp_path / "a", *run, "trainer.max_epochs=2"))
    last = first["output_dir"] / "checkpoints" / "last.ckpt"
    metrics, resumed = train(
        make_cfg(tmp_path / "b", *run, "trainer.max_epochs=4", f"ckpt_path={last}")
    )
    assert metrics["best_epoch"] == 0 and metrics["epochs"] == 4
    assert _ckpt(resumed["output_dir"], "best")["epoch"] == 0
    assert _ckpt(resumed["output_dir"], "last")["epoch"] == 3


def test_weights_from_starts_a_different_run_from_the_weights(tmp_path, single_run):
    """`weights_from` is the explicit way to take weights across runs: epoch 0, same tensors."""
    cfg = make_cfg(
        tmp_path,
        "strategy=ddp",
        "trainer.max_epochs=1",
        "model.lr=1e-12",
        f"weights_from={single_run}",
    )
    metrics, objects = train(cfg)
    assert metrics["epochs"] == 1
    source = torch.load(single_run, weights_only=False)["state_dict"]
    got = _ckpt(objects["output_dir"])["state_dict"]
    for name in source:
        torch.testing.assert_close(got[name], source[name], rtol=0, atol=1e-6)


def test_weights_that_do_not_fit_fail_before_any_rank_starts(tmp_path, single_run, monkeypatch):
    """A `weights_from` whose shapes differ from the model is named in the launcher."""

    def no_spawn(*args, **kwargs):
        raise AssertionError("ranks were started")

    monkeypatch.setattr("lightning_gnnscale.run.launch_local", no_spawn)
    cfg = make_cfg(tmp_path, "strategy=ddp", "model.hidden=8", f"weights_from={single_run}")
    with pytest.raises(ConfigError, match="does not fit this model"):
        train(cfg)


def test_resuming_a_finished_run_is_refused(tmp_path, single_run):
    cfg = make_cfg(tmp_path, "strategy=single", "trainer.max_epochs=2", f"ckpt_path={single_run}")
    with pytest.raises(ConfigError, match="already trained 2 epochs.*raise trainer.max_epochs"):
        validate(cfg)


def test_a_damaged_checkpoint_is_named(tmp_path, single_run):
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(single_run.read_bytes()[:1000])
    for key in ("ckpt_path", "weights_from"):
        cfg = make_cfg(tmp_path, "strategy=single", "trainer.max_epochs=4", f"{key}={broken}")
        with pytest.raises(ConfigError, match=f"checkpoint {broken} cannot be read"):
            validate(cfg)
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    cfg = make_cfg(tmp_path, "strategy=single", f"ckpt_path={foreign}")
    with pytest.raises(ConfigError, match=f"checkpoint {foreign} is not a Lightning checkpoint"):
        validate(cfg)


# ----------------------------------------------------------------------------- stuck ranks
def test_default_collective_timeout_fails_a_stuck_cpu_job_in_minutes(tmp_path):
    from lightning_gnnscale.comm import Comm
    from lightning_gnnscale.kit.strategies import MeteredDDPStrategy

    default = make_cfg(tmp_path, tiny=False).launcher.collective_timeout_s
    assert default <= 600
    for factory in (Comm.create, MeteredDDPStrategy):
        assert inspect.signature(factory).parameters["timeout_s"].default == default


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _rank_pids(launcher: subprocess.Popen | ScriptRun, timeout_s: float = 300) -> list[int]:
    """The launcher's ranks: the children of its rank server (multiprocessing's forkserver,
    or the warm launcher's fork of itself, which keeps the forkserver's command line), or
    under ``launcher.start_method=spawn`` its children running the spawn entry point.
    A forked rank exists only once the server has imported everything (a spawned one at once,
    importing afterwards), so on a loaded machine this waits longer than it did."""
    pid = launcher.pid if isinstance(launcher, subprocess.Popen) else launcher.processes[0].pid
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ranks = []
        for child in _children(pid):
            command = _cmdline(child)
            if "spawn_main" in command:
                ranks.append(child)
            elif "forkserver" in command:
                ranks.extend(_children(child))
        if len(ranks) == 2 and _alive(pid):
            return ranks
        time.sleep(0.5)
    raise AssertionError("the ranks did not start")


def _wait_for_training(run_dir: Path, timeout_s: float = 180) -> None:
    """Until the first epoch's checkpoint exists: the ranks are past their start-up."""
    deadline = time.monotonic() + timeout_s
    while not (run_dir / "checkpoints" / "last.ckpt").exists():
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.5)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _long_run(tmp_path: Path, *extra: str) -> list[str]:
    """``train.py``'s arguments for a run that trains until it is stopped, into ``tmp_path``."""
    return [*TINY_CLI, "trainer.max_epochs=200", f"hydra.run.dir={tmp_path / 'run'}", *extra]


def _launch(tmp_path: Path, *extra: str) -> subprocess.Popen:
    """``python train.py`` in a fresh interpreter: its own imports and its own cold rank
    server (the launch path the launcher-kill tests are about)."""
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *_long_run(tmp_path, *extra)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )


def _launch_warm(tmp_path: Path, *extra: str) -> ScriptRun:
    """The same ``train.py`` run forked from the warm rank server
    (:func:`tests.helpers.scripts.start_script`), with a warm rank server of its own: the
    launcher runs the same code (``launch_local``), without seconds of imports in it and its
    server. For the tests of what the launcher does with a stopped rank."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return start_script(REPO / "train.py", *_long_run(tmp_path, *extra), cwd=REPO, env=env)


def _stopped_now(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _stop_rank_one_then_fail(folder: Path) -> None:
    """Ranks of a launch: rank 1 writes its pid and waits; rank 0 stops it (SIGSTOP), waits
    until the kernel shows it stopped, then fails as its collective with rank 1 would."""
    pid_file = folder / "rank1.pid"
    if os.environ["LOCAL_RANK"] == "1":
        pid_file.write_text(str(os.getpid()))
        threading.Event().wait(300)  # the launcher kills it long before
        return
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "rank 1 did not start"
        time.sleep(0.05)
    peer = int(pid_file.read_text())
    os.kill(peer, signal.SIGSTOP)
    while not _stopped_now(peer):
        assert time.monotonic() < deadline, "rank 1 did not stop"
        time.sleep(0.05)
    raise RuntimeError("[gloo] Timed out waiting 8000ms for send operation to complete")


def test_the_error_names_the_stopped_rank_not_the_one_that_timed_out(tmp_path):
    """Rank 1 stopped, rank 0's send to it timed out: the launcher's error names rank 1 (and
    its pid) as the cause, with rank 0's error beside it; rank 1 is killed and reaped."""
    from lightning_gnnscale.launch import RankStopped, launch_local

    pid_file = tmp_path / "rank1.pid"
    try:
        with pytest.raises(RankStopped) as raised:
            launch_local(_stop_rank_one_then_fail, (tmp_path,), 2, 1, timeout_s=240)
        peer = int(pid_file.read_text())
        message = str(raised.value)
        assert message.startswith(f"rank 1 (pid {peer}) stopped answering"), message
        assert "rank 0 failed meanwhile: RuntimeError: [gloo] Timed out" in message, message
        assert "Process 0 terminated" in str(raised.value.__cause__)  # torch's, kept as cause
        assert not _alive(peer), "the stopped rank outlived its launch"
    finally:  # only a rank the launcher failed to reap can still be there, stopped
        if pid_file.exists() and _stopped_now(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.mark.e2e
def test_a_stopped_rank_fails_the_job_within_the_collective_timeout(tmp_path):
    from lightning_gnnscale.launch import RANK_EXIT_GRACE_S

    launcher = _launch_warm(tmp_path, "launcher.collective_timeout_s=8")
    ranks = _rank_pids(launcher)
    _wait_for_training(tmp_path / "run")
    os.kill(ranks[1], signal.SIGSTOP)
    start = time.monotonic()
    done = launcher.wait(timeout=180)
    err = done.stderr
    assert done.returncode != 0
    # The collective timeout, the grace before SIGTERM and before SIGKILL, and 15 s of slack.
    bound = 8 + 2 * RANK_EXIT_GRACE_S + 15
    assert time.monotonic() - start < bound, "the job outlived its collective timeout"
    assert not any(_alive(pid) for pid in ranks), "a rank outlived its launcher"
    assert not list(tmp_path.glob("pytorch-errorfile-*")), "torch's error files were left behind"
    # The stopped rank is named, not the rank whose collective with it timed out.
    assert f"(pid {ranks[1]}) stopped answering" in err, err[-3000:]


@pytest.mark.e2e
def test_a_stopped_bytegnn_peer_ends_the_job_within_one_collective_timeout(tmp_path):
    """ByteGNN (sampling threads, socket graph store, gradient all-reduce): a peer stopped with
    SIGSTOP mid-training ends the survivor within 1.3x the collective timeout, with an error that
    names the timeout, and the launcher then kills the stopped rank at once (it can neither exit
    within the grace nor handle SIGTERM): the job ends within 1.3x the timeout plus 4 s, not the
    timeout plus the 2 x 5 s grace it took before (docs/systems/bytegnn.md)."""
    timeout = 5
    run = _launch_warm(tmp_path, "strategy=bytegnn", f"launcher.collective_timeout_s={timeout}")
    launcher = run.processes[0]
    ranks = _rank_pids(run)
    _wait_for_training(tmp_path / "run")
    os.kill(ranks[1], signal.SIGSTOP)
    start = time.monotonic()  # measured from the stop: start-up time does not count
    try:
        survivor_s = None
        while launcher.is_alive() and time.monotonic() - start < 120:
            if survivor_s is None and not _alive(ranks[0]):
                survivor_s = time.monotonic() - start
            time.sleep(0.05)
        job_s = time.monotonic() - start
        survivor_s = job_s if survivor_s is None else survivor_s
        done = run.wait(timeout=60)
        err = done.stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(ranks[1], signal.SIGKILL)
    assert done.returncode != 0
    assert "timed out" in err.lower() or "timeout" in err.lower(), err[-3000:]
    # 2 s for the survivor's exception path on a loaded machine; 2 s more for the launcher's
    # 1 s poll and the kill. Before, the job ended at the timeout plus 2 x RANK_EXIT_GRACE_S.
    assert survivor_s <= 1.3 * timeout + 2, f"the survivor ended {survivor_s:.1f} s after the stop"
    assert job_s <= 1.3 * timeout + 4, (
        f"the job ended {job_s:.1f} s after the stop (survivor {survivor_s:.1f} s)"
    )
    assert not any(_alive(pid) for pid in ranks), "a rank outlived its launcher"


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_launcher_takes_its_ranks_with_it(tmp_path, sig):
    launcher = _launch(tmp_path)
    ranks = _rank_pids(launcher)
    servers = [pid for pid in _children(launcher.pid) if "forkserver" in _cmdline(pid)]
    assert servers, "no rank server found"
    _wait_for_training(tmp_path / "run")
    os.kill(ranks[0], signal.SIGSTOP)  # a hung rank, as in a stuck collective
    launcher.send_signal(sig)
    launcher.wait(timeout=60)  # not communicate(): a forked descendant may hold stdout a moment
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in ranks + servers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in ranks), "orphaned ranks"
    assert not any(_alive(pid) for pid in servers), "an orphaned rank server"


def test_a_resumed_runs_config_hash_names_the_run_it_continues(tmp_path):
    """A resumed run can differ from an uninterrupted one (Grappa keeps the checkpoint's
    super-epoch length): their hashes differ, and so do resumes of different checkpoints."""
    from lightning_gnnscale.config_types import run_config
    from lightning_gnnscale.run import config_hash

    def ckpt(name: str, epochs_done: int, parent_hash: str) -> Path:
        path = tmp_path / f"{name}.ckpt"
        block = {"identity": {}, "config_hash": parent_hash, "epochs_done": epochs_done}
        torch.save({"state_dict": {}, "lightning_gnnscale": block}, path)
        return path

    def hash_of(*overrides: str) -> str:
        return config_hash(run_config(make_cfg(tmp_path, "strategy=grappa", *overrides)))

    straight = hash_of("trainer.max_epochs=8")
    four = hash_of("trainer.max_epochs=4")
    resumed = hash_of("trainer.max_epochs=8", f"ckpt_path={ckpt('a', 4, four)}")
    assert resumed != straight
    assert resumed == hash_of("trainer.max_epochs=8", f"ckpt_path={ckpt('b', 4, four)}")
    assert resumed != hash_of("trainer.max_epochs=8", f"ckpt_path={ckpt('c', 2, four)}")


def test_the_rendezvous_store_of_a_local_run_listens_on_loopback_only():
    from lightning_gnnscale.comm.rendezvous import loopback_store

    store, port = loopback_store()
    listening = [
        line.split()[1]
        for table in ("/proc/net/tcp", "/proc/net/tcp6")
        for line in Path(table).read_text().splitlines()[1:]
        if line.split()[3] == "0A" and line.split()[1].endswith(f":{int(port):04X}")
    ]
    assert listening == [f"0100007F:{int(port):04X}"], listening  # 127.0.0.1, nothing else
    store.set("k", "v")
    assert store.get("k") == b"v"
