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
from ...graph.sampler import BlockBuilder, SampleKey, sample_neighbors
from .chunking import ChunkReader
from .schedule import PartitionSpec


@dataclass
class IsolatedPartition:
    """One partition's local graph at one super-epoch: its owned (core) nodes and their halo.

    The vocabulary is that of DistDGL's :class:`~lightning_gnnscale.graph.book.LocalPartition`
    (``num_core`` owned nodes first, ``local2global`` ids); unlike it, a Grappa partition also
    holds its halo nodes' features and labels (read from the chunk store), so it trains alone.

    Attributes (``n`` local nodes, ``n_core`` of them owned):
        spec: the chunks it seeds and owns.
        local2global: int64 ``[n]``; sorted owned gids, then sorted halo gids.
        num_core: ``n_core``.
        indptr, indices: int64 local CSC ``[n + 1]`` / ``[E]`` (sources as local ids); halo
            nodes have no in-edges.
        x ``[n, F]``, y ``[n]``, train_mask / val_mask / test_mask bool ``[n]``: per local node
            (halo labels ``-1``, halo masks false).
        deg: int64 ``[n]``, global in-degree.
        ell: int64 ``[n_core]``, owned (or, with ``count_halo_as_local``, local)
            in-neighbours of each owned node.
        seeds: int64, local ids of the training nodes of the seed chunks.
        seed_owned: bool ``[n_core]``, the node is in a seed chunk.
        io_bytes: bytes read from the store to build it (features in the dtype they are
            stored in).
        halo_chunk: int64 ``[n - n_core]``, the chunk of each halo node.
    """

    spec: PartitionSpec
    local2global: Tensor
    num_core: int
    indptr: Tensor
    indices: Tensor
    x: Tensor
    y: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    deg: Tensor
    ell: Tensor
    seeds: Tensor
    seed_owned: Tensor
    io_bytes: int
    halo_chunk: Tensor

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
    store: ChunkReader,
    spec: PartitionSpec,
    halo_hops: int = 1,
    count_halo_as_local: bool = False,
) -> IsolatedPartition:
    """Read the owned chunks, then the halo rows, and assemble the local graph
    (docs/systems/grappa.md, "Partitions")."""
    chunks = {c: store.load(c) for c in spec.owned_chunks}
    own = torch.cat([chunks[c]["nodes"] for c in spec.owned_chunks])
    order = own.argsort()
    own = own[order]
    cat = {
        k: torch.cat([chunks[c][k] for c in spec.owned_chunks])[order]
        for k in ("x", "y", "train_mask", "val_mask", "test_mask", "deg")
    }
    stored = cat["x"]  # as the chunks hold it; the partition holds the run's dtype
    cat["x"] = stored.to(store.dtype)
    seed_owned = torch.cat(
        [
            torch.full((chunks[c]["nodes"].numel(),), c in spec.seed_chunks)
            for c in spec.owned_chunks
        ]
    )[order]
    # in-edges of the owned nodes, in the new (sorted) node order
    seg_ptr, seg_src = [], []
    for c in spec.owned_chunks:
        seg_ptr.append(chunks[c]["indptr"])
        seg_src.append(chunks[c]["indices"])
    starts = torch.cat([p[:-1] + off for p, off in zip(seg_ptr, _offsets(seg_src))])[order]
    deg_local = cat["deg"]
    all_src = torch.cat(seg_src)
    offs = torch.arange(int(deg_local.sum())) - torch.repeat_interleave(
        torch.cumsum(deg_local, 0) - deg_local, deg_local
    )
    src = all_src[torch.repeat_interleave(starts, deg_local) + offs]
    owned_src = torch.isin(src, own)
    io = _nbytes(own, stored, *(cat[k] for k in cat if k != "x"), src)
    if halo_hops == 0:
        keep = owned_src
        halo = own.new_empty(0)
    elif halo_hops == 1:
        keep = torch.ones_like(owned_src)
        halo = torch.unique(src[~owned_src])
    else:
        raise ValueError(f"halo_hops={halo_hops} is not supported; valid: 0, 1")
    kept_deg = torch.zeros(own.numel(), dtype=torch.int64).index_add_(
        0, torch.repeat_interleave(torch.arange(own.numel()), deg_local), keep.long()
    )
    indptr = torch.zeros(own.numel() + halo.numel() + 1, dtype=torch.int64)
    torch.cumsum(kept_deg, 0, out=indptr[1 : own.numel() + 1])
    indptr[own.numel() + 1 :] = indptr[own.numel()]
    local2global = torch.cat([own, halo])
    src = src[keep]
    # halo rows from the other chunks' files
    hx = cat["x"].new_zeros((halo.numel(), cat["x"].shape[1]))
    hy = torch.full((halo.numel(),), -1, dtype=torch.int64)
    hdeg = torch.zeros(halo.numel(), dtype=torch.int64)
    hchunk = torch.full((halo.numel(),), -1, dtype=torch.int64)
    if halo.numel():
        for c in store.halo_sources(spec.owned_chunks):
            record = store.load(c)
            pos = torch.searchsorted(record["nodes"], halo).clamp(max=record["nodes"].numel() - 1)
            hit = (record["nodes"][pos] == halo).nonzero().flatten()
            rows = pos[hit]
            hx[hit] = record["x"][rows].to(hx.dtype)
            hy[hit], hdeg[hit] = record["y"][rows], record["deg"][rows]
            hchunk[hit] = c
            del record
        if (hchunk < 0).any():  # a chunk list that misses some (a directory's, say)
            lost = halo[hchunk < 0][:5].tolist()
            raise ValueError(
                f"halo nodes {lost}... of chunks {spec.owned_chunks} are in no chunk read"
            )
        io += _nbytes(halo, hy, hdeg) + hx.numel() * stored.element_size()
    part = IsolatedPartition(
        spec=spec,
        local2global=local2global,
        num_core=own.numel(),
        indptr=indptr,
        indices=src,  # mapped to local ids below
        x=torch.cat([cat["x"], hx]),
        y=torch.cat([cat["y"], hy]),
        train_mask=torch.cat([cat["train_mask"], torch.zeros(halo.numel(), dtype=torch.bool)]),
        val_mask=torch.cat([cat["val_mask"], torch.zeros(halo.numel(), dtype=torch.bool)]),
        test_mask=torch.cat([cat["test_mask"], torch.zeros(halo.numel(), dtype=torch.bool)]),
        deg=torch.cat([deg_local, hdeg]),
        ell=torch.zeros(0, dtype=torch.int64),
        seeds=(cat["train_mask"] & seed_owned).nonzero().flatten(),
        seed_owned=seed_owned,
        io_bytes=io,
        halo_chunk=hchunk,
    )
    part.indices = part.local_of(src)
    local_src_owned = part.indices < part.num_core
    dst = torch.repeat_interleave(torch.arange(own.numel()), kept_deg)
    counted = torch.ones_like(local_src_owned) if count_halo_as_local else local_src_owned
    part.ell = torch.zeros(own.numel(), dtype=torch.int64).index_add_(0, dst, counted.long())
    return part


def _offsets(segments: list[Tensor]) -> list[int]:
    out, total = [], 0
    for s in segments:
        out.append(total)
        total += s.numel()
    return out


class PartitionSampler:
    """Hash-keyed multi-hop sampling inside one partition (never leaves it).

    Args:
        part: the partition.
        fanouts: by hop from the seeds (PyG order); ``-1`` = every local in-edge.
        seed: base sampling seed.
    Blocks hold local ids; ``src_deg`` is the *global* in-degree (GCN normalisation as in
    full-graph evaluation). Keys hash global ids, so a partition holding a node's whole
    neighbourhood samples what the whole graph would.
    """

    def __init__(self, part: IsolatedPartition, fanouts: list[int], seed: int):
        self.part, self.fanouts, self.seed = part, list(fanouts), seed
        self.build_block = BlockBuilder(part.num_nodes, part.deg)

    def sample(self, seeds: Tensor, epoch: int, step: int, salt: int) -> list[Block]:
        key = SampleKey(self.seed, epoch, step, salt)
        frontier, blocks = seeds.to(torch.int64), []
        for hop, fanout in enumerate(self.fanouts):
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
