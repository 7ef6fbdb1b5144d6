"""Scalar keys of the link-prediction random streams, chained with the sampler's splitmix64.

Each stream (the split, training negatives, evaluation negatives) starts from its own tag, so
no two draw from the same key; what a draw depends on is the key's parts and the element's
own id, never which process draws it (as graph/sampler.py's neighbour sampling).
"""

from __future__ import annotations

from ...graph.sampler import splitmix64_int

_MASK64 = (1 << 64) - 1

# stream tags: "LPsplit", "LPtrain", "LPjoint", "LPeval" as ASCII
SPLIT = 0x4C5073706C6974
TRAIN = 0x4C50747261696E
JOINT = 0x4C506A6F696E74
EVAL = 0x4C506576616C


def stream_key(*parts: int) -> int:
    """A signed int64 key from ``parts`` (each taken modulo 2**64), hashed in order."""
    h = 0
    for part in parts:
        h = splitmix64_int(h ^ (part & _MASK64))
    return h - (1 << 64) if h >= 1 << 63 else h
