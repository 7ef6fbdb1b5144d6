"""One-time chunking and the on-disk chunk store (docs/systems/grappa.md, "Chunk store").

The DataModule's ``preprocess`` cuts the graph into ``C`` chunks and writes one file per chunk:
its nodes (sorted global ids), their in-edges (CSC over the chunk's nodes, sources as global
ids, in global segment order), features and the task's target rows (``NodeTargets.arrays``:
``y`` and the three split columns). A rank then
reads only the chunks its partition owns, plus the halo rows it needs from the others, so its
memory follows the partition's size, not the graph's.

The store's folder name is a hash of everything the chunk files hold (structure, features,
the task's targets and splits, dtype, each hashed in full) and of how they were cut (method,
seed, count), so a changed input writes a new store. ``meta.json`` records the sha256 of every
chunk file: ``write_chunk_store`` checks every file before reusing a store and rewrites the
ones that do not match; a rank that received the store from its launcher checks each file
once before its first read and, if it does not match, fails naming the file (it has no graph
to rebuild from).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ...files import atomic_write
from ...graph.cache import cache_key, graph_fingerprint
from ...graph.csc import Graph
from ...graph.node_targets import NodeDataset, NodeTargets
from ...graph.partition import partition
from ...graph.partition_dir import GRAPH_COUNTS
from ...tasks.base import NodeTask
from .config import CHUNKINGS

# Bump when the store's layout or the meaning of a field changes: old stores are then ignored.
STORE_FORMAT = 3
_DIGEST_ROWS = 1 << 16  # feature rows digested at a time by ``features_digest``
_READ_BLOCK = 1 << 24
# versions (``_version``) of the chunk files this process has checked against their digest
_VERIFIED: set[tuple] = set()
# a chunk's record as partitions read it (``chunk_payload``'s keys; the in-degrees are
# ``indptr``'s differences, so the ``deg`` that stores written before kept is never read)
CHUNK_FILES = ("nodes", "indptr", "indices", "x", *NodeTargets.array_names())
# a typed graph's chunk also holds ``edge_type``: the relation of each of ``indices``' edges
# (docs/systems/grappa.md, "Typed graphs")
TYPED_FILE = "edge_type"
# link prediction's record (docs/systems/grappa.md, "Link prediction"): ``indptr``/``indices``
# are the chunk nodes' in-edges over the *training* edges only, ``test_*`` over training +
# validation edges (the test stage's structure), ``full_*`` over every edge (predictions, as
# ``single``'s), and per split the positive pairs whose destination lies in the chunk (global
# ids ``[2, m]``) with their positions in the split
LINK_SPLITS = ("train", "val", "test")
LINK_CHUNK_FILES = (
    "nodes",
    "indptr",
    "indices",
    "x",
    "test_indptr",
    "test_indices",
    "full_indptr",
    "full_indices",
    *(f"{s}_{name}" for s in LINK_SPLITS for name in ("pairs", "pair_ids")),
)
# a typed graph's link-prediction record adds the relation of each in-edge of the three
# stage structures (the training and test stages' with the inverse relations ``r + R`` of a
# directed split, the full one the graph's own) and of each positive pair, per split
# (docs/systems/grappa.md, "Typed graphs")
LINK_TYPED_FILES = (
    TYPED_FILE,
    "test_edge_type",
    "full_edge_type",
    *(f"{s}_pair_rel" for s in LINK_SPLITS),
)
# the structure files of each message-passing stage (``GrappaPart.load``'s ``stage``), and
# (typed) the file of their edges' relations
STAGE_FILES = {
    "train": ("indptr", "indices"),
    "test": ("test_indptr", "test_indices"),
    "full": ("full_indptr", "full_indices"),
}
STAGE_TYPED_FILES = {"train": TYPED_FILE, "test": "test_edge_type", "full": "full_edge_type"}


def is_link(task: NodeTask) -> bool:
    """The task's seeds are edges (link prediction): its chunks hold pairs, not node rows."""
    return task.spec.seeds == "edges"


