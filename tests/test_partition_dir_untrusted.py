"""A partition directory is untrusted input (issue 37, item 7): no entry may lead outside it,
no file is loaded before its ``.npy`` header is checked, and a resealed ``partition.json``
(its digest recomputed, as anyone can) whose counts would size huge allocations is refused
against the files' own shapes. Every refusal is a ``PartitionDirError`` naming the file, from
``prepare``: the check the launcher runs before it starts any rank; and a rank maps only the
files the launcher verified, refusing one changed since (review of issue 37)."""

import io
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from lightning_gnnscale.graph.partition_dir import (
    METADATA,
    PartitionDirError,
    file_digest,
    metadata_digest,
    part_folder,
    shared_folder,
)
from lightning_gnnscale.systems.grappa.directory import chunk_group
from tests.test_partition_dir import make_dm, write_dir


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """One small DistDGL directory (2 parts), copied by each test."""
    return write_dir(tmp_path_factory.mktemp("pristine"))


@pytest.fixture
def out(pristine, tmp_path) -> Path:
    copy = tmp_path / "parts"
    shutil.copytree(pristine, copy)
    return copy


def reseal(out: Path, edit) -> None:
    """Apply ``edit(meta)`` to ``partition.json`` and recompute its digest with the suite's own
    function, as a hostile writer can."""
    meta = json.loads((out / METADATA).read_text())
    edit(meta)
    meta["blake2b"] = metadata_digest(meta)
    (out / METADATA).write_text(json.dumps(meta))


def refused(out: Path, match: str) -> str:
    """The launcher's pre-spawn check refuses ``out``; returns the message."""
    with pytest.raises(PartitionDirError, match=match) as err:
        make_dm(out.parent / "cache", partition_dir=str(out)).prepare(2)
    message = str(err.value)
    assert "allow_pickle" not in message and "unsafe" not in message
    return message


def rename_entry(name: str):
    def edit(meta):
        files = meta["parts"][0]["files"]
        files[name] = files.pop("x.npy")

    return edit


# ------------------------------------------------------------------ entries out of the folder
@pytest.mark.parametrize("name", ["/etc/passwd", "../../x.npy", "sub/x.npy", "x.npy/.."])
def test_an_entry_name_that_is_not_a_plain_file_name_is_refused(out, name):
    reseal(out, rename_entry(name))
    message = refused(out, "lists the file .* not a plain file name")
    assert str(out / METADATA) in message and repr(name) in message


def test_a_symlink_out_of_the_directory_is_refused_even_to_the_very_same_file(out, tmp_path):
    """The target is a byte-identical copy, so size and digest match: only the place is wrong."""
    x = out / part_folder(0) / "x.npy"
    outside = tmp_path / "elsewhere.npy"
    shutil.copy(x, outside)
    x.unlink()
    x.symlink_to(outside)
    refused(out, f"part 0: {x} leads outside the partition directory")
    x.unlink()  # a symlink that stays inside is followed
    x.symlink_to(out / part_folder(0) / "y.npy")
    refused(out, f"part 0: {x} has .* bytes")


def test_a_part_folder_or_metadata_linked_from_elsewhere_is_refused(out, tmp_path):
    folder = out / part_folder(1)
    shutil.move(folder, tmp_path / "moved")
    folder.symlink_to(tmp_path / "moved")
    refused(out, f"part 1: {folder} leads outside")
    shutil.copy(out / METADATA, tmp_path / "meta.json")
    (out / METADATA).unlink()
    (out / METADATA).symlink_to(tmp_path / "meta.json")
    refused(out, f"the metadata: {out / METADATA} leads outside")


# ---------------------------------------------------------- counts that size an allocation
def trainer_sizes(size):
    def edit(meta):
        meta["trainer_sizes"] = [size, size]
        for part in meta["parts"]:
            part["trainer_seeds"] = size

    return edit


