"""Content-addressed artifact cache for preprocessing results (partitions, ...).

An artifact is keyed by the sha256 of a canonical JSON of everything it depends on plus
:data:`CODE_VERSION`, written once with ``torch.save`` to a temporary file and published
with ``os.replace``. The rename is atomic, so readers never see half a file and two processes
that build the same artifact at once both succeed (the last rename wins; contents are equal).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.partition import partition, partition_report

# Bump when a change to the code would change a cached artifact; old entries are then ignored.
CODE_VERSION = "2"  # bump when a partitioner's output for the same inputs changes
_FINGERPRINT_SAMPLES = 4096


def cache_key(key_parts: dict) -> str:
    """sha256 hex digest of ``key_parts`` (JSON values only) together with :data:`CODE_VERSION`."""
    canonical = json.dumps(
        {"code_version": CODE_VERSION, **key_parts}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def tensor_digest(tensor: Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (for small key inputs such as weights)."""
    digest = hashlib.sha256(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
    digest.update(tensor.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def graph_fingerprint(graph: Graph) -> dict:
    """A cheap identity for ``graph``: name, sizes, and a digest of evenly spaced samples and
    whole-array sums of its structure, labels and train mask (what partitions and their
    reports depend on). O(N + E) arithmetic; only ~16k values are hashed."""
    digest = hashlib.sha256()
    for tensor in (graph.indptr, graph.indices, graph.y, graph.train_mask.to(torch.int64)):
        stride = max(1, tensor.numel() // _FINGERPRINT_SAMPLES)
        digest.update(tensor[::stride].contiguous().numpy().tobytes())
        digest.update(str(int(tensor.sum())).encode())
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
        return torch.load(path, weights_only=True)
    value = build_fn()
    _atomic_write(path, lambda file: torch.save(value, file))
    return value


def artifact_path(
    key_parts: dict, cache_dir: str | os.PathLike, *, prefix: str = "artifact"
) -> Path:
    """Where :func:`cached` keeps the artifact for ``key_parts``."""
    return Path(cache_dir) / f"{prefix}-{cache_key(key_parts)}.pt"


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """Write through a temporary file in the same folder, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def cached_partition(
    graph: Graph,
    method: str,
    num_parts: int,
    seed: int,
    cache_dir: str | os.PathLike,
    *,
    node_weights: Tensor | None = None,
    edge_weights: Tensor | None = None,
    **options,
) -> Tensor:
    """:func:`~lightning_gnnscale.graph.partition.partition`, cached by content hash.

    Beside ``partition-<key>.pt`` goes ``partition-<key>.json`` with the key parts and the
    :func:`~lightning_gnnscale.graph.partition.partition_report` of the result.
    """
    key_parts = {
        "kind": "partition",
        "graph": graph_fingerprint(graph),
        "method": method,
        "num_parts": num_parts,
        "seed": seed,
        "options": options,
        "node_weights": None if node_weights is None else tensor_digest(node_weights),
        "edge_weights": None if edge_weights is None else tensor_digest(edge_weights),
    }

    def build() -> Tensor:
        parts = partition(
            graph,
            method,
            num_parts,
            seed=seed,
            node_weights=node_weights,
            edge_weights=edge_weights,
            **options,
        )
        report = {"key": key_parts, "report": partition_report(graph, parts, num_parts)}
        report_path = artifact_path(key_parts, cache_dir, prefix="partition").with_suffix(".json")
        _atomic_write(report_path, lambda file: file.write(json.dumps(report, indent=2).encode()))
        return parts

    return cached(key_parts, build, cache_dir, prefix="partition")
