"""A graph that cannot fit is refused by the suite, with the estimate and the memory
available, before any of it is generated or loaded; long generation and loading say what they
are doing (docs/testing.md, "Faults and bad inputs")."""

from __future__ import annotations

import functools
import time

import pytest

from lightning_gnnscale.graph import datasets
from lightning_gnnscale.graph.datasets import DatasetTooLargeError, estimate_memory, load_dataset
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.preflight import ConfigError
from lightning_gnnscale.run import train
from tests.helpers.config import make_cfg
from tests.test_datasets import _write_ogb_fixture


def test_a_billion_node_graph_is_refused_before_it_is_generated(tmp_path):
    """The issue's case: the launcher grew to 6 GB on its way to the OOM killer."""
    cfg = make_cfg(tmp_path, "strategy=single", "dataset.num_nodes=1000000000")
    with pytest.raises(ConfigError, match=r"does not fit.*1,000,000,000 nodes.*GiB is available"):
        train(cfg)


def test_the_refusal_names_the_estimate_the_memory_and_the_settings(monkeypatch):
    monkeypatch.setattr(datasets, "available_memory_bytes", lambda: 1 << 20)
    with pytest.raises(DatasetTooLargeError) as refused:
        load_dataset("sbm", num_nodes=3000, avg_degree=8.0, num_features=16)
    message = str(refused.value)
    estimate = estimate_memory("sbm", num_nodes=3000, avg_degree=8.0, num_features=16)
    assert f"about {estimate.peak_bytes / 2**30:,.1f} GiB" in message
    assert "and 0.0 GiB is available" in message
    assert "dataset.num_nodes / dataset.avg_degree / dataset.num_features" in message
    monkeypatch.setattr(datasets, "available_memory_bytes", lambda: estimate.peak_bytes)
    dataset = load_dataset("sbm", num_nodes=3000, avg_degree=8.0, num_features=16)
    assert dataset.graph.num_nodes == 3000


def test_a_real_datasets_estimate_comes_from_its_files_before_loading(tmp_path, monkeypatch):
    for name in ("ogbn-arxiv", "ogbn-papers100M"):
        _write_ogb_fixture(tmp_path, name, num_nodes=50, num_edges=120)
        estimate = estimate_memory(name, root=tmp_path)
        assert (estimate.nodes, estimate.edges, estimate.features) == (50, 120, 4)
    monkeypatch.setattr(datasets, "available_memory_bytes", lambda: 1000)
    with pytest.raises(DatasetTooLargeError, match="ogbn-arxiv does not fit.*50 nodes, 120 edges"):
        load_dataset("ogbn-arxiv", root=tmp_path, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists(), "ogb ran before the refusal"


def test_generation_that_takes_a_while_says_what_it_is_doing(monkeypatch, capsys):
    @functools.wraps(sbm)
    def slow_sbm(**options):
        time.sleep(0.5)
        return sbm(**options)

    monkeypatch.setattr(datasets, "PROGRESS_AFTER_S", 0.1)
    monkeypatch.setitem(datasets._GENERATORS, "sbm", slow_sbm)
    load_dataset("sbm", num_nodes=2000, num_features=8)
    err = capsys.readouterr().err
    assert "generating sbm: 2,000 nodes, 10,000 edges, 8 features" in err
    assert "generating sbm: done in" in err
    monkeypatch.setattr(datasets, "PROGRESS_AFTER_S", 60.0)
    load_dataset("sbm", num_nodes=2000, num_features=8)
    assert capsys.readouterr().err == "", "a quick generation stays silent"
