"""Start-up: ranks fork from a warm rank server instead of importing everything again, and
``import lightning_gnnscale`` imports only what it needs (docs/architecture.md, "Imports")."""

from __future__ import annotations

import ast
import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_gnnscale.launch import launch_local, nvidia_gpu_present
from lightning_gnnscale.preflight import ConfigError, validate
from tests.helpers.config import REPO, make_cfg
from tests.helpers.dist import run_distributed

# A rank that imported torch, Lightning and PyG has used more CPU time than this (1.5 s on a
# quiet 2-core machine with byte-compiled packages); a rank forked from the warm server starts
# having used a few milliseconds.
IMPORT_FREE_CPU_S = 1.0
# Where an NVIDIA GPU is present the server imports only torch and Lightning, and each rank
# the rest (tests/test_cuda_fork.py checks that path).
skip_where_ranks_import_pyg = pytest.mark.skipif(
    nvidia_gpu_present(), reason="an NVIDIA GPU is present: ranks import PyG themselves"
)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _report_start(out_dir: str) -> None:
    """One rank's state when its job function starts (CPU time is this process's own)."""
    cpu = _cpu_s()
    server = os.getppid()
    rank = os.environ["LOCAL_RANK"]
    print(f"rank {rank} says hello", flush=True)
    report = {
        "cpu_s": cpu,
        "parent_threads": len(os.listdir(f"/proc/{server}/task")),
        "probe": os.environ.get("GNNSCALE_TEST_PROBE"),
        "cwd": os.getcwd(),
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))


def _launch_and_read(tmp_path: Path, devices: int, start_method: str) -> list[dict]:
    launch_local(_report_start, (str(tmp_path),), devices, 1, 600, start_method)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(devices)]


def test_launched_ranks_start_warm_with_the_launchers_state(tmp_path, monkeypatch, capfd):
    # set after the session's rank server started: a forked rank must still see them
    monkeypatch.setenv("GNNSCALE_TEST_PROBE", "set-late")
    monkeypatch.chdir(tmp_path)
    reports = _launch_and_read(tmp_path, 2, "forkserver")
    for report in reports:
        if (
            not nvidia_gpu_present()
        ):  # else the rank imports PyG itself (skip_where_ranks_import_pyg)
            assert report["cpu_s"] < IMPORT_FREE_CPU_S, report  # nothing was imported again
        # the server had no thread pool when it forked (torch ran no parallel operator there)
        assert report["parent_threads"] == 1, report
        assert report["probe"] == "set-late"
        assert report["cwd"] == str(tmp_path)
    out = capfd.readouterr().out
    assert "rank 0 says hello" in out and "rank 1 says hello" in out


def _cpu_at_start(rank: int, world_size: int) -> float:
    return _cpu_s()


@skip_where_ranks_import_pyg
def test_test_helper_ranks_start_warm():
    for cpu in run_distributed(_cpu_at_start, 2):
        assert cpu < IMPORT_FREE_CPU_S


@pytest.mark.e2e
def test_spawn_stays_available_and_imports_again(tmp_path):
    """``launcher.start_method=spawn``: a fresh interpreter, which pays the imports: it starts
    with several times the CPU time of a rank forked from the warm server in the same test (a
    ratio, so a fast or a loaded machine moves both; measured in CI: 2.3 s against 0.42 s with a
    benchmark running beside it, 1.5 s on a quiet machine)."""
    (spawned,) = _launch_and_read(_folder(tmp_path / "spawn"), 1, "spawn")
    (forked,) = _launch_and_read(_folder(tmp_path / "forked"), 1, "forkserver")
    assert spawned["cpu_s"] > 3 * max(forked["cpu_s"], 0.01), (spawned, forked)


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def test_an_unknown_start_method_is_refused_before_any_rank(tmp_path):
    cfg = make_cfg(tmp_path, "launcher.start_method=fork")
    with pytest.raises(ConfigError, match=r"launcher.start_method='fork' is unknown.*spawn"):
        validate(cfg)


IMPORT_PROBE = r"""
import sys
import lightning_gnnscale as gs
configs = [spec.default_config() for spec in gs.SYSTEMS.values()]  # every schema, validated
heavy = sorted({m.split(".")[0] for m in sys.modules} & {
    "wandb", "ogb", "matplotlib", "lightning", "torch_geometric", "torchmetrics", "torch",
    "numpy"})
systems = sorted(m for m in sys.modules if m.startswith("lightning_gnnscale.systems.")
                 and m.rsplit(".", 1)[1] in ("strategy", "datamodule"))
from lightning.pytorch.strategies import StrategyRegistry  # after the package: still registered
names = [spec.registered_as in StrategyRegistry for spec in gs.SYSTEMS.values()]
print(heavy, systems, all(names), gs.SYSTEMS["gsplit"].default_config().name)
"""


@pytest.mark.e2e
def test_the_package_imports_no_system_and_still_registers_every_name():
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[0] == "[] [] True gsplit"


def _imports(path: Path, module: str) -> set[str]:
    """The package modules ``module`` imports anywhere in it: at its top, inside functions
    and inside ``if TYPE_CHECKING:`` blocks (an import for annotations is still an edge)."""
    is_package = path.name == "__init__.py"
    here = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found.update(f"{target}.{alias.name}" for alias in node.names)
            found.add(target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("lightning_gnnscale")}


