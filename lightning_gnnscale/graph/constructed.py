"""The ``constructed`` dataset: a folder of ``.npy`` arrays and a JSON metadata file that
``python -m lightning_gnnscale.construct`` writes from a user's tables, and its loader.

Layout (docs/datasets.md, "Your own tables"; every array memory-mappable, no pickle)::

    <root>/constructed.json   format and version, counts, columns, transforms, file digests,
                              the content digest and the seal of the whole file
    <root>/indptr.npy         int64 [N + 1]  CSC over in-edges (Graph's own layout)
    <root>/indices.npy        int64 [E]      source of each edge, in CSC order (= edge id)
    <root>/x.npy              float32 [N, F]
    <root>/y.npy              int64 [N]      class index, -1 = unlabelled
    <root>/{train,val,test}_mask.npy  bool [N]
    <root>/node_ids.npy       int64 [N] raw ids (id_type int), or for id_type str
    <root>/node_id_offsets.npy + node_id_bytes.npy   int64 [N + 1] and uint8: UTF-8 of id i
                              is bytes[offsets[i]:offsets[i+1]] (Arrow's string layout)
    <root>/edge_weight.npy    float32 [E], edge_feat.npy float32 [E, Fe] (optional; aligned
                              with indices, stored for later use)
    <root>/edge_type.npy      int64 [E] (optional): relation of each edge, an index into the
                              metadata's ``edge_types``; the graph loads typed, each segment
                              sorted by (relation, source), a pair once per relation
    <root>/edge_split.npy     int8 [E] (optional): 0 train, 1 val, 2 test, from edge tables
                              that declare a ``split``; link prediction trains on it

Node ``i`` is row ``i`` of the node table; without one (an edge-only spec: ``nodes_from`` is
``edges``) the ids the edges name, sorted, with one-hot identity features, ``y`` all -1, empty
splits and no classes: the node tasks refuse such a dataset (:func:`check_arrays`). The
metadata is written last, inside a temporary folder that is renamed to ``<root>`` at the end:
a folder without it was never finished.
No torch here (the construct command needs none): the loader is
:func:`~.datasets.load_constructed`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.files import file_digest

FORMAT = "lightning_gnnscale.constructed"
# 2: the digest covers the metadata too, and the file is sealed; 3: a typed graph keeps a pair
# once per relation (2 merged a pair's relations into its first), and edge_split.npy
VERSION = 3
METADATA = "constructed.json"
GRAPH_ARRAYS = ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")


class ConstructedDatasetError(ConfigError):
    """A ``dataset.root`` that is not a complete, intact constructed dataset; names the file."""


# Metadata keys outside the content digest: the digest and seal themselves, and where the
# tables were read from (the same tables elsewhere make the same dataset).
_NOT_CONTENT = ("digest", "blake2b", "sources")
# The type of every metadata field a reader uses.
FIELDS = {
    "format": str,
    "version": int,
    "name": str,
    "num_nodes": int,
    "num_edges": int,
    "num_features": int,
    "num_classes": int,
    "classes": list,
    "id_type": str,
    "feature_names": list,
    "edge_columns": dict,
    "files": dict,
    "digest": str,
    "blake2b": str,
}


def _blake2b(body: dict) -> str:
    text = json.dumps(body, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=32).hexdigest()


def content_digest(meta: dict) -> str:
    """The dataset's content identity: a digest of the metadata (every array file's digest
    among it) but its digest, seal and ``sources``."""
    return _blake2b({k: v for k, v in meta.items() if k not in _NOT_CONTENT})


def seal(meta: dict) -> dict:
    """``meta`` with its content ``digest`` and its ``blake2b`` seal (of all but itself), as
    :func:`read_metadata` checks them."""
    meta = {**meta, "digest": content_digest(meta)}
    return {**meta, "blake2b": _blake2b({k: v for k, v in meta.items() if k != "blake2b"})}


def write_arrays(folder: Path, arrays: dict[str, np.ndarray]) -> dict[str, dict]:
    """Save each array as ``folder/<name>.npy`` (no pickle), fsynced; ``{file: {bytes,
    blake2b}}``."""
    files = {}
    for name, array in arrays.items():
        path = folder / f"{name}.npy"
        with open(path, "wb") as file:
            np.save(file, np.ascontiguousarray(array), allow_pickle=False)
            file.flush()
            os.fsync(file.fileno())
        files[path.name] = {"bytes": path.stat().st_size, "blake2b": file_digest(path)}
    return files


def read_metadata(root: str | os.PathLike | None) -> dict:
    """The checked metadata of the constructed dataset at ``root``."""
    if root is None:
        raise ConstructedDatasetError(
            "dataset=constructed needs dataset.root=<the folder python -m "
            "lightning_gnnscale.construct wrote>"
        )
    path = Path(root).expanduser() / METADATA
    if not path.is_file():
        raise ConstructedDatasetError(
            f"dataset.root={root} holds no {METADATA}: not a folder written by python -m "
            "lightning_gnnscale.construct (or an unfinished one); run construct again"
        )
    try:
        meta = json.loads(path.read_text())
    except ValueError as err:
        raise ConstructedDatasetError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ConstructedDatasetError(f"{path}: format is not {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise ConstructedDatasetError(
            f"{path}: version {meta.get('version')!r}, this suite reads {VERSION}; run "
            "construct again"
        )
    wrong = [key for key, kind in FIELDS.items() if type(meta.get(key)) is not kind]
    if wrong:
        raise ConstructedDatasetError(f"{path}: fields {wrong} are missing or of the wrong type")
    if seal(meta)["blake2b"] != meta["blake2b"] or content_digest(meta) != meta["digest"]:
        raise ConstructedDatasetError(
            f"{path}: its content does not match its seal (edited or corrupt); run construct again"
        )
    if meta["id_type"] not in ("int", "str") or len(meta["classes"]) != meta["num_classes"]:
        raise ConstructedDatasetError(f"{path}: id_type or classes are not valid")
    return meta


def check_arrays(root: Path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """The graph arrays agree with each other and ``meta``: the CSC is well formed, every
    label is ``-1`` or a class, and every split node has a label. A dataset without labels
    (from an edge-only spec: no classes, every node ``-1``) loads; the node tasks refuse it
    (:meth:`~..tasks.base.NodeTask.labelled`)."""
    n, e, c = meta["num_nodes"], meta["num_edges"], meta["num_classes"]
    indptr, indices, y = arrays["indptr"], arrays["indices"], arrays["y"]
    shapes = {"indptr": (n + 1,), "indices": (e,), "x": (n, meta["num_features"]), "y": (n,)}
    shapes.update({f"{split}_mask": (n,) for split in ("train", "val", "test")})
    problems = [
        f"{k}.npy has shape {arrays[k].shape}, not {s}"
        for k, s in shapes.items()
        if arrays[k].shape != s
    ]
    if not problems:
        if indptr[0] != 0 or indptr[-1] != e or (np.diff(indptr) < 0).any():
            problems.append(f"indptr.npy does not rise from 0 to {e}")
        if e and (indices.min() < 0 or indices.max() >= n):
            problems.append(f"indices.npy holds ids outside [0, {n})")
        if ((y < -1) | (y >= c)).any():
            problems.append(f"y.npy holds labels outside [-1, {c})")
        for split in ("train", "val", "test"):
            if (arrays[f"{split}_mask"] & (y < 0)).any():
                problems.append(f"{split}_mask.npy holds nodes without a label")
    if problems:
        raise ConstructedDatasetError(f"{root}: {'; '.join(problems)}; run construct again")


def edge_arrays(
    root: Path, meta: dict, num_edges: int
) -> tuple[np.ndarray | None, tuple[str, ...], np.ndarray | None]:
    """``(edge_type, relations, edge_split)`` at ``root``, checked (outside input): the
    relation of each edge (``None`` when the edges have no type column) with the relation
    names, and the data's edge split (``None`` when the edge tables declare none)."""
    files = meta["files"]
    edge_type, relations, edge_split = None, (), None
    if "edge_type.npy" in files:
        names = meta.get("edge_types")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not names:
            raise ConstructedDatasetError(
                f"{root}: edge_types in {METADATA} is not a list of names"
            )
        edge_type = np.load(verified_path(root, meta, "edge_type"), allow_pickle=False)
        relations = tuple(names)
        if edge_type.shape != (num_edges,) or edge_type.dtype != np.int64:
            raise ConstructedDatasetError(f"{root}: edge_type.npy is not int64 [{num_edges}]")
        if num_edges and (edge_type.min() < 0 or edge_type.max() >= len(names)):
            raise ConstructedDatasetError(
                f"{root}: edge_type.npy holds relations outside [0, {len(names)})"
            )
    if "edge_split.npy" in files:
        edge_split = np.load(verified_path(root, meta, "edge_split"), allow_pickle=False)
        if edge_split.shape != (num_edges,) or edge_split.dtype != np.int8:
            raise ConstructedDatasetError(f"{root}: edge_split.npy is not int8 [{num_edges}]")
        if num_edges and (edge_split.min() < 0 or edge_split.max() > 2):
            raise ConstructedDatasetError(
                f"{root}: edge_split.npy holds values other than 0 (train), 1 (val), 2 (test)"
            )
    return edge_type, relations, edge_split


