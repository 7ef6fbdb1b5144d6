"""ByteGNN's graph store: this rank's partition, served to the others through the socket
transport, and the even split of the training vertices into per-rank, per-step seeds.

A request for vertices goes to their owners: this rank's own vertices are read in place (no
bytes), the others' go through :class:`~lightning_gnnscale.comm.transport.SocketTransport`
(ids as ``structure``; sampled edges back as ``structure``, feature rows and target rows back
as ``feature``). Sampling is keyed by global ids (``graph/sampler.py``), so the owner draws exactly
the edges the whole graph would give: the blocks equal the reference sampler's.

A rank loaded from a partition directory holds no ``[N]`` degree array: its store knows the
full-graph degrees of its core and halo (and of its training seeds), and an owner answers a
sampling request with the degrees of the sources it drew (which lie in its core or halo), 8 B
more per source (``structure``). So every vertex of a batch arrives with its degree.

The transport refuses any frame larger than the protocol allows (:meth:`GraphStore.request_bytes`
for a request this rank serves, :meth:`GraphStore.answer_bytes` for an answer it awaits): a
request names each vertex at most once, and only the owner's, so it carries at most the owner's
core size in ids; an answer carries one feature row, target row or count per id, and at most
``min(fanout, the owner's largest in-degree)`` sampled sources (and degrees) per id. Each rank
advertises its largest in-degree with its address.

A typed graph's store (``edge_type``) samples every relation with its own fanout
(:func:`~...graph.sampler.sample_typed_edge_ids`, keyed on global ids, so an owner draws what
the whole typed graph draws); a sampling request then carries one fanout per relation, and
the answer each drawn edge's relation (one byte per edge up to 256 relations, ``structure``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...comm.transport import SocketTransport
from ...graph.book import LocalPartition, RangeBook
from ...graph.csc import relation_indptr
from ...graph.sampler import sample_neighbors, sample_typed_edge_ids

NSC, FEATURES, TARGETS, IDMAP = 1, 2, 3, 4  # request kinds


def relation_wire_dtype(num_relations: int) -> torch.dtype:
    """The dtype a sampling answer carries relations in: one byte up to 256 relations."""
    return torch.uint8 if num_relations <= 256 else torch.int32


class GraphStore:
    """This rank's core vertices (in-edges, features, task targets) and access to the others'.

    Args:
        local: this rank's partition (``graph.book.build_local_partition``, or loaded from a
            partition directory).
        book: vertex ownership (a ``RangeBook`` is enough).
        degree: int64 ``[N]`` replicated in-degrees (task costs, GCN normalisation); ``None``
            for a rank that holds no ``[N]`` array (from a partition directory): then
            ``local_degree`` and ``seed_ids`` / ``seed_degree`` are given, and sampling
            answers carry the sources' degrees.
        transport: the socket transport (``None`` with one rank).
        local_degree: int64 ``[n_core + n_halo]`` full-graph in-degrees of the core and halo.
        seed_ids, seed_degree: sorted training gids of this rank's seed chunk and their
            degrees (a seed need not be in this partition).
        id_shard: link prediction's id map (``link.py``): ``(offsets [P + 1], gid [n_r],
            degree [n_r])``, this rank's shard of original ids ``[offsets[rank],
            offsets[rank + 1])`` with each id's gid and training in-degree; ``None``: none.
        edge_type: a typed graph's relation of every in-edge of ``local`` ``[E_k]`` (local CSC
            order; each segment sorted by relation), with ``num_relations``; ``None``:
            homogeneous.
    """

    def __init__(
        self,
        local: LocalPartition,
        book: RangeBook,
        degree: Tensor | None,
        transport: SocketTransport | None,
        *,
        local_degree: Tensor | None = None,
        seed_ids: Tensor | None = None,
        seed_degree: Tensor | None = None,
        id_shard: tuple[Tensor, Tensor, Tensor] | None = None,
        edge_type: Tensor | None = None,
        num_relations: int = 1,
    ) -> None:
        self.local, self.book, self.degree, self.transport = local, book, degree, transport
        self.rank = local.part_id
        self.first_gid = int(book.node_offsets[self.rank])
        if degree is not None:
            self.local_src_gid = local.local2global[local.indices]  # [E_k] source gids
        elif local_degree is None or seed_ids is None or seed_degree is None:
            raise ValueError("a store without the [N] degrees needs local_degree and seed_*")
        self.local_degree, self.seed_ids, self.seed_degree = local_degree, seed_ids, seed_degree
        self.id_shard = id_shard
        self.edge_type, self.num_relations = edge_type, num_relations
        self.slot_indptr = None
        if edge_type is not None:
            if edge_type.shape != local.indices.shape:
                raise ValueError(
                    f"edge_type {list(edge_type.shape)} must give one relation per in-edge of "
                    f"the partition ({local.indices.numel()})"
                )
            self.slot_indptr = relation_indptr(local.indptr, edge_type, num_relations)

    @property
    def typed(self) -> bool:
        """Whether this store samples per relation (a typed graph's)."""
        return self.edge_type is not None

    @property
    def max_in_degree(self) -> int:
        """The largest in-degree of this rank's core (bounds its sampling answers)."""
        return int(self.local.indptr.diff().max()) if self.local.num_core else 0

    def request_bytes(self, kind: int) -> int | None:
        """Most payload bytes of a request of ``kind`` this rank serves (``None``: no such
        kind): each of its core vertices once, plus ``[fanout, key]`` for sampling (a typed
        store's: a fanout per relation, then the key)."""
        ids = self.local.num_core * 8
        if kind == NSC:  # [fanout per relation..., key]
            return ids + 8 * (self.num_relations + 1)
        if kind == IDMAP:
            return None if self.id_shard is None else self.id_shard[1].numel() * 8
        return ids if kind in (FEATURES, TARGETS) else None

    def answer_bytes(
        self, owner: int, kind: int, num_ids: int, fanout: int | tuple[int, ...] = 0
    ) -> int:
        """Most payload bytes of ``owner``'s answer to a request of ``kind`` for ``num_ids``
        vertices (sampling ``fanout`` each, ``-1``: all; a typed store's: a fanout per
        relation, their sum per vertex, and each source's relation)."""
        if kind == NSC:
            most = self.transport.advertised(owner)
            fanouts = fanout if isinstance(fanout, tuple) else (fanout,)
            per_id = most if -1 in fanouts else min(sum(fanouts), most)
            per_source = 16  # a source and its degree
            if self.typed:
                per_source += relation_wire_dtype(self.num_relations).itemsize
            return num_ids * (8 + per_id * per_source)  # a count each, and the sources
        if kind == IDMAP:
            return num_ids * 16  # a gid and a degree each
        rows = self.local.x if kind == FEATURES else self.local.targets.target
        return num_ids * math.prod(rows.shape[1:]) * rows.element_size()

    @property
    def carries_degrees(self) -> bool:
        """Whether sampled sources come with their degrees (no ``[N]`` array here)."""
        return self.degree is None

    def degree_of(self, gids: Tensor) -> Tensor:
        """Full-graph in-degrees of ``gids``: from the ``[N]`` array, or (without it) of
        vertices this rank holds a degree of (core, halo, its training seeds)."""
        if self.degree is not None:
            return self.degree.index_select(0, gids)
        lid, held = self.local.find(gids)
        out = torch.zeros_like(gids)
        out[held] = self.local_degree[lid[held]]
        rest = gids[~held]
        if rest.numel():
            seeds = self.seed_ids
            pos = torch.searchsorted(seeds, rest).clamp_(max=max(seeds.numel() - 1, 0))
            if seeds.numel() == 0 or not bool((seeds[pos] == rest).all()):
                raise KeyError(f"rank {self.rank} holds no degree of some of {rest[:5].tolist()}")
            out[~held] = self.seed_degree[pos]
        return out

    # ------------------------------------------------------------------ served locally
    def _sample_owned(
        self, gids: Tensor, fanout: int, key: int
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Sample owned vertices: ``(source gids, positions in gids)`` as ``sample_neighbors``,
        and the sources' degrees when this store carries them (else ``None``)."""
        if self.degree is not None:
            src, dst_pos = sample_neighbors(
                self.local.indptr,
                self.local_src_gid,
                gids - self.first_gid,
                fanout,
                key,
                node_keys=gids,
            )
            return src, dst_pos, None
        # the same edges, drawn as local ids (the CSC order is the same), then mapped
        lid, dst_pos = sample_neighbors(
            self.local.indptr,
            self.local.indices,
            gids - self.first_gid,
            fanout,
            key,
            node_keys=gids,
        )
        return self.local.local2global[lid], dst_pos, self.local_degree[lid]

    def _sample_owned_typed(
        self, gids: Tensor, fanouts: tuple[int, ...], key: int
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        """:meth:`_sample_owned` per relation (``fanouts[r]`` of relation ``r``): ``(source
        gids, positions in gids, degrees or None, relations)``, sorted by position, then
        relation, then segment order (as the whole typed graph's sampler)."""
        eids, dst_pos = sample_typed_edge_ids(
            self.slot_indptr, gids - self.first_gid, fanouts, key, node_keys=gids
        )
        kinds = self.edge_type.index_select(0, eids)
        if self.degree is not None:
            return self.local_src_gid.index_select(0, eids), dst_pos, None, kinds
        lid = self.local.indices.index_select(0, eids)
        return self.local.local2global[lid], dst_pos, self.local_degree[lid], kinds

    def sample_local(self, gids: Tensor, fanout: int, key: int) -> list[Tensor]:
        """Sample owned vertices: ``[per-vertex counts, source gids]`` in request order, plus
        the sources' degrees when this store carries them."""
        src, dst_pos, deg = self._sample_owned(gids, fanout, key)
        counts = torch.bincount(dst_pos, minlength=gids.numel())
        return [counts, src] if deg is None else [counts, src, deg]

    def sample_local_typed(self, gids: Tensor, fanouts: tuple[int, ...], key: int) -> list[Tensor]:
        """:meth:`sample_local` per relation, the sources' relations last (in
        :func:`relation_wire_dtype`)."""
        src, dst_pos, deg, kinds = self._sample_owned_typed(gids, fanouts, key)
        counts = torch.bincount(dst_pos, minlength=gids.numel())
        kinds = kinds.to(relation_wire_dtype(self.num_relations))
        return [counts, src, kinds] if deg is None else [counts, src, deg, kinds]

    def serve(self, kind: int, tensors: list[Tensor]) -> tuple[list[Tensor], str]:
        """The transport's handler: answer a peer's request and name the answer's category."""
        gids = tensors[0]
        if kind == NSC:
            *fanouts, key = tensors[1].tolist()
            if self.typed:
                if len(fanouts) != self.num_relations:
                    raise ValueError(
                        f"a sampling request with {len(fanouts)} fanouts for "
                        f"{self.num_relations} relations"
                    )
                return self.sample_local_typed(gids, tuple(fanouts), key), "structure"
            if len(fanouts) != 1:
                raise ValueError(f"a sampling request with {len(fanouts)} fanouts (one relation)")
            return self.sample_local(gids, fanouts[0], key), "structure"
        if kind == FEATURES:
            return [self.local.x.index_select(0, gids - self.first_gid)], "feature"
        if kind == TARGETS:
            return [self.local.targets.target.index_select(0, gids - self.first_gid)], "feature"
        if kind == IDMAP and self.id_shard is not None:
            return [self._id_rows(gids)], "structure"
        raise ValueError(f"unknown request kind {kind}")

    # ------------------------------------------------------------------ any vertex
    def _by_owner(self, gids: Tensor, owners: Tensor | None = None) -> list[tuple[int, Tensor]]:
        """``[(owner, increasing positions in gids)]``: ``gids`` grouped by owning rank
        (``owners``: each one's, default the book's)."""
        owners = self.book.nid2part(gids) if owners is None else owners
        order = torch.argsort(owners, stable=True)
        counts = torch.bincount(owners, minlength=self.book.num_parts).tolist()
        groups, start = [], 0
        for owner, count in enumerate(counts):
            if count:
                groups.append((owner, order[start : start + count]))
            start += count
        return groups

    def sample(self, gids: Tensor, fanout: int, key: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """One hop for ``gids`` (unique, any owners): ``(src gids, dst positions, src degrees
        or None)`` sorted by destination position, each vertex's sources in CSC order (as
        ``sample_neighbors``); the degrees when this store carries them."""
        if self.typed:
            raise ValueError("a typed graph's store samples per relation (sample_typed)")
        groups = self._by_owner(gids)
        if len(groups) == 1 and groups[0][0] == self.rank:  # all owned here: no routing
            return self._sample_owned(gids, fanout, key)
        params = torch.tensor([fanout, key], dtype=torch.int64)
        sources, positions, degrees = [gids.new_empty(0)], [gids.new_empty(0)], [gids.new_empty(0)]
        for owner, where in groups:
            if owner == self.rank:
                src, dst_pos, deg = self._sample_owned(gids[where], fanout, key)
                positions.append(where[dst_pos])
            else:
                request = [gids[where], params]
                bound = self.answer_bytes(owner, NSC, len(where), fanout)
                answer = self.transport.request(owner, NSC, request, "structure", bound)
                per_vertex, src = answer[0], answer[1]
                deg = answer[2] if len(answer) > 2 else None
                if deg is None and self.carries_degrees:
                    raise RuntimeError(
                        f"rank {owner} answered a sampling request of rank {self.rank} without "
                        "the sources' degrees (ranks loaded from a partition directory and "
                        "ranks holding the whole graph cannot be mixed)"
                    )
                positions.append(torch.repeat_interleave(where, per_vertex))
            sources.append(src)
            if self.carries_degrees:
                degrees.append(deg)
        dst_pos = torch.cat(positions)
        perm = torch.argsort(dst_pos, stable=True)  # each group is sorted: merge them
        src_deg = torch.cat(degrees)[perm] if self.carries_degrees else None
        return torch.cat(sources)[perm], dst_pos[perm], src_deg

    def sample_typed(
        self, gids: Tensor, fanouts: tuple[int, ...], key: int
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        """:meth:`sample` per relation (a typed store's; ``fanouts[r]`` of relation ``r``):
        ``(src gids, dst positions, src degrees or None, relations)`` sorted by destination
        position, each vertex's sources by relation, then in segment order (a vertex's edges
        all come from its owner), as the whole typed graph's sampler gives them."""
        if not self.typed:
            raise ValueError("this graph store holds no relations (a homogeneous graph's)")
        fanouts = tuple(int(f) for f in fanouts)
        groups = self._by_owner(gids)
        if len(groups) == 1 and groups[0][0] == self.rank:  # all owned here: no routing
            return self._sample_owned_typed(gids, fanouts, key)
        params = torch.tensor([*fanouts, key], dtype=torch.int64)
        empty = gids.new_empty(0)
        sources, positions, degrees, kinds = [empty], [empty], [empty], [empty]
        for owner, where in groups:
            if owner == self.rank:
                src, dst_pos, deg, kind = self._sample_owned_typed(gids[where], fanouts, key)
                positions.append(where[dst_pos])
            else:
                bound = self.answer_bytes(owner, NSC, len(where), fanouts)
                answer = self.transport.request(
                    owner, NSC, [gids[where], params], "structure", bound
                )
                if len(answer) != 3 + self.carries_degrees:
                    raise RuntimeError(
                        f"rank {owner} answered a typed sampling request of rank {self.rank} "
                        f"with {len(answer)} tensors, not {3 + self.carries_degrees} (counts, "
                        "sources, " + "degrees, " * self.carries_degrees + "relations)"
                    )
                per_vertex, src, kind = answer[0], answer[1], answer[-1].to(torch.int64)
                deg = answer[2] if self.carries_degrees else None
                positions.append(torch.repeat_interleave(where, per_vertex))
            sources.append(src)
            kinds.append(kind)
            if self.carries_degrees:
                degrees.append(deg)
        dst_pos = torch.cat(positions)
        perm = torch.argsort(dst_pos, stable=True)  # each group is sorted: merge them
        src_deg = torch.cat(degrees)[perm] if self.carries_degrees else None
        return torch.cat(sources)[perm], dst_pos[perm], src_deg, torch.cat(kinds)[perm]

    def _rows(self, gids: Tensor, kind: int, local: Tensor) -> Tensor:
        groups = self._by_owner(gids)
        if len(groups) == 1 and groups[0][0] == self.rank:  # all owned here
            return local.index_select(0, gids - self.first_gid)
        out = local.new_empty((gids.numel(), *local.shape[1:]))
        for owner, where in groups:
            if owner == self.rank:
                out[where] = local.index_select(0, gids[where] - self.first_gid)
            else:
                bound = self.answer_bytes(owner, kind, len(where))
                answer = self.transport.request(owner, kind, [gids[where]], "structure", bound)
                out[where] = answer[0]
        return out

    def features(self, gids: Tensor) -> Tensor:
        """Feature rows ``[n, F]`` of ``gids``."""
        return self._rows(gids, FEATURES, self.local.x)

    def targets(self, gids: Tensor) -> Tensor:
        """The task's target rows of ``gids`` (``NodeTargets.target`` rows: ``[n]`` or
        ``[n, d]``)."""
        return self._rows(gids, TARGETS, self.local.targets.target)

    # ------------------------------------------------------------------ the id map
    def _id_rows(self, ids: Tensor) -> Tensor:
        """``[n, 2]`` (gid, training in-degree) of original ids in this rank's shard."""
        offsets, gid, degree = self.id_shard
        at = ids - offsets[self.rank]
        if ids.numel() and (int(at.min()) < 0 or int(at.max()) >= gid.numel()):
            raise ValueError(f"rank {self.rank} was asked for ids outside its id-map shard")
        return torch.stack([gid.index_select(0, at), degree.index_select(0, at)], 1)

    def resolve(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """``(gids, training in-degrees)`` of original ids ``ids`` (link prediction's pairs
        and negatives), from their id-map shards: this rank's read in place, the others'
        requested (``structure``: 8 B out and 16 B back per id)."""
        offsets = self.id_shard[0]
        owners = torch.searchsorted(offsets[1:], ids, right=True)
        out = ids.new_empty((ids.numel(), 2))
        for owner, where in self._by_owner(ids, owners):
            if owner == self.rank:
                out[where] = self._id_rows(ids[where])
            else:
                bound = self.answer_bytes(owner, IDMAP, len(where))
                answer = self.transport.request(owner, IDMAP, [ids[where]], "structure", bound)
                out[where] = answer[0]
        return out[:, 0], out[:, 1]
