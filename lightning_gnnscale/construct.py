"""``python -m lightning_gnnscale.construct spec=<file.yaml> out=<dir>``: a dataset from the
user's tables (docs/datasets.md, "Your own tables").

Reads the node table and the edge tables the spec names (CSV, TSV, gzipped or not, and Parquet
through pyarrow; ``.npy`` arrays), remaps raw ids to contiguous ones (node ``i`` = row ``i`` of
the node table; without one, the ids the edges name, sorted), applies the feature transforms
with statistics from the training split only, builds the CSC as :meth:`Graph.from_edge_index`
does, and writes the ``constructed`` dataset (:mod:`lightning_gnnscale.graph.constructed`) that
``train.py dataset=constructed dataset.root=<dir>`` trains on. Bad input is refused naming the
file, row and column; the output appears only complete (written in a temporary folder, renamed
at the end).

The node table is held in memory (O(nodes)); the edge tables are streamed in chunks of
``chunk_rows`` rows and the CSC is built through scratch files (:func:`streamed_csc`), so the
peak memory does not grow with the edges (docs/datasets.md, "Larger than memory"). Everything
is vectorised (pyarrow compute, numpy), with a Python loop per chunk at most.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.files import file_digest, fsync_folder, write_json_atomic
from lightning_gnnscale.graph.construct_spec import (
    IDENTITY_FEATURES_MAX,
    SPLITS,
    ConstructSpec,
    EdgeTableSpec,
    FeatureSpec,
    NodeTableSpec,
    load_spec,
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


@dataclass(frozen=True)
class Source:
    """A table file as messages name it (``str`` is its path), with its format and whether
    its first line is a header (``column_names`` given: it is not)."""

    path: Path
    format: str
    column_names: tuple[str, ...] | None = None

    def __str__(self) -> str:
        return str(self.path)

    def line(self, row: int) -> int | None:
        """The file line of 1-based data row ``row`` (text tables only)."""
        if self.format not in ("csv", "tsv"):
            return None
        return row + (0 if self.column_names else 1)


def _source(spec: NodeTableSpec | EdgeTableSpec) -> Source:
    return Source(spec.file, spec.format, spec.column_names)


def error_at(where: Source | Path, row: int | None, column: str | None, message: str):
    """A :class:`ConstructError` at 1-based data row ``row`` (header not counted) of
    ``where``'s ``column`` (a :class:`Source`, or an ``.npy`` file's path)."""
    text = str(where)
    if row is not None:
        line = where.line(row) if isinstance(where, Source) else None
        text += f", row {row}" + ("" if line is None else f" (line {line})")
    if column is not None:
        text += f", column {column!r}"
    return ConstructError(f"{text}: {message}")


# ---------------------------------------------------------------------------- reading
def _arrow_errors():
    import pyarrow as pa

    return (pa.ArrowException, OSError)  # OSError: a corrupt .gz


def read_table(where: Source, text_columns: list[str], text_prefixes: tuple[str, ...] = ()):
    """The whole table ``where`` (pyarrow); ``text_columns`` and the columns starting with
    one of ``text_prefixes`` are read as strings from CSV (ids, labels, categories: ``007``
    stays ``007``; an empty value is null). A ragged CSV row, a repeated column name or an
    empty table is refused."""
    import pyarrow.parquet as pq

    if not where.path.is_file():
        raise ConstructError(f"{where}: no such file")
    try:
        if where.format == "parquet":
            table = pq.read_table(where.path)
        else:
            table = _read_csv(where, text_columns, text_prefixes)
    except _arrow_errors() as err:
        raise ConstructError(f"{where}: cannot be read: {err}") from None
    names = _check_names(where, table.column_names)
    if table.num_rows == 0:
        raise ConstructError(f"{where}: the table is empty (0 rows); columns: {names}")
    return table


def _read_csv(where: Source, text_columns: list[str], text_prefixes: tuple[str, ...]):
    """A whole CSV or TSV file, read with threads (again without, to number a ragged row)."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    if text_prefixes:  # the header names, to resolve the prefixes against
        text_columns = text_columns + [n for n in _csv_header(where) if n.startswith(text_prefixes)]
    types = dict.fromkeys(text_columns, pa.string())

    def read(threads: bool):
        options, parse, convert, ragged = _csv_options(where, 1 << 20, column_types=types)
        options.use_threads = threads
        return pa_csv.read_csv(
            where.path, read_options=options, parse_options=parse, convert_options=convert
        ), ragged

    table, ragged = read(True)
    if ragged and ragged[0].number is None:  # threaded reading does not number rows
        _, ragged = read(False)
    _refuse_ragged(where, ragged)
    return table


def _check_names(where: Source, names: list[str]) -> list[str]:
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConstructError(f"{where}: column names {repeated} appear more than once: {names}")
    return names


def _csv_options(where: Source, block_size: int, **convert):
    """pyarrow's read, parse and convert options for ``where``, and the list its
    ``invalid_row_handler`` fills with the ragged rows (skipped; :func:`_refuse_ragged`)."""
    import pyarrow.csv as pa_csv

    ragged: list = []

    def invalid_row(row) -> str:
        ragged.append(row)
        return "skip"

    read = pa_csv.ReadOptions(  # one thread numbers the rows pyarrow calls ragged
        use_threads=False, block_size=block_size, column_names=where.column_names
    )
    parse = pa_csv.ParseOptions(
        delimiter="\t" if where.format == "tsv" else ",", invalid_row_handler=invalid_row
    )
    return read, parse, pa_csv.ConvertOptions(strings_can_be_null=True, **convert), ragged


