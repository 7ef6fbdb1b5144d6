"""The malloc settings of a training process (``lightning_gnnscale/cpu_memory.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lightning_gnnscale import cpu_memory
from lightning_gnnscale.cpu_memory import MALLOC_ENV, retain_freed_memory
from lightning_gnnscale.errors import ConfigError

# In a fresh process: the page faults of the median one of 50 rounds that, like a training
# step, chain 4 MiB tensors (each made from the last, one freed midway, the rest at the end),
# after 10 warm-up rounds, with the settings applied or not. With glibc's defaults freed blocks
# go back to the kernel and fault in again in every round; retained, the warm-up rounds' pages
# serve the later rounds. The median leaves out a one-off heap step (CI once saw 16 MiB of
# growth in one of the 50 retained rounds, which a total over the rounds counted).
_FAULTS = """
import json, os, resource, sys, torch
from lightning_gnnscale.cpu_memory import retain_freed_memory
applied = retain_freed_memory() if sys.argv[1] == "retain" else "system"
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():
    x = torch.ones(1 << 20)  # 4 MiB
    y = x * 2
    z = y + 1
    del x
    w = z * 3
    del y, z, w
for _ in range(10):  # warm up: torch's first-use allocations, and the pages to retain
    step()
per_round = []
for _ in range(50):
    before = faults()
    step()
    per_round.append(faults() - before)
print(json.dumps({"applied": applied, "faults": sorted(per_round)[25]}))  # the median round
"""


def _run(script: str, mode: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``python -c script mode`` in a fresh process with ``env`` added to this one's."""
    return subprocess.run(
        [sys.executable, "-c", script, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )


def _faults(mode: str, **env: str) -> dict:
    out = _run(_FAULTS, mode, env)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_retained_memory_serves_later_steps_without_page_faults():
    # The baseline pins glibc's default 128 KiB mmap threshold, as a rank that never freed a
    # large block has it: left to adapt, glibc raises it at the first freed block, and the
    # baseline then varied between 100 and 2,000 faults per round from one process to the next.
    default = _faults("system", MALLOC_MMAP_THRESHOLD_="131072")
    retained = _faults("retain")
    assert retained["applied"] == "retain"
    pages = (4 << 20) // 4096  # of one tensor
    assert default["faults"] > pages  # glibc's defaults fault a tensor's pages in every round
    assert retained["faults"] < pages // 8  # warm pages serve the rounds


# In a fresh process: four threads, alive together, each allocating; then glibc's arenas.
_ARENAS = """
import ctypes, sys, threading
from lightning_gnnscale.cpu_memory import apply_malloc_settings
print(apply_malloc_settings(sys.argv[1] == "share"), flush=True)
barrier = threading.Barrier(4)
def work():
    blocks = [bytearray(1 << 20) for _ in range(4)]
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ctypes.CDLL(None).malloc_stats()  # one "Arena <i>:" line per arena, on stderr
"""


def _arenas(mode: str, **env: str) -> tuple[str, int]:
    out = _run(_ARENAS, mode, env)
    return out.stdout.strip(), out.stderr.count("Arena ")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_shared_arenas_keep_new_threads_in_the_existing_arena():
    """Retained, every arena keeps the most it held: ByteGNN's sampling threads, one arena
    each, kept the batches the trainer had freed (a full epoch of the bench graph peaked
    1324 MB against 1046 MB in one arena). A rank of a system that shares arenas starts with
    them shared, before its threads; others keep glibc's arena per thread."""
    assert _arenas("own") == ("retain", 5)  # glibc's default: an arena per thread
    assert _arenas("share") == ("retain", 1)
    assert _arenas("share", **{MALLOC_ENV: "system"}) == ("system", 5)


def test_only_bytegnn_shares_malloc_arenas():
    """The S-Worker's threads build the batches the trainer frees; no other system's threads
    hand the trainer what they allocate."""
    from lightning_gnnscale.systems.registry import SYSTEMS

    sharing = {n for n, spec in SYSTEMS.items() if spec.config_type.shares_malloc_arenas}
    assert sharing == {"bytegnn"}


def test_env_chooses_system_defaults_or_fails_on_a_bad_value(monkeypatch):
    monkeypatch.setenv(MALLOC_ENV, "system")
    assert retain_freed_memory() == "system"
    monkeypatch.setenv(MALLOC_ENV, "jemalloc")
    with pytest.raises(ConfigError, match="valid: retain, system"):
        retain_freed_memory()


def test_without_glibc_mallopt_nothing_is_set(monkeypatch):
    monkeypatch.delenv(MALLOC_ENV, raising=False)

    class NoMallopt:  # a C library without mallopt (musl)
        def __init__(self, name):
            pass

    monkeypatch.setattr(cpu_memory.ctypes, "CDLL", NoMallopt)
    assert retain_freed_memory() == "unavailable"


def test_a_refused_value_warns_and_says_so(monkeypatch):
    monkeypatch.delenv(MALLOC_ENV, raising=False)
    monkeypatch.setattr(cpu_memory.sys, "platform", "linux")

    class Refusing:  # glibc that rejects the value (32-bit builds cap the threshold at 512 KiB)
        def __init__(self, name):
            self.mallopt = lambda param, value: 0

    monkeypatch.setattr(cpu_memory.ctypes, "CDLL", Refusing)
    with pytest.warns(UserWarning, match="glibc refused mallopt"):
        assert retain_freed_memory() == "refused"


def test_train_refuses_a_bad_value_before_spawning_any_rank(tmp_path, monkeypatch):
    from lightning_gnnscale import run
    from tests.helpers.config import make_cfg

    def no_launch(*args, **kwargs):
        raise AssertionError("ranks were spawned")

    monkeypatch.setattr(run, "launch_local", no_launch)
    monkeypatch.setenv(MALLOC_ENV, "jemalloc")
    with pytest.raises(ConfigError, match="GNNSCALE_MALLOC='jemalloc'; valid: retain, system"):
        run.train(make_cfg(tmp_path, "strategy=ddp"))
    assert not (tmp_path / "out").exists()  # failed before the run claimed its folder
