"""The spec ``python -m lightning_gnnscale.construct`` reads: a small YAML file naming one node
table (or none: the nodes come from the edges) and one or more edge tables, checked once into
the typed classes below (an unknown key is named with the valid ones). The format is documented
in docs/datasets.md, "Your own tables".
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from lightning_gnnscale.errors import ConfigError

ID_TYPES = ("int", "str")
TRANSFORMS = ("none", "standardise", "min-max", "one-hot")
DUPLICATES = ("merge", "error")
SELF_LOOPS = ("remove", "keep", "error")
SPLITS = ("train", "val", "test")
# file suffix -> format (tsv: a CSV whose delimiter is a tab)
FORMATS = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet", ".npy": "npy"}
TABLE_FORMATS = ("csv", "tsv", "parquet", "npy")
# Rows of an edge table read at once, and the most CSC entries sorted at once (one
# destination's in-edges are never split); docs/datasets.md, "Larger than memory".
CHUNK_ROWS = 1 << 22
# An edge-only spec's nodes get one-hot identity features up to this many nodes.
IDENTITY_FEATURES_MAX = 4096


class SpecError(ConfigError):
    """A bad construct spec; names the spec file and the key."""


@dataclass(frozen=True)
class FeatureSpec:
    """One group of feature columns: named ``columns``, every column starting with ``prefix``,
    or an ``npy`` matrix ``[N, F]`` aligned row by row with the node table; ``transform``
    applies to each column (one-hot: each column is a category column)."""

    columns: tuple[str, ...] = ()
    prefix: str | None = None
    npy: Path | None = None
    transform: str = "none"


@dataclass(frozen=True)
class SplitFractions:
    """Seeded fractions of the labelled nodes; test gets the rest."""

    train: float
    val: float
    seed: int = 0


@dataclass(frozen=True)
class NodeTableSpec:
    file: Path
    id: str
    id_type: str
    label: str
    features: tuple[FeatureSpec, ...] = ()
    classes: tuple[str, ...] | None = None  # declared label values, in class-index order
    split: str | None = None  # a column of train / val / test (empty: in no split)
    split_fractions: SplitFractions | None = None
    format: str = "csv"  # one of TABLE_FORMATS (default: from the file's suffix)
    column_names: tuple[str, ...] | None = None  # a header-less CSV's columns


@dataclass(frozen=True)
class EdgeTableSpec:
    """A table of edges ``src -> dst`` (raw ids), or an ``[E, 2]`` ``.npy`` of integer ids."""

    file: Path
    src: str | None = None
    dst: str | None = None
    weight: str | None = None
    features: tuple[FeatureSpec, ...] = ()
    type: str | None = None
    format: str = "csv"
    column_names: tuple[str, ...] | None = None
    split: str | None = None  # the whole table's link-prediction split: train / val / test


@dataclass(frozen=True)
class ConstructSpec:
    """``nodes`` ``None``: an edge-only spec (its nodes are the ids the edges name, sorted,
    of type ``id_type``)."""

    nodes: NodeTableSpec | None
    edges: tuple[EdgeTableSpec, ...]
    name: str | None = None
    undirected: bool = False  # Graph.from_edge_index's defaults
    duplicates: str = "merge"
    self_loops: str = "remove"
    id_type: str | None = None  # an edge-only spec's; a node table declares its own
    chunk_rows: int = CHUNK_ROWS
    path: Path | None = None  # the spec file (messages)

    @property
    def node_id_type(self) -> str:
        return self.id_type if self.nodes is None else self.nodes.id_type


def table_format(path: Path) -> str:
    """``csv`` (``.csv``, ``.csv.gz``), ``tsv`` (``.tsv``, ``.tsv.gz``), ``parquet`` or
    ``npy``, from the file's suffix."""
    name = path.name.lower()
    kind = FORMATS.get(Path(name[:-3]).suffix if name.endswith(".gz") else path.suffix.lower())
    if kind is None or (name.endswith(".gz") and kind not in ("csv", "tsv")):
        raise SpecError(
            f"{path}: unknown table format; valid suffixes: .csv, .csv.gz, .tsv, .tsv.gz, "
            ".parquet, .pq, .npy, or give format: one of {list(TABLE_FORMATS)}"
        )
    return kind


