"""Dataset registry: ``load_dataset(name, root, **options) -> NodeDataset``.

Synthetic graphs (``sbm``, ``rmat``) are generated in memory. Real datasets are read from
files under ``root`` and never downloaded: this suite runs where only package registries are
reachable, so a missing dataset fails fast with the directory and files it expects. Every
graph is returned undirected (both directions stored), with the dataset's public split.

A dataset root belongs to the user: the one-off processing step that PyG and ogb run writes
into a mirror under ``cache_dir``, never into ``root`` (whether or not ``root`` is writable),
unless ``download=True`` asked for files to be fetched into ``root``. Processing output that
already sits in ``root`` is used as it is.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib
import os
import pickle
import shutil
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.files import (
    UnsafeFileError,
    load_restricted,
    load_weights_only,
    weights_only_loads,
)
from lightning_gnnscale.graph.constructed import (
    GRAPH_ARRAYS,
    ConstructedDatasetError,
    check_arrays,
    edge_arrays,
    read_metadata,
    verified_path,
)
from lightning_gnnscale.graph.csc import Graph
from lightning_gnnscale.graph.dataset_config import (
    OGB,
    OGB_TYPED,
    PLANETOID,
    DatasetConfig,
    FileDatasetConfig,
    PlanetoidConfig,
    dataset_config,
)
from lightning_gnnscale.graph.generators import (
    rmat,
    rmat_peak_bytes,
    sbm,
    sbm_peak_bytes,
    typed_sbm,
    typed_sbm_peak_bytes,
)
from lightning_gnnscale.graph.node_targets import NodeDataset, NodeTargets
from lightning_gnnscale.graph.partition_dir import NPY_HEADER_READERS

DEFAULT_ROOT = Path.home() / ".cache" / "lightning_gnnscale" / "datasets"
PROCESSED_DATASETS_DIR = Path.home() / ".cache" / "lightning_gnnscale" / "processed"

_GENERATORS: dict[str, Callable[..., NodeDataset]] = {
    "sbm": sbm,
    "rmat": rmat,
    "typed-sbm": typed_sbm,
}
_PEAK_BYTES: dict[str, Callable[..., int]] = {
    "sbm": sbm_peak_bytes,
    "rmat": rmat_peak_bytes,
    "typed-sbm": typed_sbm_peak_bytes,
}
# The settings that size a synthetic graph (named when it cannot fit).
_SIZE_KEYS = {
    "sbm": ("num_nodes", "avg_degree", "num_features"),
    "typed-sbm": ("num_nodes", "num_relations", "avg_degree", "num_features"),
    "rmat": ("num_nodes", "num_edges", "num_features"),
}
_PLANETOID_RAW = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
_OGB_URL = "http://snap.stanford.edu/ogb/data/nodeproppred/{}.zip"


class DatasetNotFoundError(FileNotFoundError):
    """A real dataset's files are not under ``root`` (and cannot be downloaded here)."""


class DatasetTooLargeError(ConfigError):
    """A dataset whose estimated memory exceeds what this machine has available."""


def load_dataset(
    dataset: str | DatasetConfig, root: str | os.PathLike | None = None, **options
) -> NodeDataset:
    """Load ``dataset`` through its registered loader: a :class:`DatasetConfig` (a run's
    ``dataset``), or a name (one of :data:`~.dataset_config.DATASETS`, case-insensitive,
    ``_`` = ``-``) with its ``root`` and options, typed by :func:`~.dataset_config.dataset_config`
    (an unknown option or a value of the wrong type fails there, naming the key).

    ``sbm`` / ``rmat`` pass their settings to their generator and refuse a ``root`` (they read
    no files). Real datasets read under ``root`` (default :data:`DEFAULT_ROOT`); their processing
    output goes to ``cache_dir`` (default :data:`PROCESSED_DATASETS_DIR`; ``root`` is only read),
    and ``download`` lets PyG / ogb fetch missing files into ``root`` (see
    :class:`~.dataset_config.FileDatasetConfig`). Planetoid: ``<root>/<Cora|CiteSeer|PubMed>/raw/``.
    OGB: ``<root>/<name with - as _>/`` in ogb's layout (``raw/``, ``split/``, ``processed/``).
    """
    config = dataset_config(dataset, root, **options)
    estimate = check_fits(config)
    source = config.source
    module, function = source.loader.split(":")
    loader = getattr(importlib.import_module(module), function)
    action = "generating" if source.generated else "loading"
    with progress(f"{action} {source.name}", estimate.describe() if estimate else ""):
        return loader(config)


