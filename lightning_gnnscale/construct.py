"""``python -m lightning_gnnscale.construct spec=<file.yaml> out=<dir>``: a dataset from the
user's tables (docs/datasets.md, "Your own tables").

Reads the node and edge tables the spec names (CSV, gzipped CSV and Parquet through pyarrow;
``.npy`` arrays), remaps raw ids to contiguous ones (node ``i`` = row ``i`` of the node
table), applies the feature transforms with statistics from the training split only, builds
the CSC as :meth:`Graph.from_edge_index` does, and writes the ``constructed`` dataset
(:mod:`lightning_gnnscale.graph.constructed`) that ``train.py dataset=constructed
dataset.root=<dir>`` trains on. Bad input is refused naming the file, row and column; the
output appears only complete (written in a temporary folder, renamed at the end).

Everything is vectorised (pyarrow compute, numpy); the whole tables are held in memory.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.files import write_json_atomic
from lightning_gnnscale.graph.construct_spec import (
    SPLITS,
    ConstructSpec,
    EdgeTableSpec,
    FeatureSpec,
    NodeTableSpec,
    load_spec,
    table_format,
)
from lightning_gnnscale.graph.constructed import (
    FORMAT,
    METADATA,
    VERSION,
    seal,
    write_arrays,
)

USAGE = (
    "usage: python -m lightning_gnnscale.construct spec=<file.yaml> out=<dir>\n"
    "  then: python train.py dataset=constructed dataset.root=<dir> strategy=<any> model=<any>"
)
_INT = re.compile(r"^\s*-?[0-9]+\s*$")
_INT64_MAX = str(2**63 - 1)


class ConstructError(ConfigError):
    """Input that cannot become a dataset; names the file, row and column."""


def _at(path: Path, row: int | None, column: str | None, message: str) -> ConstructError:
    """An error at 1-based data row ``row`` (header not counted) of ``path``'s ``column``."""
    where = str(path)
    if row is not None:
        line = f" (line {row + 1})" if table_format(path) == "csv" else ""
        where += f", row {row}{line}"
    if column is not None:
        where += f", column {column!r}"
    return ConstructError(f"{where}: {message}")