def load_spec(path: str | Path) -> ConstructSpec:
    """The checked spec of the YAML file ``path``; table paths are relative to its folder."""
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise SpecError(f"spec {path}: {err}") from None
    return parse_spec(raw, path)


def parse_spec(raw: Any, path: Path) -> ConstructSpec:
    base = path.parent
    where = f"spec {path}"
    top = _keys(raw, where, ConstructSpec, required=("edges",), skip=("path",))
    edges = top["edges"]
    if isinstance(edges, dict):
        edges = [edges]
    if not isinstance(edges, list) or not edges:
        raise SpecError(f"{where}: edges must be a table or a list of tables")
    if top.get("nodes") is None:
        if top.get("id_type") is None:
            raise SpecError(
                f"{where}: without a node table (nodes) the nodes come from the edges, and "
                f"id_type (one of {list(ID_TYPES)}) must be given at the top level"
            )
        id_type = _choice(top["id_type"], ID_TYPES, f"{where}: id_type")
        nodes = None
    else:
        if top.get("id_type") is not None:
            raise SpecError(f"{where}: id_type belongs to the node table (nodes.id_type)")
        id_type, nodes = None, _node_table(top["nodes"], base, f"{where}: nodes")
    chunk_rows = top.get("chunk_rows", CHUNK_ROWS)
    if not isinstance(chunk_rows, int) or isinstance(chunk_rows, bool) or chunk_rows < 1:
        raise SpecError(f"{where}: chunk_rows={chunk_rows!r} must be a positive integer")
    return ConstructSpec(
        nodes=nodes,
        edges=tuple(
            _edge_table(table, base, f"{where}: edges[{i}]") for i, table in enumerate(edges)
        ),
        name=_opt_str(top, "name", where),
        undirected=_bool(top.get("undirected", False), f"{where}: undirected"),
        duplicates=_choice(top.get("duplicates", "merge"), DUPLICATES, f"{where}: duplicates"),
        self_loops=_choice(top.get("self_loops", "remove"), SELF_LOOPS, f"{where}: self_loops"),
        id_type=id_type,
        chunk_rows=chunk_rows,
        path=path,
    )


def _file(table: dict, base: Path, where: str) -> tuple[Path, str, tuple[str, ...] | None]:
    """A table's file, its format (given, else from the suffix) and its header-less columns."""
    file = base / _str(table["file"], f"{where}.file")
    given = table.get("format")
    kind = table_format(file) if given is None else _choice(given, TABLE_FORMATS, f"{where}.format")
    names = table.get("column_names")
    if names is not None:
        if kind not in ("csv", "tsv"):
            raise SpecError(f"{where}.column_names: only a CSV or TSV file has no header")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise SpecError(f"{where}.column_names must be a non-empty list of column names")
        names = tuple(names)
    return file, kind, names


def _node_table(raw: Any, base: Path, where: str) -> NodeTableSpec:
    table = _keys(raw, where, NodeTableSpec, required=("file", "id", "id_type", "label"))
    file, kind, column_names = _file(table, base, where)
    if kind == "npy":
        raise SpecError(f"{where}.file={file}: a node table is CSV, TSV or Parquet")
    classes = table.get("classes")
    if classes is not None:
        if not isinstance(classes, list) or not classes:
            raise SpecError(f"{where}.classes must be a non-empty list of label values")
        classes = tuple(str(value) for value in classes)
        if len(set(classes)) != len(classes):
            raise SpecError(f"{where}.classes lists a value twice: {list(classes)}")
    fractions = table.get("split_fractions")
    if fractions is not None:
        fractions = _keys(fractions, f"{where}.split_fractions", SplitFractions, ("train", "val"))
        train, val = (
            _number(fractions[key], f"{where}.split_fractions.{key}") for key in ("train", "val")
        )
        if train <= 0 or val < 0 or train + val > 1:
            raise SpecError(
                f"{where}.split_fractions: train={train}, val={val} must have train > 0, "
                "val >= 0 and train + val <= 1 (test gets the rest)"
            )
        seed = fractions.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise SpecError(f"{where}.split_fractions.seed={seed!r} must be an integer")
        fractions = SplitFractions(train, val, seed)
    split = _opt_str(table, "split", where)
    if (split is None) == (fractions is None):
        raise SpecError(f"{where}: give exactly one of split (a column) and split_fractions")
    return NodeTableSpec(
        file=file,
        id=_str(table["id"], f"{where}.id"),
        id_type=_choice(table["id_type"], ID_TYPES, f"{where}.id_type"),
        label=_str(table["label"], f"{where}.label"),
        features=_features(table.get("features", []), base, f"{where}.features", nodes=True),
        classes=classes,
        split=split,
        split_fractions=fractions,
        format=kind,
        column_names=column_names,
    )


