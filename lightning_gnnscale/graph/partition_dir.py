"""Partition directories: a graph partitioned once, on disk, one folder per part
(docs/partitioning.md).

Layout::

    <dir>/partition.json        metadata: format version, dataset identity and fingerprint,
                                system, method, parts, sizes per part, a digest per file
    <dir>/part-00000/<name>.npy one array per file, opened memory-mapped (copy-on-write)
    <dir>/part-00001/...
    <dir>/shared-<name>/<name>.npy  a group of files several parts use (a system's topology
                                held once per machine); each part lists the groups it needs

``partition.json`` is written last (atomically), so a directory without it is unfinished.
Part ``k`` owns the relabelled node ids ``[node_offsets[k], node_offsets[k+1])``, so the
partition book is the ``[P + 1]`` offsets in the metadata. A rank opens only its own part:
loading maps the files, and pages are read when touched.

Every check names the file or key that failed: :class:`PartitionDirError` (a ``ConfigError``,
raised before any rank starts when the launcher opens the directory). Nothing in a directory is
trusted: ``blake2b`` guards against damage, not against a hostile writer (anyone can reseal a
file), so every entry must resolve inside the directory, every ``.npy`` header is read and
checked before its data, and every count that sizes an allocation must agree with the files.
Each file is verified and later mapped through a descriptor opened beneath the directory with
no symlink followed, and a rank maps only the inode that was verified (:class:`VerifiedFile`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import Tensor

from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.files import atomic_write, file_digest, stream_digest
from lightning_gnnscale.graph.dataset_config import DatasetConfig, dataset_content

FORMAT = "lightning_gnnscale.partition_dir"
FORMAT_VERSION = 1
METADATA = "partition.json"
# dataset settings that say where a dataset is read from, not what it is
_NOT_IDENTITY = ("root", "cache_dir", "download")
# what a file of a part or shared group may be called: a plain name in its folder
FILE_NAME = re.compile(r"[A-Za-z0-9_]+\.npy")
# part files with one row per node the part owns (whichever system writes them)
NODE_ROW_FILES = (
    "x",
    "y",
    "train_mask",
    "val_mask",
    "test_mask",
    "orig_ids",
    "own_ids",
    "input_frequency",
)
# metadata counts of the whole graph
GRAPH_COUNTS = ("num_nodes", "num_edges", "num_features", "num_classes")
# a part file is opened read-only, never through a symlink, and a FIFO swapped in cannot block
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PartitionDirError(ConfigError):
    """A partition directory that does not fit the run, or a damaged one; names the file/key."""


def dataset_identity(config: DatasetConfig) -> dict:
    """What defines a dataset in the config: its name and the settings that change its content
    (not where it is read from), and the content digest of a source that has one. Compared
    without loading the dataset."""
    kept = {k: v for k, v in sorted(config.options.items()) if k not in _NOT_IDENTITY}
    identity = {"name": config.name, "options": kept}
    content = dataset_content(config.name, config.root)
    if content is not None:  # a folder of the user's data: what it holds, not its path
        identity["content"] = content
    return json.loads(json.dumps(identity, default=str))


def part_folder(k: int) -> str:
    return f"part-{k:05d}"


def shared_folder(name: str) -> str:
    return f"shared-{name}"


def _save_arrays(folder: Path, arrays: dict[str, Tensor]) -> dict:
    """Save ``arrays`` (name -> tensor) as ``folder/<name>.npy``; their ``{bytes, blake2b}``."""
    files = {}
    for name, tensor in arrays.items():
        path = folder / f"{name}.npy"
        array = tensor.detach().cpu().contiguous().numpy()
        atomic_write(path, lambda file, array=array: np.save(file, array, allow_pickle=False))
        files[f"{name}.npy"] = {"bytes": path.stat().st_size, "blake2b": file_digest(path)}
    return files


def is_count(value: Any) -> bool:
    """Whether a metadata value is a count: a non-negative int (not a bool, not a float)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def inside(root: Path, path: Path, what: str) -> Path:
    """``path`` if it resolves (symlinks followed) inside the resolved directory ``root``;
    else ``PartitionDirError`` naming it (nothing outside a directory is read)."""
    if not path.resolve().is_relative_to(root):
        raise PartitionDirError(
            f"{what}: {path} leads outside the partition directory {root} (an absolute "
            f"name, '..' or a symlink out of it); partition again"
        )
    return path


