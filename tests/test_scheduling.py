"""CI's scheduler (``tests/conftest.py``, ``--dist loadfile``): the conformance suite by case,
every other file whole, and the longest scopes first, so that the run does not end with one
worker on a long file while the other has nothing left (docs/testing.md)."""

from types import SimpleNamespace

import pytest

from tests import conftest

pytest.importorskip("xdist")


class _Config:
    option = SimpleNamespace(loadscopereorder=True)

    def getvalue(self, name: str):
        return {"dist": "loadfile", "tx": ["2*popen"]}[name]


class _Node:
    """A worker that records the tests it is sent, by nodeid."""

    def __init__(self, name: str, collection: list[str], sent: list) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.collection, self.sent, self.shutting_down = collection, sent, False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append([self.collection[i] for i in indexes])

    def shutdown(self) -> None:
        self.shutting_down = True


def _units(collection: list[str]) -> list[list[str]]:
    """The units (lists of nodeids) the two workers are sent, in the order they are handed
    out."""
    scheduler = conftest.pytest_xdist_make_scheduler(_Config(), None)
    sent: list[list[str]] = []
    nodes = [_Node(f"gw{i}", collection, sent) for i in range(2)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    while scheduler.workqueue:  # a worker finishes what it holds, then is sent the next unit
        node = nodes[len(sent) % 2]
        for nodeids in list(scheduler.assigned_work[node].values()):
            for nodeid in [n for n, done in nodeids.items() if not done]:
                scheduler.mark_test_complete(node, collection.index(nodeid))
    return sent


def test_long_scopes_go_first_and_conformance_cases_are_units_of_their_own():
    conformance = conftest.CONFORMANCE
    many = [f"tests/test_many.py::test_{i}" for i in range(40)]  # 40 x 0.3 s: 12 s
    case = [f"{conformance}::test_{c}[ddp-node_classification]" for c in "abcd"]  # 8 s
    other_case = [f"{conformance}::test_a[gsplit-node_regression]"]  # 2 s
    long = ["tests/test_out_of_tree_system.py::test_x"]  # one test, but 30 s
    short = ["tests/test_short.py::test_y"]  # 0.3 s
    units = _units([*short, *many, *case, *other_case, *long])
    # xdist alone orders by count of tests: the 40 quick ones first, the 30 s file near the end
    assert units == [long, many, case, other_case, short]  # each case whole, apart from others


def test_a_scopes_guess_is_the_table_or_its_count_of_tests():
    assert (
        conftest.scope_seconds("tests/test_cluster.py", 30)
        == conftest.SCOPE_S["tests/test_cluster.py"]
    )
    assert conftest.scope_seconds("tests/test_new.py", 10) == pytest.approx(10 * conftest.TEST_S)
    case = f"{conftest.CONFORMANCE}::ddp-node_classification"
    assert conftest.scope_seconds(case, 3) == pytest.approx(3 * conftest.CONFORMANCE_TEST_S)
