"""A multi-node Hydra multirun: job k's ranks meet at ``MASTER_PORT`` + k, so a node that starts
job k + 1 while node 0 still finishes job k never joins job k's rendezvous (still open there)."""

from __future__ import annotations

import contextlib
import os

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from lightning_gnnscale import run
from lightning_gnnscale.errors import ConfigError
from tests.helpers.config import REPO, make_cfg


@contextlib.contextmanager
def _sweep_job(num: int):
    """Hydra's state inside job ``num`` of a multirun, as ``train.py -m`` sets it."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["paths.root=."], return_hydra_config=True)
    cfg.hydra.mode, cfg.hydra.job.num = RunMode.MULTIRUN, num
    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    hydra_config.set_config(cfg)
    try:
        yield
    finally:
        hydra_config.cfg = previous


def test_each_job_of_a_multi_node_sweep_has_its_own_rendezvous_port(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path, "strategy=ddp", "trainer.devices=1", "trainer.num_nodes=2")
    for var, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500"), ("NODE_RANK", "1")):
        monkeypatch.setenv(var, value)
    ports = []
    monkeypatch.setattr(run, "launch_local", lambda *_: ports.append(os.environ["MASTER_PORT"]))
    run.train(cfg)  # not in a sweep: the port as given
    for num in (0, 3):
        with _sweep_job(num):
            run.train(cfg)
    assert ports == ["29500", "29500", "29503"]
    assert os.environ["MASTER_PORT"] == "29500"  # the next job starts from the given port


def test_a_sweep_job_whose_port_passes_65535_is_refused_before_its_ranks(monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "65535")
    refused = pytest.raises(ConfigError, match=r"65535 \+ sweep job 1 = 65536")
    with _sweep_job(1), refused, run.sweep_rendezvous():
        raise AssertionError("the job's ranks would start here")
    assert os.environ["MASTER_PORT"] == "65535"
