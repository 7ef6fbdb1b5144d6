"""The conformance suite's typed-graph case (``conformance.TYPED``: RGCN on a tiny typed_sbm)
through checks 1-4 of ``test_conformance.py`` for every name that trains typed graphs
(docs/testing.md). A file of its own, so that pytest-xdist (``--dist loadfile``) runs it beside
the main conformance file instead of after it on the same worker."""

from __future__ import annotations

import pytest

from tests.systems import test_conformance as checks
from tests.systems.conformance import cases
from tests.systems.test_conformance import runs as runs  # noqa: F401 (the shared runs)

pytestmark = pytest.mark.timeout(600)
TYPED_ONLY = {"typed": True, "tasks": False}


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("name", "task"),
    cases(lambda s: s.name != "single" and (s.exact or bool(s.exact_settings)), **TYPED_ONLY),
)
def test_an_exact_setting_equals_single_in_float64(runs, tmp_path, name, task):
    checks.test_an_exact_setting_equals_single_in_float64(runs, tmp_path, name, task)


@pytest.mark.e2e
@pytest.mark.parametrize(("name", "task"), cases(**TYPED_ONLY))
def test_the_comm_audit_passes(runs, name, task):
    checks.test_the_comm_audit_passes(runs, name, task)


@pytest.mark.e2e
@pytest.mark.parametrize(("name", "task"), cases(lambda s: s.supports_partition_dir, **TYPED_ONLY))
def test_a_partition_directory_run_equals_the_in_memory_run(
    runs,
    tmp_path,
    monkeypatch,
    name,
    task,
):
    checks.test_a_partition_directory_run_equals_the_in_memory_run(
        runs, tmp_path, monkeypatch, name, task
    )


@pytest.mark.e2e
@pytest.mark.parametrize(("name", "task"), cases(**TYPED_ONLY))
def test_a_resumed_run_equals_the_uninterrupted_run(runs, tmp_path, name, task):
    checks.test_a_resumed_run_equals_the_uninterrupted_run(runs, tmp_path, name, task)
