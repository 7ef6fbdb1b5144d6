"""A partition at one super-epoch: owned chunks + a 1-hop halo, built from the chunk store.

Local ids: owned nodes first (sorted by global id), then halo nodes (sorted). Owned nodes keep
all their in-edges, in global segment order, so the hash-keyed sampler keyed on global ids
draws exactly what it would on the whole graph wherever the partition holds the neighbourhood.
Halo nodes get no in-edges (sampling stops at them). Features of halo nodes are read from the
other chunks' files (storage), never from a peer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...graph.block import Block
from ...graph.csc import relation_indptr
from ...graph.node_targets import NodeTargets
from ...graph.sampler import (
    BlockBuilder,
    SampleKey,
    check_relation_fanouts,
    sample_neighbors,
    sample_typed_edge_ids,
)
from ...tasks.base import NodeTask
from .chunking import GrappaPart
from .schedule import PartitionSpec


@dataclass
class IsolatedPartition:
    """One partition's local graph at one super-epoch: its owned (core) nodes and their halo.

    The vocabulary is that of DistDGL's :class:`~lightning_gnnscale.graph.book.LocalPartition`
    (``num_core`` owned nodes first, ``local2global`` ids); unlike it, a Grappa partition also
    holds its halo nodes' features and target rows (read from the chunk store), so it trains
    alone.

    Attributes (``n`` local nodes, ``n_core`` of them owned):
        spec: the chunks it seeds and owns.
        local2global: int64 ``[n]``; sorted owned gids, then sorted halo gids.
        num_core: ``n_core``.
        indptr, indices: int64 local CSC ``[n + 1]`` / ``[E]`` (sources as local ids); halo
            nodes have no in-edges.
        x ``[n, F]``: features per local node.
        targets: the task's rows per local node (:class:`~...graph.node_targets.NodeTargets`);
            halo rows are in no split (a partition trains and scores its owned rows only).
        deg: int64 ``[n]``, global in-degree.
        ell: int64 ``[n_core]``, owned (or, with ``count_halo_as_local``, local)
            in-neighbours of each owned node.
        seeds: int64, local ids of the task's training seeds in the seed chunks.
        seed_owned: bool ``[n_core]``, the node is in a seed chunk.
        io_bytes: bytes read from the store to build it (features in the dtype they are
            stored in).
        halo_chunk: int64 ``[n - n_core]``, the chunk of each halo node.
        pairs: link prediction: int64 ``[2, m]`` global ``(src, dst)`` of the training pairs
            it trains (destination in a seed chunk, source held: owned or in the halo),
            ordered by ``pair_ids``; ``None`` for a node task.
        pair_ids: int64 ``[m]`` their positions among the training pairs (sorted); then
            ``seeds`` are these ids.
        excluded_pairs: training pairs whose destination lies in a seed chunk but whose
            source the partition does not hold (``halo_hops=0`` only), not trained here.
        edge_type: a typed graph's relation per local edge ``[E]`` (each segment sorted by
            relation, as the graph's); ``None``: homogeneous.
        num_relations: ``R`` (1 when homogeneous).
        deg_rel, ell_rel: typed graphs: int64 ``[n_core, R]``, each owned node's global
            in-degree and ``ell`` per relation (the coverage's per-relation counts,
            docs/systems/grappa.md, "Typed graphs"); ``None`` when homogeneous.
        pair_rel: typed link prediction: int64 ``[m]``, the relation of each of ``pairs``;
            ``None`` otherwise.
    """

    spec: PartitionSpec
    local2global: Tensor
    num_core: int
    indptr: Tensor
    indices: Tensor
    x: Tensor
    targets: NodeTargets
    deg: Tensor
    ell: Tensor
    seeds: Tensor
    seed_owned: Tensor
    io_bytes: int
    halo_chunk: Tensor
    pairs: Tensor | None = None
    pair_ids: Tensor | None = None
    excluded_pairs: int = 0
    edge_type: Tensor | None = None
    num_relations: int = 1
    deg_rel: Tensor | None = None
    ell_rel: Tensor | None = None
    pair_rel: Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return self.local2global.numel()

    @property
    def n_avail(self) -> Tensor:
        """Local in-degree of every local node (0 for halo nodes)."""
        return self.indptr.diff()

    def local_of(self, gids: Tensor) -> Tensor:
        """Local ids of global ids that are in the partition (``-1`` otherwise)."""
        own, halo = self.local2global[: self.num_core], self.local2global[self.num_core :]
        out = torch.full_like(gids, -1)
        for base, ids in ((0, own), (self.num_core, halo)):
            if ids.numel():
                pos = torch.searchsorted(ids, gids).clamp(max=ids.numel() - 1)
                hit = ids[pos] == gids
                out[hit] = base + pos[hit]
        return out


def _nbytes(*tensors: Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def build_partition(
    part: GrappaPart,
    spec: PartitionSpec,
    task: NodeTask,
    halo_hops: int = 1,
    count_halo_as_local: bool = False,
    stage: str = "train",
    halo_pairs: bool = False,
) -> IsolatedPartition:
    """Read the owned chunks of the rank's ``part``, then the halo rows, and assemble the
    local graph (docs/systems/grappa.md, "Partitions"); its seeds are ``task``'s training
    seeds (``task.is_train_seed``) among the seed chunks' nodes. Link prediction
    (``part.link``): the local graph is over ``stage``'s structure (``train``: training edges
    only), and the seeds are the training pairs whose destination lies in a seed chunk and
    whose source the partition owns (or holds in its halo, with ``halo_pairs``); the others
    are counted in ``excluded_pairs`` (docs/systems/grappa.md, "Link prediction").

    Peak memory is the partition plus about three ``[E]`` int64 arrays: the features are
    written once into the partition's ``x`` (owned rows straight from each chunk's mapping),
    and the owned sources' local ids come from the same search that finds them."""
    if halo_hops not in (0, 1):
        raise ValueError(f"halo_hops={halo_hops} is not supported; valid: 0, 1")
    link = part.link
    chunks = {c: part.load(c, stage) for c in spec.owned_chunks}
    sizes = [chunks[c]["nodes"].numel() for c in spec.owned_chunks]
    own = torch.cat([chunks[c]["nodes"] for c in spec.owned_chunks])
    order = own.argsort()
    own = own[order]
    n_own = own.numel()
    typed = part.typed
    pair_rel = None
    if link:  # the seed chunks' training pairs (by destination), in pair order
        pair_ids = torch.cat([chunks[c]["train_pair_ids"] for c in spec.seed_chunks])
        pairs = torch.cat([chunks[c]["train_pairs"] for c in spec.seed_chunks], 1)
        by_id = pair_ids.argsort()
        pair_ids, pairs = pair_ids[by_id], pairs[:, by_id]
        if typed:  # each pair's relation (a typed graph's triples)
            pair_rel = torch.cat([chunks[c]["train_pair_rel"] for c in spec.seed_chunks])[by_id]
        no_rows = torch.zeros(n_own, dtype=torch.bool)
        owned = NodeTargets(torch.zeros(n_own, dtype=torch.int64), no_rows, no_rows, no_rows, 0)
    else:
        owned = NodeTargets.cat(
            [NodeTargets.from_arrays(chunks[c], part.out_dim) for c in spec.owned_chunks]
        ).rows(order)
    deg_local = torch.cat([chunks[c]["deg"] for c in spec.owned_chunks])[order]
    seed_owned = torch.cat(
        [torch.full((n,), c in spec.seed_chunks) for c, n in zip(spec.owned_chunks, sizes)]
    )[order]
    # in-edges of the owned nodes, in the new (sorted) node order: node i's segment starts at
    # starts[i] in the chunks' concatenated indices and lands at ptr[i]
    starts = torch.cat(
        [
            chunks[c]["indptr"][:-1] + off
            for c, off in zip(spec.owned_chunks, _edge_offsets(chunks, spec))
        ]
    )[order]
    ptr = torch.zeros(n_own + 1, dtype=torch.int64)
    torch.cumsum(deg_local, 0, out=ptr[1:])
    gather = torch.arange(int(ptr[-1]))
    gather += torch.repeat_interleave(starts - ptr[:-1], deg_local)
    src = torch.cat([chunks[c]["indices"] for c in spec.owned_chunks])[gather]
    edge_type = (
        torch.cat([chunks[c]["edge_type"] for c in spec.owned_chunks])[gather] if typed else None
    )
    del gather, starts
    stored = chunks[spec.owned_chunks[0]]["x"]
    width = stored.shape[1]
    io = _nbytes(own, deg_local, src) + (_nbytes(edge_type) if typed else 0)
    io += _nbytes(pair_ids, pairs) if link else _nbytes(*owned.arrays().values())
    io += _nbytes(pair_rel) if pair_rel is not None else 0
    io += n_own * width * stored.element_size()
    # owned sources' local ids from one search in the sorted owned ids
    pos = torch.searchsorted(own, src).clamp_(max=max(n_own - 1, 0))
    owned_src = own[pos] == src if n_own else torch.zeros_like(src, dtype=torch.bool)
    deg_rel = ell_rel = None
    if typed:  # per relation: every in-edge's (owned node, relation) slot
        num_relations = part.num_relations
        slot = torch.repeat_interleave(torch.arange(n_own), deg_local) * num_relations + edge_type
        counted = torch.ones_like(owned_src) if count_halo_as_local else owned_src
        if halo_hops == 0:
            counted = owned_src
        width_rel = n_own * num_relations
        deg_rel = torch.bincount(slot, minlength=width_rel).view(n_own, num_relations)
        ell_rel = torch.bincount(slot[counted], minlength=width_rel).view(n_own, num_relations)
        del slot, counted
    if halo_hops == 0:
        halo = own.new_empty(0)
        kept_deg = _segment_counts(owned_src, ptr)
        indices = pos[owned_src]
        if typed:
            edge_type = edge_type[owned_src]
        local_src_owned = torch.ones_like(indices, dtype=torch.bool)
    else:
        remote = src[~owned_src]
        halo = torch.unique(remote)
        kept_deg = deg_local
        indices = pos
        indices[~owned_src] = n_own + torch.searchsorted(halo, remote)
        del remote
        local_src_owned = owned_src
    del pos
    indptr = torch.zeros(n_own + halo.numel() + 1, dtype=torch.int64)
    torch.cumsum(kept_deg, 0, out=indptr[1 : n_own + 1])
    indptr[n_own + 1 :] = indptr[n_own]
    # features: owned rows from each chunk's mapping, then halo rows from the other chunks
    x = torch.empty((n_own + halo.numel(), width), dtype=part.dtype)
    new_pos = torch.empty_like(order)
    new_pos[order] = torch.arange(n_own)
    offset = 0
    for c, n in zip(spec.owned_chunks, sizes):
        x[new_pos[offset : offset + n]] = chunks[c]["x"].to(part.dtype)
        offset += n
    del chunks, new_pos
    # halo target rows, every one filled below (a halo node in no chunk read is an error)
    hy = owned.target.new_zeros((halo.numel(), *owned.target.shape[1:]))
    hdeg = torch.zeros(halo.numel(), dtype=torch.int64)
    hchunk = torch.full((halo.numel(),), -1, dtype=torch.int64)
    if halo.numel():
        for c in part.halo_sources(spec.owned_chunks):
            record = part.load(c, stage)  # the halo's degrees in this stage's structure
            pos = torch.searchsorted(record["nodes"], halo).clamp(max=record["nodes"].numel() - 1)
            hit = (record["nodes"][pos] == halo).nonzero().flatten()
            rows = pos[hit]
            x[n_own + hit] = record["x"][rows].to(part.dtype)
            if not link:
                hy[hit] = record["y"][rows]
            hdeg[hit] = record["deg"][rows]
            hchunk[hit] = c
            del record
        if (hchunk < 0).any():  # a chunk list that misses some (a directory's, say)
            lost = halo[hchunk < 0][:5].tolist()
            raise ValueError(
                f"halo nodes {lost}... of chunks {spec.owned_chunks} are in no chunk read"
            )
        io += _nbytes(halo, hy, hdeg) + halo.numel() * width * stored.element_size()
    counted = torch.ones_like(local_src_owned) if count_halo_as_local else local_src_owned
    ell = _segment_counts(counted, indptr[: n_own + 1])
    no_halo = torch.zeros(halo.numel(), dtype=torch.bool)
    halo_targets = NodeTargets(hy, no_halo, no_halo, no_halo, owned.out_dim)
    local2global = torch.cat([own, halo])
    excluded = 0
    if link:  # a pair trains here iff its source is owned (or held: halo_pairs)
        held = _holds(own, halo if halo_pairs else halo[:0], pairs[0])
        excluded = int((~held).sum())
        pair_ids, pairs = pair_ids[held], pairs[:, held]
        pair_rel = pair_rel[held] if pair_rel is not None else None
        seeds = pair_ids
    else:
        seeds = (task.is_train_seed(owned) & seed_owned).nonzero().flatten()
    return IsolatedPartition(
        spec=spec,
        local2global=local2global,
        num_core=n_own,
        indptr=indptr,
        indices=indices,
        x=x,
        targets=NodeTargets.cat([owned, halo_targets]),
        deg=torch.cat([deg_local, hdeg]),
        ell=ell,
        seeds=seeds,
        seed_owned=seed_owned,
        io_bytes=io,
        halo_chunk=hchunk,
        pairs=pairs if link else None,
        pair_ids=pair_ids if link else None,
        excluded_pairs=excluded,
        edge_type=edge_type,
        num_relations=part.num_relations if typed else 1,
        deg_rel=deg_rel,
        ell_rel=ell_rel,
        pair_rel=pair_rel,
    )


