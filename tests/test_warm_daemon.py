"""The opt-in warm server (``python -m lightning_gnnscale.warm``): ``train.py`` hands its run to
it, with the same results as a cold start, and the run's end, signals and death follow the
command that handed it over. One real server for the module (its imports cost ~10 s); the
commands are real ``python train.py`` processes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from lightning_gnnscale import warm_client
from tests.helpers.config import REPO, TINY
from tests.helpers.scripts import run_script

WARM = [sys.executable, "-m", "lightning_gnnscale.warm"]
TRAIN = [sys.executable, str(REPO / "train.py")]
LONG = [*(o for o in TINY if not o.startswith("trainer.max_epochs")), "trainer.max_epochs=100000"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A started server whose socket folder is private to this module: ``(env, folder)``."""
    folder = tmp_path_factory.mktemp("warm") / "sockets"  # start creates it, mode 0700
    env = {**os.environ, warm_client.DIR_ENV: str(folder)}
    env.pop(warm_client.DISABLE_ENV, None)
    started = subprocess.run(
        [*WARM, "start", "--idle-minutes", "10"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert started.returncode == 0, started.stderr
    pid = _status(folder)["server"]
    yield env, folder
    subprocess.run([*WARM, "stop"], cwd=REPO, env=env, timeout=60)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)


def _status(folder: Path) -> dict:
    answer = warm_client.request({"op": "status"}, folder=folder)
    assert answer is not None, "no warm server answers"
    return answer


def _train(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TRAIN, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def _same_in_every_run(summary):
    """The summary without what differs between identical runs (times, memory, ids, paths)."""
    if isinstance(summary, dict):
        return {
            key: _same_in_every_run(value)
            for key, value in summary.items()
            if not key.endswith(("_s", "_rss_mb")) and key not in {"run_id", "output_dir"}
        }
    if isinstance(summary, list):
        return [_same_in_every_run(value) for value in summary]
    return summary


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_warm_runs_match_a_cold_run_and_run_side_by_side(server, tmp_path):
    env, folder = server
    served = _status(folder)["served"]
    args = ["strategy=ddp", "dtype=float64", *TINY]
    # two runs at once through the server, each in a folder named by its own run token
    runs = [
        subprocess.Popen(
            [*TRAIN, *args, f"hydra.run.dir={tmp_path}/warm{i}/${{run_token:}}"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [run.communicate(timeout=240) for run in runs]
    for run, (out, err) in zip(runs, outputs):
        assert run.returncode == 0, err[-3000:]
        assert "summary:" in out and "not used" not in err
    assert _status(folder)["served"] == served + 2  # both were handed over
    warm = [next((tmp_path / f"warm{i}").glob("*/summary.json")) for i in range(2)]
    assert warm[0].parent.name != warm[1].parent.name  # two tokens, as two cold starts have
    cold = run_script("train.py", *args, f"hydra.run.dir={tmp_path}/cold", cwd=REPO, timeout=240)
    assert cold.returncode == 0, cold.stderr[-3000:]
    expected = _same_in_every_run(json.loads((tmp_path / "cold" / "summary.json").read_text()))
    for path in warm:
        assert _same_in_every_run(json.loads(path.read_text())) == expected


def test_a_warm_run_logs_as_a_cold_one(server, tmp_path):
    """Lightning's lines reach the run's log file (Hydra's handlers), as in a cold run, where
    Lightning is imported after Hydra has configured logging."""
    env, folder = server
    served = _status(folder)["served"]
    args = ["strategy=single", "trainer.max_epochs=1", "logger=none", "trainer.devices=1"]
    proc = _train(env, *args, f"hydra.run.dir={tmp_path}/warm")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _status(folder)["served"] == served + 1
    log = (tmp_path / "warm" / "train.log").read_text()
    assert "[lightning.pytorch" in log and "`Trainer.fit` stopped" in log, log[-2000:]


def test_exit_status_and_error_come_back(server, tmp_path):
    env, folder = server
    served = _status(folder)["served"]
    proc = _train(env, "data.fanouts=[5]", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 1
    assert "one fanout per layer" in proc.stderr
    assert _status(folder)["served"] == served + 1


def test_a_server_that_does_not_match_is_not_used(server):
    """Changed source or import-time environment: the run starts cold and says why, once."""
    env, folder = server
    served = _status(folder)["served"]
    config = REPO / "conf" / "config.yaml"
    before, text = os.stat(config), config.read_bytes()
    assert text.startswith(b"# lightning_gnnscale")
    try:  # an edit in a comment that keeps the size and the modification time
        with open(config, "r+b") as file:
            file.write(b"# L")
        os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
        proc = _train(env, "--help")
    finally:
        with open(config, "r+b") as file:
            file.write(text[:3])
        os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert proc.returncode == 0 and "Powered by Hydra" in proc.stdout  # ran, cold
    stale = [line for line in proc.stderr.splitlines() if "warm server" in line]
    assert len(stale) == 1 and "source changed" in stale[0], proc.stderr
    assert "python -m lightning_gnnscale.warm stop" in stale[0]

    proc = _train({**env, "TORCH_SHOW_CPP_STACKTRACES": "1"}, "--help")
    assert proc.returncode == 0 and "import-time environment" in proc.stderr

    if shutil.which("unshare") and os.geteuid() == 0:  # a network namespace of its own
        proc = subprocess.run(
            ["unshare", "--net", *TRAIN, "--help"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0 and "other Linux namespaces" in proc.stderr, proc.stderr

    proc = _train({**env, warm_client.DISABLE_ENV: "0"}, "--help")
    assert proc.returncode == 0 and "warm server" not in proc.stderr  # off: silent, cold
    assert _status(folder)["served"] == served  # none of them was handed over


def _start_long_run(env: dict, tmp_path: Path, folder: Path):
    """A client whose run has launched its two ranks; ``(client, run pid, its processes)``."""
    runs = set(_status(folder)["runs"])
    client = subprocess.Popen(
        [*TRAIN, *LONG, f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pid = _wait_for(lambda: set(_status(folder)["runs"]) - runs, 60, "the run").pop()
    # the run, its rank server and two ranks (and what torch starts in them)
    processes = _wait_for(lambda: len(d := _descendants(pid)) >= 3 and d, 120, "the ranks")
    return client, pid, processes | {pid}


def test_the_run_and_its_ranks_die_with_the_client(server, tmp_path):
    env, folder = server
    client, pid, processes = _start_long_run(env, tmp_path, folder)
    client.kill()
    client.wait()
    _wait_for(lambda: not any(_alive(p) for p in processes), 30, "the run's processes to end")
    _wait_for(lambda: pid not in _status(folder)["runs"], 10, "the server to reap the run")
    assert _alive(_status(folder)["server"])  # the server lives on


def test_signals_are_forwarded_to_the_run(server, tmp_path):
    env, folder = server
    client, pid, processes = _start_long_run(env, tmp_path, folder)
    client.send_signal(signal.SIGTERM)
    # the run ended on the signal (as a cold run does) and the client took its status; a
    # client that kept SIGTERM for itself would have died of it (-SIGTERM)
    assert client.wait(timeout=60) not in (0, -signal.SIGTERM)
    _wait_for(lambda: not any(_alive(p) for p in processes), 30, "the run's processes to end")


def test_a_warm_script_takes_its_temporary_folder_from_its_own_environment(tmp_path):
    """As a fresh interpreter does: ``tempfile`` reads the run's ``$TMPDIR``, not the folder
    the server chose when it started (torch's error files of a launch go there)."""
    script = tmp_path / "where.py"
    script.write_text("import tempfile\nprint(tempfile.gettempdir())\n")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = run_script(script, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(tmp_path)


def test_socket_folder_must_be_private(tmp_path, monkeypatch):
    folder = tmp_path / "open"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    monkeypatch.setenv(warm_client.DIR_ENV, str(folder))
    with pytest.raises(PermissionError, match="mode 0700"):
        warm_client.socket_dir()
    assert warm_client.connect() is None  # train.py then runs cold


def test_a_source_edit_that_keeps_size_and_mtime_shows(tmp_path, monkeypatch):
    """The source part of the fingerprint hashes the files' bytes, not their stat."""
    package = tmp_path / "lightning_gnnscale"
    (tmp_path / "conf").mkdir()
    package.mkdir()
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "conf" / "config.yaml").write_text("seed: 0\n")
    module = package / "module.py"
    module.write_text("VALUE = 1\n")
    monkeypatch.setattr(warm_client, "PACKAGE_DIR", package)
    monkeypatch.setattr(warm_client, "REPO_DIR", tmp_path)
    before, stat_before = warm_client.fingerprint(), os.stat(module)
    module.write_text("VALUE = 2\n")  # same size
    os.utime(module, ns=(stat_before.st_atime_ns, stat_before.st_mtime_ns))
    assert os.stat(module).st_size == stat_before.st_size
    assert os.stat(module).st_mtime_ns == stat_before.st_mtime_ns
    after = warm_client.fingerprint()
    assert warm_client.mismatch(after, before) == warm_client.MISMATCH["source"]


def _cgroup_v2_child(name: str) -> Path:
    """A new cgroup v2 child of this process's cgroup (its folder), or a skip saying why."""
    own = next(
        (
            line[3:]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line[:3] == "0::"
        ),
        None,
    )
    mounts = [
        line.split(" - ")[0].split()
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.partition(" - ")[2].startswith("cgroup2 ")
    ]
    if own is None or not mounts:
        pytest.skip("no cgroup v2 here (/proc/self/cgroup has no 0:: line or no cgroup2 mount)")
    root, point = mounts[0][3], Path(mounts[0][4])
    relative = os.path.relpath(own, root)
    if relative.startswith(".."):
        pytest.skip(f"this process's cgroup v2 {own} is outside the cgroup2 mount at {point}")
    child = (point / relative / name).resolve()
    try:
        child.mkdir()
    except OSError as error:
        reason = f"cannot create a cgroup v2 child {child}: {error}"
        print(reason)
        pytest.skip(reason)
    return child


# ``python -c`` that hands the script argv[1] off as train.py does, and prints "cold" if none took it
_HAND_OFF = f"""import importlib.util, sys
spec = importlib.util.spec_from_file_location("warm_client", {warm_client.__file__!r})
client = importlib.util.module_from_spec(spec)
spec.loader.exec_module(client)
client.hand_off(sys.argv[1])
print("cold")
"""


def test_a_command_in_another_cgroup_runs_cold(server, tmp_path):
    """A run handed to the server would run in the server's cgroups, under its limits: a
    command in a child cgroup runs cold and says which cgroups differ."""
    from lightning_gnnscale.cluster import memory

    env, folder = server
    served = _status(folder)["served"]
    script = tmp_path / "script.py"
    script.write_text("print('handed over')\n")
    command = [sys.executable, "-c", _HAND_OFF, str(script)]
    here = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert here.stdout == "handed over\n", here.stderr  # from this cgroup: the server runs it
    child = _cgroup_v2_child(f"lgc-warm-test-{os.getpid()}")
    try:
        proc = subprocess.run(
            memory.joined(child, command),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        memory.remove(child)
    assert proc.returncode == 0 and proc.stdout == "cold\n", proc.stderr
    said = [line for line in proc.stderr.splitlines() if "warm server" in line]
    assert len(said) == 1 and "cgroups differ" in said[0], proc.stderr
    assert f"/{child.name} (the server's: " in said[0], said[0]
    assert _status(folder)["served"] == served + 1


def test_a_malformed_run_request_leaves_the_server_serving(server):
    """A request that matches the fingerprint but lacks the run's fields is refused, and the
    server serves on (it once forked, then failed on the missing command line)."""
    _env, folder = server
    served = _status(folder)["served"]
    sock = warm_client.connect(folder=folder)
    assert sock is not None
    with sock:
        fingerprint = _status(folder)["fingerprint"]  # what it accepts
        warm_client.send(sock, {"op": "run", "fingerprint": fingerprint, "stdio": []})
        assert warm_client.receive(sock) == (None, [])  # closed, nothing started
    assert _status(folder)["served"] == served


def test_a_foreign_socket_folder_is_named_not_a_traceback(tmp_path, monkeypatch, capsys):
    """Another user's ``lightning_gnnscale-<uid>`` folder in the temporary directory: start,
    status and stop say which folder and what is wrong (owner or mode), and train.py's
    hand-off runs cold saying the same."""
    from lightning_gnnscale import warm

    monkeypatch.delenv(warm_client.DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    folder = tmp_path / f"lightning_gnnscale-{os.getuid()}"
    folder.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(folder, 65534, 65534)
        wrong = "is owned by uid 65534, not by you"
    else:  # a loose mode is all a non-root user can make here
        folder.chmod(0o755)
        wrong = "has mode 0755 (others can enter it)"
    for command in ("start", "status", "stop"):
        assert warm.main([command]) == 1
        err = capsys.readouterr().err
        assert f"{folder} {wrong}" in err and "Traceback" not in err, err
    assert warm_client.connect() is None
    assert f"not used: the warm server's folder {folder} {wrong}" in capsys.readouterr().err


def test_a_silent_client_holds_no_one_up(tmp_path_factory, monkeypatch, capsys):
    """A client that connects and sends nothing (or half a request) holds no one up: the
    server answers ``warm status`` meanwhile (it once waited 10 s for the first, so status said
    no server was running), and drops such a client at its deadline."""
    from lightning_gnnscale import warm

    folder = tmp_path_factory.mktemp("ws")
    folder.chmod(0o700)
    monkeypatch.setenv(warm_client.DIR_ENV, str(folder))
    lock_fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    server = warm.Server(folder, 600.0, warm_client.fingerprint(), lock_fd)
    serving = threading.Thread(target=server.serve, daemon=True)
    serving.start()
    clients = []

    def connect(partial: bytes) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        clients.append(sock)
        sock.connect(str(server.path))
        sock.sendall(partial)
        return sock

    try:
        # accepted before status's connection (the listen queue is first come, first served)
        early = [connect(b""), connect(struct.pack("!I", 100) + b'{"op": ')]
        assert warm.main(["status"]) == 0
        out = capsys.readouterr().out
        assert f"pid:          {os.getpid()}" in out, out
        for sock in early:
            sock.close()
        monkeypatch.setattr(warm, "REQUEST_DEADLINE_S", 0.2)  # for the connections below
        for late in (connect(b""), connect(struct.pack("!I", 100) + b'{"op": ')):
            late.settimeout(60)
            assert late.recv(1) == b""  # dropped
        assert warm_client.request({"op": "stop"}, folder=folder) is not None
        serving.join(timeout=60)
        assert not serving.is_alive()
        out += capsys.readouterr().out
        assert out.count("no whole request within 0.2 s") == 2, out
    finally:
        for sock in clients:
            sock.close()
        if serving.is_alive():
            server.stop()
        os.close(lock_fd)


def test_stop_ends_the_server_and_removes_its_socket(server):
    env, folder = server
    pid = _status(folder)["server"]
    proc = subprocess.run([*WARM, "stop"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and f"pid {pid} stopped" in proc.stdout
    assert not warm_client.socket_path(folder).exists()
    _wait_for(lambda: not _alive(pid), 10, "the server to end")
    assert warm_client.request({"op": "status"}, folder=folder) is None
