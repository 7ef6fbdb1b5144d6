"""The ``constructed`` dataset: a folder of ``.npy`` arrays and a JSON metadata file that
``python -m lightning_gnnscale.construct`` writes from a user's tables, and its loader.

Layout (docs/datasets.md, "Your own tables"; every array memory-mappable, no pickle)::

    <root>/constructed.json   format and version, counts, columns, transforms, file digests
    <root>/indptr.npy         int64 [N + 1]  CSC over in-edges (Graph's own layout)
    <root>/indices.npy        int64 [E]      source of each edge, in CSC order (= edge id)
    <root>/x.npy              float32 [N, F]
    <root>/y.npy              int64 [N]      class index, -1 = unlabelled
    <root>/{train,val,test}_mask.npy  bool [N]
    <root>/node_ids.npy       int64 [N] raw ids (id_type int), or for id_type str
    <root>/node_id_offsets.npy + node_id_bytes.npy   int64 [N + 1] and uint8: UTF-8 of id i
                              is bytes[offsets[i]:offsets[i+1]] (Arrow's string layout)
    <root>/edge_weight.npy    float32 [E], edge_feat.npy float32 [E, Fe], edge_type.npy int64
                              [E] (optional; aligned with indices, stored for later use)

Node ``i`` is row ``i`` of the node table. The metadata is written last, inside a temporary
folder that is renamed to ``<root>`` at the end: a folder without it was never finished.
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
VERSION = 1
METADATA = "constructed.json"
GRAPH_ARRAYS = ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")


class ConstructedDatasetError(ConfigError):
    """A ``dataset.root`` that is not a complete, intact constructed dataset; names the file."""


def content_digest(files: dict[str, dict]) -> str:
    """One digest over every file's name and digest: the dataset's content identity."""
    text = json.dumps({name: info["blake2b"] for name, info in sorted(files.items())})
    return hashlib.blake2b(text.encode(), digest_size=32).hexdigest()


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
    if content_digest(meta.get("files", {})) != meta.get("digest"):
        raise ConstructedDatasetError(f"{path}: its digest does not match its files")
    return meta


def verified_path(root: Path, meta: dict, array_name: str) -> Path:
    """``root/<array_name>.npy``, checked against the digest the metadata records."""
    path = root / f"{array_name}.npy"
    record = meta["files"].get(path.name)
    if record is None or not path.is_file() or file_digest(path) != record["blake2b"]:
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
    read (no model here reads edge data yet); ``None`` when nothing is stored or ``root``
    holds no constructed dataset (its loader says so)."""
    try:
        edges = read_metadata(root)["edge_columns"]
    except ConstructedDatasetError:
        return None
    stored = [f"{kind} ({', '.join(map(str, cols))})" for kind, cols in edges.items() if cols]
    if not stored:
        return None
    return (
        f"dataset {root}: model={model} ignores the stored edge columns {'; '.join(stored)} "
        "(batches carry no edge data yet; they are kept for typed-graph models)"
    )
