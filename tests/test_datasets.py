"""Synthetic generators and the dataset registry (Cora when present, OGB through a fixture)."""

from __future__ import annotations

import gzip
import inspect
import os
import shutil
import stat
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from lightning_gnnscale.graph import datasets
from lightning_gnnscale.graph.dataset_config import DATASETS, DatasetConfig
from lightning_gnnscale.graph.datasets import DatasetNotFoundError, load_dataset
from lightning_gnnscale.graph.generators import rmat, sbm

PLANETOID_ROOT = Path(__file__).parents[2] / "shared/datasets/planetoid"


def _graph_tensors(dataset):
    graph, targets = dataset.graph, dataset.targets
    return (
        graph.indptr,
        graph.indices,
        graph.x,
        targets.target,
        targets.train,
        targets.val,
        targets.test,
    )


def _edge_set(graph) -> set[tuple[int, int]]:
    src, dst = graph.edge_index()
    return set(zip(src.tolist(), dst.tolist()))


def _assert_split_partition(dataset, train_frac, val_frac):
    targets, num_nodes = dataset.targets, dataset.graph.num_nodes
    masks = torch.stack([targets.train, targets.val, targets.test])
    assert bool((masks.sum(0) == 1).all()), "every node is in exactly one split"
    assert int(targets.train.sum()) == round(train_frac * num_nodes)
    assert int(targets.val.sum()) == round(val_frac * num_nodes)


# ------------------------------------------------------------------------------- generators
def test_sbm_is_deterministic_by_seed_and_sized_as_asked():
    first, again, other = (
        sbm(num_nodes=2000, seed=3),
        sbm(num_nodes=2000, seed=3),
        sbm(num_nodes=2000, seed=4),
    )
    assert all(torch.equal(a, b) for a, b in zip(_graph_tensors(first), _graph_tensors(again)))
    graph = first.graph
    assert not torch.equal(graph.indices, other.graph.indices)
    assert graph.num_nodes == 2000 and graph.num_features == 64 and first.num_classes == 8
    assert torch.bincount(first.targets.target).tolist() == [250] * 8
    assert graph.x.dtype == torch.float32
    _assert_split_partition(first, 0.3, 0.2)
    assert _edge_set(graph) == {(d, s) for s, d in _edge_set(graph)}, "stored undirected"
    assert abs(graph.num_edges / graph.num_nodes - 10.0) < 0.5


@pytest.mark.parametrize("homophily", [0.2, 0.8, 1.0])
def test_sbm_edge_homophily_is_as_configured(homophily):
    dataset = sbm(num_nodes=4000, num_classes=4, homophily=homophily, seed=0)
    src, dst = dataset.graph.edge_index()
    y = dataset.targets.target
    measured = (y[src] == y[dst]).float().mean().item()
    assert abs(measured - homophily) < 0.03


def test_sbm_features_carry_the_class_signal():
    dataset = sbm(num_nodes=4000, num_features=32, feature_signal=4.0, seed=1)
    x, y = dataset.graph.x, dataset.targets.target
    centroids = torch.stack([x[y == c].mean(0) for c in range(dataset.num_classes)])
    nearest = torch.cdist(x, centroids).argmin(1)
    assert (nearest == y).float().mean() > 0.9


