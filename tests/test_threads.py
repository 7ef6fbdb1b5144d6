"""The torch thread count of a rank (run.rank_threads)."""

import os

import pytest

from lightning_gnnscale import bounds, run
from tests.helpers.config import make_cfg


@pytest.fixture
def machine(monkeypatch):
    """Pretend to run on 8 cores (no cgroup CPU quota) at a given 1-minute load average."""
    monkeypatch.delenv(run.THREADS_ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(bounds, "cgroup_cpu_limit", lambda: None)

    def at_load(load):
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))

    return at_load


def test_an_idle_machine_shares_its_cores_between_the_ranks(machine):
    machine(0.0)
    assert run.rank_threads(1) == 8
    assert run.rank_threads(2) == 4
    assert run.rank_threads(16) == 1


def test_a_busy_machine_gets_only_its_idle_cores(machine):
    machine(5.2)
    assert run.rank_threads(1) == 3
    machine(7.6)
    assert run.rank_threads(1) == 1
    machine(30.0)
    assert run.rank_threads(1) == 1  # never below one


def test_the_environment_pins_the_threads(machine, monkeypatch):
    machine(30.0)
    monkeypatch.setenv(run.THREADS_ENV, "3")
    assert run.rank_threads(2) == 3
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv(run.THREADS_ENV, bad)
        with pytest.raises(ValueError, match=run.THREADS_ENV):
            run.rank_threads(1)


def test_a_rank_fits_with_the_threads_it_chose(tmp_path, monkeypatch):
    """Lightning's launcher would set ``cores // devices`` threads (1 here with 2 ranks on 2
    cores); the rank keeps ``$GNNSCALE_NUM_THREADS`` through the fit instead."""
    monkeypatch.setenv(run.THREADS_ENV, "3")
    metrics, _ = run.train(make_cfg(tmp_path, "strategy=ddp", "trainer.devices=2"))
    assert metrics["torch_threads"] == 3
    assert metrics["rank_cpus"] == len(os.sched_getaffinity(0))
