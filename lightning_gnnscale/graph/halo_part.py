"""One rank's part of a relabelled partition as DistDGL and ByteGNN hold it: its core, the
1-hop halo and every in-edge of the core, the degrees and the rank's chunk of the training ids.
The same object comes from the in-memory partition (:meth:`HaloPart.of`) and from a partition
directory (:meth:`HaloPart.load`), and :func:`write_halo_parts` writes what ``load`` reads
(docs/partitioning.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from lightning_gnnscale.graph.book import (
    LocalPartition,
    PartitionedGraph,
    RangeBook,
    build_local_partition,
)
from lightning_gnnscale.graph.seed_split import SeedSplit

if TYPE_CHECKING:
    from lightning_gnnscale.graph.partition_dir import PartitionDir, PartitionDirWriter


@dataclass(frozen=True)
class HaloPart:
    """Rank ``local.part_id``'s part. Where it differs by source, the field says how.

    Attributes:
        local: the partition (core + halo, local CSC; features in the run's dtype).
        book: node ownership; in memory the :class:`~.book.PartitionBook` (with the
            relabelling), from a directory the ``[P + 1]`` offsets (a :class:`RangeBook`).
        degree: int64 ``[N]`` whole-graph in-degrees, in memory; ``None`` from a directory
            (no ``[N]`` array: the degrees of nodes beyond the core and halo come from
            their owners).
        local_degree: int64 ``[n_local]`` whole-graph in-degrees of the core and halo.
        orig_ids: int64 ``[n_core]`` original ids of the core.
        trainer_seeds: int64 ``[n_seeds]`` this rank's chunk of the sorted training gids
            (:meth:`SeedSplit.chunks`).
        trainer_sizes: int64 ``[P]`` every rank's chunk size.
        seed_degree: int64 ``[n_seeds]`` degrees of ``trainer_seeds`` (ByteGNN's), or ``None``.
        agreed: what every rank must hold the same (checked in ``setup_rank``): in memory the
            relabelling ``new2old [N]`` each rank computed; ``None`` from a directory (the kit
            checked that every rank opened the same one).
    """

    local: LocalPartition
    book: RangeBook
    degree: Tensor | None
    local_degree: Tensor
    orig_ids: Tensor
    trainer_seeds: Tensor
    trainer_sizes: Tensor
    seed_degree: Tensor | None
    agreed: Tensor | None

    @classmethod
    def of(
        cls, prepared: PartitionedGraph, k: int, train_seeds: Tensor, *, seed_degrees: bool = False
    ) -> HaloPart:
        """Part ``k`` of the in-memory partition (pure: no collective); ``train_seeds``: the
        task's training seeds in gids, sorted; ``seed_degrees``: with :attr:`seed_degree`."""
        graph, book = prepared.graph, prepared.book
        degree = graph.in_degree()
        local = build_local_partition(graph, prepared.targets, book, k)
        chunks = SeedSplit.chunks(train_seeds, book.num_parts)
        lo, hi = int(book.node_offsets[k]), int(book.node_offsets[k + 1])
        return cls(
            local=local,
            book=book,
            degree=degree,
            local_degree=degree[local.local2global],
            orig_ids=book.new2old[lo:hi],
            trainer_seeds=chunks[k],
            trainer_sizes=torch.tensor([c.numel() for c in chunks], dtype=torch.int64),
            seed_degree=degree[chunks[k]] if seed_degrees else None,
            agreed=book.new2old,
        )

    @classmethod
    def load(cls, opened: PartitionDir, k: int, out_dim: int, dtype: torch.dtype) -> HaloPart:
        """Part ``k`` from its files only (memory-mapped; features cast to ``dtype`` if they
        differ), with the shared metadata's offsets and chunk sizes; ``out_dim``: the targets'
        head width (the task's, from the metadata)."""
        arrays = opened.load_part(k)
        offsets = opened.node_offsets
        return cls(
            local=LocalPartition.from_arrays(arrays, k, out_dim, dtype),
            book=RangeBook(offsets),
            degree=None,
            local_degree=arrays["degree"],
            orig_ids=arrays["orig_ids"],
            trainer_seeds=arrays["trainer_seeds"],
            trainer_sizes=torch.tensor(opened.meta["trainer_sizes"], dtype=torch.int64),
            seed_degree=arrays.get("trainer_seed_degree"),
            agreed=None,
        )

    def arrays(self) -> dict[str, Tensor]:
        """The part's files (what :meth:`load` reads)."""
        arrays = {
            **self.local.arrays(),
            "degree": self.local_degree,
            "orig_ids": self.orig_ids,
            "trainer_seeds": self.trainer_seeds,
        }
        if self.seed_degree is not None:
            arrays["trainer_seed_degree"] = self.seed_degree
        return arrays

    def sizes(self) -> dict[str, int]:
        """The part's record in the directory's metadata."""
        local = self.local
        return {
            "nodes": local.num_core,
            "halo": local.num_halo,
            "edges": local.num_edges,
            "trainer_seeds": self.trainer_seeds.numel(),
        }

    def seed_split(self, batch_size: int, seed: int) -> SeedSplit:
        """This rank's even trainer split (:class:`SeedSplit`) of ``batch_size`` global seeds."""
        return SeedSplit.from_chunk(
            self.trainer_seeds, self.trainer_sizes, self.local.part_id, batch_size, seed
        )


def write_halo_parts(
    prepared: PartitionedGraph,
    part_of: Callable[[PartitionedGraph, int], HaloPart],
    writer: PartitionDirWriter,
    log,
) -> dict:
    """Write ``part_of(prepared, k)`` (a system's ``part_of``) as part ``k`` for every ``k``.
    Returns the metadata the parts share (offsets, every rank's chunk size, the report)."""
    world_size = prepared.book.num_parts
    for k in range(world_size):
        part = part_of(prepared, k)
        sizes = part.sizes()
        writer.write_part(k, part.arrays(), sizes)
        log(f"[partition] part {k + 1}/{world_size} written ({sizes})")
        trainer_sizes = part.trainer_sizes.tolist()
        del part
    return {
        "node_offsets": prepared.book.node_offsets.tolist(),
        "trainer_sizes": trainer_sizes,
        "report": prepared.report,
    }