def _holds(own: Tensor, halo: Tensor, gids: Tensor) -> Tensor:
    """bool ``[n]``: ``gids`` among the sorted ``own`` or ``halo`` ids."""
    out = torch.zeros(gids.shape, dtype=torch.bool)
    for ids in (own, halo):
        if ids.numel():
            pos = torch.searchsorted(ids, gids).clamp_(max=ids.numel() - 1)
            out |= ids[pos] == gids
    return out


def _segment_counts(flags: Tensor, ptr: Tensor) -> Tensor:
    """Number of true ``flags`` in each segment ``[ptr[i], ptr[i + 1])``; int64
    ``[len(ptr) - 1]``."""
    running = torch.zeros(flags.numel() + 1, dtype=torch.int64)
    torch.cumsum(flags, 0, out=running[1:])
    return running[ptr[1:]] - running[ptr[:-1]]


def _edge_offsets(chunks: dict[int, dict], spec: PartitionSpec) -> list[int]:
    """Where each owned chunk's ``indices`` start in their concatenation."""
    out, total = [], 0
    for c in spec.owned_chunks:
        out.append(total)
        total += chunks[c]["indices"].numel()
    return out


class PartitionSampler:
    """Hash-keyed multi-hop sampling inside one partition (never leaves it).

    Args:
        part: the partition.
        fanouts: by hop from the seeds (PyG order); ``-1`` = every local in-edge.
        seed: base sampling seed.
        relation_fanouts: a typed partition's fanout of every relation per hop (default
            ``fanouts[hop]`` for each); sampled per ``(node, relation)`` slot.
    Blocks hold local ids; ``src_deg`` is the *global* in-degree (GCN normalisation as in
    full-graph evaluation). Keys hash global ids (a typed slot's: ``gid * R + r``), so a
    partition holding a node's whole neighbourhood samples what the whole graph would.
    """

    def __init__(
        self,
        part: IsolatedPartition,
        fanouts: list[int],
        seed: int,
        relation_fanouts: list[tuple[int, ...]] | None = None,
    ):
        self.part, self.fanouts, self.seed = part, list(fanouts), seed
        self.build_block = BlockBuilder(part.num_nodes, part.deg)
        self.relation_fanouts = None
        if part.edge_type is not None:
            r = part.num_relations
            self.relation_fanouts = check_relation_fanouts(
                relation_fanouts or [(f,) * r for f in self.fanouts], len(self.fanouts), r
            )
            self.slot_indptr = relation_indptr(part.indptr, part.edge_type, r)

    def sample(self, seeds: Tensor, epoch: int, step: int, salt: int) -> list[Block]:
        key = SampleKey(self.seed, epoch, step, salt)
        frontier, blocks = seeds.to(torch.int64), []
        for hop, fanout in enumerate(self.fanouts):
            if self.relation_fanouts is not None:
                eids, dst_pos = sample_typed_edge_ids(
                    self.slot_indptr,
                    frontier,
                    self.relation_fanouts[hop],
                    key.hop_key(hop),
                    node_keys=self.part.local2global[frontier],
                )
                src = self.part.indices.index_select(0, eids)
                block = self.build_block(frontier, src, dst_pos, self.part.edge_type[eids])
                blocks.append(block)
                frontier = block.src_ids
                continue
            src, dst_pos = sample_neighbors(
                self.part.indptr,
                self.part.indices,
                frontier,
                fanout,
                key.hop_key(hop),
                node_keys=self.part.local2global[frontier],
            )
            block = self.build_block(frontier, src, dst_pos)
            blocks.append(block)
            frontier = block.src_ids
        return blocks[::-1]