# ---------------------------------------------------------------------------- reading
def read_table(path: Path, text_columns: list[str], text_prefixes: tuple[str, ...] = ()):
    """The whole table at ``path`` (pyarrow); ``text_columns`` and the columns starting with
    one of ``text_prefixes`` are read as strings from CSV (ids, labels, categories: ``007``
    stays ``007``; an empty value is null). A ragged CSV row, a repeated column name or an
    empty table is refused."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    if not path.is_file():
        raise ConstructError(f"{path}: no such file")
    try:
        if table_format(path) == "parquet":
            table = pq.read_table(path)
        else:
            table = _read_csv(path, text_columns, text_prefixes, pa, pa_csv)
    except (pa.ArrowException, OSError) as err:  # OSError: a corrupt .gz
        raise ConstructError(f"{path}: cannot be read: {err}") from None
    names = table.column_names
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConstructError(f"{path}: column names {repeated} appear more than once: {names}")
    if table.num_rows == 0:
        raise ConstructError(f"{path}: the table is empty (0 rows); columns: {table.column_names}")
    return table


def _read_csv(path: Path, text_columns: list[str], text_prefixes: tuple[str, ...], pa, pa_csv):
    ragged = []

    def invalid_row(row) -> str:
        ragged.append(row)
        return "skip"

    parse = pa_csv.ParseOptions(invalid_row_handler=invalid_row)
    if text_prefixes:  # the header names, to resolve the prefixes against
        with pa_csv.open_csv(path, parse_options=parse) as reader:
            header = reader.schema.names
        text_columns = text_columns + [n for n in header if n.startswith(text_prefixes)]
        ragged.clear()

    def read(threads: bool):
        return pa_csv.read_csv(
            path,
            read_options=pa_csv.ReadOptions(use_threads=threads),
            parse_options=parse,
            convert_options=pa_csv.ConvertOptions(
                column_types=dict.fromkeys(text_columns, pa.string()), strings_can_be_null=True
            ),
        )

    table = read(True)
    if ragged and ragged[0].number is None:  # threaded reading does not number rows
        ragged.clear()
        read(False)
    if ragged:
        bad = ragged[0]
        where = f"line {bad.number}" if bad.number is not None else "a row"
        raise ConstructError(
            f"{path}, {where}: {bad.actual_columns} values where the header has "
            f"{bad.expected_columns} columns: {bad.text[:200]!r}"
        )
    return table


def column(table, name: str, path: Path):
    """Column ``name`` of ``table`` (one array); a missing one is named with those that exist."""
    import difflib

    if name not in table.column_names:
        near = difflib.get_close_matches(name, table.column_names, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConstructError(f"{path}: no column {name!r}{hint}; its columns: {table.column_names}")
    return _plain(table.column(name).combine_chunks())


def _plain(values):
    """``values`` with a dictionary decoded and a large string column as a string one (Parquet
    writers choose either for text)."""
    import pyarrow as pa

    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if pa.types.is_large_string(values.type):
        values = values.cast(pa.string())
    return values


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _refuse_rows(bad: np.ndarray, path: Path, column: str, message: Callable[[int], str]) -> None:
    """A :class:`ConstructError` at the first row where ``bad`` is set (none: nothing), its
    text ``message(row)`` (``row``: 0-based)."""
    if bad.any():
        row = _first(bad)
        raise _at(path, row + 1, column, message(row))


def parse_ids(values, id_type: str, path: Path, name: str):
    """``values`` as ids of ``id_type`` (int64 or string array); a null or a value that does
    not parse is named."""
    import pyarrow as pa
    import pyarrow.compute as pc

    nulls = values.is_null().to_numpy(zero_copy_only=False)
    if nulls.any():
        raise _at(path, _first(nulls) + 1, name, "an empty id")
    if id_type == "str":
        if not (pa.types.is_string(values.type) or pa.types.is_integer(values.type)):
            raise _at(path, None, name, f"ids of type {values.type} are not strings")
        return values.cast(pa.string())
    if pa.types.is_integer(values.type):
        if pa.types.is_uint64(values.type):
            limit = pa.scalar(2**63 - 1, pa.uint64())
            over = pc.greater(values, limit).to_numpy(zero_copy_only=False)
            _refuse_rows(
                over, path, name, lambda row: f"{values[row].as_py()} is above the int64 range"
            )
        return values.cast(pa.int64())
    if not pa.types.is_string(values.type):
        raise _at(path, None, name, f"ids of type {values.type} are not integers (id_type int)")
    good = pc.match_substring_regex(values, _INT.pattern).to_numpy(zero_copy_only=False)
    _refuse_rows(
        ~good, path, name, lambda row: f"{values[row].as_py()!r} is not an integer (id_type int)"
    )
    trimmed = pc.utf8_trim_whitespace(values)
    digits = pc.replace_substring_regex(trimmed, "^-?0*", "")
    length = pc.utf8_length(digits).to_numpy(zero_copy_only=False)
    limit = pc.if_else(pc.starts_with(trimmed, "-"), str(2**63), _INT64_MAX)
    over = (length > 19) | (
        (length == 19) & pc.greater(digits, limit).to_numpy(zero_copy_only=False)
    )
    _refuse_rows(
        over, path, name, lambda row: f"{values[row].as_py()!r} is outside the int64 range"
    )
    return trimmed.cast(pa.int64())


def _strings(values):
    """``values`` as a string array (nulls kept)."""
    import pyarrow as pa

    return values.cast(pa.string())


# ----------------------------------------------------------------------------- nodes
def node_ids(table, spec: NodeTableSpec):
    """The node table's ids; a duplicate is named with the row it first appeared in."""
    import pyarrow.compute as pc

    ids = parse_ids(column(table, spec.id, spec.file), spec.id_type, spec.file, spec.id)
    unique = pc.unique(ids)
    if len(unique) != len(ids):
        codes = pc.index_in(ids, value_set=unique).to_numpy()
        _, first = np.unique(codes, return_index=True)
        row = _first(first[codes] != np.arange(len(codes)))
        raise _at(
            spec.file,
            row + 1,
            spec.id,
            f"duplicate node id {ids[row].as_py()!r} (first in row {first[codes[row]] + 1})",
        )
    return ids