def node_counts(nodes: int):
    """Offsets, parts and ``num_nodes`` consistent with each other, not with the files."""

    def edit(meta):
        meta["node_offsets"] = [0, nodes, 2 * nodes]
        for part in meta["parts"]:
            part["nodes"] = nodes
        meta["num_nodes"] = 2 * nodes

    return edit


@pytest.mark.parametrize(
    "edit, match",
    [
        (
            lambda meta: meta.update(trainer_sizes=[1e12, 1e12]),
            r"'trainer_sizes' \[1000000000000.0, 1000000000000.0\] is not an even split",
        ),
        (
            trainer_sizes(10**12),
            r"'trainer_sizes' \[1000000000000, 1000000000000\] is not an even split",
        ),
        (trainer_sizes(150), r"trainer_seeds.npy has the shape \[45\], .* says \[150\]"),
        (lambda meta: meta.update(num_nodes=2 * 10**9), "'num_nodes' 2000000000 is not the parts'"),
        (
            node_counts(10**9),
            r"x.npy has the shape \[161, 10\], .* 'nodes' says \[1000000000, 10\]",
        ),
        (lambda meta: meta.update(num_features=10**9), r"x.npy .* 'num_features' says \[\*, 1000"),
        (lambda meta: meta.update(num_classes=10**9), r"'num_classes' 1000000000 is not in"),
        (lambda meta: meta.update(train_count=10**12), r"'train_count' 1000000000000 is not in"),
        (lambda meta: meta["parts"][0].update(halo=10**9), r"'nodes' \+ 'halo' says"),
        (lambda meta: meta.update(num_parts=True), "'num_parts' True is not a positive int"),
    ],
)
def test_resealed_counts_are_bounded_by_the_files(out, edit, match):
    reseal(out, edit)
    message = refused(out, match)
    assert str(out) in message


# ------------------------------------------------- a file changed between verifying and loading
def verified_in_the_launcher(out: Path):
    """``out`` opened and both parts verified, as the launcher does, then pickled as it travels
    to the ranks."""
    return pickle.loads(
        pickle.dumps(make_dm(out.parent / "cache", partition_dir=str(out)).prepare(2))
    )


def same_bytes_new_inode(x: Path) -> None:
    """``x`` replaced by a copy with the same bytes, size and mtime: only its inode differs."""
    status = x.stat()
    copy = x.with_name("copy.npy")
    shutil.copy(x, copy)
    os.utime(copy, ns=(status.st_atime_ns, status.st_mtime_ns))
    os.replace(copy, x)


def symlink_to_a_copy(x: Path) -> None:
    """``x`` replaced by a symlink, inside the directory, to a byte-identical copy."""
    copy = x.with_name("copy.npy")
    shutil.copy2(x, copy)
    x.unlink()
    x.symlink_to(copy)


def folder_moved_and_linked(x: Path) -> str:
    """``x``'s part folder moved aside (its inodes kept) and a symlink put in its place: the
    first file mapped is refused."""
    folder = x.parent
    folder.rename(folder.with_name("moved"))
    folder.symlink_to(folder.with_name("moved"))
    return rf"{folder}/\w+\.npy"


def fifo(x: Path) -> None:
    """``x`` replaced by a named pipe: opening one to read would wait for a writer forever."""
    x.unlink()
    os.mkfifo(x)