def _edge_table(raw: Any, base: Path, where: str) -> EdgeTableSpec:
    table = _keys(raw, where, EdgeTableSpec, required=("file",))
    file, kind, column_names = _file(table, base, where)
    columns = {key: _opt_str(table, key, where) for key in ("src", "dst", "weight", "type")}
    features = _features(table.get("features", []), base, f"{where}.features", nodes=False)
    if kind == "npy":
        named = [key for key, value in columns.items() if value is not None]
        if named or features:
            raise SpecError(
                f"{where}: an .npy edge file is an [E, 2] array of (src, dst) ids and has no "
                f"columns; drop {named or ['features']}"
            )
    elif columns["src"] is None or columns["dst"] is None:
        raise SpecError(f"{where}: a CSV or Parquet edge table needs src and dst (column names)")
    split = table.get("split")
    if split is not None:
        split = _choice(split, SPLITS, f"{where}.split")
    return EdgeTableSpec(
        file=file,
        features=features,
        format=kind,
        column_names=column_names,
        split=split,
        **columns,
    )


def _features(raw: Any, base: Path, where: str, nodes: bool) -> tuple[FeatureSpec, ...]:
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise SpecError(f"{where} must be a list of feature groups")
    groups = []
    for i, entry in enumerate(raw):
        at = f"{where}[{i}]"
        group = _keys(entry, at, FeatureSpec, required=())
        given = [key for key in ("columns", "prefix", "npy") if group.get(key) is not None]
        if len(given) != 1:
            raise SpecError(f"{at}: give exactly one of columns, prefix and npy (got {given})")
        columns = group.get("columns", [])
        if isinstance(columns, str):
            columns = [columns]
        if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
            raise SpecError(f"{at}.columns must be a list of column names")
        transform = _choice(group.get("transform", "none"), TRANSFORMS, f"{at}.transform")
        npy = group.get("npy")
        if npy is not None and not nodes:
            raise SpecError(f"{at}: edge features are columns or a prefix, not an .npy matrix")
        if transform != "none" and not nodes:
            raise SpecError(f"{at}: edge features are stored as they are (transform: none)")
        if transform == "one-hot" and npy is not None:
            raise SpecError(f"{at}: one-hot applies to category columns, not an .npy matrix")
        groups.append(
            FeatureSpec(
                columns=tuple(columns),
                prefix=_opt_str(group, "prefix", at),
                npy=None if npy is None else base / _str(npy, f"{at}.npy"),
                transform=transform,
            )
        )
    return tuple(groups)


# ---------------------------------------------------------------------------- key checks
def _keys(raw: Any, where: str, cls: type, required: tuple[str, ...], skip=()) -> dict:
    """``raw`` as a mapping whose keys are ``cls``'s fields (less ``skip``), with ``required``."""
    valid = [f.name for f in fields(cls) if f.name not in skip]
    if not isinstance(raw, dict):
        raise SpecError(f"{where} must be a mapping with keys {valid}, got {raw!r}")
    for key in raw:
        if key not in valid:
            near = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise SpecError(f"{where}: unknown key {key!r}{hint}; valid: {valid}")
    missing = [key for key in required if raw.get(key) is None]
    if missing:
        raise SpecError(f"{where}: missing {missing}; valid keys: {valid}")
    return raw


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(f"{where}={value!r} must be a non-empty string")
    return value


def _opt_str(table: dict, key: str, where: str) -> str | None:
    value = table.get(key)
    return None if value is None else _str(value, f"{where}.{key}")


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{where}={value!r} must be true or false")
    return value


def _number(value: Any, where: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise SpecError(f"{where}={value!r} must be a number")
    return float(value)


def _choice(value: Any, valid: tuple[str, ...], where: str) -> str:
    if value not in valid:
        raise SpecError(f"{where}={value!r} is unknown; valid: {list(valid)}")
    return value