def labels(table, spec: NodeTableSpec) -> tuple[np.ndarray, list[str]]:
    """Class index per node (``-1``: no label) and the classes in index order (declared, else
    the labels sorted, numerically when they all are integers)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = _label_strings(column(table, spec.label, spec.file), spec)
    present = values.is_valid().to_numpy(zero_copy_only=False)
    if spec.classes is not None:
        classes = list(spec.classes)
    else:
        found = pc.unique(values.drop_null()).to_pylist()
        numeric = all(_INT.match(v) for v in found)
        classes = sorted(found, key=int) if numeric else sorted(found)
    if not classes:
        raise _at(spec.file, None, spec.label, "no node has a label")
    codes = pc.index_in(values, value_set=pa.array(classes, pa.string()))
    unknown = present & codes.is_null().to_numpy(zero_copy_only=False)
    _refuse_rows(
        unknown,
        spec.file,
        spec.label,
        lambda row: f"label {values[row].as_py()!r} is not one of the declared classes {classes}",
    )
    y = pc.fill_null(codes, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return y, classes


def _label_strings(values, spec: NodeTableSpec):
    """A label column as strings; a float one (Parquet) holds whole numbers, NaN = no label."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_floating(values.type):
        values = pc.if_else(pc.is_nan(values), pa.scalar(None, values.type), values)
        whole = pc.fill_null(pc.equal(pc.floor(values), values), True)
        whole = whole.to_numpy(zero_copy_only=False)
        _refuse_rows(
            ~whole,
            spec.file,
            spec.label,
            lambda row: f"label {values[row].as_py()!r} is not a whole number (a class index)",
        )
        values = values.cast(pa.int64())
    return _strings(values)


