"""Content-addressed artifact cache for preprocessing results (partitions, ...).

An artifact is keyed by the sha256 of a canonical JSON of everything it depends on plus
:data:`CODE_VERSION`, written once with ``torch.save`` to a temporary file and published
with ``os.replace``. The rename is atomic, so readers never see half a file and two processes
that build the same artifact at once both succeed (the last rename wins; contents are equal).

Each file starts with the sha256 of the bytes that follow it, and holds its key beside its
value. A file that fails that check, cannot be read back (truncated, overwritten, not ours,
or needing more than tensors and plain data to load), or carries another key (an artifact
copied over another one's name) is reported by name and rebuilt.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_gnnscale.files import UnsafeFileError, atomic_write, load_weights_only
from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.node_targets import NodeTargets
from lightning_gnnscale.graph.partition import partition, partition_report

# Bump when a change to the code would change a cached artifact; old entries are then ignored.
CODE_VERSION = "4"  # bump when a partitioner's output or the file format changes
_DIGEST_BYTES = 64  # hex sha256 at the head of every artifact file


def _canonical(key_parts: dict) -> str:
    """The JSON text of ``key_parts`` with :data:`CODE_VERSION` (what a key hashes, and what an
    artifact carries to be checked against on load)."""
    return json.dumps(
        {"code_version": CODE_VERSION, **key_parts}, sort_keys=True, separators=(",", ":")
    )


def cache_key(key_parts: dict) -> str:
    """sha256 hex digest of ``key_parts`` (JSON values only) together with :data:`CODE_VERSION`."""
    return hashlib.sha256(_canonical(key_parts).encode()).hexdigest()


def _add_tensor(digest, tensor: Tensor) -> None:
    """Feed a tensor's dtype, shape and every byte to ``digest``, read in place (no copy)."""
    digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.numel():
        digest.update(flat.view(torch.uint8).numpy())


def tensor_digest(tensor: Tensor) -> str:
    """blake2b of a tensor's dtype, shape and bytes (key inputs such as weights or features)."""
    digest = hashlib.blake2b(digest_size=32)
    _add_tensor(digest, tensor)
    return digest.hexdigest()


def graph_fingerprint(graph: Graph, targets: NodeTargets) -> dict:
    """The identity of ``graph``'s structure (and node types, if any) and of the task's
    ``targets`` (targets and splits: what partitions and their reports depend on; features
    are not part of it): name,
    sizes and a digest of every byte of those arrays, so any change to them gives a new key
    (blake2b: 0.76 GiB/s measured here on a 1 GiB int64 tensor with :func:`tensor_digest`).
    Floating targets (node regression's) are read as float64, so the run's dtype does not
    change the key: a run given the float32 graph and one loading it in float64 (a partition
    directory) agree."""
    digest = hashlib.blake2b(digest_size=32)
    if isinstance(targets, NodeTargets):
        y = targets.target
        y = y.to(torch.float64) if y.is_floating_point() else y
        arrays = (y, targets.train, targets.val, targets.test)
    else:  # link prediction's LinkTargets: the positive pairs of each split
        split = targets.split
        arrays = (split.train_pos, split.val_pos, split.test_pos)
    # a typed graph's node types too (partitions balance them); a homogeneous key is unchanged
    types = () if graph.node_type is None else (graph.node_type,)
    for tensor in (graph.indptr, graph.indices, *arrays, *types):
        _add_tensor(digest, tensor)
    return {
        "name": graph.name,
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "digest": digest.hexdigest(),
    }


def cached(
    key_parts: dict,
    build_fn: Callable[[], Any],
    cache_dir: str | os.PathLike,
    *,
    prefix: str = "artifact",
) -> Any:
    """Return ``build_fn()``, computed once per distinct ``key_parts`` and kept in ``cache_dir``.

    ``build_fn`` must return what ``torch.load(weights_only=True)`` can read back: tensors,
    and dicts / lists / tuples of tensors and plain numbers or strings.
    The file is ``<cache_dir>/<prefix>-<sha256>.pt``.
    """
    path = artifact_path(key_parts, cache_dir, prefix=prefix)
    if path.exists():
        try:
            return read_verified(path, key_parts)
        except CorruptArtifactError as err:
            warnings.warn(f"{err}; rebuilding it", stacklevel=2)
    value = build_fn()
    buffer = io.BytesIO()
    torch.save({"key": _canonical(key_parts), "value": value}, buffer)
    body = buffer.getvalue()
    header = hashlib.sha256(body).hexdigest().encode()
    atomic_write(path, lambda file: (file.write(header), file.write(body)))
    return value


