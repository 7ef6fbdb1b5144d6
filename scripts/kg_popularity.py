"""The popularity baseline of knowledge-graph completion: every candidate entity scored by its
degree in the training triples (in + out, every relation), ranked with the filtered protocol of
``task.evaluation=filtered`` (each evaluation triple as tail ``(h, r, ?)`` and as head
``(?, r, t)`` against every entity, the other true triples of train + val + test filtered out,
OGB's tie rule: the mean of the optimistic and the pessimistic rank), MRR and Hits@1/3/10 over
both directions.

    python scripts/kg_popularity.py root=<a constructed folder with an edge split> [split=test]

Its ranking is numpy written here, not the suite's metric code (tasks/link/metrics.py), so the
two check each other (tests/test_typed_link_prediction.py). Prints one JSON line.
"""

from __future__ import annotations

import json
import sys

import numpy as np

KS = (1, 3, 10)
SPLITS = {"train": 0, "val": 1, "test": 2}
CHUNK = 1 << 22  # query x entity cells at once


def triples(root: str) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(hrt [E, 3], split [E], N, R)`` of the constructed folder at ``root``."""
    from lightning_gnnscale.graph.datasets import load_dataset

    dataset = load_dataset("constructed", root=root)
    graph = dataset.graph
    if not graph.is_typed or dataset.edge_split is None:
        raise SystemExit(f"{root}: needs a typed graph with an edge split (scripts/kinships.py)")
    src, dst = graph.edge_index().numpy()
    hrt = np.stack([src, graph.edge_type.numpy(), dst], 1)
    return hrt, dataset.edge_split.numpy(), graph.num_nodes, graph.num_relations


def ranks(scores: np.ndarray, answer: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Filtered ranks ``[n]`` of ``answer`` among ``scores [n, N]``, ``known [n, N]`` (true
    answers, the answer itself included) left out of the candidates; OGB's tie rule."""
    pos = scores[np.arange(len(answer)), answer][:, None]
    kept = ~known
    above = ((scores > pos) & kept).sum(1)
    at_or_above = ((scores >= pos) & kept).sum(1)
    return 1.0 + (above + at_or_above) / 2.0


def popularity(root: str, split: str = "test") -> dict:
    hrt, where, n, r = triples(root)
    train = hrt[where == 0]
    degree = (np.bincount(train[:, 0], minlength=n) + np.bincount(train[:, 2], minlength=n)).astype(
        np.float64
    )
    tail_keys = np.unique((hrt[:, 0] * r + hrt[:, 1]) * n + hrt[:, 2])
    head_keys = np.unique((hrt[:, 2] * r + hrt[:, 1]) * n + hrt[:, 0])
    queries = hrt[where == SPLITS[split]]
    every = np.arange(n)
    out = []
    step = max(1, CHUNK // n)
    for lo in range(0, len(queries), step):
        h, rel, t = queries[lo : lo + step].T
        scores = np.broadcast_to(degree, (len(h), n))
        for query, answer, keys in ((h, t, tail_keys), (t, h, head_keys)):
            cells = ((query * r + rel) * n)[:, None] + every
            out.append(ranks(scores, answer, np.isin(cells, keys)))
    rank = np.concatenate(out)
    return {
        "split": split,
        "rankings": int(rank.size),
        "mrr": float((1.0 / rank).mean()),
        **{f"hits@{k}": float((rank <= k).mean()) for k in KS},
    }


def main(argv: list[str]) -> None:
    given = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    if (
        "root" not in given
        or set(given) - {"root", "split"}
        or given.get("split", "test") not in SPLITS
    ):
        raise SystemExit("usage: python scripts/kg_popularity.py root=<dir> [split=test|val|train]")
    print(json.dumps(popularity(given["root"], given.get("split", "test"))))


if __name__ == "__main__":
    main(sys.argv[1:])