def split_masks(table, spec: NodeTableSpec, y: np.ndarray) -> dict[str, np.ndarray]:
    """``{train,val,test}_mask``: from the split column (an empty value: no split; a node in a
    split must have a label), or seeded fractions of the labelled nodes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(y)
    if spec.split is not None:
        values = pc.fill_null(_strings(column(table, spec.split, spec.file)), "")
        codes = pc.index_in(values, value_set=pa.array(["", *SPLITS], pa.string()))
        bad = codes.is_null().to_numpy(zero_copy_only=False)
        _refuse_rows(
            bad,
            spec.file,
            spec.split,
            lambda row: f"split {values[row].as_py()!r} is unknown; valid: {list(SPLITS)} or empty",
        )
        code = codes.to_numpy(zero_copy_only=False)
        unlabelled = (code > 0) & (y < 0)
        _refuse_rows(
            unlabelled,
            spec.file,
            spec.split,
            lambda row: (
                f"the node is in split {values[row].as_py()!r} but has no label (column "
                f"{spec.label!r} is empty); give it a label or leave its split empty"
            ),
        )
        return {f"{name}_mask": code == i + 1 for i, name in enumerate(SPLITS)}
    fractions = spec.split_fractions
    labelled = np.flatnonzero(y >= 0)
    order = labelled[np.random.default_rng(fractions.seed).permutation(labelled.size)]
    n_train = round(fractions.train * labelled.size)
    n_val = round(fractions.val * labelled.size)
    masks = {f"{name}_mask": np.zeros(n, dtype=bool) for name in SPLITS}
    masks["train_mask"][order[:n_train]] = True
    masks["val_mask"][order[n_train : n_train + n_val]] = True
    masks["test_mask"][order[n_train + n_val :]] = True
    return masks


def feature_columns(table, group: FeatureSpec, path: Path) -> list[str]:
    """The column names of one feature group, in table order for a prefix."""
    if group.prefix is None:
        return list(group.columns)
    names = [name for name in table.column_names if name.startswith(group.prefix)]
    if not names:
        raise ConstructError(
            f"{path}: no column starts with prefix {group.prefix!r}; its columns: "
            f"{table.column_names}"
        )
    return names


def numeric_matrix(table, names: list[str], path: Path) -> np.ndarray:
    """float64 ``[rows, len(names)]`` of numeric columns; a NaN, infinite or empty value or a
    non-numeric column is named."""
    import pyarrow as pa

    out = np.empty((table.num_rows, len(names)), dtype=np.float64)
    for j, name in enumerate(names):
        values = column(table, name, path)
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
            raise _at(
                path,
                None,
                name,
                f"values of type {values.type} are not numbers (a category column takes "
                "transform: one-hot)",
            )
        out[:, j] = values.cast(pa.float64()).to_numpy(zero_copy_only=False)
    check_finite(out, path, names)
    return out


def check_finite(matrix: np.ndarray, path: Path, names: list[str]) -> None:
    bad = ~np.isfinite(matrix)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise _at(path, int(row) + 1, names[col], f"feature value {matrix[row, col]} is not finite")


def node_features(
    table, spec: NodeTableSpec, train: np.ndarray
) -> tuple[np.ndarray, list[str], list[dict]]:
    """``x`` float32 ``[N, F]``, the name of each of its columns, and each group's transform
    with the statistics it used (from the ``train`` rows only)."""
    blocks, names, records = [], [], []
    n = table.num_rows
    for group in spec.features:
        if group.npy is not None:
            matrix, source = _npy_features(group.npy, n), str(group.npy)
            cols = [f"{group.npy.name}[{j}]" for j in range(matrix.shape[1])]
        else:
            cols, source = feature_columns(table, group, spec.file), str(spec.file)
        if group.transform == "one-hot":
            for name in cols:
                block, categories = _one_hot(column(table, name, spec.file), train)
                blocks.append(block)
                names += [f"{name}={c}" for c in categories] + [f"{name}=<unknown>"]
                records.append(
                    {"columns": [name], "transform": "one-hot", "categories": categories}
                )
            continue
        if group.npy is None:
            matrix = numeric_matrix(table, cols, spec.file)
        matrix, stats = _scale(matrix, group.transform, train, source)
        blocks.append(matrix)
        names += cols
        records.append({"columns": cols, "transform": group.transform, **stats})
    if not blocks:
        raise ConstructError(f"{spec.file}: the spec names no node features (nodes.features)")
    return np.concatenate(blocks, axis=1).astype(np.float32), names, records


def _npy_features(path: Path, n: int) -> np.ndarray:
    if not path.is_file():
        raise ConstructError(f"{path}: no such file")
    matrix = _load_npy(path, mmap_mode="r")
    if matrix.ndim != 2 or matrix.shape[0] != n:
        raise ConstructError(
            f"{path}: shape {matrix.shape}, but the node table has {n} rows: a feature matrix "
            f"is [{n}, F], aligned row by row"
        )
    if not (np.issubdtype(matrix.dtype, np.number) and not np.iscomplexobj(matrix)):
        raise ConstructError(f"{path}: dtype {matrix.dtype} is not a real number type")
    matrix = np.asarray(matrix, dtype=np.float64)
    check_finite(matrix, path, [f"[{j}]" for j in range(matrix.shape[1])])
    return matrix


def _load_npy(path: Path, mmap_mode: str | None = None) -> np.ndarray:
    """The array in the ``.npy`` file ``path`` (no pickle); an empty, truncated or other file
    (an ``.npz`` renamed) is refused."""
    try:
        array = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise ConstructError(f"{path}: not a plain .npy array: {err}") from None
    if not isinstance(array, np.ndarray):
        if hasattr(array, "close"):
            array.close()
        raise ConstructError(f"{path}: not a plain .npy array (an .npz archive?)")
    return array


def _scale(
    matrix: np.ndarray, transform: str, train: np.ndarray, source: str
) -> tuple[np.ndarray, dict]:
    if transform == "none":
        return matrix, {}
    rows = matrix[train]
    if not len(rows):
        raise ConstructError(f"{source}: {transform} needs training nodes, and there are none")
    if transform == "standardise":
        mean, std = rows.mean(0), rows.std(0)
        std[std == 0] = 1.0
        return (matrix - mean) / std, {"mean": mean.tolist(), "std": std.tolist()}
    low, high = rows.min(0), rows.max(0)
    span = high - low
    span[span == 0] = 1.0
    return (matrix - low) / span, {"min": low.tolist(), "max": high.tolist()}


def _one_hot(values, train: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """``[N, C + 1]`` one-hot over the categories seen in training rows; the last slot is
    "unknown" (unseen in training, or empty)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = _strings(values)
    categories = sorted(pc.unique(values.filter(pa.array(train)).drop_null()).to_pylist())
    codes = pc.index_in(values, value_set=pa.array(categories, pa.string()))
    slot = pc.fill_null(codes, len(categories)).to_numpy(zero_copy_only=False)
    block = np.zeros((len(slot), len(categories) + 1), dtype=np.float64)
    block[np.arange(len(slot)), slot] = 1.0
    return block, categories