def _csv_header(where: Source) -> list[str]:
    import pyarrow.csv as pa_csv

    read, parse, convert, _ = _csv_options(where, 1 << 20)
    with pa_csv.open_csv(where.path, read_options=read, parse_options=parse) as reader:
        return reader.schema.names


def _csv_batches(where: Source, types: dict, include: list[str] | None, block_size: int):
    """The record batches of a CSV or TSV file, read by one streaming reader (``types``: the
    columns read as given; ``include``: only these columns); a ragged row is refused."""
    import pyarrow.csv as pa_csv

    read, parse, convert, ragged = _csv_options(
        where, block_size, column_types=types, include_columns=include or []
    )
    with pa_csv.open_csv(
        where.path, read_options=read, parse_options=parse, convert_options=convert
    ) as reader:
        for batch in reader:
            _refuse_ragged(where, ragged)
            yield batch
    _refuse_ragged(where, ragged)


def _refuse_ragged(where: Source, ragged: list) -> None:
    if ragged:
        bad = ragged[0]
        at = f"line {bad.number}" if bad.number is not None else "a row"
        raise ConstructError(
            f"{where}, {at}: {bad.actual_columns} values where the header has "
            f"{bad.expected_columns} columns: {bad.text[:200]!r}"
        )


def _missing(name: str, names: list[str], where) -> ConstructError:
    import difflib

    near = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return ConstructError(f"{where}: no column {name!r}{hint}; its columns: {names}")


def column(table, name: str, where):
    """Column ``name`` of ``table`` (one array); a missing one is named with those that exist."""
    if name not in table.column_names:
        raise _missing(name, table.column_names, where)
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


def _refuse_rows(
    bad: np.ndarray, where, column: str, message: Callable[[int], str], offset: int = 0
) -> None:
    """A :class:`ConstructError` at the first row where ``bad`` is set (none: nothing), its
    text ``message(row)`` (``row``: 0-based in ``bad``, which starts at table row
    ``offset``)."""
    if bad.any():
        row = _first(bad)
        raise error_at(where, offset + row + 1, column, message(row))