class CorruptArtifactError(RuntimeError):
    """A cached file that fails its content check or cannot be read; the message names it."""


def read_verified(path: Path, key_parts: dict | None = None) -> Any:
    """The value of an artifact written by :func:`cached`, after checking its content digest
    and (given ``key_parts``) that it was built for that key; loaded weights-only, so a file
    put in the cache folder runs no code."""
    data = path.read_bytes()
    header, body = data[:_DIGEST_BYTES], data[_DIGEST_BYTES:]
    if hashlib.sha256(body).hexdigest().encode() != header:
        raise CorruptArtifactError(
            f"cache entry {path} is damaged (its content does not match its digest: truncated "
            f"or overwritten)"
        )
    try:
        record = load_weights_only(io.BytesIO(body), name=f"cache entry {path}")
    except UnsafeFileError as err:
        raise CorruptArtifactError(str(err)) from None
    except Exception as err:  # unpickling raises many types
        raise CorruptArtifactError(f"cache entry {path} cannot be read ({err})") from None
    if not isinstance(record, dict) or set(record) != {"key", "value"}:
        raise CorruptArtifactError(f"cache entry {path} is not a cache artifact (no key)")
    if key_parts is not None and record["key"] != _canonical(key_parts):
        theirs, ours = json.loads(record["key"]), json.loads(_canonical(key_parts))
        differences = "; ".join(
            f"{name}: {theirs.get(name)!r} in the file, {ours.get(name)!r} wanted"
            for name in sorted(set(theirs) | set(ours))
            if theirs.get(name) != ours.get(name)
        )
        raise CorruptArtifactError(
            f"cache entry {path} was built for another key ({differences}): a file copied or "
            f"renamed over this one"
        )
    return record["value"]


def artifact_path(
    key_parts: dict, cache_dir: str | os.PathLike, *, prefix: str = "artifact"
) -> Path:
    """Where :func:`cached` keeps the artifact for ``key_parts``."""
    return Path(cache_dir) / f"{prefix}-{cache_key(key_parts)}.pt"


def cached_partition(
    graph: Graph,
    method: str,
    num_parts: int,
    seed: int,
    cache_dir: str | os.PathLike,
    *,
    targets: NodeTargets,
    node_weights: Tensor | None = None,
    edge_weights: Tensor | None = None,
    **options,
) -> Tensor:
    """:func:`~lightning_gnnscale.graph.partition.partition`, cached by content hash
    (``targets``: the task's rows, whose splits the partition may balance and reports).

    Beside ``partition-<key>.pt`` goes ``partition-<key>.json`` with the key parts and the
    :func:`~lightning_gnnscale.graph.partition.partition_report` of the result.
    """
    key_parts = {
        "kind": "partition",
        "graph": graph_fingerprint(graph, targets),
        "method": method,
        "num_parts": num_parts,
        "seed": seed,
        "options": options,
        "node_weights": None if node_weights is None else tensor_digest(node_weights),
        "edge_weights": None if edge_weights is None else tensor_digest(edge_weights),
    }

    splits = targets.split_matrix()

    def build() -> Tensor:
        parts = partition(
            graph,
            method,
            num_parts,
            seed=seed,
            splits=splits,
            node_weights=node_weights,
            edge_weights=edge_weights,
            **options,
        )
        report = {
            "key": key_parts,
            "report": partition_report(graph, parts, num_parts, splits=splits),
        }
        report_path = artifact_path(key_parts, cache_dir, prefix="partition").with_suffix(".json")
        atomic_write(report_path, lambda file: file.write(json.dumps(report, indent=2).encode()))
        return parts

    return cached(key_parts, build, cache_dir, prefix="partition")
