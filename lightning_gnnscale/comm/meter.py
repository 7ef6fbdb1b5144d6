"""Counts the bytes and messages one rank sends to other ranks, by category and link class.

A snapshot is a plain JSON-able dict of ints::

    {"bytes": {category: n}, "messages": {category: n},           # summed over link classes
     "link_bytes": {link: n}, "link_messages": {link: n},          # summed over categories
     "category_link_bytes": {category: {link: n}},
     "category_link_messages": {category: {link: n}}}

Every entry is linear in the counts, so snapshots of different ranks or times can be added and
subtracted entry by entry (``sum_snapshots``, ``diff_snapshots``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lightning_gnnscale.comm.topology import LINK_CLASSES

CATEGORIES = (
    "feature",  # input feature rows
    "activation",  # hidden rows, forward
    "activation_grad",  # hidden-row gradients, backward
    "gradient",  # parameter gradients
    "parameter",  # model weights moved between ranks
    "structure",  # sampling requests, node ids, edges
    "control",  # flags, counts, scalars
)
_CATEGORY_INDEX = {name: i for i, name in enumerate(CATEGORIES)}
_LINK_INDEX = {name: i for i, name in enumerate(LINK_CLASSES)}


def check_category(category: str) -> int:
    """Index of ``category``; raises ValueError listing the valid ones if it is unknown."""
    try:
        return _CATEGORY_INDEX[category]
    except KeyError:
        raise ValueError(f"unknown comm category {category!r}; valid: {list(CATEGORIES)}") from None


class CommMeter:
    """Per-rank counters of what this rank sends, as ``[category][link class]`` int matrices,
    plus ``wait_s``: wall time spent inside blocking collectives (a measurement, not a count)."""

    def __init__(self) -> None:
        self.reset()
        self.wait_s = 0.0

    def reset(self) -> None:
        """Zero every counter."""
        self._bytes = [[0] * len(LINK_CLASSES) for _ in CATEGORIES]
        self._messages = [[0] * len(LINK_CLASSES) for _ in CATEGORIES]

    def record(self, category: str, link_class: str, nbytes: int, messages: int = 1) -> None:
        """Add ``nbytes`` in ``messages`` messages sent over one link class."""
        row = check_category(category)
        col = _LINK_INDEX[link_class]
        self._bytes[row][col] += int(nbytes)
        self._messages[row][col] += int(messages)

    def record_per_peer(
        self,
        category: str,
        nbytes_per_peer: Sequence[int],
        peer_link_classes: Sequence[str | None],
    ) -> None:
        """Add one send per peer: ``nbytes_per_peer[q]`` bytes to rank ``q``, one message each
        when non-empty; peers whose link class is ``None`` (this rank itself) are skipped."""
        row = check_category(category)
        byte_row, message_row = self._bytes[row], self._messages[row]
        for nbytes, link in zip(nbytes_per_peer, peer_link_classes, strict=True):
            if link is None or nbytes == 0:
                continue
            col = _LINK_INDEX[link]
            byte_row[col] += int(nbytes)
            message_row[col] += 1

    def snapshot(self) -> dict[str, Any]:
        """The counters now, as a JSON-able dict (see the module docstring)."""
        return snapshot_from_vector(self.to_vector())

    def delta(self, since: dict[str, Any]) -> dict[str, Any]:
        """What was counted after the snapshot ``since`` was taken."""
        return diff_snapshots(self.snapshot(), since)

    def to_vector(self) -> list[int]:
        """Counters flattened as ``bytes[c][l]`` then ``messages[c][l]`` (for reductions)."""
        return [n for row in self._bytes for n in row] + [n for row in self._messages for n in row]


def snapshot_to_vector(snapshot: dict[str, Any]) -> list[int]:
    """Flatten a snapshot in ``CommMeter.to_vector`` order."""
    byte_counts = snapshot["category_link_bytes"]
    message_counts = snapshot["category_link_messages"]
    return [byte_counts[c][link] for c in CATEGORIES for link in LINK_CLASSES] + [
        message_counts[c][link] for c in CATEGORIES for link in LINK_CLASSES
    ]


def snapshot_from_vector(vector: Sequence[int]) -> dict[str, Any]:
    """Build a snapshot from ``CommMeter.to_vector`` order."""
    width = len(LINK_CLASSES)
    half = len(CATEGORIES) * width
    if len(vector) != 2 * half:
        raise ValueError(f"expected {2 * half} counters, got {len(vector)}")

    def matrix(offset: int) -> dict[str, dict[str, int]]:
        return {
            c: {link: int(vector[offset + i * width + j]) for j, link in enumerate(LINK_CLASSES)}
            for i, c in enumerate(CATEGORIES)
        }

    byte_matrix, message_matrix = matrix(0), matrix(half)
    return {
        "bytes": {c: sum(byte_matrix[c].values()) for c in CATEGORIES},
        "messages": {c: sum(message_matrix[c].values()) for c in CATEGORIES},
        "link_bytes": {
            link: sum(byte_matrix[c][link] for c in CATEGORIES) for link in LINK_CLASSES
        },
        "link_messages": {
            link: sum(message_matrix[c][link] for c in CATEGORIES) for link in LINK_CLASSES
        },
        "category_link_bytes": byte_matrix,
        "category_link_messages": message_matrix,
    }


def sum_snapshots(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Entry-wise sum of snapshots (e.g. over ranks or epochs)."""
    totals = [0] * (2 * len(CATEGORIES) * len(LINK_CLASSES))
    for snapshot in snapshots:
        totals = [a + b for a, b in zip(totals, snapshot_to_vector(snapshot), strict=True)]
    return snapshot_from_vector(totals)


def diff_snapshots(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """Entry-wise ``after - before``."""
    return snapshot_from_vector(
        [a - b for a, b in zip(snapshot_to_vector(after), snapshot_to_vector(before), strict=True)]
    )