def chunk_files(link: bool, typed: bool = False) -> tuple[str, ...]:
    """The files of a chunk's record: :data:`LINK_CHUNK_FILES` for link prediction, else
    :data:`CHUNK_FILES` (a typed graph's with :data:`TYPED_FILE`, or
    :data:`LINK_TYPED_FILES`)."""
    if link:
        return (*LINK_CHUNK_FILES, *LINK_TYPED_FILES) if typed else LINK_CHUNK_FILES
    return (*CHUNK_FILES, TYPED_FILE) if typed else CHUNK_FILES


class ChunkStoreError(RuntimeError):
    """A chunk file that is missing, unreadable or not the one the store's digest names."""


def _version(path: Path) -> tuple:
    """What identifies one version of a file: path, inode, size and change times."""
    stat = os.stat(path)
    return str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, streamed in 16 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(_READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def chunk_assignment(graph: Graph, num_chunks: int, method: str, seed: int) -> Tensor:
    """int64 ``[N]`` chunk of every node.

    ``random``: a seeded permutation cut into ``C`` contiguous blocks (sizes differ by <= 1);
    on a graph with node types the permutation is grouped by type and dealt round-robin, so
    every chunk also holds each type's nodes to within one (DistDGL's ``balance_ntypes``);
    ``random_iid``: an independent uniform chunk per node; ``metis``: pymetis k-way on the
    symmetrised graph.
    """
    n = graph.num_nodes
    gen = torch.Generator().manual_seed(seed)
    if method == "random" and graph.node_type is not None:
        perm = torch.randperm(n, generator=gen)
        dealt = perm[torch.sort(graph.node_type[perm], stable=True).indices]
        chunk = torch.empty(n, dtype=torch.int64)
        chunk[dealt] = torch.arange(n) % num_chunks
        return chunk
    if method == "random":
        chunk = torch.empty(n, dtype=torch.int64)
        sizes = [len(b) for b in torch.arange(n).tensor_split(num_chunks)]
        chunk[torch.randperm(n, generator=gen)] = torch.repeat_interleave(
            torch.arange(num_chunks), torch.tensor(sizes)
        )
        return chunk
    if method == "random_iid":
        return torch.randint(num_chunks, (n,), generator=gen)
    if method == "metis":
        return partition(graph, "metis", num_chunks, seed=seed).to(torch.int64)
    raise ValueError(f"unknown chunking {method!r}; valid: {list(CHUNKINGS)}")


def _in_edges(
    indptr: Tensor, indices: Tensor, nodes: Tensor, edge_type: Tensor | None = None
) -> tuple[Tensor, ...]:
    """The CSC ``(indptr [n + 1], sources [e])`` of ``nodes``' in-edges (global sources, in
    global segment order), and with ``edge_type`` their relations ``[e]`` third."""
    start, end = indptr[nodes], indptr[nodes + 1]
    deg = end - start
    ptr = torch.zeros(nodes.numel() + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=ptr[1:])
    offsets = torch.arange(int(ptr[-1])) - torch.repeat_interleave(ptr[:-1], deg)
    eids = torch.repeat_interleave(start, deg) + offsets
    if edge_type is not None:
        return ptr, indices[eids].clone(), edge_type[eids].clone()
    return ptr, indices[eids].clone()


def chunk_payload(graph: Graph, targets, nodes: Tensor, chunk: Tensor | None = None) -> dict:
    """The stored record of one chunk (``nodes`` sorted global ids; ``targets``: the task's
    rows of every node, or link prediction's :class:`~...tasks.link_prediction.LinkTargets`,
    whose chunks hold the training structure and the pairs whose destination they hold; then
    ``chunk`` is every node's chunk). A typed graph's record adds ``edge_type``, the relation
    of each in-edge (each segment sorted by relation, then source, as the graph's); a typed
    link-prediction record the relations of every stage's in-edges and of its pairs
    (:data:`LINK_TYPED_FILES`)."""
    link = not isinstance(targets, NodeTargets)
    split = targets.split if link else None
    indptr, indices = split.structure("train") if link else (graph.indptr, graph.indices)
    edge_type = split.structure_edge_type("train") if link else graph.edge_type
    ptr, src, *typed = _in_edges(indptr, indices, nodes, edge_type)
    record = {"nodes": nodes.clone(), "indptr": ptr, "indices": src, "x": graph.x[nodes].clone()}
    if typed:
        record[TYPED_FILE] = typed[0]
    if not link:
        return {**record, **targets.rows(nodes).clone().arrays()}
    test = _in_edges(*split.structure("test"), nodes, split.structure_edge_type("test"))
    full = _in_edges(graph.indptr, graph.indices, nodes, graph.edge_type)
    record["test_indptr"], record["test_indices"] = test[:2]
    record["full_indptr"], record["full_indices"] = full[:2]
    if typed:
        record["test_edge_type"], record["full_edge_type"] = test[2], full[2]
    here = int(chunk[nodes[0]]) if nodes.numel() else -1
    for name in LINK_SPLITS:
        pos = split.positives(name)
        ids = (chunk[pos[1]] == here).nonzero().flatten()
        record[f"{name}_pairs"] = pos[:, ids].clone()
        record[f"{name}_pair_ids"] = ids
        if typed:
            record[f"{name}_pair_rel"] = split.positive_relations(name)[ids].clone()
    return record


def pair_count_matrix(targets, chunk: Tensor, num_chunks: int) -> list[list[int]]:
    """``[C][C]``: training pairs by (chunk of the destination, chunk of the source)."""
    pos = targets.split.train_pos
    flat = chunk[pos[1]] * num_chunks + chunk[pos[0]]
    counts = torch.bincount(flat, minlength=num_chunks * num_chunks)
    return counts.reshape(num_chunks, num_chunks).tolist()


@dataclass(frozen=True)
class GrappaPart:
    """A rank's part: the chunks it reads, what its partitions are built from; the same
    object in memory (a chunk store's files, :meth:`ChunkStore.part`) and from a partition
    directory (its chunk groups, :func:`~.directory.load_chunk_part`).

    Attributes:
        meta: ``num_chunks``, ``num_nodes`` and per chunk ``sizes`` and ``train_counts``.
        key: the chunking's content key (what a checkpoint's super-epoch ``t`` indexes):
            :func:`chunking_key`'s, whatever dtype holds the features.
        dtype: the dtype partitions hold the features in (the run's).
        out_dim: the head width of the chunks' target rows (the task's).
        home: the chunks this rank evaluates and predicts (``c mod W = rank``).
        read: ``read(chunk, names)``: those files of chunk ``chunk``'s record
            (:data:`CHUNK_FILES`), memory-mapped, ``x`` in the dtype it is stored in.
        sources: per chunk, the other chunks its halo lies in; ``None``: any other chunk.
        link: the chunks hold link prediction's record (:data:`LINK_CHUNK_FILES`).
        owners: ``() -> [N]`` every node's chunk (a partition directory's shared table);
            ``None``: read from every chunk's node list (:meth:`chunk_ids`).
        relations: a typed graph's relation names (its chunks hold ``edge_type``): link
            prediction's message relations (a directed split's inverses included); ``()``:
            homogeneous. Link prediction's pair relations (the graph's own) are
            ``meta["pair_relations"]``.
    """

    meta: dict
    key: str
    dtype: torch.dtype
    out_dim: int
    home: tuple[int, ...]
    read: Callable[[int, tuple[str, ...]], dict[str, Tensor]]
    sources: list[list[int]] | None = None
    link: bool = False
    owners: Callable[[], Tensor] | None = None
    relations: tuple[str, ...] = ()

    @property
    def num_chunks(self) -> int:
        return int(self.meta["num_chunks"])

    @property
    def typed(self) -> bool:
        """The chunks hold a typed graph (a relation per in-edge)."""
        return bool(self.relations)

    @property
    def num_relations(self) -> int:
        """``R`` (1 for a homogeneous graph)."""
        return len(self.relations) or 1

    @property
    def files(self) -> tuple[str, ...]:
        """The files of a chunk's record."""
        return chunk_files(self.link, self.typed)

    def load(self, chunk: int, stage: str = "train") -> dict[str, Tensor]:
        """Chunk ``chunk``'s record with its nodes' in-degrees ``deg`` (a partition casts the
        rows it copies to :attr:`dtype`). Link prediction: ``indptr``/``indices`` (and
        ``deg``) are those of ``stage``'s structure (``train``: training edges, ``test``:
        training + validation edges, ``full``: every edge)."""
        record = self.read(chunk, self.files)
        if self.link and stage != "train":
            record["indptr"], record["indices"] = (record[n] for n in STAGE_FILES[stage])
            if self.typed:
                record[TYPED_FILE] = record[STAGE_TYPED_FILES[stage]]
        record["deg"] = record["indptr"].diff()
        return record

    def index(self, chunk: int) -> dict[str, Tensor]:
        """Chunk ``chunk``'s ``nodes`` and ``deg`` only (no feature is read or cast)."""
        record = self.read(chunk, ("nodes", "indptr"))
        return {"nodes": record["nodes"], "deg": record["indptr"].diff()}

    def halo_sources(self, owned: tuple[int, ...]) -> list[int]:
        """The chunks that may hold the halo of the nodes of ``owned``."""
        if self.sources is None:
            return [c for c in range(self.num_chunks) if c not in owned]
        return sorted({s for c in owned for s in self.sources[c]} - set(owned))

    def chunk_table(self) -> Tensor:
        """``[N]`` chunk of every node: a directory's shared int32 table itself (no private
        copy), else :meth:`chunk_ids`."""
        return self.owners() if self.owners is not None else self.chunk_ids()

    def chunk_ids(self) -> Tensor:
        """int64 ``[N]`` chunk of every node (reads every chunk's node list: O(N) int64)."""
        if self.owners is not None:
            return self.owners().to(torch.int64)
        out = torch.empty(int(self.meta["num_nodes"]), dtype=torch.int64)
        for c in range(self.num_chunks):
            out[self.index(c)["nodes"]] = c
        return out


@dataclass(frozen=True)
class ChunkStore:
    """A written chunk store: its folder and the small replicated metadata.

    ``meta`` holds ``format``, ``num_chunks``, the whole graph's counts
    (:data:`~...graph.partition_dir.GRAPH_COUNTS`, the dataset's class count among them),
    ``name``, ``method``, and per chunk ``train_counts`` (the task's training seeds), ``sizes``
    (nodes) and ``digests`` (sha256 of the chunk file).
    """

    path: str
    meta: dict

    @property
    def num_chunks(self) -> int:
        return int(self.meta["num_chunks"])

    @property
    def key(self) -> str:
        return self.meta["chunking_key"]

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.meta["dtype"].removeprefix("torch."))

    def chunk_path(self, chunk: int) -> Path:
        return Path(self.path) / f"chunk_{chunk}.pt"

    def verify(self, chunk: int) -> None:
        """Check chunk ``chunk``'s file against its digest, once per process per file version.

        Raises :class:`ChunkStoreError` naming the file when it is missing or differs."""
        path = self.chunk_path(chunk)
        try:
            version = _version(path)
        except OSError as err:
            raise ChunkStoreError(self._fix(path, f"cannot be read ({err})")) from err
        if version in _VERIFIED:
            return
        found, expected = file_digest(path), self.meta["digests"][chunk]
        if found != expected:
            raise ChunkStoreError(
                self._fix(path, f"does not match its digest (sha256 {found}, expected {expected})")
            )
        _VERIFIED.add(version)

    def _fix(self, path: Path, problem: str) -> str:
        return (
            f"Grappa chunk file {path} {problem}. A rank cannot rebuild it (it has no graph): "
            "rerun the job, whose launching process checks the store and rewrites corrupt "
            f"chunk files, or delete {self.path} to rebuild the whole store"
        )

    def load(self, chunk: int, mmap: bool = True) -> dict:
        """Chunk ``chunk``'s record (file checked against its digest first); memory-mapped, so
        only the rows a caller reads are paged in."""
        self.verify(chunk)
        path = self.chunk_path(chunk)
        try:
            return torch.load(path, mmap=mmap, weights_only=True)
        except Exception as err:  # a file changed after its check, or torch cannot read it
            raise ChunkStoreError(self._fix(path, f"cannot be loaded ({err})")) from err

    def read(self, chunk: int, names: tuple[str, ...]) -> dict[str, Tensor]:
        """The files ``names`` of chunk ``chunk``'s record (:meth:`load`)."""
        record = self.load(chunk)
        return {name: record[name] for name in names}

    def part(self, home: tuple[int, ...], out_dim: int) -> GrappaPart:
        """The part of the rank whose home chunks are ``home``: every chunk, read from this
        store, features in its dtype; ``out_dim``: its target rows' head width (the task's)."""
        names = ("num_chunks", "num_nodes", "sizes", "train_counts", "pair_counts")
        names += ("pair_relations",)
        meta = {k: self.meta[k] for k in names if k in self.meta}
        link = self.meta.get("seeds") == "edges"
        relations = tuple(self.meta.get("relations", ()))
        return GrappaPart(
            meta, self.key, self.dtype, out_dim, home, self.read, link=link, relations=relations
        )


