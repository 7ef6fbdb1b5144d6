"""Partitioners, the partition report and the content-hashed artifact cache."""

from __future__ import annotations

import json
import multiprocessing

import pytest
import torch

from lightning_gnnscale.graph.cache import (
    artifact_path,
    cache_key,
    cached,
    cached_partition,
    graph_fingerprint,
)
from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.partition import PARTITION_METHODS, partition, partition_report


@pytest.fixture(scope="module")
def graph():
    return sbm(num_nodes=3000, num_classes=6, avg_degree=8.0, homophily=0.9, seed=0)


def _path_graph(num_nodes: int) -> Graph:
    src = torch.arange(num_nodes - 1)
    return Graph.from_edge_index(
        torch.stack([src, src + 1]),
        num_nodes,
        undirected=True,
        x=torch.zeros(num_nodes, 1),
        y=torch.zeros(num_nodes, dtype=torch.int64),
        train_mask=torch.ones(num_nodes, dtype=torch.bool),
        val_mask=torch.zeros(num_nodes, dtype=torch.bool),
        test_mask=torch.zeros(num_nodes, dtype=torch.bool),
        num_classes=1,
    )


# ----------------------------------------------------------------------------- partitioners
@pytest.mark.parametrize("method", PARTITION_METHODS)
@pytest.mark.parametrize("num_parts", [1, 3, 4])
def test_every_node_gets_a_part_in_range(graph, method, num_parts):
    parts = partition(graph, method, num_parts, seed=1)
    assert parts.shape == (graph.num_nodes,) and parts.dtype == torch.int64
    assert int(parts.min()) >= 0 and int(parts.max()) < num_parts
    if num_parts == 1:
        assert not parts.any()
    else:
        assert partition_report(graph, parts, num_parts)["node_balance"] < 1.1


def test_contiguous_cuts_the_id_range_and_permute_shuffles_it(graph):
    parts = partition(graph, "contiguous", 4)
    assert bool((parts[1:] >= parts[:-1]).all())
    assert torch.bincount(parts).tolist() == [750] * 4
    shuffled = partition(graph, "contiguous", 4, seed=2, permute=True)
    assert torch.bincount(shuffled).tolist() == [750] * 4
    assert not bool((shuffled[1:] >= shuffled[:-1]).all())
    assert torch.equal(shuffled, partition(graph, "contiguous", 4, seed=2, permute=True))


def test_random_is_seeded_and_roughly_balanced(graph):
    parts = partition(graph, "random", 4, seed=5)
    assert torch.equal(parts, partition(graph, "random", 4, seed=5))
    assert not torch.equal(parts, partition(graph, "random", 4, seed=6))
    assert partition_report(graph, parts)["node_balance"] < 1.1


def test_metis_cuts_far_fewer_edges_than_random(graph):
    metis_cut = partition_report(graph, partition(graph, "metis", 4))["edge_cut_fraction"]
    random_cut = partition_report(graph, partition(graph, "random", 4))["edge_cut_fraction"]
    assert metis_cut < 0.5 * random_cut


def test_metis_is_deterministic_for_a_seed_and_balanced(graph):
    parts = partition(graph, "metis", 4, seed=11)
    assert torch.equal(parts, partition(graph, "metis", 4, seed=11))
    assert partition_report(graph, parts)["node_balance"] <= 1.03 + 1e-9


