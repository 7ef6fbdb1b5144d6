"""Large synthetic graphs without a second copy: the CSC build and the generators stream over
fixed-size chunks, and chunking changes no number (docs/partitioning.md, "Large synthetic
graphs")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from lightning_gnnscale.graph import csc, generators
from lightning_gnnscale.graph.csc import csc_from_edges
from lightning_gnnscale.graph.generators import normal_, rmat, rmat_peak_bytes, sbm, sbm_peak_bytes
from tests.helpers.config import REPO


def _oracle(src, dst, num_nodes, undirected, remove_self_loops):
    """CSC by Python sets and sorting (no tensor kernel of the code under test)."""
    pairs = list(zip(src.tolist(), dst.tolist()))
    if undirected:
        pairs += [(d, s) for s, d in pairs]
    edges = sorted({(d, s) for s, d in pairs if not (remove_self_loops and s == d)})
    indptr = [0] * (num_nodes + 1)
    for d, _ in edges:
        indptr[d + 1] += 1
    for v in range(num_nodes):
        indptr[v + 1] += indptr[v]
    return indptr, [s for _, s in edges]


@pytest.mark.parametrize("chunk", [3, 16, 1 << 22])
@pytest.mark.parametrize("undirected", [False, True])
@pytest.mark.parametrize("remove_self_loops", [False, True])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_csc_from_edges_equals_a_set_oracle_at_any_chunk_size(
    monkeypatch, chunk, undirected, remove_self_loops, dtype
):
    monkeypatch.setattr(csc, "CHUNK", chunk)
    gen = torch.Generator().manual_seed(chunk)
    for num_nodes, num_edges in [(1, 0), (1, 3), (7, 40), (50, 301)]:
        src = torch.randint(num_nodes, (num_edges,), generator=gen, dtype=dtype)
        dst = torch.randint(num_nodes, (num_edges,), generator=gen, dtype=dtype)
        indptr, indices = csc_from_edges(
            src, dst, num_nodes, undirected=undirected, remove_self_loops=remove_self_loops
        )
        expected = _oracle(src, dst, num_nodes, undirected, remove_self_loops)
        assert (indptr.tolist(), indices.tolist()) == expected
        assert indptr.dtype == indices.dtype == torch.int64


@pytest.mark.parametrize("size", [1, 15, 16, 17, 33, 1000, 4113])
@pytest.mark.parametrize("chunk", [16, 32, 1000, 4096])
def test_chunked_normal_draws_the_numbers_of_one_randn(monkeypatch, size, chunk):
    monkeypatch.setattr(generators, "CHUNK", chunk)
    whole, chunked = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    expected = torch.randn(size, 3, generator=whole)
    assert torch.equal(normal_(torch.empty(size, 3), chunked), expected)
    assert torch.equal(torch.rand(4, generator=chunked), torch.rand(4, generator=whole))


def _graph_tensors(dataset):
    graph, targets = dataset.graph, dataset.targets
    return [graph.indptr, graph.indices, graph.x, targets.target, targets.train, targets.test]


@pytest.mark.parametrize(
    "make",
    [
        lambda: sbm(num_nodes=3000, avg_degree=7.5, num_features=33, homophily=0.6, seed=3),
        lambda: rmat(num_nodes=1000, num_edges=6000, num_features=5, seed=1),
        lambda: rmat(num_nodes=1 << 10, num_edges=5000, undirected=False),
    ],
)
def test_a_generated_graph_is_the_same_whatever_the_chunk_size(monkeypatch, make):
    expected = _graph_tensors(make())  # the default chunk covers these graphs in one piece
    for chunk in (16, 48, 1000):
        monkeypatch.setattr(csc, "CHUNK", chunk)
        monkeypatch.setattr(generators, "CHUNK", chunk)
        got = _graph_tensors(make())
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), chunk


PEAK_PROBE = r"""
import json, resource, sys
from lightning_gnnscale.graph.generators import rmat, sbm
kind, options = sys.argv[1], json.loads(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
(sbm if kind == "sbm" else rmat)(**options)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("sbm", {"num_nodes": 400_000, "avg_degree": 10.0, "num_features": 16}),
        ("rmat", {"num_nodes": 1 << 18, "num_edges": 1 << 21, "num_features": 16}),
    ],
)
def test_generation_peaks_below_its_estimate_and_far_below_the_old_build(kind, options):
    """The estimate guards the refusal before generation, so it must not be low; and the
    streamed build must stay well under what the unchunked one held (190 B per sbm pair,
    130 B per R-MAT edge)."""
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_PROBE, kind, json.dumps(options)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak = int(proc.stdout.split()[-1])
    estimate = (sbm_peak_bytes if kind == "sbm" else rmat_peak_bytes)(**options)
    edges = (
        options["num_nodes"] * options["avg_degree"] / 2 if kind == "sbm" else options["num_edges"]
    )
    assert peak <= estimate
    assert peak <= 0.6 * (190 if kind == "sbm" else 130) * edges