def generate(config: DatasetConfig) -> NodeDataset:
    """The registered loader of a generated dataset: its generator with its settings."""
    return _GENERATORS[config.source.name](**config.options)


def _root_and_cache(config: FileDatasetConfig) -> tuple[Path, Path]:
    root = Path(config.root if config.root is not None else DEFAULT_ROOT).expanduser()
    return root, Path(config.cache_dir or PROCESSED_DATASETS_DIR).expanduser()


def load_planetoid(config: PlanetoidConfig) -> NodeDataset:
    """The registered loader of a Planetoid dataset (see :func:`load_dataset`)."""
    root, cache = _root_and_cache(config)
    return _load_planetoid(
        config.source.name, root, cache, config.download, config.normalize_features
    )


def load_ogb(config: FileDatasetConfig) -> NodeDataset:
    """The registered loader of an OGB dataset (see :func:`load_dataset`)."""
    root, cache = _root_and_cache(config)
    if config.is_typed:
        return _load_ogb_typed(config.source.name, root, cache, config.download)
    return _load_ogb(config.source.name, root, cache, config.download)


def load_constructed(config: DatasetConfig) -> NodeDataset:
    """The registered loader of ``constructed``: the folder ``python -m
    lightning_gnnscale.construct`` wrote at ``root``, every array checked against the digest
    its metadata records."""
    meta = read_metadata(config.root)
    root = Path(config.root).expanduser()
    arrays = {
        array: np.load(verified_path(root, meta, array), allow_pickle=False)
        for array in GRAPH_ARRAYS
    }
    check_arrays(root, meta, arrays)
    edge_type, relations, edge_split = edge_arrays(root, meta, int(meta["num_edges"]))
    tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
    try:  # typed: the edges' relations, each segment sorted by (relation, source)
        graph = Graph(
            tensors["indptr"],
            tensors["indices"],
            tensors["x"],
            name=str(meta["name"]),
            meta={"source": "constructed", "root": str(root), "digest": meta["digest"]},
            edge_type=None if edge_type is None else torch.from_numpy(edge_type),
            relations=relations,
        )
    except ValueError as err:
        raise ConstructedDatasetError(f"{root}: {err}; run construct again") from None
    split = None if edge_split is None else torch.from_numpy(edge_split)
    targets = NodeTargets.from_arrays(tensors, int(meta["num_classes"]))
    return NodeDataset(graph, targets, split)


# --------------------------------------------------------------------- memory and progress
@dataclass(frozen=True)
class DatasetMemoryEstimate:
    """A dataset's size and about the most memory generating or loading it holds at once."""

    nodes: int
    edges: int  # drawn (synthetic) or stored in the files (real), one direction
    features: int
    peak_bytes: int
    basis: str  # where the numbers come from: the settings, or which files

    def describe(self) -> str:
        return (
            f"{self.nodes:,} nodes, {self.edges:,} edges, {self.features} features, "
            f"about {_gib(self.peak_bytes)} to build (from {self.basis})"
        )


# Loading a real dataset (ogb's numpy arrays, pandas' parsing, then the symmetrised CSC):
# bytes per edge in the files, per feature value and per node. Errs high, like the generators':
# an ogbn-arxiv-layout fixture of 200k nodes / 2M edges / 4 features peaked at 311 MiB
# (ru_maxrss over the imports), estimated 327 MiB.
_LOAD_BYTES_PER_EDGE = 160
_LOAD_BYTES_PER_FEATURE = 16
_LOAD_BYTES_PER_NODE = 48