def test_rmat_is_deterministic_sized_and_skewed():
    dataset = rmat(num_nodes=3000, num_edges=30_000, num_features=8, num_classes=5, seed=7)
    again = rmat(num_nodes=3000, num_edges=30_000, num_features=8, num_classes=5, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(_graph_tensors(dataset), _graph_tensors(again)))
    graph, other = dataset.graph, rmat(num_nodes=3000, num_edges=30_000, seed=8).graph
    assert not torch.equal(graph.indices, other.indices)
    assert graph.num_nodes == 3000 and graph.num_features == 8 and dataset.num_classes == 5
    assert int(dataset.targets.target.max()) < 5
    assert graph.num_edges <= 2 * 30_000
    assert _edge_set(graph) == {(d, s) for s, d in _edge_set(graph)}
    _assert_split_partition(dataset, 0.3, 0.2)
    degree = graph.in_degree().float()
    assert degree.max() > 20 * degree.mean(), "R-MAT has hubs"
    top_one_percent = degree.sort(descending=True).values[: graph.num_nodes // 100]
    assert top_one_percent.sum() > 0.15 * degree.sum()


def test_rmat_directed_keeps_at_most_the_drawn_edges():
    graph = rmat(num_nodes=1 << 10, num_edges=5000, undirected=False, seed=0).graph
    assert 0.8 * 5000 < graph.num_edges <= 5000
    assert _edge_set(graph) != {(d, s) for s, d in _edge_set(graph)}


def test_generators_reject_bad_parameters():
    with pytest.raises(ValueError, match="homophily"):
        sbm(homophily=1.5)
    with pytest.raises(ValueError, match="train_frac"):
        sbm(num_nodes=100, train_frac=0.9, val_frac=0.2)
    with pytest.raises(ValueError, match="a, b, c"):
        rmat(num_nodes=64, num_edges=10, a=0.6, b=0.3, c=0.3)


# ---------------------------------------------------------------------------------- registry
def test_unknown_dataset_lists_the_valid_names():
    with pytest.raises(ValueError) as error:
        load_dataset("imagenet")
    for name in DATASETS:
        assert name in str(error.value)


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(ValueError, match="avg_degree"):
        load_dataset("sbm", avg_degre=3.0)
    with pytest.raises(ValueError, match="cache_dir"):
        load_dataset("cora", root="/nonexistent", fanout=3)


def test_generators_load_through_the_registry_and_refuse_a_root(tmp_path):
    dataset = load_dataset("SBM", num_nodes=300, num_classes=3, seed=2)
    assert dataset.graph.num_nodes == 300 and dataset.num_classes == 3
    assert torch.equal(
        dataset.graph.indices, sbm(num_nodes=300, num_classes=3, seed=2).graph.indices
    )
    assert load_dataset("rmat", num_nodes=256, num_edges=1000).graph.num_nodes == 256
    for name in ("sbm", "rmat"):  # a root is a mistake: it would be ignored
        with pytest.raises(ValueError, match=r"dataset.root=.*paths.data_dir.*GNNSCALE_DATA_DIR"):
            load_dataset(name, root=tmp_path, num_nodes=300)
    assert list(tmp_path.iterdir()) == []


def test_the_torch_free_settings_classes_are_the_generators_signatures():
    """``dataset_config`` types a run's generator settings without importing the generators:
    each generated source's settings are its generator's parameters, with its defaults."""
    generated = {name: s for name, s in DATASETS.items() if s.generated}
    assert set(generated) == set(datasets._GENERATORS)
    for name, generator in datasets._GENERATORS.items():
        parameters = inspect.signature(generator).parameters.items()
        assert generated[name].default_config().options == {k: p.default for k, p in parameters}, (
            name
        )
        hints = typing.get_type_hints(generated[name].config)
        assert {k: hints[k] for k, _ in parameters} == {
            k: type(p.default) for k, p in parameters
        }, name


@pytest.mark.parametrize("name", ["cora", "citeseer", "pubmed"])
def test_missing_planetoid_files_name_the_directory(tmp_path, name):
    with pytest.raises(DatasetNotFoundError) as error:
        load_dataset(name, root=tmp_path)
    assert isinstance(error.value, FileNotFoundError)
    folder = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}[name]
    assert str(tmp_path / folder / "raw") in str(error.value)
    assert f"ind.{name}.graph" in str(error.value)


@pytest.mark.parametrize("name", ["ogbn-arxiv", "ogbn-products", "ogbn-papers100M"])
def test_missing_ogb_files_name_the_directory(tmp_path, name):
    with pytest.raises(DatasetNotFoundError) as error:
        load_dataset(name, root=tmp_path)
    assert str(tmp_path / name.replace("-", "_")) in str(error.value)
    assert "split/" in str(error.value)


@pytest.mark.cora
@pytest.mark.skipif(
    not (PLANETOID_ROOT / "Cora" / "raw").is_dir(),
    reason="needs the raw Cora files under ../shared/datasets/planetoid",
)
def test_cora_loads_from_the_read_only_shared_folder(tmp_path):
    shared_before = sorted(p.name for p in (PLANETOID_ROOT / "Cora").iterdir())
    dataset = load_dataset("cora", root=PLANETOID_ROOT, cache_dir=tmp_path)
    graph, targets = dataset.graph, dataset.targets
    assert graph.num_nodes == 2708 and graph.num_edges == 10556 and dataset.num_classes == 7
    assert graph.num_features == 1433
    assert [int(m.sum()) for m in (targets.train, targets.val, targets.test)] == [
        140,
        500,
        1000,
    ]
    assert _edge_set(graph) == {(d, s) for s, d in _edge_set(graph)}
    assert sorted(p.name for p in (PLANETOID_ROOT / "Cora").iterdir()) == shared_before
    assert any(tmp_path.rglob("data.pt")), "processing went to the cache mirror"