# ``.npy`` format version -> numpy's reader of that version's header (no data read)
NPY_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def npy_header(file: IO[bytes], path: Path, what: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data offset of the ``.npy`` file open as ``file`` (at its start; named
    ``path`` in errors) from its header alone (no data read). ``PartitionDirError`` naming the
    file unless it is a C-ordered array of plain numbers or booleans whose data fills the rest
    of the file exactly (a pickle is never loaded)."""
    try:
        version = np.lib.format.read_magic(file)
        read = NPY_HEADER_READERS.get(version)
        if read is None:
            raise ValueError(version)
        shape, fortran_order, dtype = read(file)
        offset = file.tell()
    except (ValueError, OSError, SyntaxError):
        raise PartitionDirError(
            f"{what}: {path} is not a .npy array file (its header cannot be read); partition again"
        ) from None
    if dtype.hasobject or dtype.kind not in "biuf" or not dtype.isnative:
        raise PartitionDirError(
            f"{what}: {path} holds {dtype} values, not plain numbers (a pickle or objects "
            f"are never loaded); partition again"
        )
    if fortran_order or any(size < 0 for size in shape):
        raise PartitionDirError(
            f"{what}: {path} has the header of no written array; partition again"
        )
    size = os.fstat(file.fileno()).st_size
    if offset + math.prod(shape) * dtype.itemsize != size:
        raise PartitionDirError(
            f"{what}: {path}'s header says {list(shape)} {dtype} values, but the file has "
            f"{size - offset} bytes of data; partition again"
        )
    return tuple(shape), dtype, offset


@dataclass(frozen=True)
class VerifiedFile:
    """A part or shared file as verified: what a rank maps, and the inode it must still be.

    Attributes:
        path: where it resolved to, relative to the resolved directory (no symlink in it).
        shape, dtype, offset: its ``.npy`` header's shape and dtype, and where its data starts.
        identity: ``(st_dev, st_ino, st_size, st_mtime_ns)`` of the inode whose bytes were
            checked against the digest.
    """

    path: Path
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int
    identity: tuple[int, int, int, int]


def _identity(status: os.stat_result) -> tuple[int, int, int, int]:
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


def _open_beneath(root: Path, relative: Path) -> IO[bytes]:
    """``root / relative`` (``relative``: a resolved path's part below ``root``, no ``..``)
    opened for reading one component at a time from ``root``, with no symlink followed
    (``OSError``, ``ELOOP``, for one swapped in since it was resolved): what is opened lies
    inside the directory."""
    *folders, name = relative.parts or (".",)
    folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in folders:
            inner = os.open(part, _FOLDER_FLAGS, dir_fd=folder)
            os.close(folder)
            folder = inner
        return os.fdopen(os.open(name, _FILE_FLAGS, dir_fd=folder), "rb")
    finally:
        os.close(folder)


def _verify_file(root: Path, path: Path, entry: dict, what: str) -> VerifiedFile:
    """The file ``path`` (resolved inside ``root``), read once through one descriptor: a
    regular file of its recorded size, a plain ``.npy`` header, its recorded digest, and the
    same inode, size and mtime after the digest as before it."""
    relative = inside(root, path, what).resolve().relative_to(root)
    try:
        file = _open_beneath(root, relative)
    except FileNotFoundError:
        raise PartitionDirError(f"{what}: file {path} is missing") from None
    except OSError as err:
        raise PartitionDirError(f"{what}: {path} cannot be opened ({err.strerror})") from None
    with file:
        before = os.fstat(file.fileno())
        if not stat.S_ISREG(before.st_mode):
            raise PartitionDirError(f"{what}: {path} is not a regular file; partition again")
        if before.st_size != entry["bytes"]:
            raise PartitionDirError(
                f"{what}: {path} has {before.st_size} bytes, {entry['bytes']} expected "
                f"(truncated or replaced); partition again"
            )
        shape, dtype, offset = npy_header(file, path, what)
        file.seek(0)
        if stream_digest(file) != entry["blake2b"]:
            raise PartitionDirError(
                f"{what}: {path} does not match its digest in {METADATA} "
                f"(corrupt or replaced); partition again"
            )
        if _identity(os.fstat(file.fileno())) != _identity(before):
            raise PartitionDirError(f"{what}: {path} changed while it was verified")
    return VerifiedFile(relative, shape, dtype, offset, _identity(before))


def _check_files(root: Path, folder: Path, files: dict, what: str) -> dict[str, VerifiedFile]:
    """Every file of ``files`` lies inside ``root``, exists in ``folder`` with its recorded
    size, a readable ``.npy`` header and its recorded digest (:func:`_verify_file`). Returns
    ``{stem: VerifiedFile}`` (the headers for the count checks, the inodes for the loads)."""
    inside(root, folder, what)
    return {
        name.removesuffix(".npy"): _verify_file(root, folder / name, entry, what)
        for name, entry in files.items()
    }


def _map_verified(root: Path, verified: VerifiedFile, path: Path, what: str) -> Tensor:
    """The verified file, memory-mapped copy-on-write from a descriptor opened beneath
    ``root`` with no symlink followed, once it is checked to be the inode that was verified
    (same device, inode, size and mtime); else ``PartitionDirError`` naming ``path``. The
    shape, dtype and offset are the verified header's, and the size is the verified one, so the
    map covers the data exactly (nothing is read here)."""
    changed = (
        f"{what}: {path} changed since it was verified (replaced, truncated, moved or "
        f"linked elsewhere); check who writes the directory, then run again"
    )
    try:
        file = _open_beneath(root, verified.path)
    except OSError:
        raise PartitionDirError(changed) from None
    with file:
        if _identity(os.fstat(file.fileno())) != verified.identity:
            raise PartitionDirError(changed)
        array = np.memmap(
            file,
            dtype=verified.dtype,
            shape=verified.shape,
            order="C",
            mode="c",
            offset=verified.offset,
        )
    return torch.from_numpy(array)


def metadata_digest(meta: dict) -> str:
    """blake2b of ``partition.json``'s content except its own ``blake2b`` key (canonical JSON):
    the ranks compute from the metadata (offsets, seeds per trainer), so it is sealed too."""
    body = json.dumps({k: v for k, v in meta.items() if k != "blake2b"}, sort_keys=True)
    return hashlib.blake2b(body.encode(), digest_size=32).hexdigest()


def _check_file_records(meta_path: Path, files: Any, what: str) -> None:
    """``files`` is ``{name: {bytes, blake2b}}`` with plain names (no path of any kind)."""
    if not isinstance(files, dict):
        raise PartitionDirError(f"{meta_path}: {what}'s 'files' is not a mapping")
    for name, entry in files.items():
        if not FILE_NAME.fullmatch(name):
            raise PartitionDirError(
                f"{meta_path}: {what} lists the file {name!r}, not a plain file name "
                f"(letters, digits and '_', then .npy; no folder, '..' or absolute path)"
            )
        if (
            not isinstance(entry, dict)
            or not is_count(entry.get("bytes"))
            or not isinstance(entry.get("blake2b"), str)
        ):
            raise PartitionDirError(
                f"{meta_path}: {what}'s record of {name} is not {{bytes, blake2b}}"
            )


def check_layout(meta: dict, meta_path: Path) -> None:
    """The structure and counts of ``partition.json`` agree with each other (metadata only:
    :meth:`PartitionDir.verify_parts` checks them against the files): parts and groups are
    records of plain file names, every count is a non-negative int, ``node_offsets`` start at
    0 and add up the parts' ``nodes``, ``num_nodes`` is their sum, and ``trainer_sizes`` are
    the parts' ``trainer_seeds``, an even split (sizes differ by at most 1) of at most
    ``num_nodes`` ids, so one part's file bounds them all."""
    num_parts, offsets, parts = meta["num_parts"], meta["node_offsets"], meta["parts"]
    if not is_count(num_parts) or num_parts < 1:
        raise PartitionDirError(f"{meta_path}: 'num_parts' {num_parts!r} is not a positive int")
    if not isinstance(parts, list) or not all(isinstance(part, dict) for part in parts):
        raise PartitionDirError(f"{meta_path}: 'parts' is not a list of records")
    if not isinstance(offsets, list) or not all(is_count(o) for o in offsets):
        raise PartitionDirError(f"{meta_path}: 'node_offsets' is not a list of counts")
    groups = meta.get("shared", {})
    if not isinstance(groups, dict) or not all(
        isinstance(name, str) and name.isidentifier() and isinstance(record, dict)
        for name, record in groups.items()
    ):
        raise PartitionDirError(f"{meta_path}: 'shared' is not a mapping of identifiers to records")
    for name, record in groups.items():
        _check_file_records(meta_path, record.get("files"), f"shared group {name!r}")
    for k, part in enumerate(parts):
        _check_file_records(meta_path, part.get("files"), f"part {k}")
        for key, value in part.items():
            if key not in ("files", "shared") and not is_count(value):
                raise PartitionDirError(f"{meta_path}: part {k}'s {key!r} {value!r} is not a count")
        needs = part.get("shared", [])
        if not isinstance(needs, list) or not all(isinstance(name, str) for name in needs):
            raise PartitionDirError(f"{meta_path}: part {k}'s 'shared' is not a list of names")
        if unknown := sorted(set(needs) - set(groups)):
            raise PartitionDirError(f"{meta_path}: part {k} needs shared groups {unknown}")
    counts = [b - a for a, b in zip(offsets, offsets[1:])]
    if (
        len(parts) != num_parts
        or len(offsets) != num_parts + 1
        or offsets[0] != 0
        or counts != [part.get("nodes", count) for part, count in zip(parts, counts)]
        or min(counts, default=0) < 0
    ):
        raise PartitionDirError(
            f"{meta_path}: 'node_offsets' {offsets} disagree with the parts' node counts"
        )
    for key in GRAPH_COUNTS:
        if key in meta and not is_count(meta[key]):
            raise PartitionDirError(f"{meta_path}: {key!r} {meta[key]!r} is not a count")
    num_nodes = meta.get("num_nodes", offsets[-1])
    if num_nodes != offsets[-1]:
        raise PartitionDirError(
            f"{meta_path}: 'num_nodes' {num_nodes} is not the parts' {offsets[-1]} nodes"
        )
    if not 1 <= meta.get("num_classes", 1) <= max(num_nodes, 1):
        raise PartitionDirError(
            f"{meta_path}: 'num_classes' {meta['num_classes']} is not in [1, num_nodes]"
        )
    if "train_count" in meta and not (
        is_count(meta["train_count"]) and meta["train_count"] <= num_nodes
    ):
        raise PartitionDirError(
            f"{meta_path}: 'train_count' {meta['train_count']!r} is not in [0, num_nodes]"
        )
    if "trainer_sizes" in meta:
        sizes = meta["trainer_sizes"]
        if (
            not isinstance(sizes, list)
            or len(sizes) != num_parts
            or not all(is_count(size) for size in sizes)
            or sizes != [part.get("trainer_seeds", size) for part, size in zip(parts, sizes)]
            or max(sizes) - min(sizes) > 1
            or sum(sizes) > num_nodes
        ):
            raise PartitionDirError(
                f"{meta_path}: 'trainer_sizes' {sizes} is not an even split of at most "
                f"'num_nodes' {num_nodes} training ids, one count per part (its "
                f"'trainer_seeds')"
            )


def check_writable(out: str | os.PathLike) -> Path:
    """``out`` as a Path if it is new or an empty folder; else ``PartitionDirError`` (a folder
    is never overwritten, and a left-over one from an interrupted write says so)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        unfinished = out.is_dir() and not (out / METADATA).exists()
        raise PartitionDirError(
            f"out={out} exists and is not an empty folder"
            + (f" (no {METADATA}: an unfinished write; remove it)" if unfinished else "")
            + "; choose a new one"
        )
    return out


class PartitionDirWriter:
    """Writes a partition directory part by part, then its metadata.

    Args:
        out: the directory; it must not exist or be empty (never overwritten).
    """

    def __init__(self, out: str | os.PathLike):
        self.out = check_writable(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.parts: dict[int, dict] = {}
        self.shared: dict[str, dict] = {}

    def write_part(
        self,
        k: int,
        arrays: dict[str, Tensor],
        sizes: dict[str, int],
        shared: Iterable[str] = (),
    ) -> dict:
        """Save ``arrays`` (name -> tensor) as ``part-<k>/<name>.npy``; ``sizes`` (nodes,
        halo, edges...) go into the metadata, with the ``shared`` groups the part needs
        (written with :meth:`write_shared`). Returns the part's record."""
        folder = self.out / part_folder(k)
        folder.mkdir()
        record = {**sizes, "files": _save_arrays(folder, arrays)}
        if shared := sorted(shared):
            record["shared"] = shared
        self.parts[k] = record
        return record

    def write_shared(self, name: str, arrays: dict[str, Tensor]) -> dict:
        """Save a group of files several parts use as ``shared-<name>/<file>.npy`` (a node
        holds it once, whichever of its ranks need it). Returns the group's record."""
        if not name.isidentifier() or name in self.shared:
            raise ValueError(f"shared group {name!r}: a new identifier is needed")
        folder = self.out / shared_folder(name)
        folder.mkdir()
        self.shared[name] = {"files": _save_arrays(folder, arrays)}
        return self.shared[name]

    def finish(self, metadata: dict) -> dict:
        """Write ``partition.json`` (``metadata`` plus format, version and the part records)."""
        num_parts = metadata["num_parts"]
        missing = sorted(set(range(num_parts)) - set(self.parts))
        if missing:
            raise ValueError(f"parts {missing} were not written")
        needed = {name for record in self.parts.values() for name in record.get("shared", ())}
        if unwritten := sorted(needed - set(self.shared)):
            raise ValueError(f"shared groups {unwritten} are needed but were not written")
        if unlisted := sorted(set(self.shared) - needed):
            raise ValueError(f"shared groups {unlisted} were written but no part lists them")
        full = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            **metadata,
            "parts": [self.parts[k] for k in range(num_parts)],
        }
        if self.shared:
            full["shared"] = self.shared
        full["blake2b"] = metadata_digest(full)
        text = json.dumps(full, indent=1, sort_keys=True)
        atomic_write(self.out / METADATA, lambda file: file.write(text.encode()))
        return full


@dataclass
class PartitionDir:
    """An opened partition directory (its metadata; no part loaded). Small and picklable:
    the launcher opens and checks it, the ranks receive it and load their part.

    Attributes:
        path: the directory.
        meta: the content of ``partition.json``.
        verified: parts (and shared groups, by name) whose files were checked against their
            digests in this process tree.
        verified_files: ``{folder: {stem: VerifiedFile}}``: each verified file's ``.npy``
            header (what the count checks compare the metadata with) and inode (what a rank
            maps, refusing a file changed since; on this machine only).
    """

    path: Path
    meta: dict
    verified: set[int | str] = field(default_factory=set)
    verified_files: dict[str, dict[str, VerifiedFile]] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str | os.PathLike) -> PartitionDir:
        """Read and check ``partition.json``: inside the directory, its format, version and
        digest, and its structure and counts (:func:`check_layout`)."""
        path = Path(path)
        meta_path = path / METADATA
        if not path.is_dir():
            raise PartitionDirError(f"data.partition_dir={path} is not a folder")
        inside(path.resolve(), meta_path, "the metadata")
        if not meta_path.is_file():
            raise PartitionDirError(
                f"{meta_path} is missing: data.partition_dir={path} is not a partition "
                f"directory, or its writing did not finish (python -m lightning_gnnscale.partition)"
            )
        try:
            meta = json.loads(meta_path.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            raise PartitionDirError(f"{meta_path} is not valid JSON ({err})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise PartitionDirError(f"{meta_path}: 'format' is not {FORMAT!r}")
        version = meta.get("version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise PartitionDirError(
                f"{meta_path}: 'version' {version!r} is newer than this code reads "
                f"({FORMAT_VERSION}); update lightning_gnnscale or partition again"
            )
        if version < FORMAT_VERSION:
            raise PartitionDirError(
                f"{meta_path}: 'version' {version} is older than this code reads "
                f"({FORMAT_VERSION}); partition again"
            )
        if meta.get("blake2b") != metadata_digest(meta):
            raise PartitionDirError(
                f"{meta_path}: its content does not match its 'blake2b' (edited or corrupt); "
                f"partition again"
            )
        for key in ("system", "num_parts", "node_offsets", "parts", "dataset"):
            if key not in meta:
                raise PartitionDirError(f"{meta_path}: key {key!r} is missing")
        check_layout(meta, meta_path)
        return cls(path, meta)

    @property
    def num_parts(self) -> int:
        return int(self.meta["num_parts"])

    @property
    def node_offsets(self) -> Tensor:
        return torch.tensor(self.meta["node_offsets"], dtype=torch.int64)

    @property
    def digest(self) -> str:
        """One digest of every part file's digest (the same on every rank of a run)."""
        digest = hashlib.blake2b(self.meta["blake2b"].encode(), digest_size=16)
        records = [*self.meta["parts"], *self.meta.get("shared", {}).values()]
        for record in records:
            for name, entry in sorted(record["files"].items()):
                digest.update(f"{name}:{entry['blake2b']};".encode())
        return digest.hexdigest()

    def check(self, expected: dict[str, Any]) -> None:
        """Each ``key: value`` of ``expected`` must equal the metadata's (``None`` values are
        not checked); the error names the key, both values and the file."""
        for key, want in expected.items():
            if want is None:
                continue
            have = self.meta.get(key)
            if have != want:
                hint = {
                    "num_parts": "partition for this world size (trainer.devices x "
                    "trainer.num_nodes)",
                    "dataset": "partition this dataset",
                    "system": "partition with this strategy",
                }.get(key, "partition with these settings")
                raise PartitionDirError(
                    f"{self.path / METADATA}: {key!r} is {have!r} but this run has {want!r}; "
                    f"{hint}: python -m lightning_gnnscale.partition <overrides> out=<dir>"
                )

    @property
    def root(self) -> Path:
        """The directory, symlinks resolved: every file read lies inside it."""
        return self.path.resolve()

    def shape(self, folder: str, name: str) -> tuple[int, ...] | None:
        """The shape of a verified file ``folder/<name>.npy`` (``None``: not verified or not
        there)."""
        found = self.verified_files.get(folder, {}).get(name)
        return None if found is None else found.shape

    def verify_parts(self, parts: Iterable[int]) -> None:
        """Every file of ``parts``, and of the shared groups they need, lies inside the
        directory and exists with its recorded size, a plain ``.npy`` header and its recorded
        digest (reads them once); then the metadata's counts are checked against the files'
        shapes (:meth:`check_counts`), before anything is allocated from them."""
        for k in parts:
            if k in self.verified:
                continue
            if not 0 <= k < self.num_parts:
                raise PartitionDirError(
                    f"{self.path / METADATA}: rank {k} needs part {k}, but there are "
                    f"{self.num_parts} parts"
                )
            folder = self.path / part_folder(k)
            if not folder.is_dir():
                raise PartitionDirError(
                    f"part {k} is missing: {folder} (each node needs the parts of its ranks)"
                )
            record = self.meta["parts"][k]
            self.verified_files[folder.name] = _check_files(
                self.root, folder, record["files"], f"part {k}"
            )
            for name in record.get("shared", ()):
                self._verify_shared(name, k)
            self.check_counts(k)
            self.verified.add(k)

    def _verify_shared(self, name: str, k: int) -> None:
        if name in self.verified:
            return
        folder = self.path / shared_folder(name)
        if not folder.is_dir():
            raise PartitionDirError(
                f"shared group {name!r} is missing: {folder} (part {k} needs it; each node "
                "needs the shared groups of its ranks' parts)"
            )
        files = self.meta["shared"][name]["files"]
        self.verified_files[folder.name] = _check_files(
            self.root, folder, files, f"shared group {name!r}"
        )
        self.verified.add(name)

    def expect_shape(self, folder: str, name: str, want: tuple[int | None, ...], key: str) -> None:
        """File ``folder/<name>.npy``, if verified, has the shape ``want`` (``None``: any size
        on that axis), which the metadata's ``key`` implies; else ``PartitionDirError`` naming
        both."""
        have = self.shape(folder, name)
        if have is None:
            return
        if len(have) != len(want) or any(w is not None and h != w for h, w in zip(have, want)):
            shown = "[" + ", ".join("*" if w is None else str(w) for w in want) + "]"
            raise PartitionDirError(
                f"{self.path / folder / (name + '.npy')} has the shape {list(have)}, but "
                f"{self.path / METADATA}'s {key} says {shown}; partition again"
            )

    def check_counts(self, k: int) -> None:
        """Part ``k``'s counts (and the graph's feature width) agree with its verified files:
        its node-row files have ``nodes`` rows, ``indptr`` ``nodes + 1``, ``indices`` its
        ``edges``, ``local2global`` and ``degree`` its core and halo, ``trainer_seeds`` its
        count; every ``x`` (its groups' too) is ``[*, num_features]`` of ``feature_dtype``.
        A system checks its own keys on top (``GNNDataModule.check_partition_part``)."""
        meta, record = self.meta, self.meta["parts"][k]
        folder = part_folder(k)
        nodes = record.get("nodes")
        if nodes is not None:
            for name in NODE_ROW_FILES:
                have = self.shape(folder, name)
                if have is not None:
                    self.expect_shape(folder, name, (nodes, *have[1:]), f"part {k}'s 'nodes'")
            self.expect_shape(folder, "indptr", (nodes + 1,), f"part {k}'s 'nodes'")
        if "edges" in record:
            self.expect_shape(folder, "indices", (record["edges"],), f"part {k}'s 'edges'")
        if nodes is not None and "halo" in record:
            for name in ("local2global", "degree"):
                core_halo = (nodes + record["halo"],)
                self.expect_shape(folder, name, core_halo, f"part {k}'s 'nodes' + 'halo'")
        if "trainer_seeds" in record:
            for name in ("trainer_seeds", "trainer_seed_degree"):
                seeds = (record["trainer_seeds"],)
                self.expect_shape(folder, name, seeds, f"part {k}'s 'trainer_seeds'")
        folders = [folder, *(shared_folder(name) for name in record.get("shared", ()))]
        for where in folders:
            if "num_features" in meta:
                self.expect_shape(where, "x", (None, meta["num_features"]), "'num_features'")
            found = self.verified_files.get(where, {}).get("x")
            if found is not None and str(found.dtype) != meta.get(
                "feature_dtype", str(found.dtype)
            ):
                raise PartitionDirError(
                    f"{self.path / where / 'x.npy'} holds {found.dtype} values, but "
                    f"{self.path / METADATA}'s 'feature_dtype' says {meta['feature_dtype']}; "
                    f"partition again"
                )

    def load_part(self, k: int) -> dict[str, Tensor]:
        """Part ``k``'s arrays (name -> tensor), memory-mapped copy-on-write: nothing is read
        until used, and writes stay private to this process. Verifies the part first unless
        this process (or the launcher it came from) already did."""
        self.verify_parts([k])
        return self._map(part_folder(k), self.meta["parts"][k]["files"], f"part {k}")

    def load_shared(
        self, name: str, k: int, arrays: Iterable[str] | None = None
    ) -> dict[str, Tensor]:
        """Shared group ``name``'s arrays (or only those named in ``arrays``) as part ``k``
        (which must list it) uses them, memory-mapped like :meth:`load_part`: the ranks of a
        node map the same file, so its pages are held once per machine."""
        if name not in self.meta["parts"][k].get("shared", ()):
            raise PartitionDirError(
                f"{self.path / METADATA}: part {k} does not list shared group {name!r}"
            )
        self.verify_parts([k])
        files = self.meta["shared"][name]["files"]
        if arrays is not None:
            files = {f"{a}.npy": files[f"{a}.npy"] for a in arrays}
        return self._map(shared_folder(name), files, f"shared group {name!r}")

    def _map(self, folder: str, files: dict, what: str) -> dict[str, Tensor]:
        """The verified files ``files`` of ``folder`` (name -> tensor), each mapped only if it
        is still the inode that was verified (:func:`_map_verified`)."""
        root, verified = self.root, self.verified_files[folder]
        arrays = {}
        for name in files:
            stem = name.removesuffix(".npy")
            arrays[stem] = _map_verified(root, verified[stem], self.path / folder / name, what)
        return arrays


def node_ranks(world_size: int, devices: int | None = None) -> list[int]:
    """The global ranks whose parts this process needs. A process that is one rank: its own
    (``RANK`` under torchrun, ``SLURM_PROCID`` under a multi-task srun, else ``NODE_RANK x
    devices + LOCAL_RANK`` for a manual launch, as Lightning counts). A launcher: the ranks of
    node ``$NODE_RANK`` (default 0), ``devices`` per node (default: all)."""
    env = os.environ
    devices = devices or world_size
    node = int(env.get("NODE_RANK", env.get("GROUP_RANK", "0")))
    if "RANK" in env and "LOCAL_RANK" in env:
        return [int(env["RANK"])]
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        return [int(env["SLURM_PROCID"])]
    if "LOCAL_RANK" in env:
        return [node * devices + int(env["LOCAL_RANK"])]
    return list(range(node * devices, min(world_size, (node + 1) * devices)))


def summary_line(meta: dict, seconds: float) -> str:
    """One line per part and per shared group, and a total: nodes, halo, edges, bytes; and the
    time taken."""
    lines = []
    total = 0
    for k, record in enumerate(meta["parts"]):
        size = sum(entry["bytes"] for entry in record["files"].values())
        total += size
        extra = ", ".join(
            f"{key} {value:,}" if isinstance(value, int) else f"{key} {value}"
            for key, value in record.items()
            if key != "files"
        )
        lines.append(f"  part {k}: {extra}, {size / 2**20:,.1f} MiB")
    for name, record in meta.get("shared", {}).items():
        size = sum(entry["bytes"] for entry in record["files"].values())
        total += size
        lines.append(f"  shared {name}: {size / 2**20:,.1f} MiB")
    lines.append(
        f"  {meta['num_parts']} parts, {total / 2**20:,.1f} MiB in all, {seconds:.1f} s "
        f"({time.strftime('%Y-%m-%d %H:%M:%S')})"
    )
    return "\n".join(lines)