def estimate_memory(
    dataset: str | DatasetConfig, root: str | os.PathLike | None = None, **options
) -> DatasetMemoryEstimate | None:
    """The memory estimate of ``dataset`` (as :func:`load_dataset` takes it) from its settings
    (``sbm``, ``rmat``) or from its files (OGB: the node and edge counts and feature width the
    raw files state), read without loading anything large; ``None`` when there is nothing to
    estimate from (Planetoid's graphs are a few MB; a dataset whose files are missing fails
    with its own message)."""
    config = dataset_config(dataset, root, **options)
    canonical = config.source.name
    if canonical in _GENERATORS:
        args = config.options
        nodes, features = int(args["num_nodes"]), int(args["num_features"])
        edges = (
            int(args["num_edges"])
            if canonical == "rmat"
            else round(nodes * args["avg_degree"] / 2) * args.get("num_relations", 1)
        )
        keys = ", ".join(f"dataset.{key}={args[key]}" for key in _SIZE_KEYS[canonical])
        return DatasetMemoryEstimate(nodes, edges, features, _PEAK_BYTES[canonical](**args), keys)
    if canonical in OGB:
        root = Path(config.root if config.root is not None else DEFAULT_ROOT).expanduser()
        sizes = _ogb_sizes(root / canonical.replace("-", "_"), OGB[canonical][1])
        if sizes is None:
            return None
        (nodes, edges, features), basis = sizes
        peak = (
            _LOAD_BYTES_PER_EDGE * edges
            + _LOAD_BYTES_PER_FEATURE * nodes * features
            + _LOAD_BYTES_PER_NODE * nodes
        )
        return DatasetMemoryEstimate(nodes, edges, features, peak, basis)
    return None


def check_fits(
    dataset: str | DatasetConfig, root: str | os.PathLike | None = None, **options
) -> DatasetMemoryEstimate | None:
    """:func:`estimate_memory`, refused with :class:`DatasetTooLargeError` when it exceeds the
    memory this machine has available now."""
    config = dataset_config(dataset, root, **options)
    estimate = estimate_memory(config)
    available = available_memory_bytes()
    if estimate is None or available is None or estimate.peak_bytes <= available:
        return estimate
    canonical = config.source.name
    if canonical in _GENERATORS:
        shrink = "lower " + " / ".join(f"dataset.{key}" for key in _SIZE_KEYS[canonical])
    else:
        shrink = "use a machine with more memory, or a smaller dataset"
    raise DatasetTooLargeError(
        f"dataset {canonical} does not fit in this machine's memory: {estimate.describe()}, "
        f"and {_gib(available)} is available. {shrink[0].upper()}{shrink[1:]}"
    )


def available_memory_bytes() -> int | None:
    """Memory this process may still take: ``MemAvailable`` of /proc/meminfo, lowered to what
    its cgroup's limit leaves (containers); ``None`` where neither can be read."""
    limits = []
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        with contextlib.suppress(OSError, ValueError):
            limit = Path(limit_file).read_text().strip()
            if limit != "max" and int(limit) < 1 << 60:
                limits.append(int(limit) - int(Path(usage_file).read_text()))
    return max(0, min(limits)) if limits else None


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:,.1f} GiB"


def _ogb_sizes(dataset_dir: Path, binary: bool) -> tuple[tuple[int, int, int], str] | None:
    """(nodes, edges, feature width) as ogb's raw files state them, read without loading the
    arrays: the count files and the first feature row (csv), or the arrays' headers (npz)."""
    raw = dataset_dir / "raw"
    try:
        if binary:
            path = raw / "data.npz"
            with zipfile.ZipFile(path) as archive:
                shapes = {}
                for member in ("edge_index", "node_feat", "num_nodes_list"):
                    with archive.open(f"{member}.npy") as file:
                        read_header = NPY_HEADER_READERS[np.lib.format.read_magic(file)]
                        shapes[member] = read_header(file)[0]
                with archive.open("num_nodes_list.npy") as file:
                    nodes = int(np.lib.format.read_array(file, allow_pickle=False).sum())
            edges, features = shapes["edge_index"][1], shapes["node_feat"][1]
            return (nodes, int(edges), int(features)), str(path)
        counts = [_sum_of_csv_gz(raw / f"num-{kind}-list.csv.gz") for kind in ("node", "edge")]
        with gzip.open(raw / "node-feat.csv.gz", "rt") as file:
            features = len(file.readline().split(","))
        return (counts[0], counts[1], features), f"{raw}/num-{{node,edge}}-list.csv.gz"
    except (OSError, KeyError, ValueError, IndexError, zipfile.BadZipFile):
        return None  # processed-only or damaged: ogb's own loading reports what is wrong


