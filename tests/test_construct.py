"""``python -m lightning_gnnscale.construct`` on a graph nobody here wrote (Zachary's karate
club from networkx, written to CSV and Parquet by the test), the ``constructed`` dataset it
writes, and each bad input refused with its file, row and column (docs/datasets.md)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from lightning_gnnscale import construct as construct_command
from lightning_gnnscale.construct import construct
from lightning_gnnscale.graph.constructed import METADATA, node_ids
from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.dataset_config import dataset_config
from lightning_gnnscale.graph.datasets import load_dataset
from lightning_gnnscale.graph.node_targets import NodeDataset, NodeTargets
from lightning_gnnscale.graph.partition_dir import dataset_identity
from tests.helpers.config import REPO


def karate_tables(seed: int = 0) -> tuple[dict, dict]:
    """The karate club as a node table (zero-padded string ids, the club as label, degree,
    three noise columns, a colour category, a split column) and an edge table (weights)."""
    graph = nx.karate_club_graph()
    n = graph.number_of_nodes()
    rng = np.random.default_rng(seed)
    ids = [f"{i:03d}" for i in range(n)]
    nodes = {
        "node": ids,
        "club": [graph.nodes[i]["club"] for i in range(n)],
        "deg": [float(graph.degree(i)) for i in range(n)],
        **{f"f_{j}": rng.normal(size=n).tolist() for j in range(3)},
        "colour": (["red", "red", "blue", "blue"] * n)[: n - 2] + ["green"] * 2,  # green: test only
        "split": ["train", "val"] * (n // 2 - 1) + ["test"] * 2,
    }
    edges = list(graph.edges(data="weight"))
    table = {
        "a": [ids[s] for s, _, _ in edges],
        "b": [ids[d] for _, d, _ in edges],
        "w": [float(w) for *_, w in edges],
    }
    return nodes, table


def base_spec(nodes_file="nodes.csv", edges_file="edges.csv") -> dict:
    return {
        "name": "karate",
        "nodes": {
            "file": nodes_file,
            "id": "node",
            "id_type": "str",
            "label": "club",
            "features": [
                {"columns": ["deg"], "transform": "standardise"},
                {"prefix": "f_", "transform": "min-max"},
                {"columns": ["colour"], "transform": "one-hot"},
            ],
            "split": "split",
        },
        "edges": [{"file": edges_file, "src": "a", "dst": "b", "weight": "w"}],
        "undirected": True,
    }


def write(folder: Path, name: str, table: dict) -> Path:
    path = folder / name
    arrow = pa.table(table)
    if name.endswith(".parquet"):
        pq.write_table(arrow, path)
    else:
        pa_csv.write_csv(arrow, path)
    return path


def write_spec(folder: Path, spec: dict) -> Path:
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def build(folder: Path, spec: dict | None = None, nodes=None, edges=None, fmt="csv") -> Path:
    """Write the karate tables (or the given ones) and the spec into ``folder``, construct
    ``folder/out``, return it."""
    folder.mkdir(parents=True, exist_ok=True)
    default_nodes, default_edges = karate_tables()
    write(folder, f"nodes.{fmt}", default_nodes if nodes is None else nodes)
    write(folder, f"edges.{fmt}", default_edges if edges is None else edges)
    spec = spec or base_spec(f"nodes.{fmt}", f"edges.{fmt}")
    construct(write_spec(folder, spec), folder / "out", log=lambda *_: None)
    return folder / "out"


def test_csv_and_parquet_give_the_graph_from_edge_index(tmp_path):
    nodes, edges = karate_tables()
    from_csv = load_dataset("constructed", root=build(tmp_path / "csv"))
    from_parquet = load_dataset("constructed", root=build(tmp_path / "pq", fmt="parquet"))
    n = len(nodes["node"])
    train = np.array(nodes["split"]) == "train"
    deg = np.array(nodes["deg"])
    noise = np.array([nodes[f"f_{j}"] for j in range(3)]).T
    low, high = noise[train].min(0), noise[train].max(0)
    colour = np.array(nodes["colour"])
    one_hot = np.stack(
        [colour == "blue", colour == "red", ~np.isin(colour, ["blue", "red"])], 1
    )  # green never trains: the unknown slot
    x = np.concatenate(
        [
            ((deg - deg[train].mean()) / deg[train].std())[:, None],
            (noise - low) / (high - low),
            one_hot,
        ],
        1,
    ).astype(np.float32)
    index = {raw: i for i, raw in enumerate(nodes["node"])}
    edge_index = torch.tensor([[index[r] for r in edges["a"]], [index[r] for r in edges["b"]]])
    split = np.array(nodes["split"])
    expected = NodeDataset(
        Graph.from_edge_index(edge_index, n, undirected=True, x=torch.from_numpy(x), name="karate"),
        NodeTargets(
            torch.tensor([c == "Officer" for c in nodes["club"]], dtype=torch.int64),
            torch.from_numpy(train),
            torch.from_numpy(split == "val"),
            torch.from_numpy(split == "test"),
            2,
        ),
    )
    for dataset in (from_csv, from_parquet):
        assert dataset.name == "karate" and dataset.num_classes == 2
        for field in ("indptr", "indices"):
            assert torch.equal(getattr(dataset.graph, field), getattr(expected.graph, field))
        for field in ("target", "train", "val", "test"):
            assert torch.equal(getattr(dataset.targets, field), getattr(expected.targets, field))
        # float32 of float64 statistics
        assert float((dataset.graph.x - expected.graph.x).abs().max()) < 1e-6
    assert torch.equal(from_csv.graph.x, from_parquet.graph.x)


def test_gzipped_csv_reads_as_the_plain_one(tmp_path):
    import gzip

    plain = build(tmp_path / "plain")
    zipped = tmp_path / "zipped"
    zipped.mkdir()
    for name in ("nodes", "edges"):
        text = (tmp_path / "plain" / f"{name}.csv").read_bytes()
        (zipped / f"{name}.csv.gz").write_bytes(gzip.compress(text))
    spec = write_spec(zipped, base_spec("nodes.csv.gz", "edges.csv.gz"))
    construct(spec, zipped / "out", log=lambda *_: None)
    for array in ("indptr", "indices", "x", "y", "train_mask", "node_id_bytes"):
        assert np.array_equal(
            np.load(plain / f"{array}.npy"), np.load(zipped / "out" / f"{array}.npy")
        )


def test_the_id_map_and_edge_weights_follow_the_rows(tmp_path):
    nodes, edges = karate_tables()
    out = build(tmp_path)
    ids = node_ids(out).to_pylist()
    assert ids == nodes["node"], "node i is row i, its raw id kept as written ('007')"
    graph = load_dataset("constructed", root=out).graph
    weight = np.load(out / "edge_weight.npy")
    given = {}
    for a, b, w in zip(edges["a"], edges["b"], edges["w"]):
        given[(a, b)] = given[(b, a)] = w  # undirected: the reverse carries the edge's weight
    src, dst = graph.edge_index()
    stored = {(ids[s], ids[d]): float(w) for s, d, w in zip(src.tolist(), dst.tolist(), weight)}
    assert stored == given
    meta = json.loads((out / METADATA).read_text())
    assert meta["edge_columns"]["weight"] == ["w"] and meta["transforms"][0]["transform"] == (
        "standardise"
    )


def test_int_ids_equal_by_value_and_duplicates_merge_first_row(tmp_path):
    nodes = {
        "id": ["7", "12", "30"],
        "y": [0, 1, 0],
        "v": [1.0, 2.0, 3.0],
        "split": ["train", "val", "test"],
    }
    edges = {
        "s": ["007", "12", "7", "7", "30"],  # "007" is node 7 (id_type int)
        "d": ["12", "30", "12", "7", "7"],
        "w": [1.0, 2.0, 9.0, 5.0, 3.0],
    }
    spec = {
        "nodes": {
            "file": "nodes.csv",
            "id": "id",
            "id_type": "int",
            "label": "y",
            "features": {"columns": ["v"]},
            "split": "split",
        },
        "edges": {"file": "edges.csv", "src": "s", "dst": "d", "weight": "w"},
        "self_loops": "keep",
    }
    out = build(tmp_path, spec, nodes, edges)
    dataset = load_dataset("constructed", root=out)
    graph = dataset.graph
    assert node_ids(out).to_pylist() == [7, 12, 30]
    src, dst = graph.edge_index()
    weight = np.load(out / "edge_weight.npy").tolist()
    assert sorted(zip(src.tolist(), dst.tolist(), weight)) == [
        (0, 0, 5.0),  # kept self-loop
        (0, 1, 1.0),  # 007->12 and 7->12 merged: the first row's weight
        (1, 2, 2.0),
        (2, 0, 3.0),
    ]
    assert dataset.name == "out" and dataset.num_classes == 2


def test_seeded_fractions_split_the_labelled_nodes(tmp_path):
    nodes, _ = karate_tables()
    nodes["club"] = [None] * 4 + nodes["club"][4:]  # four unlabelled nodes
    spec = base_spec()
    del spec["nodes"]["split"]
    spec["nodes"]["split_fractions"] = {"train": 0.5, "val": 0.25, "seed": 3}
    spec["nodes"]["classes"] = ["Officer", "Mr. Hi"]  # declared order = class index
    first = load_dataset("constructed", root=build(tmp_path / "a", spec, nodes)).targets
    again = load_dataset("constructed", root=build(tmp_path / "b", spec, nodes)).targets
    masks = torch.stack([first.train, first.val, first.test])
    assert masks[:, :4].sum() == 0 and bool((masks[:, 4:].sum(0) == 1).all())
    assert masks.sum(1).tolist() == [15, 8, 7]
    assert torch.equal(first.train, again.train)
    assert first.target[:4].tolist() == [-1] * 4
    assert first.target[4:].tolist() == [int(club == "Mr. Hi") for club in nodes["club"][4:]]


def test_the_content_is_the_identity_a_partition_dir_checks(tmp_path):
    first, again = build(tmp_path / "a"), build(tmp_path / "b")
    nodes, _ = karate_tables(seed=1)  # other noise features
    other = build(tmp_path / "c", nodes=nodes)
    identity = [
        dataset_identity(dataset_config("constructed", root=p)) for p in (first, again, other)
    ]
    assert identity[0] == identity[1] != identity[2]


def test_a_killed_construct_leaves_nothing_that_looks_complete(tmp_path):
    """SIGKILL after the first array is written: only a hidden temporary folder remains,
    ``out`` does not exist, and a rerun removes the left-over and succeeds."""
    build(tmp_path)  # the tables and the spec
    out = tmp_path / "again"
    script = (
        "import os, signal, lightning_gnnscale.construct as c\n"
        "from lightning_gnnscale.graph import constructed\n"
        "def first_then_die(folder, arrays):\n"
        "    constructed.write_arrays(folder, dict(list(arrays.items())[:1]))\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "c.write_arrays = first_then_die\n"
        f"c.construct({str(tmp_path / 'spec.yaml')!r}, {str(out)!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()
    left = list(tmp_path.glob(".again.construct-*"))
    assert len(left) == 1 and (left[0] / "indptr.npy").exists() and not out.exists()
    construct(tmp_path / "spec.yaml", out, log=lambda *_: None)
    assert (out / METADATA).exists() and not list(tmp_path.glob(".again.construct-*"))


# ------------------------------------------------------------------------------ bad input
def _case(tmp_path: Path, change) -> tuple[int, str, Path]:
    """Write the karate tables and spec, let ``change(nodes, edges, spec)`` spoil them, run the
    command's entry function; its exit code, stderr and the ``out`` it was given."""
    nodes, edges = karate_tables()
    spec = base_spec()
    fmt = change(nodes, edges, spec)
    fmt = fmt if isinstance(fmt, str) else "csv"
    for name, table in (("nodes", nodes), ("edges", edges)):
        write(tmp_path, f"{name}.{fmt}", table)
    out = tmp_path / "out"
    return _run(write_spec(tmp_path, spec), out), out


