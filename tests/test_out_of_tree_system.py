"""A system outside the repository: a copy of ``ddp`` under another name, in a package on
``PYTHONPATH`` registered through an entry point (group ``lightning_gnnscale.systems``), trains
from a plain ``L.Trainer(strategy=...)``, through ``train.py`` and through the conformance suite;
the warm server's fingerprint includes its sources. No file of the repository changes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_gnnscale import warm_client
from tests.helpers.config import REPO

PACKAGE = "gnnscale_ext_ddp"
NAME = "ext_ddp"


def _absolute_imports(source: str) -> str:
    """A system's relative imports of the suite, written absolute (the copy lives outside it)."""
    source = re.sub(r"from \.\.\.(\w)", r"from lightning_gnnscale.\1", source)
    source = re.sub(r"from \.\. import", "from lightning_gnnscale.systems import", source)
    return re.sub(r"from \.\.(\w)", r"from lightning_gnnscale.systems.\1", source)


def install_copy_of_ddp(site: Path) -> Path:
    """``site/gnnscale_ext_ddp/``: ``systems/ddp`` under the name ``ext_ddp``, and its
    distribution's metadata with the entry point, as ``pip install`` would leave them."""
    package = site / PACKAGE
    package.mkdir(parents=True)
    for path in sorted((REPO / "lightning_gnnscale" / "systems" / "ddp").glob("*.py")):
        source = _absolute_imports(path.read_text())
        source = source.replace('"data_parallel"', f'"metered_{NAME}"').replace(
            '"ddp"', f'"{NAME}"'
        )
        (package / path.name).write_text(source)
    dist = site / f"{PACKAGE}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[lightning_gnnscale.systems]\n{NAME} = {PACKAGE}:SYSTEM\n"
    )
    return package


SCRIPT = r"""
import json, sys
import lightning as L
import lightning_gnnscale as gs

spec = gs.SYSTEMS["ext_ddp"]
dataset = gs.load_dataset("sbm", num_nodes=300, num_features=8)
dm = spec.datamodule(dataset, spec.default_config(), gs.DataConfig(batch_size=64, fanouts=[5, 5]),
                       cache_dir=sys.argv[1])
module = gs.GNNModule(dm.build_model(gs.ModelConfig(dropout=0.0)))
before = [p.detach().clone() for p in module.parameters()]
trainer = L.Trainer(strategy="metered_ext_ddp", accelerator="cpu", devices=1, max_epochs=1,
                    use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(module, datamodule=dm)
moved = any(not a.equal(b) for a, b in zip(before, module.parameters()))
print("PLAIN " + json.dumps({"strategy": type(trainer.strategy).__module__,
                             "package": spec.package, "moved": moved}), flush=True)
"""


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_system_from_an_entry_point_trains_from_a_trainer_and_train_py(tmp_path):
    repo_before = warm_client._contents(warm_client._source_files())
    site = tmp_path / "site"
    install_copy_of_ddp(site)
    script = tmp_path / "ext.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        "GNNSCALE_WARM": "0",
        "OMP_NUM_THREADS": "1",
    }
    overrides = [
        f"strategy={NAME}",
        "dataset.num_nodes=300",
        "dataset.num_features=8",
        "data.batch_size=64",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "logger=none",
        "launcher.timeout_s=300",
        f"paths.root={tmp_path}",
        f"hydra.run.dir={out}",
    ]

    def run(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=270
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    proc = run(str(script), str(tmp_path / "cache"))
    line = next(s for s in proc.stdout.splitlines() if s.startswith("PLAIN "))
    plain = json.loads(line.removeprefix("PLAIN "))
    assert plain == {"strategy": f"{PACKAGE}.strategy", "package": PACKAGE, "moved": True}
    run("train.py", *overrides)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2  # the copy's default devices, ranks started by train.py
    assert summary["history"] and all(row["train_loss"] > 0 for row in summary["history"])
    assert warm_client._contents(warm_client._source_files()) == repo_before


def _tracked_changes() -> str:
    """``git status`` of the repository's tracked files (empty: none changed)."""
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_system_from_an_entry_point_passes_the_conformance_suite(tmp_path):
    """``pytest tests/systems/test_conformance.py`` in a process that sees the copy: the copy's
    node-classification case of every check the suite makes of ``ddp`` is collected and passes
    (the full matrix runs its others). The repository's sources and tracked files stay as they were."""
    repo_before = warm_client._contents(warm_client._source_files())
    git_before = _tracked_changes()
    site = tmp_path / "site"
    install_copy_of_ddp(site)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        "GNNSCALE_WARM": "0",
        "OMP_NUM_THREADS": "1",
    }
    case = f"{NAME}-node_classification"
    proc = subprocess.run(
        [
            sys.executable,
            *("-m", "pytest", "tests/systems/test_conformance.py", "-p", "no:cacheprovider"),
            *("-q", "-rA", "-n", "0", "-k", case, "--basetemp", str(tmp_path / "pytest")),
            *("-m", "conformance_full or not conformance_full"),  # its cases, CI's or not
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    passed = set(re.findall(rf"^PASSED \S+::(\w+)\[{case}\]$", proc.stdout, re.MULTILINE))
    from tests.systems import test_conformance as suite

    checks = {  # the checks the suite makes of ddp, which the copy is
        name
        for name, test in vars(suite).items()
        if name.startswith("test_")
        and any(
            mark.name == "parametrize"
            and any(p.id == "ddp-node_classification" for p in mark.args[1])
            for mark in getattr(test, "pytestmark", [])
        )
    }
    assert passed == checks and len(checks) >= 5, proc.stdout[-5000:]
    assert not re.search(r"^(FAILED|ERROR|XFAIL|XPASS|SKIPPED)", proc.stdout, re.MULTILINE)
    assert warm_client._contents(warm_client._source_files()) == repo_before
    assert _tracked_changes() == git_before


def test_the_warm_fingerprint_covers_an_entry_point_systems_sources(tmp_path, monkeypatch):
    """With the copy installed its files join the source list, and an edit of one of them
    changes the fingerprint (the run then goes cold: the server's differs)."""
    without = warm_client._source_files()
    package = install_copy_of_ddp(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    files = warm_client._source_files()
    assert files[: len(without)] == without
    assert sorted(files[len(without) :]) == sorted(package.glob("*.py"))
    before = warm_client.fingerprint()["source"]
    config = package / "config.py"
    config.write_text(config.read_text() + "\n# an edit\n")
    after = warm_client.fingerprint()
    assert (
        warm_client.mismatch(after, {**after, "source": before}) == warm_client.MISMATCH["source"]
    )