@pytest.mark.cora
@pytest.mark.skipif(not (PLANETOID_ROOT / "Cora" / "raw").is_dir(), reason="no Cora files")
def test_a_writable_root_is_never_written(tmp_path):
    """The user's dataset folder is only read, even when it is writable: processing output
    goes to the cache (so a shared folder stays as it was, whoever runs first)."""
    root = tmp_path / "user_data"
    shutil.copytree(PLANETOID_ROOT / "Cora" / "raw", root / "Cora" / "raw")
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    graph = load_dataset("cora", root=root, cache_dir=tmp_path / "cache").graph
    assert graph.num_nodes == 2708
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before
    assert any((tmp_path / "cache").rglob("data.pt"))


@pytest.mark.cora
@pytest.mark.skipif(not (PLANETOID_ROOT / "Cora" / "raw").is_dir(), reason="no Cora files")
def test_a_replaced_raw_file_is_processed_again(tmp_path):
    """Processed output in the cache belongs to the raw files it came from: replace one (new
    size or time) and the next load processes afresh instead of reusing stale output."""
    root = tmp_path / "user_data"
    shutil.copytree(PLANETOID_ROOT / "Cora" / "raw", root / "Cora" / "raw")
    load_dataset("cora", root=root, cache_dir=tmp_path / "cache")
    load_dataset("cora", root=root, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("planetoid-*"))) == 1
    labels = root / "Cora" / "raw" / "ind.cora.ally"
    os.utime(labels, ns=(labels.stat().st_atime_ns, labels.stat().st_mtime_ns + 10**9))
    load_dataset("cora", root=root, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("planetoid-*"))) == 2


def test_ogb_writable_root_is_never_written(tmp_path):
    data_root = tmp_path / "data"
    _write_ogb_fixture(data_root, "ogbn-arxiv")
    before = sorted(str(p.relative_to(data_root)) for p in data_root.rglob("*"))
    graph = load_dataset("ogbn-arxiv", root=data_root, cache_dir=tmp_path / "cache").graph
    assert graph.num_nodes == 50
    assert sorted(str(p.relative_to(data_root)) for p in data_root.rglob("*")) == before
    assert any((tmp_path / "cache").rglob("data_processed"))