def features_digest(x: Tensor) -> str:
    """blake2b of the feature values, whatever dtype holds them: ``_DIGEST_ROWS`` rows at a
    time, each block's bytes as float32 where float32 holds its values exactly (any float32,
    float16 or bfloat16 block, and a float64 block upcast from one), else as float64. So the
    features of a float32 dataset digest the same held in float32 or in float64, at the cost
    of one pass over float32 bytes."""
    digest = hashlib.blake2b(digest_size=32)
    digest.update(f"features{tuple(x.shape)}".encode())
    for block in x.split(_DIGEST_ROWS):
        narrow = block.to(torch.float32)
        exact = block.dtype == torch.float32 or torch.allclose(
            narrow.to(block.dtype), block, rtol=0, atol=0, equal_nan=True
        )
        canonical = narrow if exact else block.to(torch.float64)
        digest.update(b"f" if exact else b"d")
        digest.update(canonical.contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def chunking_key(
    graph: Graph, targets: NodeTargets, num_chunks: int, method: str, seed: int
) -> dict:
    """What the chunks hold, whatever dtype: structure and the task's ``targets`` with their
    splits (``graph_fingerprint``, every byte), the features' values (:func:`features_digest`, every
    value; the fingerprint leaves them out), and the chunking's method, seed and count. A
    checkpoint's layout names it (with the run's dtype apart), so a run from a partition
    directory and the in-memory run agree. Halo settings are not in it: the chunks hold no
    halo (partitions build theirs when read)."""
    return {
        "kind": "grappa_chunks",
        "format": STORE_FORMAT,
        "graph": graph_fingerprint(graph, targets),
        "features": features_digest(graph.x),
        "num_chunks": num_chunks,
        "method": method,
        "seed": seed,
    }


def chunk_store_key(
    graph: Graph, targets: NodeTargets, num_chunks: int, method: str, seed: int
) -> dict:
    """Everything a chunk store's files depend on: :func:`chunking_key` and the dtype the
    features are stored in (the run's)."""
    key = chunking_key(graph, targets, num_chunks, method, seed)
    return {**key, "dtype": str(graph.x.dtype)}


def chunk_store_path(
    graph: Graph, targets: NodeTargets, num_chunks: int, method: str, seed: int, cache_dir
) -> Path:
    """The folder of the store for these inputs."""
    key = cache_key(chunk_store_key(graph, targets, num_chunks, method, seed))
    return Path(cache_dir) / f"grappa-chunks-{key[:24]}"


def _read_meta(folder: Path) -> dict | None:
    """The store's metadata, or ``None`` (with a message) if it is missing or unreadable."""
    path = folder / "meta.json"
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        print(f"[grappa] unreadable chunk store metadata {path} ({err}); rebuilding", flush=True)
        return None
    complete = (
        isinstance(meta, dict)
        and meta.get("format") == STORE_FORMAT
        and len(meta.get("digests") or ()) == meta.get("num_chunks")
    )
    if not complete:
        print(f"[grappa] chunk store metadata {path} has no chunk digests; rebuilding", flush=True)
        return None
    return meta


def _bad_chunks(folder: Path, meta: dict) -> list[int]:
    """Chunks whose file is missing or does not match its digest (each reported by path)."""
    bad = []
    for c, expected in enumerate(meta["digests"]):
        path = folder / f"chunk_{c}.pt"
        found = file_digest(path) if path.exists() else None
        if found != expected:
            problem = "is missing" if found is None else f"has sha256 {found}, not {expected}"
            print(f"[grappa] chunk file {path} {problem}; rebuilding it", flush=True)
            bad.append(c)
        else:
            _VERIFIED.add(_version(path))  # a rank in this process need not read it again
    return bad


def write_chunk_store(
    dataset: NodeDataset,
    targets: NodeTargets,
    task: NodeTask,
    num_chunks: int,
    method: str,
    seed: int,
    cache_dir: str,
) -> ChunkStore:
    """Chunk ``dataset``'s graph with ``task``'s ``targets`` (its rows of every node) and write
    the store under ``cache_dir`` (content-keyed, reused). ``train_counts`` counts the task's
    training seeds (``task.is_train_seed``); the metadata records the dataset's class count.

    An existing store is reused after every chunk file has been checked against its digest;
    a missing or corrupt file is rewritten (the chunking is a pure function of the key)."""
    graph, link = dataset.graph, is_link(task)
    key = chunking_key(graph, targets, num_chunks, method, seed)
    store_key = cache_key({**key, "dtype": str(graph.x.dtype)})
    folder = Path(cache_dir) / f"grappa-chunks-{store_key[:24]}"
    meta = _read_meta(folder)
    todo = list(range(num_chunks)) if meta is None else _bad_chunks(folder, meta)
    if not todo:
        return ChunkStore(str(folder), meta)
    # link prediction chunks the training structure (validation and test edges never shape
    # the chunks, metis's included)
    cut = task.stage_graph(graph, targets, "train") if link else graph
    chunk = chunk_assignment(cut, num_chunks, method, seed)
    sizes = torch.bincount(chunk, minlength=num_chunks).tolist()
    if link:  # training pairs by the chunk of their destination
        pairs = pair_count_matrix(targets, chunk, num_chunks)
        train_counts = [sum(row) for row in pairs]
    else:
        seeds = task.is_train_seed(targets)
        train_counts = torch.bincount(chunk[seeds], minlength=num_chunks).tolist()
    if meta is not None and (meta["sizes"], meta["train_counts"]) != (sizes, train_counts):
        todo = list(range(num_chunks))  # the chunking itself changed: no old file is kept
    folder.mkdir(parents=True, exist_ok=True)
    digests = []
    for c in range(num_chunks):
        nodes = (chunk == c).nonzero().flatten()
        if c not in todo:
            digests.append(meta["digests"][c])
            continue
        buffer = io.BytesIO()
        torch.save(chunk_payload(graph, targets, nodes, chunk), buffer)
        data = buffer.getbuffer()
        digests.append(hashlib.sha256(data).hexdigest())
        path = folder / f"chunk_{c}.pt"
        atomic_write(path, lambda f, d=data: f.write(d))
        _VERIFIED.add(_version(path))
        del data, buffer
    counts = (graph.num_nodes, graph.num_edges, graph.num_features, dataset.targets.out_dim)
    meta = {
        "format": STORE_FORMAT,
        "num_chunks": num_chunks,
        **dict(zip(GRAPH_COUNTS, counts, strict=True)),
        "name": graph.name,
        "train_counts": train_counts,
        "sizes": sizes,
        "method": method,
        "digests": digests,
        "chunking_key": cache_key(key),
        "dtype": str(graph.x.dtype),
        **({"seeds": "edges", "pair_counts": pairs} if link else {}),
        **({"relations": list(graph.relations)} if graph.is_typed and not link else {}),
        # link prediction: the message relations, and the pairs' (the graph's own)
        **(
            {"relations": list(targets.split.relations), "pair_relations": list(graph.relations)}
            if graph.is_typed and link
            else {}
        ),
    }
    atomic_write(folder / "meta.json", lambda f: f.write(json.dumps(meta).encode()))
    return ChunkStore(str(folder), meta)