def test_metis_balances_a_node_weight_column(graph):
    weights = torch.ones(graph.num_nodes, dtype=torch.int64)
    weights[: graph.num_nodes // 3] = 5
    parts = partition(graph, "metis", 3, node_weights=weights[:, None])
    per_part = torch.zeros(3, dtype=torch.int64).index_add_(0, parts, weights)
    assert float(per_part.max()) * 3 / float(per_part.sum()) < 1.05


def test_metis_edge_weights_steer_the_cut():
    graph = _path_graph(40)
    src, dst = graph.edge_index()
    heavy = torch.where((torch.minimum(src, dst) == 19), 1, 1000)  # only 19-20 is cheap
    parts = partition(graph, "metis", 2, edge_weights=heavy, ufactor=100)
    assert partition_report(graph, parts)["edge_cut"] == 2  # one undirected edge, both ways
    assert int(parts[19]) != int(parts[20])


def test_partition_errors(graph):
    with pytest.raises(ValueError) as error:
        partition(graph, "kmeans", 2)
    assert all(method in str(error.value) for method in PARTITION_METHODS)
    with pytest.raises(ValueError, match="num_parts"):
        partition(graph, "random", 0)
    with pytest.raises(ValueError, match="unknown options"):
        partition(graph, "metis", 2, ufactr=10)
    with pytest.raises(ValueError, match="only supported by 'metis'"):
        partition(graph, "random", 2, node_weights=torch.ones(graph.num_nodes, dtype=torch.int64))
    with pytest.raises(ValueError, match="one node-weight column"):
        partition(graph, "metis", 2, node_weights=torch.ones(graph.num_nodes, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="all zero"):
        partition(graph, "metis", 2, node_weights=torch.zeros(graph.num_nodes, dtype=torch.int64))
    with pytest.raises(ValueError, match="integers"):
        partition(graph, "metis", 2, node_weights=torch.ones(graph.num_nodes))
    with pytest.raises(ValueError, match="positive"):
        partition(graph, "metis", 2, edge_weights=torch.zeros(graph.num_edges, dtype=torch.int64))


def test_report_counts_match_brute_force():
    graph = sbm(num_nodes=200, num_classes=3, avg_degree=4.0, seed=3)
    parts = partition(graph, "random", 3, seed=0)
    report = partition_report(graph, parts)
    src, dst = graph.edge_index()
    edges = list(zip(src.tolist(), dst.tolist()))
    owner = parts.tolist()
    cut = sum(owner[s] != owner[d] for s, d in edges)
    assert report["edge_cut"] == cut
    assert report["edge_cut_fraction"] == pytest.approx(cut / len(edges))
    for k in range(3):
        assert report["nodes_per_part"][k] == owner.count(k)
        assert report["edges_per_part"][k] == sum(owner[d] == k for _, d in edges)
        halo = {s for s, d in edges if owner[d] == k and owner[s] != k}
        assert report["halo_nodes_per_part"][k] == len(halo)
        train = graph.train_mask.nonzero().flatten().tolist()
        assert report["train_nodes_per_part"][k] == sum(owner[v] == k for v in train)
    json.dumps(report)


# ------------------------------------------------------------------------------------ cache
def test_cached_builds_once_and_rebuilds_on_a_new_key(tmp_path):
    calls = []

    def build():
        calls.append(1)
        return {"parts": torch.arange(5), "score": 0.5}

    first = cached({"dataset": "toy", "parts": 2}, build, tmp_path)
    second = cached({"parts": 2, "dataset": "toy"}, build, tmp_path)  # key order is irrelevant
    assert len(calls) == 1
    assert torch.equal(first["parts"], second["parts"]) and second["score"] == 0.5
    cached({"dataset": "toy", "parts": 3}, build, tmp_path)
    assert len(calls) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        artifact_path({"dataset": "toy", "parts": n}, tmp_path).name for n in (2, 3)
    )


def test_cached_leaves_no_temporary_file_when_saving_fails(tmp_path):
    def unsaveable():
        return {"unpicklable": lambda: None}

    with pytest.raises(Exception):  # noqa: B017 - torch.save's pickling error type varies
        cached({"k": 1}, unsaveable, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_cache_key_depends_on_every_part():
    base = {"dataset": "cora", "method": "metis", "parts": 4, "seed": 0}
    keys = {cache_key(base)} | {cache_key({**base, name: "x"}) for name in base}
    assert len(keys) == len(base) + 1


def test_graph_fingerprint_sees_structure_changes(graph):
    other = sbm(num_nodes=3000, num_classes=6, avg_degree=8.0, homophily=0.9, seed=1)
    assert graph_fingerprint(graph) == graph_fingerprint(
        graph.with_structure(graph.indptr, graph.indices)
    )
    assert graph_fingerprint(graph) != graph_fingerprint(other)


def test_cached_partition_reuses_the_artifact_and_writes_a_report(graph, tmp_path, monkeypatch):
    import lightning_gnnscale.graph.cache as cache_module

    calls = []
    real_partition = cache_module.partition

    def counting_partition(*args, **kwargs):
        calls.append(args[1])
        return real_partition(*args, **kwargs)

    monkeypatch.setattr(cache_module, "partition", counting_partition)
    parts = cached_partition(graph, "metis", 4, 0, tmp_path, ufactor=30)
    again = cached_partition(graph, "metis", 4, 0, tmp_path, ufactor=30)
    assert calls == ["metis"] and torch.equal(parts, again)
    cached_partition(graph, "metis", 4, 1, tmp_path, ufactor=30)
    assert calls == ["metis", "metis"]

    report_files = sorted(tmp_path.glob("partition-*.json"))
    assert all(path.with_suffix(".pt").exists() for path in report_files)
    reports = [json.loads(path.read_text()) for path in report_files]
    assert sorted(report["key"]["seed"] for report in reports) == [0, 1]
    assert all(report["report"]["num_parts"] == 4 for report in reports)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _race(cache_dir):
    parts = cached_partition(sbm(num_nodes=500, seed=0), "random", 3, 0, cache_dir)
    return parts.tolist()


def test_concurrent_builders_agree_and_leave_one_artifact(tmp_path):
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_race, [str(tmp_path)] * 4)
    assert all(result == results[0] for result in results)
    assert len(list(tmp_path.glob("partition-*.pt"))) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
