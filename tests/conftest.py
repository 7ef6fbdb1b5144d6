"""Session set-up shared by every test module: the warm rank server, ``gpu``-marked tests
skipped, with the reason, where no CUDA device is, and the conformance suite's full matrix
deselected unless asked for, and spread over the xdist workers case by case."""

import os

import pytest
import torch

from lightning_gnnscale.warm_client import DISABLE_ENV
from tests.helpers.dist import warm_context


def pytest_sessionstart(session) -> None:
    # A warm server a developer started for this checkout (python -m lightning_gnnscale.warm)
    # must not take the `python train.py` processes of the tests; test_warm_daemon.py starts
    # its own and turns this back on for its commands.
    os.environ[DISABLE_ENV] = "0"
    # One warm rank server per pytest run (per xdist worker), started before collection so
    # that its imports overlap the collection's: every test that starts ranks forks them.
    warm_context()


def pytest_collection_modifyitems(config, items):
    _deselect_full_conformance(config, items)
    if torch.cuda.is_available():
        return
    reason = (
        f"no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False): "
        "GPU tests run on a GPU machine through scripts/gpu_check.sh"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


CONFORMANCE = "tests/systems/test_conformance.py"
# The scheduler's guess of a scope's length: seconds per test (a conformance case's tests
# train; elsewhere most are pure functions), except for the files that take far longer than
# their count of tests says (cold interpreters, a real warm server, emulated hosts, runs in
# every test), in seconds of a quiet 2-core machine (CI's --durations). A guess only orders
# the scopes; a wrong one costs time, never a result.
TEST_S, CONFORMANCE_TEST_S = 0.3, 2.0
SCOPE_S = {
    "tests/systems/test_conformance_typed.py": 75.0,
    "tests/test_cluster.py": 80.0,
    "tests/test_memory.py": 50.0,
    "tests/test_examples.py": 45.0,
    "tests/test_faults.py": 45.0,
    "tests/test_warm_daemon.py": 35.0,
    "tests/test_out_of_tree_system.py": 30.0,
    "tests/systems/granndis/test_granndis_dist.py": 25.0,
    "tests/test_startup.py": 15.0,
    "tests/test_registry.py": 15.0,
    "tests/test_cuda_fork.py": 12.0,
    "tests/test_cpu_memory.py": 10.0,
}


def scope_seconds(scope: str, count: int) -> float:
    """The guessed length of a scheduling scope (a file, or a conformance case) of ``count``
    tests."""
    if scope in SCOPE_S:
        return SCOPE_S[scope]
    return count * (CONFORMANCE_TEST_S if scope.startswith(f"{CONFORMANCE}::") else TEST_S)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, except that the conformance suite is scheduled by case (``<name>-
    <task>``: each case's checks share its runs, :class:`tests.systems.conformance.Runs`), so
    its cases spread over the workers instead of holding one for the whole file; and the
    longest scopes go first (xdist orders them by their count of tests, which put a few long
    files, such as the out-of-tree system's three tests, at the end, one worker running them
    while the other had nothing left)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ConformanceByCase(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            file, _, test = nodeid.partition("::")
            if file != CONFORMANCE or "[" not in test:
                return file
            return f"{file}::{test.partition('[')[2].removesuffix(']')}"

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the queue is complete before its first unit is handed out
                self.ordered = True
                queue = sorted(
                    self.workqueue.items(), key=lambda unit: -scope_seconds(unit[0], len(unit[1]))
                )
                self.workqueue.clear()
                self.workqueue.update(queue)
            super()._assign_work_unit(node)

    return ConformanceByCase(config, log)


def _deselect_full_conformance(config, items) -> None:
    """The conformance suite's full matrix (marker ``conformance_full``) runs only when the
    ``-m`` expression names it (``pytest -m conformance_full``); CI runs the rest."""
    if "conformance_full" in (config.getoption("markexpr") or ""):
        return
    full = [item for item in items if "conformance_full" in item.keywords]
    if full:
        config.hook.pytest_deselected(items=full)
        items[:] = [item for item in items if "conformance_full" not in item.keywords]