def truncated(x: Path) -> None:
    os.truncate(x, x.stat().st_size // 2)  # mapped, a touched page past the end would SIGBUS


@pytest.mark.parametrize(
    "swap", [same_bytes_new_inode, symlink_to_a_copy, folder_moved_and_linked, fifo, truncated]
)
def test_a_rank_refuses_a_file_changed_since_the_launcher_verified_it(out, swap):
    opened = verified_in_the_launcher(out)
    x = out / part_folder(0) / "x.npy"
    named = swap(x) or str(x)
    with pytest.raises(PartitionDirError, match=f"part 0: {named} changed since it was verified"):
        opened.load_part(0)
    assert opened.load_part(1)["x"].shape[0] == opened.meta["parts"][1]["nodes"]  # untouched


def test_a_file_written_while_it_is_verified_is_refused(out, monkeypatch):
    """A writer that touches a file while its digest is computed (so the digest read mixes
    two versions) is caught: the inode's mtime differs after the digest."""
    import lightning_gnnscale.graph.partition_dir as partition_dir

    x = out / part_folder(0) / "x.npy"
    digest = partition_dir.stream_digest

    def digest_while_written(file):
        found = digest(file)
        if os.fstat(file.fileno()).st_ino == x.stat().st_ino:
            os.utime(x, ns=(0, 0))
        return found

    monkeypatch.setattr(partition_dir, "stream_digest", digest_while_written)
    refused(out, f"part 0: {x} changed while it was verified")


# ---------------------------------------------------------------------- what a file holds
def replace_file(out: Path, data: bytes) -> Path:
    """Part 0's ``x.npy`` becomes ``data``, with its size and digest resealed."""
    x = out / part_folder(0) / "x.npy"
    x.write_bytes(data)

    def edit(meta):
        meta["parts"][0]["files"]["x.npy"] = {"bytes": len(data), "blake2b": file_digest(x)}

    reseal(out, edit)
    return x


def object_npy(tmp_path: Path) -> bytes:
    np.save(tmp_path / "objects.npy", np.array([{"run": "code"}], dtype=object), allow_pickle=True)
    return (tmp_path / "objects.npy").read_bytes()


def lying_header(_) -> bytes:
    """A valid header claiming ``[10^9, 10]`` float64 values, followed by 80 bytes of data."""
    header = io.BytesIO()
    fields = {"shape": (10**9, 10), "fortran_order": False, "descr": "<f8"}
    np.lib.format.write_array_header_1_0(header, fields)
    return header.getvalue() + bytes(80)


@pytest.mark.parametrize(
    "make, match",
    [
        (object_npy, r"holds object values, not plain numbers"),
        (lambda _: pickle.dumps({"run": "code"}), "is not a .npy array file"),
        (lambda _: b"root:x:0:0:root:/root:/bin/bash\n", "is not a .npy array file"),
        (lying_header, r"header says \[1000000000, 10\] float64 values, but the file has 80"),
    ],
)
def test_a_file_that_is_no_plain_npy_array_is_never_loaded(out, tmp_path, make, match):
    x = replace_file(out, make(tmp_path))
    refused(out, f"part 0: {x}('s)? {match}")


# ------------------------------------------------------------- a system's own counts: Grappa
def test_resealed_grappa_chunk_sizes_are_bounded_by_the_chunk_files(tmp_path):
    """Grappa sizes an ``[N]`` array from ``num_nodes`` (``chunk_ids``): grown by 10^9 along
    with the offsets, the part and one chunk's size, all consistent, the chunk's own files
    refuse it; grown without the chunk sizes, the chunk metadata does."""
    from tests.systems.grappa.test_partition_dir_grappa import make_dm as grappa_dm

    out = tmp_path / "parts"
    grappa_dm(tmp_path / "cache").write_partition_dir(out, 2, log=lambda *_: 0)
    pristine = (out / METADATA).read_text()

    def grow(meta, chunk_too=True):
        meta["num_nodes"] += 10**9
        meta["node_offsets"] = [
            meta["node_offsets"][0],
            *(o + 10**9 for o in meta["node_offsets"][1:]),
        ]
        meta["parts"][0]["nodes"] += 10**9  # part 0's home chunks: 0 and 2
        if chunk_too:
            meta["chunk_sizes"][0] += 10**9

    def prepare():
        grappa_dm(tmp_path / "cache", str(out)).prepare(2)

    reseal(out, grow)
    nodes = out / shared_folder(chunk_group(0)) / "nodes.npy"
    with pytest.raises(PartitionDirError, match=rf"{nodes} has the shape .* 'chunk_sizes'\[0\]"):
        prepare()
    (out / METADATA).write_text(pristine)
    reseal(out, lambda meta: grow(meta, chunk_too=False))
    with pytest.raises(PartitionDirError, match="'chunk_sizes'.* do not describe the chunks"):
        prepare()