def test_the_schema_imports_no_system():
    package = REPO / "lightning_gnnscale"
    for name in ("config_types.py", "errors.py"):
        imported = _imports(package / name, f"lightning_gnnscale.{name[:-3]}")
        assert not {m for m in imported if m.startswith("lightning_gnnscale.systems")}, name


def _module_graph() -> dict[str, set[str]]:
    """Every module of the package -> the package modules it imports (itself left out)."""
    modules = {}
    for path in (REPO / "lightning_gnnscale").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {
        name: {m for m in _imports(path, name) if m in modules and m != name}
        for name, path in modules.items()
    }


def _collapse(graph: dict[str, set[str]], unit: Callable[[str], str | None]) -> dict:
    """``graph`` with every module replaced by ``unit(module)`` (``None``: left out), and the
    edges inside one unit dropped."""
    collapsed: dict[str, set[str]] = {}
    for name, imported in graph.items():
        if unit(name) is not None:
            targets = {unit(m) for m in imported} - {None, unit(name)}
            collapsed.setdefault(unit(name), set()).update(targets)
    return collapsed


def _top_level(module: str) -> str:
    """``lightning_gnnscale.graph.csc`` -> ``graph``; ``lightning_gnnscale.config_types`` ->
    ``config_types``; the package's own ``__init__`` -> ``lightning_gnnscale``."""
    return (module.split(".") + [""])[1] or "lightning_gnnscale"


def _systems_unit(module: str) -> str | None:
    """A ``systems/<name>`` folder, or a module of ``systems/`` itself (``registry``,
    the package's ``__init__``); ``None`` outside ``systems``."""
    parts = module.split(".")
    if parts[1:2] != ["systems"]:
        return None
    return ".".join(parts[:3]) if len(parts) > 3 else module


def _shortest_circle(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """The shortest circle ``[start, ..., start]`` inside ``members`` (breadth first)."""
    paths, frontier = {start: [start]}, [start]
    while not any(start in graph[name] for name in frontier):
        frontier = [
            paths.setdefault(other, [*paths[name], other])[-1]
            for name in frontier
            for other in sorted(graph[name] & members)
            if other not in paths
        ]
    last = next(name for name in frontier if start in graph[name])
    return [*paths[last], start]


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph``: for each strongly connected group (Tarjan), the shortest
    circle through each member, each circle once, written from its smallest name. ``[]``:
    the graph has none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for other in sorted(graph.get(name, ())):
            if other not in index:
                connect(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            group = [stack.pop()]
            while group[-1] != name:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(set(group))

    for name in sorted(graph):
        if name not in index:
            connect(name)
    circles: list[list[str]] = []
    for group in groups:
        for member in sorted(group):
            circle = _shortest_circle(graph, member, group)[:-1]
            first = circle.index(min(circle))
            circle = [*circle[first:], *circle[:first], min(circle)]
            if circle not in circles:
                circles.append(circle)
    return sorted(circles)


def test_circles_names_each_circle_once():
    graph = {"a": {"b"}, "b": {"c", "a2"}, "a2": {"c"}, "c": {"a", "d"}, "d": {"e"}}
    graph |= {"e": {"d"}, "f": {"a"}, "m": {"s"}, "s": {"m", "k"}, "k": {"s"}}
    assert _circles(graph) == [
        ["a", "b", "a2", "c", "a"],
        ["a", "b", "c", "a"],
        ["d", "e", "d"],
        ["k", "s", "k"],
        ["m", "s", "m"],
    ]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    """No module imports itself through others, counting late imports inside functions and
    ``TYPE_CHECKING`` imports; nor does any top-level package or module of the suite
    (``graph``, ``models``, ``systems``, ``schema``...), nor any ``systems/<name>`` folder."""
    modules = _module_graph()
    found = {
        "modules": _circles(modules),
        "packages": _circles(_collapse(modules, _top_level)),
        "systems folders": _circles(_collapse(modules, _systems_unit)),
    }
    circles = [f"{kind}: {' -> '.join(c)}" for kind, cs in found.items() for c in cs]
    assert not circles, "import circles:\n" + "\n".join(circles)


EXIT_PROBE = r"""
import atexit, logging, sys
from lightning_gnnscale.launch import exit_without_teardown

class Teardown:
    def __del__(self):
        print("interpreter teardown ran", flush=True)

keep = Teardown()  # a module global: collected only by the interpreter's teardown
logging.basicConfig(filename=sys.argv[2], level=logging.INFO)

def main():
    atexit.register(print, "the run's exit handler ran")
    logging.getLogger("probe").info("last log line")
    sys.stdout.write("unflushed output")
    if sys.argv[1] == "error":
        raise ValueError("boom")
    if sys.argv[1] != "ok":
        raise SystemExit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])

exit_without_teardown(main)
"""


@pytest.mark.parametrize(
    ("outcome", "status"), [("ok", 0), ("3", 3), ("error", 1), ("a message", 1)]
)
def test_a_command_ends_with_its_status_and_output_but_without_interpreter_teardown(
    tmp_path, outcome, status
):
    log = tmp_path / "run.log"
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_PROBE, outcome, str(log)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == status, proc.stderr[-2000:]
    assert proc.stdout.startswith("unflushed output")
    assert "the run's exit handler ran" in proc.stdout  # every other exit handler still runs
    assert "interpreter teardown ran" not in proc.stdout
    assert log.read_text().rstrip().endswith("last log line")
    assert ("ValueError: boom" in proc.stderr) == (outcome == "error")
