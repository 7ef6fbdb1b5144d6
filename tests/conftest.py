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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, except that the conformance suite is scheduled by case (``<name>-
    <task>``: each case's checks share its runs, :class:`tests.systems.conformance.Runs`), so
    its cases spread over the workers instead of holding one for the whole file."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ConformanceByCase(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file, _, test = nodeid.partition("::")
            if file != CONFORMANCE or "[" not in test:
                return file
            return f"{file}::{test.partition('[')[2].removesuffix(']')}"

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