# ----------------------------------------------------------------------------- edges
def edge_table(spec: EdgeTableSpec, ids, id_type: str, types: dict[str, int]) -> dict[str, Any]:
    """One edge table as contiguous ``src``/``dst`` (int64), ``weight``, ``feat``, ``type``
    (``None`` when not given); an id no node has is named."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table_format(spec.file) == "npy":
        return _npy_edges(spec.file, ids, id_type)
    text = [name for name in (spec.src, spec.dst, spec.type) if name is not None]
    table = read_table(spec.file, text)
    out: dict[str, Any] = {"rows": table.num_rows, "weight": None, "feat": None, "type": None}
    for end in ("src", "dst"):
        name = getattr(spec, end)
        raw = parse_ids(column(table, name, spec.file), id_type, spec.file, name)
        out[end] = _contiguous(raw, ids, spec.file, name)
    if spec.weight is not None:
        out["weight"] = numeric_matrix(table, [spec.weight], spec.file)[:, 0]
    names = [n for group in spec.features for n in feature_columns(table, group, spec.file)]
    if names:
        out["feat"] = numeric_matrix(table, names, spec.file)
        out["feat_names"] = names
    if spec.type is not None:
        values = _strings(column(table, spec.type, spec.file))
        empty = values.is_null().to_numpy(zero_copy_only=False)
        _refuse_rows(empty, spec.file, spec.type, lambda row: "an empty edge type")
        for name in pc.unique(values).to_pylist():
            types.setdefault(name, len(types))
        known = pa.array(list(types), pa.string())
        out["type"] = pc.index_in(values, value_set=known).to_numpy().astype(np.int64)
    return out


def _contiguous(raw, ids, path: Path, name: str) -> np.ndarray:
    import pyarrow.compute as pc

    index = pc.index_in(raw, value_set=ids)
    unknown = index.is_null().to_numpy(zero_copy_only=False)
    _refuse_rows(
        unknown, path, name, lambda row: f"id {raw[row].as_py()!r} is not in the node table"
    )
    return index.to_numpy().astype(np.int64)


def _npy_edges(path: Path, ids, id_type: str) -> dict[str, Any]:
    import pyarrow as pa

    if not path.is_file():
        raise ConstructError(f"{path}: no such file")
    if id_type != "int":
        raise ConstructError(
            f"{path}: an .npy edge array holds integers; id_type str needs a table"
        )
    edges = _load_npy(path)
    if edges.ndim != 2 or edges.shape[1] != 2 or not np.issubdtype(edges.dtype, np.integer):
        raise ConstructError(f"{path}: shape {edges.shape} {edges.dtype}, expected integer [E, 2]")
    if not len(edges):
        raise ConstructError(f"{path}: the edge array is empty (0 rows)")
    out = {"rows": len(edges), "weight": None, "feat": None, "type": None}
    for j, end in enumerate(("src", "dst")):
        out[end] = _contiguous(pa.array(edges[:, j].astype(np.int64)), ids, path, f"[{j}]")
    return out


def merge_edge_tables(tables: list[dict], specs: tuple[EdgeTableSpec, ...]) -> dict[str, Any]:
    """All tables' edges in one set of arrays; every table must carry the same edge data."""
    merged: dict[str, Any] = {}
    for key in ("src", "dst", "weight", "feat", "type"):
        given = [t[key] is not None for t in tables]
        if any(given) and not all(given):
            lacking = specs[given.index(False)].file
            raise ConstructError(
                f"{lacking}: this edge table has no {key} but another one has; every edge "
                f"table carries the same edge data"
            )
        merged[key] = np.concatenate([t[key] for t in tables]) if all(given) else None
    widths = {t["feat"].shape[1] for t in tables if t["feat"] is not None}
    if len(widths) > 1:
        raise ConstructError(f"edge tables have {sorted(widths)} edge features; they must agree")
    merged["feat_names"] = tables[0].get("feat_names", [])
    merged["rows"] = np.cumsum([0] + [t["rows"] for t in tables])
    return merged