def _sum_of_csv_gz(path: Path) -> int:
    with gzip.open(path, "rt") as file:
        return sum(int(value) for value in file.read().split())


# Generation or loading that runs longer than this says what it is doing, then how long it took.
PROGRESS_AFTER_S = 3.0
_PROGRESS_EVERY_S = 30.0


@contextlib.contextmanager
def progress(action: str, detail: str = "") -> Iterator[None]:
    """Say on stderr what the block is doing (``action``: ``detail``) once it has run
    :data:`PROGRESS_AFTER_S`, then every 30 s how long it has run, and at the end how long it
    took; silent for quicker blocks."""
    start = time.monotonic()
    done = threading.Event()
    shown = threading.Event()

    def report() -> None:
        if done.wait(PROGRESS_AFTER_S):
            return
        shown.set()
        print(f"{action}{f': {detail}' if detail else ''} ...", file=sys.stderr, flush=True)
        while not done.wait(_PROGRESS_EVERY_S):
            print(
                f"  still {action} ({time.monotonic() - start:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    watcher = threading.Thread(target=report, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        if shown.is_set():
            print(
                f"{action}: done in {time.monotonic() - start:.1f} s",
                file=sys.stderr,
                flush=True,
            )


# ------------------------------------------------------------------------------ file layout
def _mirror_dir(cache_dir: Path, kind: str, root: Path, sources: list[Path]) -> Path:
    """Where processing output for the files under ``root`` goes: one folder per source root
    and state of its source files (path, size, modification time), so replacing or repairing a
    raw file gives a fresh folder instead of stale processed output."""
    digest = hashlib.sha256(str(root.resolve()).encode())
    for path in sorted(sources):
        info = path.stat()
        digest.update(f"{path.relative_to(root)}:{info.st_size}:{info.st_mtime_ns}".encode())
    return cache_dir / f"{kind}-{digest.hexdigest()[:16]}"


def _missing(paths: list[Path]) -> list[Path]:
    return [path for path in paths if not path.exists()]


# ------------------------------------------------------------------------------- Planetoid
def _load_planetoid(
    name: str, root: Path, cache_dir: Path, download: bool, normalize_features: bool
) -> NodeDataset:
    """Cora / CiteSeer / PubMed through PyG's ``Planetoid`` with the public split."""
    folder = PLANETOID[name]
    raw_dir = root / folder / "raw"
    raw_files = [raw_dir / f"ind.{name}.{suffix}" for suffix in _PLANETOID_RAW]
    missing = _missing(raw_files)
    if missing and not download:
        raise DatasetNotFoundError(
            f"{name}: raw Planetoid files missing in {raw_dir}/: {[p.name for p in missing]}. "
            f"Copy ind.{name}.{{{','.join(_PLANETOID_RAW)}}} "
            f"(from https://github.com/kimiyoung/planetoid/tree/master/data) into that folder, "
            f"or set dataset.download=true on a machine with internet."
        )
    from torch_geometric.datasets import Planetoid  # slow import: only once files exist

    pyg_root = root
    if not (root / folder / "processed" / "data.pt").exists() and not download:
        pyg_root = _mirror_dir(cache_dir, "planetoid", root, raw_files)
        mirror_raw = pyg_root / folder / "raw"
        mirror_raw.mkdir(parents=True, exist_ok=True)
        for path in raw_files:
            if not (mirror_raw / path.name).exists():
                shutil.copyfile(path, mirror_raw / path.name)
    dataset = _load_weights_only(
        lambda: Planetoid(str(pyg_root), folder, split="public"), pyg_root / folder / "processed"
    )
    data = dataset[0]
    x = data.x.float()
    if normalize_features:
        x = x / x.sum(1, keepdim=True).clamp(min=1e-12)
    graph = Graph.from_edge_index(
        data.edge_index,
        data.num_nodes,
        undirected=True,
        x=x,
        name=name,
        meta={"source": "planetoid", "root": str(root)},
    )
    targets = NodeTargets(
        data.y.long(), data.train_mask, data.val_mask, data.test_mask, dataset.num_classes
    )
    return NodeDataset(graph, targets)


def _load_weights_only(load: Callable[[], Any], processed: Path) -> Any:
    """``load()`` (PyG's dataset constructor) with every ``torch.load`` in it weights-only:
    PyG reads ``processed/*.pt`` with ``weights_only=False`` or falls back to it, so a file
    put in the dataset folder could otherwise run code. A refused file is named."""
    try:
        with weights_only_loads():
            return load()
    except pickle.UnpicklingError as err:
        for path in sorted(processed.glob("*.pt")):  # which file: check each, weights-only
            load_weights_only(path, name=f"dataset file {path}")
        raise UnsafeFileError(f"a dataset file under {processed} was refused: {err}") from None


# ------------------------------------------------------------------------------------- OGB
# What ogb's pickles (numpy arrays in dicts, written by ``torch.save``) may name, in numpy 1 and 2
# spelling: rebuilding an array or scalar from its bytes runs no code of the file.
_OGB_GLOBALS = (
    *(
        f"{core}.{name}"
        for core in ("numpy.core.multiarray", "numpy._core.multiarray")
        for name in ("_reconstruct", "scalar")
    ),
    "numpy.ndarray",
    "numpy.dtype",
    "torch._utils._rebuild_tensor_v2",
    "collections.OrderedDict",
)


class _TorchSafeLoad:
    """Stands in for ``torch`` inside ogb's dataset module: ``load`` reads numpy arrays and
    tensors only.

    ogb 1.3.6 pickles numpy arrays with ``torch.save`` (protocol 4) and reads them back with a
    bare ``torch.load``; torch's weights-only unpickler cannot read protocol 4, and a full
    unpickle would run whatever a file in the dataset folder names. So every global the file
    names is checked against :data:`_OGB_GLOBALS` first (:func:`~lightning_gnnscale.files.load_restricted`).
    """

    def __getattr__(self, attribute: str):
        return getattr(torch, attribute)

    @staticmethod
    def load(path, *_args, **_kwargs):
        return load_restricted(path, _OGB_GLOBALS, name=f"dataset file {path}")


@contextlib.contextmanager
def _ogb_compat() -> Iterator[None]:
    """Run ogb's loader on torch >= 2.6 and never let it prompt on stdin.

    Only ogb's own module is patched (its ``torch`` and ``input`` globals), for the duration
    of the block. ogb prompts "update the dataset now?" when the ``RELEASE_v*.txt`` marker is
    missing; the answer is "no", i.e. use the files that are there.
    """
    import ogb.nodeproppred.dataset as ogb_dataset

    ogb_dataset.torch = _TorchSafeLoad()
    ogb_dataset.input = lambda *_: "n"
    try:
        yield
    finally:
        ogb_dataset.torch = torch
        del ogb_dataset.input


def _ogb_dataset(name: str, root: Path, cache_dir: Path, download: bool):
    """ogb's ``NodePropPredDataset`` of ``name`` (processed in a cache mirror when ``root`` holds
    only the raw files) and its split; a missing file fails naming ogb's expected layout."""
    split_name, binary, zip_folder = OGB[name]
    typed = name in OGB_TYPED
    dir_name = name.replace("-", "_")
    dataset_dir = root / dir_name
    processed = dataset_dir / "processed" / "data_processed"
    main = "triplet-type-list.csv.gz" if typed else ("data.npz" if binary else "edge.csv.gz")
    raw_main = dataset_dir / "raw" / main
    split_dir = dataset_dir / "split" / split_name
    split_files = (
        [split_dir / "nodetype-has-split.csv.gz"]
        if typed
        else [split_dir / f"{part}.csv.gz" for part in ("train", "valid", "test")]
    )
    has_split = (split_dir / "split_dict.pt").exists() or not _missing(split_files)
    if (not (processed.exists() or raw_main.exists()) or not has_split) and not download:
        split_names = "nodetype-has-split.csv.gz" if typed else "{train,valid,test}.csv.gz"
        raise DatasetNotFoundError(
            f"{name}: expected ogb's layout in {dataset_dir}/: {raw_main.relative_to(dataset_dir)} "
            f"(or processed/data_processed) and split/{split_name}/{split_names}. "
            f"On a machine with internet, download "
            f"{_OGB_URL.format(zip_folder)}, unzip it and rename the folder {zip_folder!r} to "
            f"{dataset_dir} (or run ogb's NodePropPredDataset({name!r}, root=...) there and copy "
            f"{dir_name}/ over), or set dataset.download=true on a machine with internet."
        )
    from ogb.nodeproppred import NodePropPredDataset  # slow import: only once files exist

    ogb_root = root
    if not processed.exists():
        if not download:
            sources = [
                path
                for folder in ("raw", "split")
                for path in (dataset_dir / folder).rglob("*")
                if path.is_file()
            ]
            ogb_root = _mirror_dir(cache_dir, "ogb", root, sources)
            _link_ogb_sources(dataset_dir, ogb_root / dir_name)
        (ogb_root / dir_name / "processed").mkdir(parents=True, exist_ok=True)
    with _ogb_compat():
        dataset = NodePropPredDataset(name, root=str(ogb_root))
        split = dataset.get_idx_split()
        ogb_graph, labels = dataset[0]
    return dataset, split, ogb_graph, labels


def _load_ogb(name: str, root: Path, cache_dir: Path, download: bool) -> NodeDataset:
    """ogbn-* through ogb's ``NodePropPredDataset`` with ogb's split; NaN labels -> -1."""
    dataset, split, ogb_graph, labels = _ogb_dataset(name, root, cache_dir, download)
    num_nodes = int(ogb_graph["num_nodes"])
    y = _writable_tensor(labels).reshape(num_nodes)
    if y.is_floating_point():
        y = torch.nan_to_num(y, nan=-1.0)
    masks = []
    for split_key in ("train", "valid", "test"):
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[_writable_tensor(split[split_key]).long()] = True
        masks.append(mask)
    graph = Graph.from_edge_index(
        _writable_tensor(ogb_graph["edge_index"]),
        num_nodes,
        undirected=True,
        x=_writable_tensor(ogb_graph["node_feat"]).float(),
        name=name,
        meta={"source": "ogb", "root": str(root)},
    )
    return NodeDataset(graph, NodeTargets(y.long(), *masks, dataset.num_classes))


def _load_ogb_typed(name: str, root: Path, cache_dir: Path, download: bool) -> NodeDataset:
    """A heterogeneous OGB dataset (``ogbn-mag``) as a typed graph (docs/datasets.md, "OGB-MAG").

    Node types in ogb's (sorted) order, each a contiguous id range; every relation
    ``(head, rel, tail)`` as relation ``head__rel__tail`` plus its reverse
    ``tail__rev_rel__head`` (message passing both ways, as PyG's ``ToUndirected`` does).
    Features: the widest type's width, narrower and featureless types zero-padded (their rows
    are counted as any other); labels and splits of the labelled types, -1 and no split
    elsewhere."""
    dataset, split, ogb_graph, labels = _ogb_dataset(name, root, cache_dir, download)
    num_nodes_dict = {t: int(n) for t, n in ogb_graph["num_nodes_dict"].items()}
    node_types = tuple(sorted(num_nodes_dict))
    counts = torch.tensor([num_nodes_dict[t] for t in node_types])
    offsets = dict(zip(node_types, (torch.cumsum(counts, 0) - counts).tolist(), strict=True))
    num_nodes = int(counts.sum())
    feats = {t: f for t, f in (ogb_graph.get("node_feat_dict") or {}).items() if f is not None}

    def check(ok: bool, what: str) -> None:  # the files are outside input
        if not ok:
            raise ValueError(f"{name} at {root}: {what}; the files are damaged or not ogb's")

    for kind, rows in feats.items():
        check(
            rows.shape[0] == num_nodes_dict[kind],
            f"{kind} has {num_nodes_dict[kind]} nodes but {rows.shape[0]} feature rows",
        )
    for kind, rows in labels.items():
        check(
            kind in offsets and rows.shape[0] == num_nodes_dict[kind],
            f"{kind}'s labels do not match its {num_nodes_dict.get(kind)} nodes",
        )
    for key in ("train", "valid", "test"):
        for kind, ids in split[key].items():
            ids = np.asarray(ids)
            check(
                kind in offsets
                and (ids.size == 0 or (ids.min() >= 0 and ids.max() < num_nodes_dict[kind])),
                f"{kind}'s {key} split has ids outside its {num_nodes_dict.get(kind)} nodes",
            )
    width = max((f.shape[1] for f in feats.values()), default=1)
    x = torch.zeros(num_nodes, width)
    for kind, rows in feats.items():
        start = offsets[kind]
        x[start : start + rows.shape[0], : rows.shape[1]] = _writable_tensor(rows).float()
    relations, sources, destinations, kinds = [], [], [], []
    for head, rel, tail in sorted(ogb_graph["edge_index_dict"]):
        edges = _writable_tensor(ogb_graph["edge_index_dict"][head, rel, tail]).long()
        check(
            head in offsets
            and tail in offsets
            and (
                edges.numel() == 0
                or (
                    int(edges.min()) >= 0
                    and int(edges[0].max()) < num_nodes_dict[head]
                    and int(edges[1].max()) < num_nodes_dict[tail]
                )
            ),
            f"relation {head}-{rel}-{tail} names nodes outside its types' ranges",
        )
        src, dst = edges[0] + offsets[head], edges[1] + offsets[tail]
        for name_, a, b in (
            (f"{head}__{rel}__{tail}", src, dst),
            (f"{tail}__rev_{rel}__{head}", dst, src),
        ):
            sources.append(a)
            destinations.append(b)
            kinds.append(torch.full_like(a, len(relations)))
            relations.append(name_)
    y = torch.full((num_nodes,), -1, dtype=torch.long)
    masks = [torch.zeros(num_nodes, dtype=torch.bool) for _ in range(3)]
    for kind, rows in labels.items():
        y[offsets[kind] : offsets[kind] + rows.shape[0]] = _writable_tensor(rows).reshape(-1).long()
    for mask, key in zip(masks, ("train", "valid", "test"), strict=True):
        for kind, ids in split[key].items():
            mask[_writable_tensor(np.asarray(ids)).long() + offsets[kind]] = True
    graph = Graph.from_edge_index(
        torch.stack([torch.cat(sources), torch.cat(destinations)]),
        num_nodes,
        edge_type=torch.cat(kinds),
        x=x,
        name=name,
        meta={
            "source": "ogb",
            "root": str(root),
            "featureless_node_types": [t for t in node_types if t not in feats],
        },
        relations=tuple(relations),
        node_type=torch.repeat_interleave(torch.arange(len(node_types)), counts),
        node_types=node_types,
    )
    return NodeDataset(graph, NodeTargets(y, *masks, dataset.num_classes))


def _writable_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over ``array``, copied only when numpy marks it read-only (pandas output)."""
    return torch.from_numpy(np.require(array, requirements=["C", "W"]))


def _link_ogb_sources(source: Path, mirror: Path) -> None:
    """Mirror ogb's read-only dataset folder: link ``raw``/``split``, copy release markers."""
    mirror.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        target = mirror / entry.name
        if target.exists() or target.is_symlink() or entry.name == "processed":
            continue
        if entry.is_dir():
            target.symlink_to(entry.resolve(), target_is_directory=True)
        else:
            shutil.copyfile(entry, target)
