"""``construct`` streams its edge tables (docs/datasets.md, "Larger than memory"): a tiny
``chunk_rows`` writes the files of a one-chunk run byte for byte, each stored edge carries the
data of its first occurrence, errors name the same row at any chunk size, and a construct
killed after its first chunk leaves nothing that looks complete. Edge-only specs ("Edge-only
specs"): the nodes come from the edges, read here from PyKEEN's Nations triples by path."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import torch

from lightning_gnnscale.construct import ConstructError, construct
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.constructed import METADATA, node_ids
from lightning_gnnscale.graph.csc import csc_from_edges, typed_csc_from_edges
from lightning_gnnscale.graph.datasets import load_dataset
from lightning_gnnscale.tasks import build_task
from tests.helpers.config import REPO
from tests.test_construct import write, write_spec

QUIET = {"log": lambda *_: None}


def random_tables(folder: Path, seed: int = 5, n: int = 40, e: int = 300) -> list[dict]:
    """A node table (str ids in shuffled order) and its edges split over a CSV and a Parquet
    table (small row groups), with self-loops, reversed pairs and repeats; the edge rows,
    in input order, as ``[{s, d, w, f, t}]`` (node indices)."""
    rng = np.random.default_rng(seed)
    ids = [f"v{i:03d}" for i in rng.permutation(n)]
    nodes = {
        "id": ids,
        "y": rng.integers(0, 3, n).tolist(),
        "a": rng.normal(size=n).tolist(),
        "split": rng.choice(["train", "val", "test"], n).tolist(),
    }
    write(folder, "nodes.csv", nodes)
    s, d = rng.integers(0, n, e), rng.integers(0, n, e)
    s[:20] = d[:20]  # self-loops
    s[20:70], d[20:70] = d[100:150], s[100:150]  # the reverse of later rows
    s[150:180], d[150:180] = s[180:210], d[180:210]  # repeats of later rows
    w, t = rng.random(e), rng.choice(["x", "y", "z"], e)
    f = rng.normal(size=(e, 2))
    table = {
        "s": [ids[i] for i in s],
        "d": [ids[i] for i in d],
        "w": w.tolist(),
        "f_0": f[:, 0].tolist(),
        "f_1": f[:, 1].tolist(),
        "t": t.tolist(),
    }
    half = e // 2
    write(folder, "e1.csv", {k: v[:half] for k, v in table.items()})
    pq.write_table(pa.table({k: v[half:] for k, v in table.items()}), folder / "e2.parquet", 40)
    return [{"s": int(s[i]), "d": int(d[i]), "w": w[i], "f": f[i], "t": t[i]} for i in range(e)]


def random_spec(undirected: bool, self_loops: str, chunk_rows: int | None) -> dict:
    edge = {"src": "s", "dst": "d", "weight": "w", "type": "t", "features": {"prefix": "f_"}}
    spec = {
        "name": "random",
        "nodes": {
            "file": "nodes.csv",
            "id": "id",
            "id_type": "str",
            "label": "y",
            "split": "split",
            "features": [{"columns": ["a"], "transform": "standardise"}],
        },
        "edges": [{"file": "e1.csv", **edge}, {"file": "e2.parquet", **edge}],
        "undirected": undirected,
        "self_loops": self_loops,
    }
    if chunk_rows is not None:
        spec["chunk_rows"] = chunk_rows
    return spec


def expected_edges(rows: list[dict], undirected: bool, self_loops: str) -> dict:
    """``{(src, dst, type): row}``: the row whose data each stored edge carries (typed: a pair
    once per type), one input row at a time: an input edge's first row, else (undirected) the
    first row it is the reverse of."""
    stored = {}
    for row in rows:
        stored.setdefault((row["s"], row["d"], row["t"]), row)
    if undirected:
        for row in rows:
            stored.setdefault((row["d"], row["s"], row["t"]), row)
    if self_loops == "remove":
        stored = {edge: row for edge, row in stored.items() if edge[0] != edge[1]}
    return stored


def files_of(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.mark.parametrize(
    ("undirected", "self_loops"), [(False, "remove"), (True, "keep"), (True, "remove")]
)
def test_a_tiny_chunk_writes_the_files_of_one_chunk(tmp_path, undirected, self_loops):
    rows = random_tables(tmp_path)
    outs = {}
    for chunk in (3, None):  # 3 rows: every chunk, and most CSC regions, hold a few entries
        spec = write_spec(tmp_path, random_spec(undirected, self_loops, chunk))
        outs[chunk] = tmp_path / f"out-{chunk}"
        construct(spec, outs[chunk], **QUIET)
    tiny, whole = files_of(outs[3]), files_of(outs[None])
    assert tiny.keys() == whole.keys() and "edge_feat.npy" in tiny
    for name in tiny:
        assert tiny[name] == whole[name], name
        if name.endswith(".npy"):  # the streamed .npy files are what np.save writes
            buffer = io.BytesIO()
            np.save(buffer, np.load(outs[3] / name), allow_pickle=False)
            assert buffer.getvalue() == tiny[name], name

    out = outs[3]
    indptr, indices = np.load(out / "indptr.npy"), np.load(out / "indices.npy")
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    types = json.loads((out / METADATA).read_text())["edge_types"]
    kind = np.load(out / "edge_type.npy")
    key = (dst * len(types) + kind) * 1000 + indices
    assert (np.diff(key) > 0).all()  # sorted by (dst, type, src), no repeat
    ids = pa_csv.read_csv(tmp_path / "nodes.csv").column("id").to_pylist()
    assert node_ids(out).to_pylist() == ids  # node i is row i: the rows' s and d are nodes
    expected = expected_edges(rows, undirected, self_loops)
    weight, feat = np.load(out / "edge_weight.npy"), np.load(out / "edge_feat.npy")
    stored = {(int(s), int(d), types[k]): e for e, (s, d, k) in enumerate(zip(indices, dst, kind))}
    assert stored.keys() == expected.keys()
    for triple, edge in stored.items():
        row = expected[triple]
        assert weight[edge] == np.float32(row["w"]), triple
        assert np.array_equal(feat[edge], row["f"].astype(np.float32)), triple


@pytest.mark.parametrize("stride", [1, 1000])  # a dense id table, and a binary search
def test_npy_edge_arrays_stream_in_either_memory_order(tmp_path, stride):
    """An ``[E, 2]`` ``.npy`` read in slices: C order (int64) and Fortran order (int32) give
    the CSC of the whole arrays."""
    rng = np.random.default_rng(1)
    n = 30
    raw = rng.permutation(np.arange(n) * stride + 3)  # integer ids, shuffled
    write(tmp_path, "nodes.csv", {"id": raw.tolist(), "y": [0, 1] * (n // 2), "v": [1.0] * n})
    edges = rng.integers(0, n, (90, 2))
    np.save(tmp_path / "c.npy", raw[edges])
    np.save(tmp_path / "f.npy", np.asfortranarray(raw[edges[::-1]].astype(np.int32)))
    spec = {
        "nodes": {
            "file": "nodes.csv",
            "id": "id",
            "id_type": "int",
            "label": "y",
            "features": {"columns": ["v"]},
            "split_fractions": {"train": 0.5, "val": 0.25},
        },
        "edges": [{"file": "c.npy"}, {"file": "f.npy"}],
        "chunk_rows": 4,
    }
    out = tmp_path / "out"
    construct(write_spec(tmp_path, spec), out, **QUIET)
    both = np.concatenate([edges, edges[::-1]])
    indptr, indices = csc_from_edges(torch.from_numpy(both[:, 0]), torch.from_numpy(both[:, 1]), n)
    assert np.array_equal(np.load(out / "indptr.npy"), indptr.numpy())
    assert np.array_equal(np.load(out / "indices.npy"), indices.numpy())


def test_a_parquet_edge_table_is_read_in_bounded_memory(tmp_path):
    """Arrow's memory while the chunks of a 200-row-group file are read stays a few chunks'
    worth (pre-buffering, pyarrow's default, kept every row group read: 6 MB here)."""
    from lightning_gnnscale.construct import EdgeTable
    from lightning_gnnscale.graph.construct_spec import EdgeTableSpec

    rng = np.random.default_rng(0)
    rows, chunk = 400_000, 2000
    columns = {"s": rng.integers(0, 10**9, rows), "d": rng.integers(0, 10**9, rows)}
    pq.write_table(pa.table(columns), tmp_path / "e.parquet", row_group_size=chunk)
    table = EdgeTable(EdgeTableSpec(tmp_path / "e.parquet", "s", "d", format="parquet"), chunk)
    base, peak, read = pa.total_allocated_bytes(), 0, 0
    for _, part in table.chunks():
        peak, read = max(peak, pa.total_allocated_bytes() - base), read + part.num_rows
    assert read == rows and peak < 20 * chunk * 16, peak  # 16 bytes a row


@pytest.mark.parametrize("stride", [1, 9, 10**15])
def test_the_integer_id_map_finds_every_node_and_no_other_id(stride):
    from lightning_gnnscale.construct import IdMap

    rng = np.random.default_rng(2)
    raw = rng.permutation(np.arange(-50, 50, dtype=np.int64) * stride)
    lookup = IdMap(pa.array(raw))
    assert (lookup.table is not None) == (stride == 1)  # the two paths
    extremes = np.array([-(2**63), 2**63 - 1, raw.min() - 1, raw.max() + 1], dtype=np.int64)
    queries = np.concatenate([rng.choice(raw, 500), rng.integers(-(2**62), 2**62, 500), extremes])
    index = {int(v): i for i, v in enumerate(raw)}
    assert lookup(queries).tolist() == [index.get(int(q), -1) for q in queries]


BAD_LATE = {
    "unknown id": (lambda e: e["d"].__setitem__(130, "nobody"), "row 131 (line 132), column 'd'"),
    "NaN weight": (lambda e: e["w"].__setitem__(77, float("nan")), "row 78 (line 79), column 'w'"),
    "empty type": (lambda e: e["t"].__setitem__(101, None), "row 102 (line 103), column 't'"),
}


@pytest.mark.parametrize("case", list(BAD_LATE))
def test_an_error_in_a_late_chunk_names_its_row_and_leaves_nothing(tmp_path, case):
    rows = random_tables(tmp_path)
    spoil, where = BAD_LATE[case]
    table = {
        "s": [f"v{r['s']:03d}" for r in rows],
        "d": [f"v{r['d']:03d}" for r in rows],
        "w": [r["w"] for r in rows],
        "f_0": [r["f"][0] for r in rows],
        "f_1": [r["f"][1] for r in rows],
        "t": [str(r["t"]) for r in rows],
    }
    spoil(table)
    write(tmp_path, "e1.csv", table)
    messages = []
    for chunk in (3, None):
        raw = random_spec(False, "remove", chunk)
        raw["edges"] = raw["edges"][:1]
        with pytest.raises(ConstructError) as err:
            construct(write_spec(tmp_path, raw), tmp_path / "out", **QUIET)
        messages.append(str(err.value))
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.construct-*"))
    assert messages[0] == messages[1] and f"e1.csv, {where}" in messages[0], messages


def test_a_duplicate_and_a_self_loop_declared_errors_name_their_rows_at_any_chunk(tmp_path):
    rows = random_tables(tmp_path)
    first_loop = min(i for i, r in enumerate(rows) if r["s"] == r["d"])
    triples = [(r["s"], r["d"], r["t"]) for r in rows]  # typed: a pair repeats per type
    first_repeat = min(i for i, p in enumerate(triples) if p in triples[:i])
    for key, value, row in (
        ("self_loops", "error", first_loop),
        ("duplicates", "error", first_repeat),
    ):
        messages = []
        for chunk in (3, None):
            raw = random_spec(False, "keep", chunk)
            raw[key] = value
            with pytest.raises(ConstructError) as err:
                construct(write_spec(tmp_path, raw), tmp_path / "out", **QUIET)
            messages.append(str(err.value))
        table, local = ("e1.csv", row) if row < 150 else ("e2.parquet", row - 150)
        assert messages[0] == messages[1], messages
        assert messages[0].endswith(
            f"{table}, row {local + 1}"
            + (f" (line {local + 2})" if table.endswith("csv") else "")
            + f": a {'self-loop' if key == 'self_loops' else 'duplicate edge'} ({key}: error)"
        ), messages[0]


def test_a_construct_killed_after_its_first_chunk_leaves_nothing_that_looks_complete(tmp_path):
    """SIGKILL once the first chunk is in the scratch files: the hidden temporary folder holds
    them and no metadata, ``out`` does not exist, and a rerun removes it and succeeds."""
    random_tables(tmp_path)
    spec = write_spec(tmp_path, random_spec(True, "remove", 16))
    out = tmp_path / "out"
    script = (
        "import os, signal, lightning_gnnscale.construct as c\n"
        "real = c.edge_chunk\n"
        "calls = []\n"
        "def first_then_die(*args):\n"
        "    if calls:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    calls.append(1)\n"
        "    return real(*args)\n"
        "c.edge_chunk = first_then_die\n"
        f"c.construct({str(spec)!r}, {str(out)!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()
    left = list(tmp_path.glob(".out.construct-*"))
    assert len(left) == 1 and not out.exists()
    assert (left[0] / "scratch" / "src").stat().st_size == 16 * 8  # the first chunk's sources
    assert not list(left[0].rglob(METADATA))
    construct(spec, out, **QUIET)
    assert (out / METADATA).exists() and not list(tmp_path.glob(".out.construct-*"))
    assert not (out / "scratch").exists()


# ---------------------------------------------------------------------------- edge-only
def _pykeen_dataset(name: str) -> Path:
    """PyKEEN's folder of ``name`` triples (train/valid/test.txt), found without importing
    pykeen (scripts/install.sh installs it, ``--no-deps``)."""
    found = importlib.util.find_spec("pykeen")
    if found is None or found.origin is None:
        pytest.skip("the pykeen wheel is not installed (scripts/install.sh installs it)")
    return Path(found.origin).parent / "datasets" / name


def _triples_spec(folder: Path, **extra) -> dict:
    names = ["head", "relation", "tail"]
    return {
        "name": folder.name,
        "id_type": "str",
        "edges": [
            {
                "file": str(folder / f"{part}.txt"),
                "format": "tsv",
                "column_names": names,
                "src": "head",
                "dst": "tail",
                "type": "relation",
            }
            for part in ("train", "valid", "test")
        ],
        **extra,
    }


def _read_triples(folder: Path) -> list[tuple[str, str, str]]:
    return [
        tuple(line.split("\t"))
        for part in ("train", "valid", "test")
        for line in (folder / f"{part}.txt").read_text().splitlines()
        if line
    ]


@pytest.mark.parametrize("dataset", ["nations", "kinships"])
def test_an_edge_only_spec_takes_its_nodes_from_pykeen_triples(tmp_path, dataset):
    folder = _pykeen_dataset(dataset)
    triples = _read_triples(folder)
    out = tmp_path / "out"
    lines = []
    meta = construct(write_spec(tmp_path, _triples_spec(folder)), out, log=lines.append)
    entities = sorted({h for h, _, _ in triples} | {t for _, _, t in triples})
    n = len(entities)
    assert node_ids(out).to_pylist() == entities  # sorted raw ids
    assert meta["num_nodes"] == n and meta["num_classes"] == 0 and meta["nodes_from"] == "edges"
    assert np.array_equal(np.load(out / "x.npy"), np.eye(n, dtype=np.float32))
    assert (np.load(out / "y.npy") == -1).all() and not np.load(out / "train_mask.npy").any()
    assert meta["feature_names"][:2] == [f"id={entities[0]}", f"id={entities[1]}"]
    relations = list(dict.fromkeys(r for _, r, _ in triples))  # first-seen order
    assert meta["edge_types"] == relations
    index = {e: i for i, e in enumerate(entities)}
    src = torch.tensor([index[h] for h, _, _ in triples])
    dst = torch.tensor([index[t] for _, _, t in triples])
    rel = torch.tensor([relations.index(r) for _, r, _ in triples])
    # a typed graph: a pair related several ways keeps every relation, sorted by (dst, rel, src)
    indptr, indices, kinds = typed_csc_from_edges(src, dst, rel, n, len(relations))
    assert int(indptr[-1]) == len(set(triples))
    assert np.array_equal(np.load(out / "indptr.npy"), indptr.numpy())
    assert np.array_equal(np.load(out / "indices.npy"), indices.numpy())
    assert np.array_equal(np.load(out / "edge_type.npy"), kinds.numpy())
    assert any("no node table" in line and "no labels" in line for line in lines), lines
    dataset = load_dataset("constructed", root=out)  # loads typed; the node tasks refuse it
    assert dataset.graph.num_nodes == n and dataset.targets.out_dim == 0
    assert dataset.graph.relations == tuple(relations) and dataset.edge_split is None
    for task in ("node_classification", "node_regression"):
        with pytest.raises(ConfigError, match=rf"no labels \(built from an edge-only.*task={task}"):
            build_task(task).prepare(dataset, 0)


def test_node_classification_on_an_edge_only_dataset_is_refused_before_training(tmp_path):
    """The data module's ``prepare`` (the launcher's load, before any rank is spawned) stops
    with the reason."""
    from lightning_gnnscale.preflight import validate
    from lightning_gnnscale.run import build_datamodule
    from tests.helpers.config import make_cfg

    out = tmp_path / "out"
    construct(write_spec(tmp_path, _triples_spec(_pykeen_dataset("nations"))), out, **QUIET)
    run = validate(make_cfg(tmp_path, "dataset=constructed", f"dataset.root={out}", tiny=False))
    with pytest.raises(ConfigError, match="task=node_classification needs a node table"):
        build_datamodule(run).prepare(1)


def test_link_prediction_trains_on_pykeen_kinships_in_its_own_ids(tmp_path):
    """Kinships' triples through construct (an edge-only spec: 104 people, one-hot
    features, typed by relation), then ``task=link_prediction`` through ``train.py``: its
    (random) split holds every triple once, and the run reports the task's metrics."""
    from lightning_gnnscale.run import train
    from lightning_gnnscale.tasks import TaskConfig
    from tests.helpers.config import make_cfg

    folder = _pykeen_dataset("kinships")
    out = tmp_path / "out"
    construct(write_spec(tmp_path, _triples_spec(folder)), out, **QUIET)
    triples = set(_read_triples(folder))
    dataset = load_dataset("constructed", root=out)
    split = build_task(TaskConfig("link_prediction")).prepare(dataset, 0).split
    held = [split.train_pos.shape[1], split.val_pos.shape[1], split.test_pos.shape[1]]
    assert not split.undirected and sum(held) == len(triples)
    settings = ["strategy=single", "task=link_prediction", "dataset=constructed"]
    settings += [f"dataset.root={out}", "trainer.max_epochs=2", "logger=none"]
    metrics, _ = train(
        make_cfg(tmp_path, *settings, "trainer.enable_progress_bar=false", tiny=False)
    )
    for name in ("auc", "mrr", "hits@1", "hits@3", "hits@10"):
        assert 0.0 <= metrics[f"test_{name}"] <= 1.0, name
    assert metrics["best_val_mrr"] > 0


def test_an_edge_only_spec_past_the_identity_size_is_refused(tmp_path):
    chain = np.stack([np.arange(5000), np.arange(1, 5001)], axis=1)
    np.save(tmp_path / "chain.npy", chain)
    spec = {"id_type": "int", "edges": {"file": "chain.npy"}, "chunk_rows": 1000}
    with pytest.raises(ConstructError, match=r"edges name more than 4,096 nodes \(past .*chain"):
        construct(write_spec(tmp_path, spec), tmp_path / "out", **QUIET)
    assert not list(tmp_path.glob(".out.construct-*"))


def test_npy_edges_with_string_ids_are_refused(tmp_path):
    np.save(tmp_path / "e.npy", np.zeros((3, 2), dtype=np.int64))
    spec = {"id_type": "str", "edges": {"file": "e.npy"}}
    with pytest.raises(ConstructError, match=r"e.npy: an .npy edge array holds integers; id_type"):
        construct(write_spec(tmp_path, spec), tmp_path / "out", **QUIET)


def test_a_header_less_tsv_row_is_its_line(tmp_path):
    (tmp_path / "t.txt").write_text("a\tr\tb\nb\tr\t\nb\tr\tc\n")
    spec = {
        "id_type": "str",
        "edges": {
            "file": "t.txt",
            "format": "tsv",
            "column_names": ["h", "r", "t"],
            "src": "h",
            "dst": "t",
        },
    }
    with pytest.raises(ConstructError, match=r"t.txt, row 2 \(line 2\), column 't': an empty id"):
        construct(write_spec(tmp_path, spec), tmp_path / "out", **QUIET)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.pop("id_type"), "without a node table (nodes) the nodes come from the edges"),
        (lambda s: s.update(nodes={"file": "n.csv"}), "id_type belongs to the node table"),
        (lambda s: s.update(chunk_rows=0), "chunk_rows=0 must be a positive integer"),
        (lambda s: s["edges"].update(format="xml"), "format='xml' is unknown; valid: ['csv',"),
        (
            lambda s: s["edges"].update(file="t.parquet", format=None),
            "column_names: only a CSV or TSV file has no header",
        ),
    ],
)
def test_edge_only_and_streaming_spec_keys_are_checked(tmp_path, change, message):
    from lightning_gnnscale.graph.construct_spec import SpecError

    spec = {
        "id_type": "str",
        "edges": {
            "file": "t.txt",
            "format": "tsv",
            "column_names": ["h", "t"],
            "src": "h",
            "dst": "t",
        },
    }
    change(spec)
    with pytest.raises(
        SpecError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        construct(write_spec(tmp_path, spec), tmp_path / "out", **QUIET)