def build_csc(
    src: np.ndarray, dst: np.ndarray, n: int, spec: ConstructSpec, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(indptr, indices, edge_row)``: the CSC :func:`~.graph.csc.csc_from_edges` builds
    (sorted by (dst, src); duplicates merged unless ``duplicates: error``; self-loops as
    declared) and, per stored edge, the input edge whose data it carries (its first
    occurrence; the reverse of an undirected edge carries the edge's)."""
    keys = dst * n + src
    loops = src == dst
    if spec.self_loops == "error" and loops.any():
        raise _edge_error(spec, rows, _first(loops), "a self-loop (self_loops: error)")
    if spec.duplicates == "error":
        order = np.argsort(keys, kind="stable")
        repeat = np.flatnonzero(keys[order][1:] == keys[order][:-1])
        if repeat.size:
            edge = int(order[1:][repeat].min())
            raise _edge_error(spec, rows, edge, "a duplicate edge (duplicates: error)")
    edge_row = np.arange(len(keys), dtype=np.int64)
    if spec.undirected:
        keys = np.concatenate([keys, src * n + dst])
        edge_row = np.concatenate([edge_row, edge_row])
    order = np.argsort(keys, kind="stable")
    keys, edge_row = keys[order], edge_row[order]
    keep = np.ones(len(keys), dtype=bool)
    keep[1:] = keys[1:] != keys[:-1]
    if spec.self_loops == "remove":
        keep &= keys % (n + 1) != 0
    keys, edge_row = keys[keep], edge_row[keep]
    indptr = np.searchsorted(keys, np.arange(n + 1, dtype=np.int64) * n)
    return indptr.astype(np.int64), keys % n, edge_row


def _edge_error(spec: ConstructSpec, rows: np.ndarray, edge: int, message: str):
    table = int(np.searchsorted(rows, edge, side="right")) - 1
    return _at(spec.edges[table].file, edge - int(rows[table]) + 1, None, message)


# ---------------------------------------------------------------------------- command
def construct(spec_path: str | os.PathLike, out: str | os.PathLike, log=print) -> dict:
    """Build the dataset the spec at ``spec_path`` describes into the new folder ``out``;
    returns its metadata. Nothing is left at ``out`` on an error."""
    start = time.perf_counter()
    spec = load_spec(spec_path)
    out = _check_out(Path(out))
    nodes = spec.nodes
    text = [nodes.id, nodes.label] + [c for c in (nodes.split,) if c]
    one_hot = [g for g in nodes.features if g.transform == "one-hot"]
    text += [c for g in one_hot for c in g.columns]
    table = read_table(nodes.file, text, tuple(g.prefix for g in one_hot if g.prefix))
    ids = node_ids(table, nodes)
    n = len(ids)
    y, classes = labels(table, nodes)
    masks = split_masks(table, nodes, y)
    x, feature_names, transforms = node_features(table, nodes, masks["train_mask"])
    log(f"[construct] {nodes.file}: {n:,} nodes, {x.shape[1]} features, {len(classes)} classes")
    types: dict[str, int] = {}
    tables = [edge_table(e, ids, nodes.id_type, types) for e in spec.edges]
    edges = merge_edge_tables(tables, spec.edges)
    indptr, indices, edge_row = build_csc(edges["src"], edges["dst"], n, spec, edges["rows"])
    log(f"[construct] {int(edges['rows'][-1]):,} edge rows -> {len(indices):,} stored edges")
    arrays = {"indptr": indptr, "indices": indices, "x": x, "y": y, **masks}
    arrays.update(_id_arrays(ids))
    edge_columns = {"weight": [], "features": [], "type": []}
    if edges["weight"] is not None:
        arrays["edge_weight"] = edges["weight"][edge_row].astype(np.float32)
        edge_columns["weight"] = [spec.edges[0].weight]
    if edges["feat"] is not None:
        arrays["edge_feat"] = edges["feat"][edge_row].astype(np.float32)
        edge_columns["features"] = edges["feat_names"]
    if edges["type"] is not None:
        arrays["edge_type"] = edges["type"][edge_row]
        edge_columns["type"] = [spec.edges[0].type]
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "name": spec.name or out.name,
        "num_nodes": n,
        "num_edges": len(indices),
        "num_features": x.shape[1],
        "num_classes": len(classes),
        "classes": classes,
        "id_type": nodes.id_type,
        "feature_names": feature_names,
        "transforms": transforms,
        "edge_columns": edge_columns,
        "edge_types": list(types),
        "split": {"column": nodes.split}
        if nodes.split
        else {"fractions": asdict(nodes.split_fractions)},
        "undirected": spec.undirected,
        "duplicates": spec.duplicates,
        "self_loops": spec.self_loops,
        "sources": [str(nodes.file)] + [str(e.file) for e in spec.edges],
    }
    _write(out, arrays, meta)
    log(f"[construct] wrote {out} ({time.perf_counter() - start:.1f} s)")
    log(f"[construct] train with: python train.py dataset=constructed dataset.root={out}")
    return meta


def _id_arrays(ids) -> dict[str, np.ndarray]:
    """The id map: ``node_ids`` (int), or UTF-8 bytes and offsets (str, Arrow's layout)."""
    import pyarrow as pa

    if pa.types.is_integer(ids.type):
        return {"node_ids": ids.to_numpy()}
    large = ids.cast(pa.large_string())
    offsets = np.frombuffer(large.buffers()[1], dtype=np.int64)[
        large.offset : large.offset + len(large) + 1
    ]
    data = np.frombuffer(large.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    return {"node_id_offsets": offsets - offsets[0], "node_id_bytes": data}


def _check_out(out: Path) -> Path:
    """``out`` if it is new or an empty folder (never overwritten); the left-overs of a
    construct that was killed (temporary folders of processes that no longer run) removed."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConstructError(f"out={out} exists and is not an empty folder; choose a new one")
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.construct-*"):
        pid = stale.name.rsplit("-", 2)[-2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write(out: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Write the arrays, then the metadata with their digests, in a temporary folder beside
    ``out``, and rename it to ``out``: ``out`` never exists half-written."""
    tmp = out.parent / f".{out.name}.construct-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        files = write_arrays(tmp, arrays)
        write_json_atomic(tmp / METADATA, seal({**meta, "files": files}))
        with contextlib.suppress(FileNotFoundError):
            out.rmdir()  # an empty folder given as out
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    folder = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    given = dict(arg.split("=", 1) for arg in args if "=" in arg)
    if set(given) != {"spec", "out"} or len(args) != 2 or not all(given.values()):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        construct(given["spec"], given["out"])
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
