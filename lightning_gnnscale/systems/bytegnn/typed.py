"""A ByteGNN rank's part of a typed graph (docs/systems/bytegnn.md, "Typed graphs"): the
:class:`~...graph.halo_part.HaloPart` plus the relation of every in-edge it holds and the
node types of its core, in memory and in a partition directory (``edge_type.npy``,
``node_type.npy``; the names in the metadata's ``relations`` and ``node_types``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ...graph.book import PartitionedGraph
from ...graph.halo_part import HaloPart
from ...graph.partition_dir import PartitionDir, PartitionDirError, part_folder


@dataclass(frozen=True)
class TypedHaloPart(HaloPart):
    """:class:`HaloPart` with a typed graph's types (``None`` for a homogeneous graph).

    Attributes:
        edge_type: int64 ``[E_k]`` the relation of every in-edge of ``local`` (local CSC
            order; each segment sorted by relation, as the relabelled graph's).
        node_type: int64 ``[n_core]`` the type of every core node.
    """

    edge_type: Tensor | None = None
    node_type: Tensor | None = None

    @classmethod
    def of(
        cls, prepared: PartitionedGraph, k: int, train_seeds: Tensor, *, seed_degrees: bool = False
    ) -> TypedHaloPart:
        """:meth:`HaloPart.of` with the relations of its edges (the relabelled graph's, by
        the edges' global ids) and its core's node types."""
        part = super().of(prepared, k, train_seeds, seed_degrees=seed_degrees)
        graph, book = prepared.graph, prepared.book
        lo, hi = int(book.node_offsets[k]), int(book.node_offsets[k + 1])
        return replace(
            part,
            edge_type=None if graph.edge_type is None else graph.edge_type[part.local.edge_ids],
            node_type=None if graph.node_type is None else graph.node_type[lo:hi].clone(),
        )

    @classmethod
    def load(cls, opened: PartitionDir, k: int, out_dim: int, dtype: torch.dtype) -> TypedHaloPart:
        """:meth:`HaloPart.load` with the part's ``edge_type`` / ``node_type`` files, checked
        against the metadata's ``relations`` / ``node_types`` (outside input: every value in
        range, each segment sorted by relation) before any sampling reads them."""
        part = super().load(opened, k, out_dim, dtype)
        check_typed_files(opened, k)
        arrays = opened.load_part(k)
        edge_type, node_type = arrays.get("edge_type"), arrays.get("node_type")
        where = opened.path / part_folder(k)
        if edge_type is not None:
            check_edge_types(edge_type, part.local.indptr, len(opened.meta["relations"]), where)
        if node_type is not None:
            check_values(node_type, len(opened.meta["node_types"]), where / "node_type.npy")
        return replace(part, edge_type=edge_type, node_type=node_type)

    def arrays(self) -> dict[str, Tensor]:
        arrays = super().arrays()
        for name in ("edge_type", "node_type"):
            if getattr(self, name) is not None:
                arrays[name] = getattr(self, name)
        return arrays


def typed_meta(graph) -> dict:
    """The metadata a typed graph's directory records (``relations``, ``node_types``); ``{}``
    for a homogeneous graph (its directory as before)."""
    meta = {}
    if graph.is_typed:
        meta["relations"] = list(graph.relations)
    if graph.node_type is not None:
        meta["node_types"] = list(graph.node_types)
    return meta


def check_typed_files(opened: PartitionDir, k: int) -> None:
    """Part ``k`` (verified) holds ``edge_type.npy`` exactly when the metadata lists
    ``relations``, and ``node_type.npy`` when it lists ``node_types``: int64, of the part's
    edge and node counts (the verified files' headers: nothing is read)."""
    folder, record = part_folder(k), opened.meta["parts"][k]
    files = opened.verified_files.get(folder)
    if files is None:  # not verified here (another node's part)
        return
    for name, key, count in (
        ("edge_type", "relations", "edges"),
        ("node_type", "node_types", "nodes"),
    ):
        names = opened.meta.get(key)
        if key in opened.meta and not (
            isinstance(names, list) and names and all(isinstance(n, str) for n in names)
        ):
            raise PartitionDirError(
                f"{opened.path}: the metadata's '{key}' {names!r} is not a list of names"
            )
        found = files.get(name)
        if bool(names) != (found is not None):
            said = f"lists '{key}'" if names else f"lists no '{key}'"
            held = f"no {name}.npy" if found is None else f"{name}.npy"
            raise PartitionDirError(
                f"{opened.path / folder} holds {held}, but the metadata {said}; partition again"
            )
        if found is None:
            continue
        if str(found.dtype) != "int64":
            raise PartitionDirError(
                f"{opened.path / folder / name}.npy holds {found.dtype} values, not int64"
            )
        if count in record:
            opened.expect_shape(folder, name, (record[count],), f"part {k}'s '{count}'")


def check_values(values: Tensor, count: int, where) -> None:
    """Every value of ``values`` lies in ``[0, count)``; else ``PartitionDirError``."""
    if values.numel() and (int(values.min()) < 0 or int(values.max()) >= count):
        raise PartitionDirError(
            f"{where}: values in [{int(values.min())}, {int(values.max())}], outside [0, {count})"
        )


def check_edge_types(edge_type: Tensor, indptr: Tensor, num_relations: int, where) -> None:
    """``edge_type`` (``[E_k]``) names relations in ``[0, R)`` and each segment of ``indptr``
    is sorted by relation (the sampler reads a relation's in-edges as one run)."""
    check_values(edge_type, num_relations, where / "edge_type.npy")
    if edge_type.numel() < 2:
        return
    starts = torch.zeros(edge_type.numel(), dtype=torch.bool)
    starts[indptr[:-1][indptr[:-1] < edge_type.numel()]] = True
    falls = (edge_type[1:] < edge_type[:-1]) & ~starts[1:]
    if bool(falls.any()):
        edge = int(falls.nonzero()[0]) + 1
        raise PartitionDirError(
            f"{where / 'edge_type.npy'}: edge {edge}'s relation {int(edge_type[edge])} follows "
            f"{int(edge_type[edge - 1])} within its destination's in-edges (each must be sorted "
            "by relation); partition again"
        )
