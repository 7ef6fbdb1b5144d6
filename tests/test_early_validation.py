"""A bad value is reported before torch, Lightning or PyG is imported, and a generated dataset
refuses a root (docs/configuration.md, "Validation")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lightning_gnnscale.preflight import ConfigError, check_config
from tests.helpers.config import REPO, make_cfg

# what a run imports only once its config has been checked (top-level package names)
HEAVY = {"torch", "lightning", "lightning_fabric", "torch_geometric", "torchmetrics"}


def _imported(importtime_log: str) -> set[str]:
    """The modules ``python -X importtime`` reported importing (its log on stderr)."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in importtime_log.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.fanouts=[5]", "one fanout per layer"),  # a rule between sections
        (
            "trainer.devices=2000",
            "ranks per node; set launcher.allow_oversubscribe=true",
        ),  # a bound
    ],
)
def test_a_bad_value_fails_before_torch_lightning_or_pyg_is_imported(tmp_path, override, message):
    """``train.py`` checks the composed config first: the error comes from a process that has
    imported none of them (the import trace of the whole command)."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "train.py", override, f"hydra.run.dir={out}"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "GNNSCALE_WARM": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-3000:]
    imported = _imported(proc.stderr)
    assert {"hydra", "lightning_gnnscale.preflight"} <= imported  # the trace saw the run's imports
    assert not {name.split(".")[0] for name in imported} & HEAVY
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize("name", ["sbm", "rmat"])
def test_a_root_given_to_a_generator_is_refused(tmp_path, name):
    cfg = make_cfg(tmp_path, f"dataset={name}", "dataset.root=/data/mine")
    with pytest.raises(
        ConfigError, match=r"dataset.root='/data/mine'.*paths.data_dir.*GNNSCALE_DATA_DIR"
    ):
        check_config(cfg)


def test_the_data_dir_is_the_root_of_file_datasets_only(tmp_path, monkeypatch):
    """``GNNSCALE_DATA_DIR`` (``paths.data_dir``) is one root for a sweep that mixes datasets:
    Cora reads it, a generator is not given it."""
    monkeypatch.setenv("GNNSCALE_DATA_DIR", str(tmp_path / "datasets"))
    cora = check_config(make_cfg(tmp_path, "dataset=cora", tiny=False))
    assert cora.dataset.root == str(tmp_path / "datasets")
    sbm = check_config(make_cfg(tmp_path, "dataset=sbm"))
    assert sbm.dataset.root is None
