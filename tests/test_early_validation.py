"""A bad value is reported before torch, Lightning or PyG is imported (docs/configuration.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.config import REPO

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
        ("model.lr=-1", "model.lr=-1.0 must be > 0"),  # a value of one section
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
    assert {"hydra", "lightning_gnnscale.config"} <= imported  # the trace saw the run's imports
    assert not {name.split(".")[0] for name in imported} & HEAVY
    assert not (out / "summary.json").exists()