def _run(spec: Path, out: Path):
    from io import StringIO
    from unittest import mock

    err = StringIO()
    with mock.patch.object(sys, "stderr", err):
        code = construct_command.main([f"spec={spec}", f"out={out}"])
    return code, err.getvalue()


def _set(table: dict, key: str, row: int, value) -> None:
    table[key] = [*table[key][:row], value, *table[key][row + 1 :]]


BAD = {
    "duplicate node id": (
        lambda n, e, s: _set(n, "node", 5, "003"),
        "nodes.csv, row 6 (line 7), column 'node': duplicate node id '003' (first in row 4)",
    ),
    "unknown edge id": (
        lambda n, e, s: _set(e, "b", 2, "099"),
        "edges.csv, row 3 (line 4), column 'b': id '099' is not in the node table",
    ),
    "misspelt column": (
        lambda n, e, s: s["nodes"].update(label="clubb"),
        "nodes.csv: no column 'clubb' (did you mean 'club'?); its columns: ['node', 'club',",
    ),
    "NaN feature": (
        lambda n, e, s: _set(n, "f_1", 8, float("nan")),
        "nodes.csv, row 9 (line 10), column 'f_1': feature value nan is not finite",
    ),
    "infinite feature": (
        lambda n, e, s: _set(n, "deg", 2, float("inf")),
        "nodes.csv, row 3 (line 4), column 'deg': feature value inf is not finite",
    ),
    "label outside the classes": (
        lambda n, e, s: (
            s["nodes"].update(classes=["Mr. Hi", "Officer"]),
            _set(n, "club", 4, "Boss"),
        ),
        "nodes.csv, row 5 (line 6), column 'club': label 'Boss' is not one of the declared "
        "classes ['Mr. Hi', 'Officer']",
    ),
    "id that does not parse": (
        lambda n, e, s: (s["nodes"].update(id_type="int"), _set(n, "node", 10, "x10")),
        "nodes.csv, row 11 (line 12), column 'node': 'x10' is not an integer (id_type int)",
    ),
    "empty node table": (
        lambda n, e, s: [table.update({k: []}) for table in (n,) for k in list(table)],
        "nodes.csv: the table is empty (0 rows); columns: ['node', 'club',",
    ),
    "unknown split value": (
        lambda n, e, s: _set(n, "split", 7, "training"),
        "nodes.csv, row 8 (line 9), column 'split': split 'training' is unknown; valid: "
        "['train', 'val', 'test'] or empty",
    ),
    "edge table of 0 rows": (
        lambda n, e, s: [e.update({k: []}) for k in list(e)],
        "edges.parquet: the table is empty (0 rows); columns: ['a', 'b', 'w']",
    ),
    "ragged CSV row": (
        lambda n, e, s: None,  # replaced below: the edge file is written by hand
        "ragged.csv, line 3: 2 values where the header has 3 columns: '000,002'",
    ),
    "duplicate edge, declared an error": (
        lambda n, e, s: (s.update(duplicates="error"), _set(e, "b", 1, e["b"][0])),
        "edges.csv, row 2 (line 3): a duplicate edge (duplicates: error)",
    ),
    "self-loop, declared an error": (
        lambda n, e, s: (s.update(self_loops="error"), _set(e, "b", 3, e["a"][3])),
        "edges.csv, row 4 (line 5): a self-loop (self_loops: error)",
    ),
    "split but no label": (
        lambda n, e, s: _set(n, "club", 3, None),
        "nodes.csv, row 4 (line 5), column 'split': the node is in split 'val' but has no "
        "label (column 'club' is empty)",
    ),
    "id with a plus sign": (
        lambda n, e, s: (s["nodes"].update(id_type="int"), _set(n, "node", 10, "+10")),
        "nodes.csv, row 11 (line 12), column 'node': '+10' is not an integer (id_type int)",
    ),
    "id above int64": (
        lambda n, e, s: (
            s["nodes"].update(id_type="int"),
            _set(n, "node", 10, "9223372036854775808"),
        ),
        "nodes.csv, row 11 (line 12), column 'node': '9223372036854775808' is outside the "
        "int64 range",
    ),
    "repeated column name": (
        lambda n, e, s: None,  # replaced below: the edge file is written by hand
        "dup.csv: column names ['a'] appear more than once: ['a', 'b', 'a']",
    ),
    "corrupt gzipped CSV": (
        lambda n, e, s: None,  # replaced below: the edge file is written by hand
        "bad.csv.gz: cannot be read:",
    ),
    "unknown spec key": (
        lambda n, e, s: s["nodes"].update(lable="club"),
        "unknown key 'lable' (did you mean 'label'?); valid: ['file', 'id', 'id_type', 'label',",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_named_and_leaves_nothing(tmp_path, case):
    change, message = BAD[case]
    if case == "ragged CSV row":

        def change(nodes, edges, spec):
            spec["edges"][0].update(file="ragged.csv")
            (tmp_path / "ragged.csv").write_text("a,b,w\n000,001,1\n000,002\n001,002,1\n")

    hand_written = {
        "repeated column name": ("dup.csv", b"a,b,a\n000,001,1\n"),
        "corrupt gzipped CSV": ("bad.csv.gz", b"not gzip at all"),
    }
    if case in hand_written:
        name, text = hand_written[case]

        def change(nodes, edges, spec):
            spec["edges"][0].update(file=name)
            (tmp_path / name).write_bytes(text)

    if case == "edge table of 0 rows":

        def change(nodes, edges, spec, base=change):
            base(nodes, edges, spec)
            spec["nodes"]["file"] = "nodes.parquet"
            spec["edges"][0]["file"] = "edges.parquet"
            return "parquet"

    (code, err), out = _case(tmp_path, change)
    assert code == 1 and message in err, err
    assert err.startswith(f"error: {tmp_path}") or case == "unknown spec key"
    assert not out.exists() and not list(tmp_path.glob(".out.construct-*"))


def test_npy_files_that_are_not_arrays_are_named(tmp_path):
    build(tmp_path)  # the tables and the spec
    (tmp_path / "empty.npy").write_bytes(b"")
    np.savez(tmp_path / "z.npz", a=np.zeros((2, 2), dtype=np.int64))
    (tmp_path / "z.npz").rename(tmp_path / "zip.npy")
    features = base_spec()
    features["nodes"]["features"] = [{"npy": "empty.npy"}]
    edges = base_spec()
    edges["edges"] = [{"file": "zip.npy"}]
    edges["nodes"]["id_type"] = "int"
    for spec, file in ((features, "empty.npy"), (edges, "zip.npy")):
        code, err = _run(write_spec(tmp_path, spec), tmp_path / "bad")
        assert code == 1 and f"{tmp_path / file}: not a plain .npy array" in err, err


def test_a_uint64_parquet_id_above_int64_is_named(tmp_path):
    nodes, edges = karate_tables()
    n = len(nodes["node"])
    nodes["node"] = pa.array([*range(n - 1), 2**63], pa.uint64())
    edges = {"a": list(range(n - 1)), "b": [1] * (n - 1), "w": [1.0] * (n - 1)}
    spec = base_spec("nodes.parquet", "edges.parquet")
    spec["nodes"]["id_type"] = "int"
    write(tmp_path, "nodes.parquet", nodes), write(tmp_path, "edges.parquet", edges)
    code, err = _run(write_spec(tmp_path, spec), tmp_path / "out")
    assert code == 1 and f"row {n}, column 'node': 9223372036854775808 is above" in err, err


def test_parquet_large_string_and_dictionary_columns_read_as_strings(tmp_path):
    nodes, edges = karate_tables()
    plain = build(tmp_path / "plain", nodes=nodes, edges=edges, fmt="parquet")
    nodes["node"] = pa.array(nodes["node"], pa.large_string())
    nodes["club"] = pa.array(nodes["club"]).dictionary_encode()
    edges["a"] = pa.array(edges["a"]).dictionary_encode()
    edges["b"] = pa.array(edges["b"], pa.large_string())
    other = build(tmp_path / "other", nodes=nodes, edges=edges, fmt="parquet")
    for name in ("indptr", "indices", "x", "y", "train_mask", "node_id_bytes"):
        assert np.array_equal(np.load(plain / f"{name}.npy"), np.load(other / f"{name}.npy"))


def test_float_labels_nan_is_unlabelled_and_fractions_are_refused(tmp_path):
    nodes, edges = karate_tables()
    n = len(nodes["node"])
    nodes["club"] = [float("nan")] * 2 + [float(i % 2) for i in range(n - 2)]
    nodes["split"] = [None] * 2 + nodes["split"][2:]
    out = build(tmp_path / "a", nodes=nodes, edges=edges, fmt="parquet")
    meta = json.loads((out / METADATA).read_text())
    assert meta["classes"] == ["0", "1"]
    assert np.load(out / "y.npy").tolist() == [-1, -1] + [i % 2 for i in range(n - 2)]
    nodes["club"] = nodes["club"][:5] + [2.5] + nodes["club"][6:]
    with pytest.raises(construct_command.ConstructError, match=r"row 6, column 'club': label 2.5"):
        build(tmp_path / "b", nodes=nodes, edges=edges, fmt="parquet")


def test_prefix_selected_one_hot_columns_are_read_as_text(tmp_path):
    nodes, _ = karate_tables()
    nodes["c_code"] = (["007", "007", "7", "7"] * len(nodes["node"]))[: len(nodes["node"])]
    spec = base_spec()
    spec["nodes"]["features"] = [{"prefix": "c_", "transform": "one-hot"}]
    meta = json.loads((build(tmp_path, spec, nodes) / METADATA).read_text())
    assert meta["feature_names"] == ["c_code=007", "c_code=7", "c_code=<unknown>"]


def test_constructed_without_root_stops_at_the_config_check(tmp_path):
    from lightning_gnnscale.config_types import run_config
    from lightning_gnnscale.errors import ConfigError
    from tests.helpers.config import make_cfg

    cfg = make_cfg(tmp_path, "dataset=constructed", tiny=False)
    with pytest.raises(ConfigError, match=r"dataset.root has no value and is required"):
        run_config(cfg)
    with pytest.raises(ConfigError, match=r"dataset=constructed needs dataset.root="):
        dataset_config("constructed")


def test_a_resume_onto_another_folders_content_is_refused(tmp_path):
    """The run identity (what a resume must match) and the config hash carry the dataset's
    content: the same tables in another folder resume, other tables do not."""
    from lightning_gnnscale.config_types import run_config, run_identity
    from lightning_gnnscale.run import config_hash
    from tests.helpers.config import make_cfg

    first, same = build(tmp_path / "a"), build(tmp_path / "b")
    other = build(tmp_path / "c", nodes=karate_tables(seed=1)[0])
    runs = [
        run_config(make_cfg(tmp_path, "dataset=constructed", f"dataset.root={p}", tiny=False))
        for p in (first, same, other)
    ]
    assert runs[0].identity == runs[1].identity != runs[2].identity
    assert {k for k in runs[0].identity if runs[0].identity[k] != runs[2].identity[k]} == {
        "dataset.content"
    }
    assert config_hash(runs[0]) != config_hash(runs[2])
    sbm = run_config(make_cfg(tmp_path))  # a dataset its settings fix: identity unchanged
    assert sbm.identity == run_identity(sbm.settings)


def _reseal(out: Path, change_meta=None, arrays=None) -> None:
    """Rewrite ``out``'s arrays and metadata as a consistent (sealed) but wrong dataset."""
    from lightning_gnnscale.graph.constructed import seal, write_arrays

    meta = json.loads((out / METADATA).read_text())
    if arrays:
        meta["files"].update(write_arrays(out, arrays))
    if change_meta:
        change_meta(meta)
    (out / METADATA).write_text(json.dumps(seal(meta)))


def test_the_loader_checks_the_sealed_metadata_and_the_arrays(tmp_path):
    from lightning_gnnscale.graph.constructed import ConstructedDatasetError

    out = build(tmp_path / "base")
    meta = json.loads((out / METADATA).read_text())
    y, train = np.load(out / "y.npy"), np.load(out / "train_mask.npy")
    indptr = np.load(out / "indptr.npy")
    edited = json.loads((out / METADATA).read_text())
    edited["num_classes"] = 3
    spoiled = {
        "its content does not match its seal": lambda o: (o / METADATA).write_text(
            json.dumps(edited)
        ),
        "fields ['num_classes'] are missing or of the wrong type": lambda o: _reseal(
            o, lambda m: m.update(num_classes="2")
        ),
        "y.npy holds labels outside [-1, 2)": lambda o: _reseal(
            o, arrays={"y": np.where(train, y, 2)}
        ),
        "train_mask.npy holds nodes without a label": lambda o: _reseal(
            o, arrays={"y": np.where(train, -1, y)}
        ),
        "indptr.npy does not rise from 0": lambda o: _reseal(
            o, arrays={"indptr": indptr[[0, 2, 1, *range(3, len(indptr))]]}
        ),
    }
    for i, (message, spoil) in enumerate(spoiled.items()):
        copy = tmp_path / f"spoilt{i}"
        shutil.copytree(out, copy)
        spoil(copy)
        with pytest.raises(ConstructedDatasetError, match=re.escape(message)):
            load_dataset("constructed", root=copy)
    assert meta["num_classes"] == 2 and load_dataset("constructed", root=out).num_classes == 2


def test_an_existing_output_folder_is_never_overwritten(tmp_path):
    out = build(tmp_path)
    code, err = _run(tmp_path / "spec.yaml", out)
    assert code == 1 and "exists and is not an empty folder" in err
    assert (out / METADATA).exists()


# ------------------------------------------------------------------------------- training
TRAIN = (
    "dataset=constructed",
    "trainer.max_epochs=2",
    "data.batch_size=16",
    "logger=none",
    "trainer.enable_progress_bar=false",
    "launcher.timeout_s=240",
)


@pytest.mark.e2e
def test_train_py_trains_on_it_alone_and_from_a_partition_dir(tmp_path):
    """``single`` in one process, then DistDGL on 2 ranks from the partition directory that
    ``python -m lightning_gnnscale.partition`` wrote; a partition directory of other content
    is refused."""
    from lightning_gnnscale.errors import ConfigError
    from lightning_gnnscale.partition import partition
    from lightning_gnnscale.preflight import validate
    from lightning_gnnscale.run import build_datamodule
    from tests.helpers.config import make_cfg
    from tests.helpers.scripts import run_script

    out = build(tmp_path / "data")
    single = run_script(
        "train.py",
        *TRAIN,
        f"dataset.root={out}",
        "strategy=single",
        f"hydra.run.dir={tmp_path / 'single'}",
        cwd=REPO,
        timeout=240,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    assert f"dataset {out}: model=gcn ignores the stored edge columns weight (w)" in single.stdout
    summary = json.loads((tmp_path / "single" / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["dataset"] == "constructed"

    distributed = (*TRAIN, f"dataset.root={out}", "strategy=distdgl", "trainer.devices=2")
    parts = tmp_path / "parts"
    partition(list(distributed), parts, log=lambda *_: None)
    ranks = run_script(
        "train.py",
        *distributed,
        f"data.partition_dir={parts}",
        f"hydra.run.dir={tmp_path / 'distdgl'}",
        cwd=REPO,
        timeout=240,
    )
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    assert json.loads((tmp_path / "distdgl" / "summary.json").read_text())["world_size"] == 2

    nodes, _ = karate_tables(seed=1)
    other = build(tmp_path / "other", nodes=nodes)
    overrides = [o for o in distributed if not o.startswith("dataset.root")]
    run = validate(
        make_cfg(
            tmp_path,
            *overrides,
            f"dataset.root={other}",
            f"data.partition_dir={parts}",
            tiny=False,
        )
    )
    with pytest.raises(ConfigError, match="dataset.*content"):
        build_datamodule(run).prepare(2)
