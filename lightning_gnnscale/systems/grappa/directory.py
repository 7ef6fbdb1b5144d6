"""Grappa's partition directory (docs/systems/grappa.md, "From a partition directory").

Grappa's unit of storage is the chunk, and its partitions change every super-epoch: partition
``p`` (rank ``p mod W``) owns base chunk ``p`` and a variable chunk that the pinned sweep moves
over every other chunk, and it reads its halo rows from the other chunks' files. So each chunk
is one shared group ``chunk<c>`` (the chunk store's record, as ``.npy``), and part ``k`` lists
the chunks rank ``k`` reads over a whole schedule cycle: its partitions' owned chunks and the
chunks holding their halo, plus its home chunks (``c mod W = k``, evaluated and predicted by
``k``) and their halo's. Under the pinned sweep and the tournament that is every chunk; a rank
maps a chunk only while it builds a partition from it (the partition is a copy).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from ...graph.node_targets import NodeTargets
from ...graph.partition_dir import (
    METADATA,
    PartitionDir,
    PartitionDirError,
    is_count,
    part_folder,
    shared_folder,
)
from ...tasks.link.split import message_relations
from .chunking import LINK_SPLITS, STAGE_FILES, STAGE_TYPED_FILES, GrappaPart
from .config import GrappaConfig
from .schedule import Schedule

# chunk files with one row per node of the chunk (link prediction's: nodes and features)
CHUNK_ROW_FILES = ("nodes", "x", *NodeTargets.array_names())
LINK_ROW_FILES = ("nodes", "x")
NODE_CHUNKS = "grappa_node_chunks"  # the shared group of every node's chunk (link prediction)


def chunk_group(chunk: int) -> str:
    """The shared group of chunk ``chunk``."""
    return f"chunk{chunk:05d}"


def home_chunks(rank: int, world_size: int, num_chunks: int) -> tuple[int, ...]:
    """The chunks rank ``rank`` evaluates and predicts (and serves under Grappa-50S): ``c mod
    W = rank``, the base chunks of its pinned-sweep partitions."""
    return tuple(range(rank, num_chunks, world_size))


def chunk_sources(part: GrappaPart) -> list[list[int]]:
    """Per chunk, the other chunks its nodes' in-neighbours lie in (where its halo is), from
    a part that reads every chunk."""
    owner = part.chunk_ids()
    # link prediction: every edge (predictions' structure) holds the training and test
    # stages' ones, so its halo is the largest
    name = "full_indices" if part.link else "indices"
    return [
        [s for s in torch.unique(owner[part.read(c, (name,))[name]]).tolist() if s != c]
        for c in range(part.num_chunks)
    ]


def rank_chunks(
    cfg: GrappaConfig, schedule: Schedule, sources: list[list[int]], rank: int, world_size: int
) -> list[int]:
    """The chunks rank ``rank`` reads in a run: the owned chunks of its partitions over one
    schedule cycle (the rounds repeat after it; ``fixed`` has one) and its home chunks, each
    with the chunks of its halo; every chunk under Grappa-50S (its owners' degrees)."""
    if cfg.remote_sample_frac > 0:
        return list(range(schedule.num_chunks))
    home = home_chunks(rank, world_size, schedule.num_chunks)
    owned = set(home)
    for p in range(rank, schedule.num_partitions, world_size):
        for t in range(1 if schedule.kind == "fixed" else schedule.cycle):
            owned.update(schedule.partition(p, t).owned_chunks)
    needed = set(owned)
    for c in owned if cfg.halo_hops else home:
        needed.update(sources[c])
    return sorted(needed)


def write_chunk_parts(
    cfg: GrappaConfig, parts: tuple[GrappaPart, ...], seed: int, writer, log
) -> dict:
    """Write every chunk as a shared group and every rank's part of ``parts`` (in memory, each
    reads every chunk): its home chunks and the groups it reads; returns the metadata the
    ranks share."""
    first, world_size = parts[0], len(parts)
    schedule = Schedule(cfg.schedule, first.num_chunks, cfg.sweep_order, seed)
    for c in range(first.num_chunks):
        writer.write_shared(chunk_group(c), first.read(c, first.files))
        log(f"[partition] chunk {c + 1}/{first.num_chunks} written")
    if first.link:  # evaluation finds the owner of any endpoint (int32 per node)
        writer.write_shared(NODE_CHUNKS, {"chunk": first.chunk_ids().to(torch.int32)})
    sources = chunk_sources(first)
    sizes = first.meta["sizes"]
    home_sizes = []
    for k, part in enumerate(parts):
        needed = rank_chunks(cfg, schedule, sources, k, world_size)
        home_sizes.append(sum(sizes[c] for c in part.home))
        writer.write_part(
            k,
            {"home_chunks": torch.tensor(part.home, dtype=torch.int64)},
            {"nodes": home_sizes[-1], "chunks": len(needed)},
            shared=[chunk_group(c) for c in needed] + ([NODE_CHUNKS] if first.link else []),
        )
        log(f"[partition] part {k + 1}/{world_size} written (reads {len(needed)} chunks)")
    offsets = torch.tensor([0, *home_sizes]).cumsum(0)
    return {
        "node_offsets": offsets.tolist(),
        "chunking_key": first.key,
        "num_chunks": first.num_chunks,
        "chunk_sizes": sizes,
        "train_counts": first.meta["train_counts"],
        "chunk_sources": sources,
        **({"pair_counts": first.meta["pair_counts"]} if first.link else {}),
        **({"relations": list(first.relations)} if first.typed else {}),
        **(
            {"pair_relations": list(first.meta["pair_relations"])}
            if first.typed and first.link
            else {}
        ),
    }


def check_chunk_counts(opened: PartitionDir, part: int, link: bool = False) -> None:
    """The chunk metadata a rank allocates from agrees with itself and with the verified files
    of part ``part``: one ``chunk_sizes``, ``train_counts`` (at most the size) and
    ``chunk_sources`` (chunk ids) entry per chunk, sizes adding up to ``num_nodes``, the part's
    (``link``: ``train_counts`` count training pairs, any number, and ``pair_counts`` is their
    ``[C][C]`` table by chunk, summing by row to them), the part's
    ``nodes`` the sizes of its home chunks, and each verified chunk group's row files one row
    per node of its size (``indptr`` one more). ``PartitionDirError`` naming the key."""
    meta, where = opened.meta, opened.path / METADATA
    num_chunks = meta.get("num_chunks")
    sizes, train, sources = (
        meta.get("chunk_sizes"),
        meta.get("train_counts"),
        meta.get("chunk_sources"),
    )
    lists = all(isinstance(value, list) for value in (sizes, train, sources))
    if not (
        is_count(num_chunks)
        and lists
        and len(sizes) == len(train) == len(sources) == num_chunks
        and all(is_count(size) for size in sizes)
        and all(is_count(t) and (link or t <= size) for t, size in zip(train, sizes))
        and (not link or _pair_counts_fit(meta.get("pair_counts"), train))
        and all(
            isinstance(chunks, list) and all(is_count(c) and c < num_chunks for c in chunks)
            for chunks in sources
        )
        and sum(sizes) == meta.get("num_nodes")
    ):
        raise PartitionDirError(
            f"{where}: 'num_chunks', 'chunk_sizes', 'train_counts' and 'chunk_sources' do not "
            "describe the chunks (one entry each per chunk, training nodes at most the chunk's "
            "nodes, sources among the chunks, sizes adding up to 'num_nodes'); partition again"
        )
    home = home_chunks(part, opened.num_parts, num_chunks)
    if meta["parts"][part].get("nodes") != sum(sizes[c] for c in home):
        raise PartitionDirError(
            f"{where}: part {part}'s 'nodes' is not the size of its home chunks {list(home)}"
        )
    opened.expect_shape(part_folder(part), "home_chunks", (len(home),), "'num_chunks'")
    for c, size in enumerate(sizes):
        folder, key = shared_folder(chunk_group(c)), f"'chunk_sizes'[{c}]"
        for name in LINK_ROW_FILES if link else CHUNK_ROW_FILES:
            if (have := opened.shape(folder, name)) is not None:
                opened.expect_shape(folder, name, (size, *have[1:]), key)
        opened.expect_shape(folder, "indptr", (size + 1,), key)
        if "relations" in meta:  # each stage's relations beside its in-edges
            stages = STAGE_FILES if link else {"train": STAGE_FILES["train"]}
            for stage, (_, indices) in stages.items():
                if (have := opened.shape(folder, indices)) is not None:
                    where = f"'relations' (chunk {c}'s {indices})"
                    opened.expect_shape(folder, STAGE_TYPED_FILES[stage], have, where)
        if link and "relations" in meta:
            for split in LINK_SPLITS:
                if (have := opened.shape(folder, f"{split}_pair_ids")) is not None:
                    where = f"'pair_relations' ({split}_pair_ids)"
                    opened.expect_shape(folder, f"{split}_pair_rel", have, where)
        if link:
            opened.expect_shape(folder, "test_indptr", (size + 1,), key)
            opened.expect_shape(folder, "full_indptr", (size + 1,), key)
            for split in ("train", "val", "test"):
                if (have := opened.shape(folder, f"{split}_pair_ids")) is not None:
                    pairs = (2, *have)
                    opened.expect_shape(folder, f"{split}_pairs", pairs, f"{split}_pair_ids")
    if link:
        opened.expect_shape(
            shared_folder(NODE_CHUNKS), "chunk", (meta["num_nodes"],), "'num_nodes'"
        )


def _pair_counts_fit(counts, train: list) -> bool:
    """``counts`` is a ``[C][C]`` table of counts whose rows sum to ``train``."""
    return (
        isinstance(counts, list)
        and len(counts) == len(train)
        and all(
            isinstance(row, list) and len(row) == len(train) and all(is_count(n) for n in row)
            for row in counts
        )
        and [sum(row) for row in counts] == train
    )


def load_chunk_part(
    opened: PartitionDir, part: int, out_dim: int, dtype: torch.dtype, link: bool = False
) -> GrappaPart:
    """Part ``part`` of a partition directory: its chunk groups, each memory-mapped when read
    (:meth:`~...graph.partition_dir.PartitionDir.load_shared`; a chunk the part does not list
    cannot be read, ``PartitionDirError``), features in the directory's dtype (a partition
    casts the rows it copies to ``dtype``, the run's), ``out_dim`` its target rows' head width
    (the task's, from the metadata), its ``home_chunks.npy`` checked against
    :func:`home_chunks`. A directory without ``chunking_key`` (older) is refused."""
    meta = opened.meta
    key = meta.get("chunking_key")
    if key is None:
        raise PartitionDirError(
            f"{opened.path}: no 'chunking_key' (written by an older version, format version "
            f"{meta.get('version')}); partition again"
        )
    stored = opened.load_part(part)["home_chunks"].tolist()
    want = list(home_chunks(part, opened.num_parts, meta["num_chunks"]))
    if stored != want:
        raise PartitionDirError(
            f"{opened.path}: part {part}'s home_chunks.npy is {stored}, but rank {part} of "
            f"{opened.num_parts} evaluates chunks {want}; partition again"
        )
    counts = {"pair_counts": meta["pair_counts"]} if link else {}
    owners = partial(_node_chunks, opened, part) if link else None
    relations = directory_relations(opened, link)
    pair_relations = directory_pair_relations(opened, link)
    if pair_relations:
        counts["pair_relations"] = list(pair_relations)
    return GrappaPart(
        {
            "num_chunks": meta["num_chunks"],
            "num_nodes": meta["num_nodes"],
            "sizes": meta["chunk_sizes"],
            "train_counts": meta["train_counts"],
            **counts,
        },
        key,
        dtype,
        out_dim,
        tuple(stored),
        partial(_read_group, opened, part, len(relations), len(pair_relations)),
        meta["chunk_sources"],
        link=link,
        owners=owners,
        relations=relations,
    )


def _names(value) -> bool:
    """``value`` is a list of distinct strings."""
    return (
        isinstance(value, list)
        and all(isinstance(r, str) for r in value)
        and len(set(value)) == len(value)
    )


def directory_relations(opened: PartitionDir, link: bool = False) -> tuple[str, ...]:
    """A directory's relation names (``()``: homogeneous; link prediction's: the message
    relations), checked as outside input: a list of distinct names and, for link prediction,
    the pairs' relations (:func:`directory_pair_relations`), then (a directed split) their
    inverses; else ``PartitionDirError``."""
    relations = opened.meta.get("relations", [])
    fits = _names(relations)
    if fits and link:
        pair = list(directory_pair_relations(opened, link))
        fits = (not relations and not pair) or any(
            relations == list(message_relations(tuple(pair), undirected))
            for undirected in (True, False)
        )
    elif fits:
        fits = "pair_relations" not in opened.meta
    if not fits:
        raise PartitionDirError(
            f"{opened.path / METADATA}: 'relations' must list a typed graph's distinct relation "
            "names (link prediction: 'pair_relations', the pairs' relations, then for a "
            f"directed split each one's '_inverse'), got {relations!r}; partition again"
        )
    return tuple(relations)


def directory_pair_relations(opened: PartitionDir, link: bool) -> tuple[str, ...]:
    """A link-prediction directory's pair relations (the typed graph's own; ``()``: none),
    checked as outside input (distinct names); else ``PartitionDirError``."""
    pair = opened.meta.get("pair_relations", [])
    if not _names(pair) or (pair and not link):
        raise PartitionDirError(
            f"{opened.path / METADATA}: 'pair_relations' must list a typed graph's distinct "
            f"relation names (link prediction only), got {pair!r}; partition again"
        )
    return tuple(pair)


def _node_chunks(opened: PartitionDir, part: int) -> Tensor:
    return opened.load_shared(NODE_CHUNKS, part, ("chunk",))["chunk"]


def _read_group(
    opened: PartitionDir,
    part: int,
    num_relations: int,
    num_pair_relations: int,
    chunk: int,
    names: tuple[str, ...],
) -> dict[str, Tensor]:
    """Chunk ``chunk``'s files ``names``; its relations checked (``num_relations`` message
    relations, the full structure's and the pairs' among the ``num_pair_relations`` of a
    typed link-prediction directory)."""
    record = opened.load_shared(chunk_group(chunk), part, names)
    folder = opened.path / shared_folder(chunk_group(chunk))
    for stage, name in STAGE_TYPED_FILES.items():
        if name in names:
            limit = num_pair_relations if stage == "full" else num_relations
            indptr = record.get(STAGE_FILES[stage][0])
            check_edge_types(record[name], indptr, limit, str(folder / f"{name}.npy"))
    for split in LINK_SPLITS:
        if (name := f"{split}_pair_rel") in names:
            check_edge_types(record[name], None, num_pair_relations, str(folder / f"{name}.npy"))
    return record


def check_edge_types(edge_type: Tensor, indptr: Tensor | None, num_relations: int, where: str):
    """A chunk's ``edge_type`` read from outside (a directory): int64 relations in
    ``[0, R)``, each in-edge segment of ``indptr`` sorted by relation (what the per-relation
    slots assume); else ``PartitionDirError`` naming the file."""
    ok = edge_type.dtype == torch.int64
    if ok and edge_type.numel():
        ok = int(edge_type.min()) >= 0 and int(edge_type.max()) < num_relations
        if ok and indptr is not None:
            starts = torch.zeros(edge_type.numel(), dtype=torch.bool)
            starts[indptr[:-1][indptr[1:] > indptr[:-1]]] = True
            ok = bool(((edge_type[1:] >= edge_type[:-1]) | starts[1:]).all())
    if not ok:
        raise PartitionDirError(
            f"{where} must be int64, one relation in [0, {num_relations}) per in-edge, each "
            "in-edge segment sorted by relation; partition again"
        )