# ----------------------------------------------------------------------------- OGB fixture
def _write_csv_gz(path: Path, rows: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as file:
        np.savetxt(
            file,
            rows.reshape(len(rows), -1),
            delimiter=",",
            fmt="%d" if rows.dtype.kind in "iu" else "%.6f",
        )


def _write_ogb_fixture(root: Path, name: str, num_nodes: int = 50, num_edges: int = 120):
    """A tiny dataset in ogb's on-disk layout (csv for arxiv, npz for papers100M)."""
    rng = np.random.default_rng(0)
    edges = rng.integers(0, num_nodes, size=(num_edges, 2))
    features = rng.standard_normal((num_nodes, 4)).astype(np.float32)
    year = rng.integers(2000, 2020, size=(num_nodes, 1))
    labels = rng.integers(0, 40, size=(num_nodes, 1))
    folder = root / name.replace("-", "_")
    raw = folder / "raw"
    if name == "ogbn-papers100M":
        labels = labels.astype(np.float32)
        labels[::3] = np.nan
        raw.mkdir(parents=True)
        np.savez(
            raw / "data.npz",
            edge_index=edges.T,
            num_nodes_list=np.array([num_nodes]),
            num_edges_list=np.array([num_edges]),
            node_feat=features,
            node_year=year,
        )
        np.savez(raw / "node-label.npz", node_label=labels)
    else:
        _write_csv_gz(raw / "edge.csv.gz", edges)
        _write_csv_gz(raw / "num-node-list.csv.gz", np.array([num_nodes]))
        _write_csv_gz(raw / "num-edge-list.csv.gz", np.array([num_edges]))
        _write_csv_gz(raw / "node-feat.csv.gz", features)
        _write_csv_gz(raw / "node_year.csv.gz", year)
        _write_csv_gz(raw / "node-label.csv.gz", labels)
    order = rng.permutation(num_nodes)
    for split, ids in zip(("train", "valid", "test"), np.split(order, [20, 30])):
        _write_csv_gz(folder / "split" / "time" / f"{split}.csv.gz", np.sort(ids))
    (folder / "RELEASE_v1.txt").write_text("fixture\n")
    return edges, features, labels, order


@pytest.mark.parametrize("name", ["ogbn-arxiv", "ogbn-papers100M"])
def test_ogb_fixture_loads_through_ogb_and_reloads_its_processed_file(tmp_path, name):
    edges, features, labels, order = _write_ogb_fixture(tmp_path, name)
    first = load_dataset(name, root=tmp_path, cache_dir=tmp_path / "cache")
    (processed,) = (tmp_path / "cache").rglob("data_processed")
    written = processed.stat().st_mtime_ns
    # torch.load of ogb's pickle (torch >= 2.6), reused from the same cache mirror
    second = load_dataset(name, root=tmp_path, cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").rglob("data_processed")) == [processed]
    assert processed.stat().st_mtime_ns == written
    assert not (tmp_path / name.replace("-", "_") / "processed").exists()
    assert all(torch.equal(a, b) for a, b in zip(_graph_tensors(first), _graph_tensors(second)))

    graph, targets = first.graph, first.targets
    assert graph.num_nodes == 50 and first.num_classes == (40 if name == "ogbn-arxiv" else 172)
    assert torch.allclose(graph.x, torch.from_numpy(features), atol=1e-5)
    expected_y = torch.from_numpy(np.nan_to_num(labels.reshape(-1), nan=-1)).long()
    assert torch.equal(targets.target, expected_y)
    loop_free = {(int(s), int(d)) for s, d in edges if s != d}
    assert _edge_set(graph) == loop_free | {(d, s) for s, d in loop_free}
    assert targets.train.nonzero().flatten().tolist() == sorted(order[:20].tolist())
    assert targets.val.nonzero().flatten().tolist() == sorted(order[20:30].tolist())
    assert int(targets.test.sum()) == 20


def test_ogb_read_only_root_processes_into_the_cache_mirror(tmp_path):
    data_root = tmp_path / "data"
    _write_ogb_fixture(data_root, "ogbn-arxiv")
    dataset_dir = data_root / "ogbn_arxiv"
    dataset_dir.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    try:
        graph = load_dataset("ogbn-arxiv", root=data_root, cache_dir=tmp_path / "cache").graph
        assert not (dataset_dir / "processed").exists()
        assert any((tmp_path / "cache").rglob("data_processed"))
        assert graph.num_nodes == 50
    finally:
        dataset_dir.chmod(stat.S_IRWXU)


def test_each_dataset_yaml_selects_its_schema_and_copies_no_default():
    """``conf/dataset/<name>.yaml`` names its registered schema first and sets only what the
    schema cannot: a file dataset's roots from ``paths`` (a generated one sets none)."""
    conf_dir = Path(__file__).parents[1] / "conf" / "dataset"
    configs = {path.stem: OmegaConf.load(path) for path in conf_dir.glob("*.yaml")}
    assert sorted(configs) == sorted(name.replace("-", "_") for name in DATASETS)
    for stem, cfg in configs.items():
        name = stem.replace("_", "-") if stem.replace("_", "-") in DATASETS else stem
        assert list(cfg.defaults) == [{"/schema/dataset@dataset": name}, "_self_"], stem
        given = OmegaConf.to_container(cfg).get("dataset", {})
        # a generator reads no files; constructed's one folder is named on the command line
        if DATASETS[name].generated or name == "constructed":
            assert given == {}, stem
        else:
            assert given == {
                "root": "${paths.data_dir}",
                "cache_dir": "${paths.cache_dir}/datasets",
            }, stem
    for source in DATASETS.values():  # never start a download by default
        assert getattr(source.default_config(), "download", False) is False


def test_every_dataset_schema_is_in_hydras_config_store():
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, source in DATASETS.items():
        node = store.load(f"schema/dataset/{name}.yaml").node
        assert OmegaConf.get_type(node) is source.config and node.name == name


@pytest.mark.cora
@pytest.mark.skipif(not (PLANETOID_ROOT / "Cora" / "raw").is_dir(), reason="no Cora files")
def test_cora_features_are_row_normalised_by_default(tmp_path):
    graph = load_dataset("cora", root=PLANETOID_ROOT, cache_dir=tmp_path).graph
    sums = graph.x.sum(1)
    assert torch.allclose(sums[sums > 0], torch.ones(int((sums > 0).sum())))
    raw = load_dataset(
        "cora", root=PLANETOID_ROOT, cache_dir=tmp_path, normalize_features=False
    ).graph
    assert torch.equal(raw.x > 0, graph.x > 0) and raw.x.max() == 1.0


@dataclass(frozen=True)
class TinyConfig(DatasetConfig):
    """The settings of the test source below."""

    length: int = 12


def tiny_path(config):
    """A registered loader for the test below: a small SBM graph of ``config.length`` nodes."""
    return sbm(num_nodes=config.length, num_classes=2, seed=config.length)


def test_a_registered_source_loads_through_its_loader_with_its_settings(monkeypatch):
    """One registration names a dataset's settings class and loader: ``load_dataset`` types
    the options by it and calls that loader; a second registration of a name is refused."""
    from lightning_gnnscale.graph import dataset_config

    monkeypatch.setitem(dataset_config.DATASETS, "tiny", None)
    del dataset_config.DATASETS["tiny"]
    source = dataset_config.DatasetSource("tiny", TinyConfig, f"{__name__}:tiny_path")
    dataset_config.register_dataset(source)
    graph = load_dataset("tiny", length=12).graph
    assert graph.num_nodes == 12
    assert torch.equal(graph.indices, tiny_path(TinyConfig(name="tiny")).graph.indices)
    assert load_dataset(TinyConfig(name="tiny", length=20)).graph.num_nodes == 20
    with pytest.raises(ValueError, match=r"dataset.length=1\.5 is a float, expected int"):
        load_dataset("tiny", length=1.5)
    with pytest.raises(ValueError, match=r"unknown options \['width'\]; valid: \['length'\]"):
        load_dataset("tiny", width=2)
    with pytest.raises(ValueError, match="dataset.name='tiny' takes TinyConfig, not SBMConfig"):
        dataset_config.SBMConfig(name="tiny")
    with pytest.raises(ValueError, match="'tiny' is registered twice"):
        dataset_config.register_dataset(source)


def _write_ogb_mag_fixture(root: Path) -> dict:
    """A tiny ogbn-mag in ogb's heterogeneous on-disk layout (csv)."""
    rng = np.random.default_rng(1)
    counts = {"author": 7, "field_of_study": 3, "institution": 2, "paper": 11}
    triplets = [
        ("author", "affiliated_with", "institution"),
        ("author", "writes", "paper"),
        ("paper", "cites", "paper"),
        ("paper", "has_topic", "field_of_study"),
    ]
    folder = root / "ogbn_mag"
    raw = folder / "raw"
    raw.mkdir(parents=True)
    import pandas as pd

    pd.DataFrame({k: [v] for k, v in counts.items()}).to_csv(
        raw / "num-node-dict.csv.gz", index=False, compression="gzip"
    )
    pd.DataFrame(triplets).to_csv(
        raw / "triplet-type-list.csv.gz", index=False, header=False, compression="gzip"
    )
    edges = {}
    for head, rel, tail in triplets:
        pairs = np.unique(
            np.stack([rng.integers(0, counts[head], 9), rng.integers(0, counts[tail], 9)], 1),
            axis=0,
        )
        pairs = pairs[pairs[:, 0] != pairs[:, 1]] if head == tail else pairs
        edges[head, rel, tail] = pairs
        sub = raw / "relations" / f"{head}___{rel}___{tail}"
        _write_csv_gz(sub / "edge.csv.gz", pairs)
        _write_csv_gz(sub / "num-edge-list.csv.gz", np.array([len(pairs)]))
    features = rng.standard_normal((counts["paper"], 4)).astype(np.float32)
    _write_csv_gz(raw / "node-feat" / "paper" / "node-feat.csv.gz", features)
    labels = rng.integers(0, 349, size=(counts["paper"], 1))
    _write_csv_gz(raw / "node-label" / "paper" / "node-label.csv.gz", labels)
    pd.DataFrame({t: [t == "paper"] for t in counts}).to_csv(
        raw / "nodetype-has-label.csv.gz", index=False, compression="gzip"
    )
    split = folder / "split" / "time"
    split.mkdir(parents=True)
    pd.DataFrame({t: [t == "paper"] for t in counts}).to_csv(
        split / "nodetype-has-split.csv.gz", index=False, compression="gzip"
    )
    for name, ids in zip(("train", "valid", "test"), ([0, 3, 5, 8], [1, 9], [2, 10]), strict=True):
        _write_csv_gz(split / "paper" / f"{name}.csv.gz", np.array(ids))
    (folder / "RELEASE_v2.txt").write_text("fixture\n")
    return {"counts": counts, "edges": edges, "features": features, "labels": labels}


def test_ogbn_mag_loads_as_a_typed_graph_with_reverse_relations(tmp_path):
    fixture = _write_ogb_mag_fixture(tmp_path / "data")
    data = load_dataset("ogbn-mag", root=tmp_path / "data", cache_dir=tmp_path / "cache")
    g, t = data.graph, data.targets
    counts = fixture["counts"]
    order = sorted(counts)
    offsets = dict(zip(order, np.cumsum([0] + [counts[k] for k in order])[:-1].tolist()))
    assert g.node_types == tuple(order) and g.num_nodes == sum(counts.values())
    assert torch.equal(torch.bincount(g.node_type), torch.tensor([counts[k] for k in order]))
    src, dst = g.edge_index()
    have = set(zip(src.tolist(), dst.tolist(), g.edge_type.tolist(), strict=True))
    want = set()
    for (head, rel, tail), pairs in sorted(fixture["edges"].items()):
        forward = g.relations.index(f"{head}__{rel}__{tail}")
        reverse = g.relations.index(f"{tail}__rev_{rel}__{head}")
        for a, b in pairs.tolist():
            want |= {(a + offsets[head], b + offsets[tail], forward)}
            want |= {(b + offsets[tail], a + offsets[head], reverse)}
    assert have == want and len(g.relations) == 8
    paper = slice(offsets["paper"], offsets["paper"] + counts["paper"])
    torch.testing.assert_close(g.x[paper], torch.from_numpy(fixture["features"]))
    assert bool((g.x[: offsets["paper"]] == 0).all())  # featureless types: zero rows
    assert g.meta["featureless_node_types"] == ["author", "field_of_study", "institution"]
    assert torch.equal(t.target[paper], torch.from_numpy(fixture["labels"]).reshape(-1))
    assert bool((t.target[: offsets["paper"]] == -1).all())
    assert t.train.nonzero().flatten().tolist() == [offsets["paper"] + i for i in (0, 3, 5, 8)]
    assert int(t.val.sum()) == 2 and int(t.test.sum()) == 2


def test_ogbn_mag_needs_a_typed_system(tmp_path, monkeypatch):
    """A system that does not train typed graphs (ddp's config with its flag taken away)
    refuses ogbn-mag from its settings alone, before any file is read."""
    from lightning_gnnscale.config_types import run_config
    from lightning_gnnscale.errors import ConfigError
    from lightning_gnnscale.systems.ddp.config import DataParallelConfig
    from tests.helpers.config import make_cfg

    monkeypatch.setattr(DataParallelConfig, "TYPED_GRAPHS", False)
    with pytest.raises(ConfigError, match="the dataset is a typed graph"):
        run_config(make_cfg(tmp_path, "strategy=ddp", "dataset=ogbn_mag", tiny=False))


def test_a_damaged_ogbn_mag_is_refused_naming_what_does_not_fit(tmp_path):
    _write_ogb_mag_fixture(tmp_path / "data")
    feat = tmp_path / "data" / "ogbn_mag" / "raw" / "node-feat" / "paper" / "node-feat.csv.gz"
    _write_csv_gz(feat, np.zeros((5, 4), dtype=np.float32))  # 5 rows for 11 papers
    with pytest.raises(ValueError, match="paper has 11 nodes but 5 feature rows"):
        load_dataset("ogbn-mag", root=tmp_path / "data", cache_dir=tmp_path / "cache")
