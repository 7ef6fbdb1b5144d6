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
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...comm.transport import SocketTransport
from ...graph.book import LocalPartition, RangeBook
from ...graph.sampler import sample_neighbors

NSC, FEATURES, TARGETS, IDMAP = 1, 2, 3, 4  # request kinds


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

    @property
    def max_in_degree(self) -> int:
        """The largest in-degree of this rank's core (bounds its sampling answers)."""
        return int(self.local.indptr.diff().max()) if self.local.num_core else 0

    def request_bytes(self, kind: int) -> int | None:
        """Most payload bytes of a request of ``kind`` this rank serves (``None``: no such
        kind): each of its core vertices once, plus ``[fanout, key]`` for sampling."""
        ids = self.local.num_core * 8
        if kind == NSC:
            return ids + 16
        if kind == IDMAP:
            return None if self.id_shard is None else self.id_shard[1].numel() * 8
        return ids if kind in (FEATURES, TARGETS) else None

    def answer_bytes(self, owner: int, kind: int, num_ids: int, fanout: int = 0) -> int:
        """Most payload bytes of ``owner``'s answer to a request of ``kind`` for ``num_ids``
        vertices (sampling ``fanout`` each, ``-1``: all)."""
        if kind == NSC:
            most = self.transport.advertised(owner)
            per_id = most if fanout == -1 else min(fanout, most)
            return num_ids * (8 + per_id * 16)  # a count; a source and its degree each
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

    def sample_local(self, gids: Tensor, fanout: int, key: int) -> list[Tensor]:
        """Sample owned vertices: ``[per-vertex counts, source gids]`` in request order, plus
        the sources' degrees when this store carries them."""
        src, dst_pos, deg = self._sample_owned(gids, fanout, key)
        counts = torch.bincount(dst_pos, minlength=gids.numel())
        return [counts, src] if deg is None else [counts, src, deg]

    def serve(self, kind: int, tensors: list[Tensor]) -> tuple[list[Tensor], str]:
        """The transport's handler: answer a peer's request and name the answer's category."""
        gids = tensors[0]
        if kind == NSC:
            fanout, key = tensors[1].tolist()
            return self.sample_local(gids, fanout, key), "structure"
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
