"""Ranks forked from the rank server can use CUDA: where an NVIDIA GPU is present the server
imports only torch and Lightning (a child forked after PyG's import could not use CUDA on an
H100), and a rank that still cannot initialise CUDA says how to start ranks instead
(docs/architecture.md, "Launching").

This machine has no GPU: the tests pin the rule (which modules, when) and run the reduced
server's ranks; scripts/gpu_check.sh probes the modules and runs 2-rank jobs on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from multiprocessing import forkserver
from pathlib import Path

import pytest
import torch

from lightning_gnnscale import launch, warm
from tests.helpers.config import REPO


@pytest.fixture
def preload_asked(monkeypatch) -> list:
    """What ``start_rank_server`` asks the forkserver to import (none is started)."""
    asked = []
    monkeypatch.setattr(forkserver, "set_forkserver_preload", asked.append)
    monkeypatch.setattr(forkserver, "ensure_running", lambda: None)
    return asked


def test_with_an_nvidia_gpu_the_server_imports_only_the_cuda_safe_modules(
    monkeypatch, preload_asked
):
    monkeypatch.setattr(launch, "nvidia_gpu_present", lambda: True)
    launch.start_rank_server(("lightning_gnnscale.systems.distdgl.strategy",))
    assert preload_asked == [list(launch.CUDA_SAFE_PRELOAD)]
    assert not {"torch_geometric", "lightning_gnnscale.run"} & set(warm.preload())


def test_without_one_the_server_imports_everything_a_rank_needs(monkeypatch, preload_asked):
    monkeypatch.setattr(launch, "nvidia_gpu_present", lambda: False)
    launch.start_rank_server(("lightning_gnnscale.systems.distdgl.strategy",))
    expected = [*launch.RANK_SERVER_PRELOAD, "lightning_gnnscale.systems.distdgl.strategy"]
    assert preload_asked == [expected]
    assert {"torch_geometric", "lightning_gnnscale.run"} <= set(warm.preload())


@pytest.mark.parametrize(
    ("visible", "driver", "expected"),
    [
        (None, True, True),
        ("0", True, True),
        ("", True, False),
        ("-1", True, False),
        (" ", True, False),
        ("-1,0", True, False),
        ("GPU-8c6bd1a2", True, True),
        (None, False, False),
    ],
)
def test_an_nvidia_gpu_is_present_when_a_driver_shows_and_a_device_is_visible(
    monkeypatch, visible, driver, expected
):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(launch.os.path, "exists", lambda path: driver and "nvidia" in path)
    assert launch.nvidia_gpu_present() is expected


def test_a_forked_rank_that_cannot_initialise_cuda_says_how_to_start_ranks(monkeypatch):
    def broken_init():
        raise RuntimeError("CUDA error: initialization error")

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "init", broken_init)
    with pytest.raises(RuntimeError, match=r"initialization error.*launcher.start_method=spawn"):
        launch.check_cuda_after_fork()


def test_another_cuda_failure_is_left_to_lightning(monkeypatch):
    def old_driver():
        raise RuntimeError("The NVIDIA driver on your system is too old")

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "init", old_driver)
    launch.check_cuda_after_fork()  # no advice to spawn: a spawned rank would fail alike


@pytest.mark.parametrize("forked", [True, False])
def test_a_rank_checks_cuda_first_when_it_was_forked(monkeypatch, forked):
    """``_rank_main``: the check runs before the payload is loaded, and only for forked ranks."""
    calls = []
    monkeypatch.setenv("LOCAL_RANK", "0")  # restored afterwards; _rank_main sets it
    monkeypatch.setattr(launch, "_die_with_parent", lambda pid: None)
    monkeypatch.setattr(launch, "adopt_launcher_state", lambda env, stdio: None)
    monkeypatch.setattr(launch, "adopt_launcher_logging", lambda logging, rank: None)
    monkeypatch.setattr(launch, "check_cuda_after_fork", lambda: calls.append("check"))
    payload = (lambda: calls.append("job"), ())
    monkeypatch.setattr(launch, "load_payload", lambda *a: calls.append("load") or payload)
    launch._rank_main(
        0,
        {"env": {"NODE_RANK": "0"}, "stdio": (1, 2), "forked": forked, "logging": {}},
        0,
        [b""],
        [],
    )
    assert calls == (["check", "load", "job"] if forked else ["load", "job"])


def test_without_a_cuda_device_the_rank_initialises_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "init", lambda: pytest.fail("CUDA initialised"))
    launch.check_cuda_after_fork()


def report_modules_at_start(out_dir: str) -> None:
    """One rank's view: which of PyG and the suite's runtime its server had imported; then
    that it imports them itself."""
    had = [m for m in ("torch_geometric", "lightning_gnnscale.run") if m in sys.modules]
    import lightning_gnnscale.run  # noqa: F401  (what each rank now imports itself, PyG too)

    Path(out_dir, f"rank{os.environ['LOCAL_RANK']}.json").write_text(json.dumps(had))


LAUNCH_AS_ON_A_GPU_MACHINE = r"""
import sys
from lightning_gnnscale import launch
from tests.test_cuda_fork import report_modules_at_start
launch.nvidia_gpu_present = lambda: True
launch.launch_local(report_modules_at_start, (sys.argv[1],), 2, 1, 300, "forkserver")
"""


@pytest.mark.e2e
def test_ranks_forked_from_the_cuda_safe_server_import_the_rest_themselves(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCH_AS_ON_A_GPU_MACHINE, str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)] == [[], []]


GUARD_AFTER_PYARROW = r"""
import sys
import pyarrow
import lightning_gnnscale.rank_server_guard
assert sys.modules["pyarrow"] is pyarrow, sys.modules.get("pyarrow")
"""

GUARD_ALONE = r"""
import sys
import lightning_gnnscale.rank_server_guard
import pandas.compat
assert "pyarrow" not in sys.modules and not pandas.compat.HAS_PYARROW
import pyarrow  # the block is lifted: a rank that needs it imports it
"""


@pytest.mark.parametrize("script", [GUARD_AFTER_PYARROW, GUARD_ALONE])
def test_the_rank_server_guard_imports_pandas_without_pyarrow_and_keeps_an_earlier_one(script):
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