def parse_ids(values, id_type: str, path, name: str, offset: int = 0):
    """``values`` as ids of ``id_type`` (int64 or string array); a null or a value that does
    not parse is named (its row: ``offset`` + its index + 1)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    nulls = values.is_null().to_numpy(zero_copy_only=False)
    if nulls.any():
        raise error_at(path, offset + _first(nulls) + 1, name, "an empty id")
    if id_type == "str":
        if not (pa.types.is_string(values.type) or pa.types.is_integer(values.type)):
            raise error_at(path, None, name, f"ids of type {values.type} are not strings")
        return values.cast(pa.string())
    if pa.types.is_integer(values.type):
        if pa.types.is_uint64(values.type):
            limit = pa.scalar(2**63 - 1, pa.uint64())
            over = pc.greater(values, limit).to_numpy(zero_copy_only=False)
            _refuse_rows(
                over,
                path,
                name,
                lambda row: f"{values[row].as_py()} is above the int64 range",
                offset,
            )
        return values.cast(pa.int64())
    if not pa.types.is_string(values.type):
        raise error_at(
            path, None, name, f"ids of type {values.type} are not integers (id_type int)"
        )
    good = pc.match_substring_regex(values, _INT.pattern).to_numpy(zero_copy_only=False)
    _refuse_rows(
        ~good,
        path,
        name,
        lambda row: f"{values[row].as_py()!r} is not an integer (id_type int)",
        offset,
    )
    trimmed = pc.utf8_trim_whitespace(values)
    digits = pc.replace_substring_regex(trimmed, "^-?0*", "")
    length = pc.utf8_length(digits).to_numpy(zero_copy_only=False)
    limit = pc.if_else(pc.starts_with(trimmed, "-"), str(2**63), _INT64_MAX)
    over = (length > 19) | (
        (length == 19) & pc.greater(digits, limit).to_numpy(zero_copy_only=False)
    )
    _refuse_rows(
        over, path, name, lambda row: f"{values[row].as_py()!r} is outside the int64 range", offset
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

    ids = parse_ids(column(table, spec.id, _source(spec)), spec.id_type, _source(spec), spec.id)
    unique = pc.unique(ids)
    if len(unique) != len(ids):
        codes = pc.index_in(ids, value_set=unique).to_numpy()
        _, first = np.unique(codes, return_index=True)
        row = _first(first[codes] != np.arange(len(codes)))
        raise error_at(
            _source(spec),
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

    values = _label_strings(column(table, spec.label, _source(spec)), spec)
    present = values.is_valid().to_numpy(zero_copy_only=False)
    if spec.classes is not None:
        classes = list(spec.classes)
    else:
        found = pc.unique(values.drop_null()).to_pylist()
        numeric = all(_INT.match(v) for v in found)
        classes = sorted(found, key=int) if numeric else sorted(found)
    if not classes:
        raise error_at(_source(spec), None, spec.label, "no node has a label")
    codes = pc.index_in(values, value_set=pa.array(classes, pa.string()))
    unknown = present & codes.is_null().to_numpy(zero_copy_only=False)
    _refuse_rows(
        unknown,
        _source(spec),
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
            _source(spec),
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
        values = pc.fill_null(_strings(column(table, spec.split, _source(spec))), "")
        codes = pc.index_in(values, value_set=pa.array(["", *SPLITS], pa.string()))
        bad = codes.is_null().to_numpy(zero_copy_only=False)
        _refuse_rows(
            bad,
            _source(spec),
            spec.split,
            lambda row: f"split {values[row].as_py()!r} is unknown; valid: {list(SPLITS)} or empty",
        )
        code = codes.to_numpy(zero_copy_only=False)
        unlabelled = (code > 0) & (y < 0)
        _refuse_rows(
            unlabelled,
            _source(spec),
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


def feature_columns(columns: list[str], group: FeatureSpec, path) -> list[str]:
    """The column names of one feature group (``columns``: the table's), in table order for
    a prefix."""
    if group.prefix is None:
        return list(group.columns)
    names = [name for name in columns if name.startswith(group.prefix)]
    if not names:
        raise ConstructError(
            f"{path}: no column starts with prefix {group.prefix!r}; its columns: {columns}"
        )
    return names


def numeric_matrix(table, names: list[str], path, offset: int = 0) -> np.ndarray:
    """float64 ``[rows, len(names)]`` of numeric columns; a NaN, infinite or empty value or a
    non-numeric column is named."""
    import pyarrow as pa

    out = np.empty((table.num_rows, len(names)), dtype=np.float64)
    for j, name in enumerate(names):
        values = column(table, name, path)
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
            raise error_at(
                path,
                None,
                name,
                f"values of type {values.type} are not numbers (a category column takes "
                "transform: one-hot)",
            )
        out[:, j] = values.cast(pa.float64()).to_numpy(zero_copy_only=False)
    check_finite(out, path, names, offset)
    return out


def check_finite(matrix: np.ndarray, path, names: list[str], offset: int = 0) -> None:
    bad = ~np.isfinite(matrix)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        value = matrix[row, col]
        raise error_at(
            path, offset + int(row) + 1, names[col], f"feature value {value} is not finite"
        )


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
            cols, source = feature_columns(table.column_names, group, _source(spec)), str(spec.file)
        if group.transform == "one-hot":
            for name in cols:
                block, categories = _one_hot(column(table, name, _source(spec)), train)
                blocks.append(block)
                names += [f"{name}={c}" for c in categories] + [f"{name}=<unknown>"]
                records.append(
                    {"columns": [name], "transform": "one-hot", "categories": categories}
                )
            continue
        if group.npy is None:
            matrix = numeric_matrix(table, cols, _source(spec))
        matrix, stats = _scale(matrix, group.transform, train, source)
        blocks.append(matrix)
        names += cols
        records.append({"columns": cols, "transform": group.transform, **stats})
    if not blocks:
        raise ConstructError(f"{_source(spec)}: the spec names no node features (nodes.features)")
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
# An integer id map is a dense table when the ids span at most this many values per node.
DENSE_IDS_PER_NODE = 8


class IdMap:
    """Raw ids -> contiguous ids (node ``i`` has raw id ``ids[i]``), O(nodes), built once.
    Integer ids: a dense table ``raw - min -> node`` when the ids span at most
    :data:`DENSE_IDS_PER_NODE` values a node (int32: at most 32 bytes a node), else a binary
    search of each chunk's ids, sorted first, in a sorted copy. String ids: ``pc.index_in``
    against the node ids (which hashes them on each call: one call per chunk)."""

    def __init__(self, ids):
        import pyarrow as pa

        self.ids, self.table = ids, None
        self.integer = pa.types.is_integer(ids.type)
        if not self.integer:
            return
        raw = ids.to_numpy()
        self.low, span = int(raw.min()), int(raw.max()) - int(raw.min()) + 1
        if span <= DENSE_IDS_PER_NODE * len(raw):
            dtype = np.int32 if len(raw) < 2**31 else np.int64
            self.table = np.full(span, -1, dtype=dtype)
            self.table[raw - self.low] = np.arange(len(raw), dtype=dtype)
            return
        self.order = np.argsort(raw, kind="stable")
        self.sorted = raw[self.order]

    def __call__(self, raw) -> np.ndarray:
        """int64 contiguous ids of ``raw`` (an id array, or int64 numpy); -1: no such node."""
        import pyarrow.compute as pc

        if not self.integer:
            return (
                pc.fill_null(pc.index_in(raw, value_set=self.ids), -1).to_numpy().astype(np.int64)
            )
        values = raw if isinstance(raw, np.ndarray) else raw.to_numpy()
        if self.table is not None:
            offset = values - self.low  # may wrap for ids far outside: then out of range
            inside = (values >= self.low) & (offset >= 0) & (offset < len(self.table))
            found = np.full(len(values), -1, dtype=np.int64)
            found[inside] = self.table[offset[inside]]
            return found
        by_value = np.argsort(values)  # sorted queries: a cache-friendly binary search
        pos = np.minimum(np.searchsorted(self.sorted, values[by_value]), len(self.sorted) - 1)
        found = np.empty(len(values), dtype=np.int64)
        hit = self.sorted[pos] == values[by_value]
        found[by_value] = np.where(hit, self.order[pos], -1)
        return found


class EdgeTable:
    """One edge table, read in chunks of at most ``chunk_rows`` rows (a streaming CSV reader,
    Parquet's batches, ``.npy`` slices read from the file); its columns are checked when it
    is opened, before any row is read."""

    def __init__(self, spec: EdgeTableSpec, chunk_rows: int):
        self.spec, self.where, self.chunk_rows = spec, _source(spec), chunk_rows
        self.feat_names: list[str] = []
        if not spec.file.is_file():
            raise ConstructError(f"{self.where}: no such file")
        if spec.format == "npy":
            self._open_npy()
            return
        try:
            if spec.format == "parquet":
                import pyarrow.parquet as pq

                parquet = pq.ParquetFile(spec.file)
                self.names, self.num_rows = parquet.schema_arrow.names, parquet.metadata.num_rows
                parquet.close()
            else:
                self.names, self.num_rows = _csv_header(self.where), None
        except _arrow_errors() as err:
            raise ConstructError(f"{self.where}: cannot be read: {err}") from None
        _check_names(self.where, self.names)
        self.feat_names = [
            n for group in spec.features for n in feature_columns(self.names, group, self.where)
        ]
        numeric = [n for n in (spec.weight, *self.feat_names) if n is not None]
        self.text = [n for n in (spec.src, spec.dst, spec.type) if n is not None]
        for name in (*self.text, *numeric):
            if name not in self.names:
                raise _missing(name, self.names, self.where)
        self.columns = list(dict.fromkeys([*self.text, *numeric]))
        self.numeric = numeric
        if self.num_rows == 0:
            self._empty()

    def _open_npy(self) -> None:
        edges = _load_npy(self.spec.file, mmap_mode="r")
        shape, dtype = edges.shape, edges.dtype
        if len(shape) != 2 or shape[1] != 2 or not np.issubdtype(dtype, np.integer):
            raise ConstructError(f"{self.where}: shape {shape} {dtype}, expected integer [E, 2]")
        if not shape[0]:
            raise ConstructError(f"{self.where}: the edge array is empty (0 rows)")
        fortran = edges.flags.f_contiguous and not edges.flags.c_contiguous
        self.npy = (int(edges.offset), dtype, fortran)
        self.num_rows = int(shape[0])
        del edges  # unmapped: its pages are read chunk by chunk (_npy_chunk)

    def _empty(self):
        raise ConstructError(f"{self.where}: the table is empty (0 rows); columns: {self.names}")

    def chunks(self) -> Iterator[tuple[int, Any]]:
        """``(offset, chunk)``: the rows from table row ``offset`` (0-based), a pyarrow table
        (an ``int64 [m, 2]`` array for ``.npy``)."""
        if self.spec.format == "npy":
            for start in range(0, self.num_rows, self.chunk_rows):
                yield start, self._npy_chunk(start, min(self.num_rows, start + self.chunk_rows))
            return
        offset = 0
        try:
            for chunk in _rechunk(self._batches(), self.chunk_rows):
                yield offset, chunk
                offset += chunk.num_rows
        except _arrow_errors() as err:
            raise ConstructError(f"{self.where}: cannot be read: {err}") from None
        if not offset:
            self._empty()

    def _batches(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.spec.format == "parquet":  # pre-buffering would keep every row group read
            with pq.ParquetFile(self.spec.file, pre_buffer=False) as parquet:
                yield from parquet.iter_batches(batch_size=self.chunk_rows, columns=self.columns)
            return
        types = {
            **dict.fromkeys(self.numeric, pa.float64()),
            **dict.fromkeys(self.text, pa.string()),
        }
        block = int(np.clip(self.chunk_rows * 32, 1 << 20, 1 << 26))
        yield from _csv_batches(self.where, types, self.columns, block)

    def _npy_chunk(self, start: int, stop: int) -> np.ndarray:
        offset, dtype, fortran = self.npy
        rows = stop - start
        if not fortran:
            flat = np.fromfile(
                self.spec.file, dtype, count=2 * rows, offset=offset + 2 * start * dtype.itemsize
            )
            return flat.reshape(rows, 2).astype(np.int64)
        columns = [
            np.fromfile(
                self.spec.file,
                dtype,
                count=rows,
                offset=offset + (j * self.num_rows + start) * dtype.itemsize,
            )
            for j in range(2)
        ]
        return np.stack(columns, axis=1).astype(np.int64)


def _rechunk(batches, rows: int):
    """Tables of exactly ``rows`` rows (the last: fewer) from record batches of any size."""
    import pyarrow as pa

    held, count = [], 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        while count >= rows:
            table = pa.Table.from_batches(held)
            yield table.slice(0, rows)
            rest = table.slice(rows)
            held, count = rest.to_batches(), rest.num_rows
    if count:
        yield pa.Table.from_batches(held)


def _raw_ids(table: EdgeTable, chunk, offset: int, id_type: str) -> tuple:
    """The chunk's raw ``(src, dst)`` ids, parsed as ``id_type``."""
    if table.spec.format == "npy":
        return chunk[:, 0], chunk[:, 1]
    where = table.where
    return tuple(
        parse_ids(column(chunk, name, where), id_type, where, name, offset)
        for name in (table.spec.src, table.spec.dst)
    )


def _raw_value(raw, row: int):
    return int(raw[row]) if isinstance(raw, np.ndarray) else raw[row].as_py()


def edge_chunk(
    table: EdgeTable, chunk, offset: int, ids: IdMap, id_type: str, types: dict[str, int]
) -> dict[str, np.ndarray]:
    """One chunk as contiguous ``src``/``dst`` (int64) and, where the table has them,
    ``weight`` (float32), ``feat`` (float32 ``[m, Fe]``), ``type`` (int64; ``types``, the
    type names in order of first appearance, grows); an id no node has is named."""
    import pyarrow as pa
    import pyarrow.compute as pc

    spec, where = table.spec, table.where
    npy = spec.format == "npy"
    out = {}
    for j, (end, raw) in enumerate(zip(("src", "dst"), _raw_ids(table, chunk, offset, id_type))):
        index = ids(raw)
        name = f"[{j}]" if npy else getattr(spec, end)
        _refuse_rows(
            index < 0,
            where,
            name,
            lambda row, raw=raw: f"id {_raw_value(raw, row)!r} is not in the node table",
            offset,
        )
        out[end] = index
    if npy:
        return out
    if spec.weight is not None:
        out["weight"] = numeric_matrix(chunk, [spec.weight], where, offset)[:, 0].astype(np.float32)
    if table.feat_names:
        out["feat"] = numeric_matrix(chunk, table.feat_names, where, offset).astype(np.float32)
    if spec.type is not None:
        values = _strings(column(chunk, spec.type, where))
        empty = values.is_null().to_numpy(zero_copy_only=False)
        _refuse_rows(empty, where, spec.type, lambda row: "an empty edge type", offset)
        for name in pc.unique(values).to_pylist():
            types.setdefault(name, len(types))
        known = pa.array(list(types), pa.string())
        out["type"] = pc.index_in(values, value_set=known).to_numpy().astype(np.int64)
    return out


def open_edge_tables(spec: ConstructSpec) -> tuple[list[EdgeTable], dict[str, Any]]:
    """The edge tables, opened, and the edge data every one of them carries (``{column:
    (dtype, width)}``); tables that carry different edge data are refused."""
    for e in spec.edges:
        if e.format == "npy" and spec.node_id_type != "int":
            raise ConstructError(
                f"{e.file}: an .npy edge array holds integers; id_type str needs a table"
            )
    tables = [EdgeTable(e, spec.chunk_rows) for e in spec.edges]
    for key, given in (
        ("weight", [e.weight is not None for e in spec.edges]),
        ("feat", [bool(t.feat_names) for t in tables]),
        ("type", [e.type is not None for e in spec.edges]),
        ("split", [e.split is not None for e in spec.edges]),
    ):
        if any(given) and not all(given):
            raise ConstructError(
                f"{spec.edges[given.index(False)].file}: this edge table has no {key} but "
                f"another one has; every edge table carries the same edge data"
            )
    if spec.edges[0].split is not None:
        missing = sorted({"train"} - {e.split for e in spec.edges})
        if missing:
            raise ConstructError(
                f"spec {spec.path}: the edge tables declare splits "
                f"{sorted({e.split for e in spec.edges})} but none is train"
            )
    widths = {len(t.feat_names) for t in tables}
    if len(widths) > 1:
        raise ConstructError(f"edge tables have {sorted(widths)} edge features; they must agree")
    data = {}
    if spec.edges[0].weight is not None:
        data["weight"] = (np.float32, 1)
    if tables[0].feat_names:
        data["feat"] = (np.float32, len(tables[0].feat_names))
    if spec.edges[0].type is not None:
        data["type"] = (np.int64, 1)
    if spec.edges[0].split is not None:
        data["split"] = (np.int8, 1)
    return tables, data


def nodes_from_edges(tables: list[EdgeTable], spec: ConstructSpec):
    """An edge-only spec's node ids: every id its edges name, sorted (numerically for
    ``int``, by UTF-8 bytes for ``str``); refused past :data:`IDENTITY_FEATURES_MAX`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    id_type = spec.id_type
    seen = np.empty(0, np.int64) if id_type == "int" else pa.array([], pa.string())
    for table in tables:
        for offset, chunk in table.chunks():
            src, dst = _raw_ids(table, chunk, offset, id_type)
            if id_type == "int":
                seen = np.unique(np.concatenate([seen, np.asarray(src), np.asarray(dst)]))
            else:
                seen = pc.unique(pa.concat_arrays([seen, src, dst]))
            if len(seen) > IDENTITY_FEATURES_MAX:
                raise ConstructError(
                    f"spec {spec.path}: no node table, and the edges name more than "
                    f"{IDENTITY_FEATURES_MAX:,} nodes (past {table.where}, row {offset + 1}): "
                    f"an edge-only spec gives each node a one-hot identity feature, up to "
                    f"{IDENTITY_FEATURES_MAX:,} nodes. Give a node table with features (nodes:) "
                    "for a larger graph (learnable node embeddings are not there yet)"
                )
    if id_type == "int":
        return pa.array(seen, pa.int64())
    return seen.take(pc.sort_indices(seen))


# ------------------------------------------------------------------------ scratch files
class _Column:
    """A raw scratch file of fixed-width rows (``dtype``, ``width`` values a row), appended
    to, written at a row and read by row range through plain file calls (opened per call: a
    few thousand in all): no memory map, so the pages read or written never count in the
    process's resident set."""

    def __init__(self, path: Path, dtype, width: int = 1):
        self.path, self.dtype, self.width = path, np.dtype(dtype), width
        self.row_bytes = self.dtype.itemsize * width
        self.rows = 0
        path.write_bytes(b"")

    def append(self, array: np.ndarray) -> None:
        self.write_at(self.rows, array)

    def write_at(self, row: int, array: np.ndarray) -> None:
        with open(self.path, "r+b") as file:
            file.seek(row * self.row_bytes)
            file.write(np.ascontiguousarray(array, dtype=self.dtype).data)
        self.rows = max(self.rows, row + len(array))

    def read(self, start: int, stop: int) -> np.ndarray:
        count = (stop - start) * self.width
        array = np.fromfile(self.path, self.dtype, count=count, offset=start * self.row_bytes)
        return array.reshape(-1, self.width) if self.width > 1 else array


class _NpyWriter:
    """An ``.npy`` file written row block by row block, byte for byte what ``np.save`` writes
    for the whole array: the header (whose length does not depend on the row count) is
    rewritten with the final shape by :meth:`close`."""

    def __init__(self, path: Path, dtype, row_shape: tuple[int, ...] = ()):
        self.path, self.dtype, self.row_shape, self.rows = path, np.dtype(dtype), row_shape, 0
        self.header = self._header()
        path.write_bytes(self.header)

    def _header(self) -> bytes:
        import io

        buffer = io.BytesIO()
        header = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": (self.rows, *self.row_shape),
        }
        np.lib.format.write_array_header_1_0(buffer, header)
        return buffer.getvalue()

    def append(self, array: np.ndarray) -> None:
        with open(self.path, "ab") as file:
            file.write(np.ascontiguousarray(array, dtype=self.dtype).data)
        self.rows += len(array)

    def close(self) -> dict:
        """Finish the file; its ``{bytes, blake2b}`` record (as :func:`write_arrays`)."""
        header = self._header()
        if len(header) != len(self.header):
            raise AssertionError(f"{self.path}: the .npy header changed length")
        with open(self.path, "r+b") as file:
            file.write(header)
            file.flush()
            os.fsync(file.fileno())
        return {"bytes": self.path.stat().st_size, "blake2b": file_digest(self.path)}


# ------------------------------------------------------------------------------- the CSC
def spool_edges(
    tables: list[EdgeTable], data: dict, ids: IdMap, spec: ConstructSpec, n: int, scratch: Path
) -> tuple[dict[str, _Column], np.ndarray, np.ndarray, list[str]]:
    """Pass 1: every table's chunks mapped to contiguous ids and appended to scratch columns
    (``src``, ``dst`` and the edge data, in input order), with the CSC entries per destination
    (the in-degree, and the out-degree too when ``undirected``). Returns the columns, the
    entry counts ``[N]``, each table's first input edge (``[T + 1]``) and the type names."""
    columns = {"src": _Column(scratch / "src", np.int64), "dst": _Column(scratch / "dst", np.int64)}
    columns.update({k: _Column(scratch / k, dt, width) for k, (dt, width) in data.items()})
    counts = np.zeros(n, dtype=np.int64)
    rows, loop, types = [0], None, {}
    for table in tables:
        for offset, chunk in table.chunks():
            mapped = edge_chunk(table, chunk, offset, ids, spec.node_id_type, types)
            src, dst = mapped["src"], mapped["dst"]
            if "split" in data:  # the whole table's
                mapped["split"] = np.full(len(src), SPLITS.index(table.spec.split), np.int8)
            counts += np.bincount(dst, minlength=n)
            if spec.undirected:
                counts += np.bincount(src, minlength=n)
            if spec.self_loops == "error" and loop is None and (src == dst).any():
                loop = rows[-1] + offset + _first(src == dst)
            for key, values in mapped.items():
                columns[key].append(values)
        rows.append(columns["src"].rows)
    if loop is not None:
        raise _edge_error(spec, np.array(rows), loop, "a self-loop (self_loops: error)")
    return columns, counts, np.array(rows), list(types)


def _buckets(starts: np.ndarray, budget: int) -> np.ndarray:
    """Destination bounds ``[B + 1]`` of consecutive ranges holding at most ``budget`` CSC
    entries each (``starts``: each destination's first entry, ``[N + 1]``); a destination
    with more has a range of its own."""
    n, bounds = len(starts) - 1, [0]
    while bounds[-1] < n:
        lo = bounds[-1]
        hi = int(np.searchsorted(starts, starts[lo] + budget, side="right")) - 1
        bounds.append(max(hi, lo + 1))
    return np.array(bounds, dtype=np.int64)


def streamed_csc(
    columns: dict[str, _Column],
    counts: np.ndarray,
    rows: np.ndarray,
    spec: ConstructSpec,
    scratch: Path,
    folder: Path,
    num_relations: int = 1,
) -> tuple[np.ndarray, dict[str, dict]]:
    """The CSC :meth:`Graph.from_edge_index` builds (sorted by (dst, src), duplicates merged
    unless ``duplicates: error``, self-loops as declared), each stored edge carrying the data
    of its first occurrence (a reverse of an undirected edge: after every input edge), from
    the pass-1 ``columns``; ``indices`` and the edge data are written to ``folder`` as
    ``.npy`` files. Returns ``indptr`` and the files' records.

    Pass 2 scatters each entry (key ``dst * N + src``, its priority: input edge ``e``, or
    ``E + e`` for the reverse of edge ``e``, and its data) into the scratch region of its
    destination range (:func:`_buckets`, at most ``chunk_rows`` entries); pass 3 sorts each
    region by (key, priority), keeps each key's first entry and appends it to the output.
    Memory: O(N) and a chunk; the scratch files hold every entry once.

    Typed edges (a ``type`` column of ``num_relations`` relations): the key is
    ``(dst * R + relation) * N + src``, so each segment is sorted by (relation, source) and a
    pair is kept once per relation (``Graph``'s typed invariant). Split edge tables: an edge
    (a triple) in two splits is refused."""
    n, edges, chunk = len(counts), columns["src"].rows, spec.chunk_rows
    typed = "type" in columns
    r = num_relations if typed else 1
    if n * n * r >= 2**63:  # (dst * R + rel) * N + src must fit in int64
        raise ConstructError(
            f"{n:,} nodes x {r} relations: the CSC keys ((dst * R + relation) * N + src) "
            "overflow int64"
        )
    starts = np.concatenate([[0], np.cumsum(counts)])
    bounds = _buckets(starts, chunk)
    first_entry = starts[bounds]
    data = [k for k in ("weight", "feat", "type", "split") if k in columns]
    region = {
        "key": _Column(scratch / "key", np.int64),
        "prio": _Column(scratch / "prio", np.int64),
    }
    region.update(
        {k: _Column(scratch / f"region-{k}", columns[k].dtype, columns[k].width) for k in data}
    )
    cursor = first_entry[:-1].copy()
    for start in range(0, edges, chunk):  # pass 2
        stop = min(edges, start + chunk)
        src, dst = columns["src"].read(start, stop), columns["dst"].read(start, stop)
        values = {k: columns[k].read(start, stop) for k in data}
        prio = np.arange(start, stop, dtype=np.int64)
        rel = values["type"] if typed else 0
        key, dest = (dst * r + rel) * n + src, dst
        if spec.undirected:
            key, dest, prio = (
                np.concatenate([key, (src * r + rel) * n + dst]),
                np.concatenate([dst, src]),
                np.concatenate([prio, prio + edges]),
            )
            values = {k: np.concatenate([v, v]) for k, v in values.items()}
        bucket = np.searchsorted(bounds, dest, side="right") - 1
        order = np.argsort(bucket, kind="stable")
        per_bucket = np.bincount(bucket, minlength=len(bounds) - 1)
        entries = {
            "key": key[order],
            "prio": prio[order],
            **{k: v[order] for k, v in values.items()},
        }
        ends = np.cumsum(per_bucket)
        for b in np.flatnonzero(per_bucket):
            lo, hi = ends[b] - per_bucket[b], ends[b]
            for name, column_ in region.items():
                column_.write_at(int(cursor[b]), entries[name][lo:hi])
            cursor[b] += per_bucket[b]
    dtype = {"weight": np.float32, "feat": np.float32, "type": np.int64, "split": np.int8}
    writers = {"indices": _NpyWriter(folder / "indices.npy", np.int64)}
    names = {
        "weight": "edge_weight",
        "feat": "edge_feat",
        "type": "edge_type",
        "split": "edge_split",
    }
    for k in data:
        shape = (columns[k].width,) if k == "feat" else ()
        writers[names[k]] = _NpyWriter(folder / f"{names[k]}.npy", dtype[k], shape)
    stored = np.zeros(n, dtype=np.int64)
    repeat = conflict = None
    for b in range(len(bounds) - 1):  # pass 3
        lo, hi = int(first_entry[b]), int(first_entry[b + 1])
        if lo == hi:
            continue
        key, prio = region["key"].read(lo, hi), region["prio"].read(lo, hi)
        order = np.lexsort((prio, key))
        key, prio = key[order], prio[order]
        keep = np.ones(len(key), dtype=bool)
        keep[1:] = key[1:] != key[:-1]
        if spec.duplicates == "error":  # a repeat of an input edge (not a reverse)
            again = ~keep & (prio < edges)
            if again.any():
                first = int(prio[again].min())
                repeat = first if repeat is None else min(repeat, first)
        if "split" in data:  # an edge (or its undirected reverse) in two splits
            split = region["split"].read(lo, hi)[order]
            two = np.flatnonzero(~keep[1:] & (split[1:] != split[:-1])) + 1
            if two.size:
                first = int((prio[two] % edges).min())
                conflict = first if conflict is None else min(conflict, first)
        if spec.self_loops == "remove":
            keep &= key % n != key // n // r
        key = key[keep]
        stored[bounds[b] : bounds[b + 1]] = np.bincount(
            key // n // r - bounds[b], minlength=int(bounds[b + 1] - bounds[b])
        )
        writers["indices"].append(key % n)
        for k in data:
            writers[names[k]].append(region[k].read(lo, hi)[order][keep])
    if repeat is not None:
        raise _edge_error(spec, rows, repeat, "a duplicate edge (duplicates: error)")
    if conflict is not None:
        what = "this edge" + (" (with its relation)" if typed else "")
        raise _edge_error(
            spec,
            rows,
            conflict,
            f"{what} is also in an edge table of another split"
            + (" (or its reverse: undirected)" if spec.undirected else "")
            + "; an edge belongs to one split",
        )
    files = {f"{name}.npy": writer.close() for name, writer in writers.items()}
    return np.concatenate([[0], np.cumsum(stored)]).astype(np.int64), files


def _split_counts(folder: Path) -> dict[str, int]:
    """Stored edges per split of ``folder/edge_split.npy``."""
    counts = np.bincount(np.load(folder / "edge_split.npy"), minlength=len(SPLITS))
    return {name: int(c) for name, c in zip(SPLITS, counts)}


def _edge_error(spec: ConstructSpec, rows: np.ndarray, edge: int, message: str):
    table = int(np.searchsorted(rows, edge, side="right")) - 1
    return error_at(_source(spec.edges[table]), edge - int(rows[table]) + 1, None, message)


# ---------------------------------------------------------------------------- command
def construct(spec_path: str | os.PathLike, out: str | os.PathLike, log=print) -> dict:
    """Build the dataset the spec at ``spec_path`` describes into the new folder ``out``;
    returns its metadata. Everything is written in a hidden temporary folder beside ``out``
    (scratch files included), renamed to ``out`` at the end: nothing is left at ``out`` on an
    error, and the temporary folder is removed."""
    start = time.perf_counter()
    spec = load_spec(spec_path)
    out = _check_out(Path(out))
    tmp = out.parent / f".{out.name}.construct-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        meta = _build(spec, out.name, tmp, log)
        with contextlib.suppress(FileNotFoundError):
            out.rmdir()  # an empty folder given as out
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_folder(out.parent)
    log(f"[construct] wrote {out} ({time.perf_counter() - start:.1f} s)")
    if meta["num_classes"]:
        log(f"[construct] train with: python train.py dataset=constructed dataset.root={out}")
    else:
        typed = " model=rgcn task.decoder=distmult" if meta["edge_types"] else ""
        log(
            "[construct] train link prediction with: python train.py task=link_prediction "
            f"dataset=constructed dataset.root={out}{typed}"
        )
    return meta


def _build(spec: ConstructSpec, name: str, tmp: Path, log) -> dict:
    """Write the dataset's arrays and metadata into ``tmp``; its metadata."""
    nodes = spec.nodes
    if nodes is not None:
        node = _node_arrays(nodes, log)
        tables, data = open_edge_tables(spec)
    else:
        tables, data = open_edge_tables(spec)
        node = _edge_only_nodes(tables, spec, log)
    ids = node.pop("ids")
    n = len(ids)
    scratch = tmp / "scratch"
    scratch.mkdir()
    passes = time.perf_counter()
    columns, counts, rows, types = spool_edges(tables, data, IdMap(ids), spec, n, scratch)
    indptr, files = streamed_csc(columns, counts, rows, spec, scratch, tmp, len(types))
    shutil.rmtree(scratch)
    num_edges = int(indptr[-1])
    chunks = -(-int(rows[-1]) // spec.chunk_rows)
    log(
        f"[construct] {int(rows[-1]):,} edge rows -> {num_edges:,} stored edges "
        f"(in {chunks:,} chunk{'s' * (chunks > 1)} of <= {spec.chunk_rows:,} rows, "
        f"{time.perf_counter() - passes:.1f} s)"
    )
    arrays = {"indptr": indptr, **node.pop("arrays"), **_id_arrays(ids)}
    files = {**write_arrays(tmp, arrays), **files}
    first = spec.edges[0]
    edge_columns = {
        "weight": [first.weight] if "weight" in data else [],
        "features": tables[0].feat_names,
        "type": [first.type] if "type" in data else [],
    }
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "name": spec.name or name,
        "num_nodes": n,
        "num_edges": num_edges,
        **node,
        "id_type": spec.node_id_type,
        "edge_columns": edge_columns,
        "edge_types": types,
        "edge_splits": _split_counts(tmp) if "split" in data else {},
        "undirected": spec.undirected,
        "duplicates": spec.duplicates,
        "self_loops": spec.self_loops,
        "sources": ([str(nodes.file)] if nodes else []) + [str(e.file) for e in spec.edges],
        "files": files,
    }
    write_json_atomic(tmp / METADATA, seal(meta))
    return meta


def _node_arrays(nodes: NodeTableSpec, log) -> dict:
    """The node table's ids, its arrays (``x``, ``y``, the masks) and its metadata fields."""
    text = [nodes.id, nodes.label] + [c for c in (nodes.split,) if c]
    one_hot = [g for g in nodes.features if g.transform == "one-hot"]
    text += [c for g in one_hot for c in g.columns]
    table = read_table(_source(nodes), text, tuple(g.prefix for g in one_hot if g.prefix))
    ids = node_ids(table, nodes)
    y, classes = labels(table, nodes)
    masks = split_masks(table, nodes, y)
    x, feature_names, transforms = node_features(table, nodes, masks["train_mask"])
    del table
    log(
        f"[construct] {nodes.file}: {len(ids):,} nodes, {x.shape[1]} features, {len(classes)} classes"
    )
    return {
        "ids": ids,
        "arrays": {"x": x, "y": y, **masks},
        "num_features": x.shape[1],
        "num_classes": len(classes),
        "classes": classes,
        "feature_names": feature_names,
        "transforms": transforms,
        "split": {"column": nodes.split}
        if nodes.split
        else {"fractions": asdict(nodes.split_fractions)},
    }


def _edge_only_nodes(tables: list[EdgeTable], spec: ConstructSpec, log) -> dict:
    """An edge-only spec's nodes (:func:`nodes_from_edges`): one-hot identity features, no
    labels (``y`` -1, empty splits, no classes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = nodes_from_edges(tables, spec)
    n = len(ids)
    log(
        f"[construct] no node table: {n:,} nodes from the edges (ids sorted), one-hot identity "
        "features, no labels: a dataset for link prediction; node tasks refuse it"
    )
    empty = np.zeros(n, dtype=bool)
    names = pc.binary_join_element_wise("id=", ids.cast(pa.string()), "")
    return {
        "ids": ids,
        "arrays": {
            "x": np.eye(n, dtype=np.float32),
            "y": np.full(n, -1, dtype=np.int64),
            **{f"{split}_mask": empty for split in SPLITS},
        },
        "num_features": n,
        "num_classes": 0,
        "classes": [],
        "feature_names": names.to_pylist(),
        "transforms": [{"columns": [], "transform": "identity"}],
        "split": None,
        "nodes_from": "edges",
    }


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
