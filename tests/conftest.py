"""Session set-up shared by every test module."""

from tests.helpers.dist import warm_context


def pytest_sessionstart(session) -> None:
    # One warm rank server per pytest run (per xdist worker), started before collection so
    # that its imports overlap the collection's: every test that starts ranks forks them.
    warm_context()