def is_typed_at(root: str | os.PathLike | None) -> bool:
    """Whether the constructed dataset at ``root`` is a typed graph (its metadata records
    an edge type file); ``False`` when ``root`` holds none (its loader says why)."""
    try:
        return "edge_type.npy" in read_metadata(root)["files"]
    except ConstructedDatasetError:
        return False


def verified_path(root: Path, meta: dict, array_name: str) -> Path:
    """``root/<array_name>.npy``, checked against the digest the metadata records."""
    path = root / f"{array_name}.npy"
    record = meta["files"].get(path.name)
    if (
        not isinstance(record, dict)
        or not path.is_file()
        or file_digest(path) != record.get("blake2b")
    ):
        raise ConstructedDatasetError(
            f"{path} is missing or differs from what {METADATA} records; run construct again"
        )
    return path


def node_ids(root: str | os.PathLike):
    """The id map at ``root``: the raw id of each node, in node order (a pyarrow array)."""
    import pyarrow as pa

    root = Path(root)
    meta = read_metadata(root)
    if meta["id_type"] == "int":
        return pa.array(np.load(verified_path(root, meta, "node_ids"), allow_pickle=False))
    offsets = np.load(verified_path(root, meta, "node_id_offsets"), allow_pickle=False)
    data = np.load(verified_path(root, meta, "node_id_bytes"), allow_pickle=False)
    return pa.LargeStringArray.from_buffers(
        len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data)
    )


def digest_at(root: str | os.PathLike | None) -> str:
    """The content digest the metadata at ``root`` records (the dataset's identity)."""
    return str(read_metadata(root)["digest"])


def ignored_columns_line(root: str | os.PathLike | None, model: str) -> str | None:
    """The line a run prints about the edge data stored at ``root`` that ``model`` does not
    read (no model here reads edge weights or features yet; edge types make the graph typed);
    ``None`` when nothing is stored or ``root`` holds no constructed dataset (its loader says
    so)."""
    try:
        edges = read_metadata(root)["edge_columns"]
    except ConstructedDatasetError:
        return None
    # the type column is read: the graph loads typed (model=rgcn reads its relations)
    stored = [
        f"{kind} ({', '.join(map(str, cols))})"
        for kind, cols in edges.items()
        if cols and kind != "type"
    ]
    if not stored:
        return None
    return (
        f"dataset {root}: model={model} ignores the stored edge columns {'; '.join(stored)} "
        "(batches carry no edge data yet; they are kept for typed-graph models)"
    )
