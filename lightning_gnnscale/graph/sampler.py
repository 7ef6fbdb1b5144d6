"""Hash-keyed neighbour sampling that returns blocks (docs/architecture.md, "One training step").

The neighbours kept for node ``v`` at ``(seed, epoch, step, hop, salt)`` depend only on those
keys, on ``v``'s id and on ``v``'s CSC segment. They never depend on which other nodes are in
the frontier or on which process samples ``v``. So sampling seeds in two halves and merging gives
exactly what sampling them together gives, and a split-parallel or partitioned system samples
edge for edge what one process would. Data-parallel baselines pass their rank as ``salt``.

Sampling rule per node of in-degree ``d`` and fanout ``k``: ``d <= k`` (or ``k == -1``) keeps
every in-edge; otherwise a uniform ``k``-subset without replacement. The subset is drawn with
Floyd's algorithm, vectorised over nodes (a Python loop over the ``k`` draws only), from hashed
random numbers, so a hop costs ``O(n k^2)`` however large the degrees are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .block import Block

_MASK64 = (1 << 64) - 1


def _signed(c: int) -> int:
    """A 64-bit unsigned constant as the int64 torch stores it."""
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shr(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64(x: Tensor) -> Tensor:
    """The splitmix64 finaliser on int64 tensors (two's-complement wrap-around arithmetic)."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def splitmix64_int(x: int) -> int:
    """Python-int twin of :func:`splitmix64`, for the scalar key."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


@dataclass(frozen=True)
class SampleKey:
    """What a sample depends on besides the graph: seed, epoch, step and a salt (rank for DP)."""

    seed: int
    epoch: int = 0
    step: int = 0
    salt: int = 0

    def hop_key(self, hop: int) -> int:
        """A 64-bit key for one hop, as a signed int64 value."""
        h = 0
        for part in (self.seed, self.epoch, self.step, self.salt, hop):
            h = splitmix64_int(h ^ (part & _MASK64))
        return _signed(h)


def uniform_below(h: Tensor, n: Tensor) -> Tensor:
    """Map hashes ``h`` to integers in ``[0, n)`` (Lemire's multiply-shift on the top 32 bits)."""
    return (_shr(h, 32) * n) >> 32


def sample_neighbors(
    indptr: Tensor,
    indices: Tensor,
    dst: Tensor,
    fanout: int,
    key: int,
    node_keys: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Sample in-edges of the ``dst`` nodes.

    Args:
        indptr, indices: CSC structure (int64).
        dst: int64 ``[n]`` node ids (unique) in this CSC.
        fanout: neighbours per node, ``-1`` for all.
        key: the hop key from :meth:`SampleKey.hop_key`.
        node_keys: the ids the hash is keyed on (default ``dst``). A partition sampling its local
            CSC passes the nodes' global ids, so it draws exactly what the whole graph would.

    Returns:
        ``(src, dst_pos)``: int64 ``[E_s]`` source ids (as stored in ``indices``) and the position
        in ``dst`` of each edge's destination, sorted by ``dst_pos``, and within one destination
        in the order of its CSC segment (by source id only where ``indices`` is sorted so, as
        ``Graph`` builds it; a relabelled CSC keeps the original segment order).
    """
    start = indptr.index_select(0, dst)
    deg = indptr.index_select(0, dst + 1) - start
    keep = deg if fanout < 0 else torch.clamp(deg, max=fanout)
    out_off = torch.cumsum(keep, 0) - keep
    total = int(keep.sum())
    eids = torch.empty(total, dtype=torch.int64)

    whole = keep == deg
    full = whole.nonzero().flatten()
    if full.numel():
        f_start, f_deg, f_off = start[full], deg[full], out_off[full]
        seg_first = torch.repeat_interleave(f_off, f_deg)
        within = torch.arange(seg_first.numel()) - torch.repeat_interleave(
            torch.cumsum(f_deg, 0) - f_deg, f_deg
        )
        eids.index_copy_(0, seg_first + within, torch.repeat_interleave(f_start, f_deg) + within)

    part = (~whole).nonzero().flatten()
    if part.numel():
        hashed = dst if node_keys is None else node_keys
        chosen = _floyd_subsets(hashed[part], deg[part], fanout, key)  # [m, k] sorted positions
        picked = (start[part].unsqueeze(1) + chosen).flatten()
        if part.numel() == dst.numel():  # every row sampled: slots are contiguous
            eids = picked
        else:
            slots = out_off[part].unsqueeze(1) + torch.arange(fanout)
            eids.index_copy_(0, slots.flatten(), picked)

    dst_pos = torch.repeat_interleave(torch.arange(dst.numel()), keep)
    return indices.index_select(0, eids), dst_pos


def _floyd_subsets(nodes: Tensor, deg: Tensor, k: int, key: int) -> Tensor:
    """Uniform ``k``-subsets of ``[0, deg)`` per row (all ``deg > k``), sorted; ``[m, k]``.

    Floyd: draw ``i`` is ``t_i`` in ``[0, j_i]`` with ``j_i = deg - k + i``; if ``t_i`` was
    already taken, take ``j_i`` instead. All draws are hashed at once; only the collision
    resolution is sequential.
    """
    steps = torch.arange(k)
    upper = deg.unsqueeze(1) - k + steps  # j_i, [m, k]
    draws = uniform_below(splitmix64(splitmix64(nodes ^ key).unsqueeze(1) + steps), upper + 1)
    chosen = draws.clone()
    for i in range(1, k):
        taken = (chosen[:, :i] == draws[:, i : i + 1]).any(1)
        chosen[:, i] = torch.where(taken, upper[:, i], draws[:, i])
    return chosen.sort(dim=1).values


class BlockBuilder:
    """Turns sampled edges into :class:`Block` s, deduplicating sources with a dense id table.

    The table (one int64 slot per node, reset after each use) replaces a sort of the sampled
    sources: building a block costs ``O(E_s)`` scatters plus one ``O(N)`` scan of a bool mask.

    Attributes:
        slot: int64 ``[N]`` the table, ``-1`` between uses.
        seen: bool ``[N]`` the mask, all ``False`` between uses (a subclass that orders the
            sources differently reuses both).
    """

    def __init__(self, num_nodes: int, degree: Tensor):
        self.degree = degree
        self.slot = torch.full((num_nodes,), -1, dtype=torch.int64)
        self.seen = torch.zeros(num_nodes, dtype=torch.bool)

    def __call__(self, dst: Tensor, src: Tensor, dst_pos: Tensor) -> Block:
        """Sources are ``dst`` followed by the ids new in ``src``, in increasing id order;
        edges in ``src``'s order."""
        slot, seen = self.slot, self.seen
        n_dst = dst.numel()
        slot.index_copy_(0, dst, torch.arange(n_dst))
        seen.index_fill_(0, src, True)
        seen.index_fill_(0, dst, False)
        new_ids = seen.nonzero().flatten()
        seen.index_fill_(0, new_ids, False)
        slot.index_copy_(0, new_ids, torch.arange(n_dst, n_dst + new_ids.numel()))
        edge_index = torch.stack([slot.index_select(0, src), dst_pos])
        src_ids = torch.cat([dst, new_ids])
        slot.index_fill_(0, src_ids, -1)
        return Block(
            src_ids=src_ids,
            num_dst=n_dst,
            edge_index=edge_index,
            src_deg=self.degree.index_select(0, src_ids),
        )


def build_block_sorted(dst: Tensor, src: Tensor, dst_pos: Tensor, src_deg=None) -> Block:
    """:class:`BlockBuilder`'s block without its ``[N]`` tables: sources deduplicated by a sort
    (``O(E_s log E_s)``), for a rank that holds no global array. ``src_deg``:
    ``fn(src_ids) -> degrees``; ``None`` leaves zeros for the caller to fill
    (``dataclasses.replace``)."""
    n_dst = dst.numel()
    candidates = torch.unique(src)  # sorted
    new_ids = candidates[~torch.isin(candidates, dst)]
    src_ids = torch.cat([dst, new_ids])
    order = torch.argsort(src_ids)
    position = order[torch.searchsorted(src_ids[order], src)]
    degree = torch.zeros_like(src_ids) if src_deg is None else src_deg(src_ids)
    return Block(src_ids, n_dst, torch.stack([position, dst_pos]), degree)


def build_block_carried(
    dst: Tensor, dst_deg: Tensor, src: Tensor, dst_pos: Tensor, src_deg: Tensor
) -> Block:
    """:func:`build_block_sorted`'s block (equal to :class:`BlockBuilder`'s) whose degrees
    travel with the ids: ``dst_deg`` ``[n_dst]`` of the destinations and ``src_deg``
    ``[E_s]`` of each sampled source, as the sources' owners answered them (a rank that holds
    no ``[N]`` degree array, ByteGNN from a partition directory)."""
    n_dst = dst.numel()
    candidates, inverse = torch.unique(src, return_inverse=True)  # sorted
    candidate_deg = torch.zeros_like(candidates).scatter_(0, inverse, src_deg)
    new = ~torch.isin(candidates, dst)
    src_ids = torch.cat([dst, candidates[new]])
    order = torch.argsort(src_ids)
    position = order[torch.searchsorted(src_ids[order], src)]
    degree = torch.cat([dst_deg, candidate_deg[new]])
    return Block(src_ids, n_dst, torch.stack([position, dst_pos]), degree)


def drop_excluded(
    src: Tensor,
    dst_pos: Tensor,
    dst_ids: Tensor,
    src_ids: Tensor,
    num_nodes: int,
    exclude: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """The sampled edges ``(src, dst_pos)`` of :func:`sample_neighbors` without those whose key
    ``dst * N + src`` is in ``exclude`` (sorted int64; ``None`` or empty: all kept), the key
    taken in the ids ``dst_ids[dst_pos]`` and ``src_ids`` (``[E_s]``, e.g. original ids of a
    relabelled graph). GraphStorm's exclusion of a step's target pairs, after sampling."""
    if exclude is None or exclude.numel() == 0:
        return src, dst_pos
    keys = dst_ids[dst_pos] * num_nodes + src_ids
    at = torch.searchsorted(exclude, keys).clamp_(max=exclude.numel() - 1)
    kept = exclude[at] != keys
    return src[kept], dst_pos[kept]


class NeighborSampler:
    """Multi-hop hash-keyed sampler producing a list of blocks, input layer first.

    Args:
        indptr, indices: CSC structure of the graph (int64).
        fanouts: neighbours per node by hop *from the seeds* (``[15, 10, 5]``: seeds keep 15);
            ``-1`` keeps the full neighbourhood.
        seed: base seed of every key.
    """

    def __init__(self, indptr: Tensor, indices: Tensor, fanouts: list[int], seed: int = 0):
        if not fanouts:
            raise ValueError("fanouts must list at least one hop")
        bad = [f for f in fanouts if f == 0 or f < -1]
        if bad:
            raise ValueError(f"fanouts must be positive or -1 (full), got {list(fanouts)}")
        self.indptr = indptr
        self.indices = indices
        self.fanouts = list(fanouts)
        self.seed = seed
        self.build_block = BlockBuilder(indptr.numel() - 1, indptr[1:] - indptr[:-1])

    def sample(
        self,
        seeds: Tensor,
        epoch: int = 0,
        step: int = 0,
        salt: int = 0,
        exclude: Tensor | None = None,
    ) -> list[Block]:
        """Sample the blocks of one mini-batch; ``blocks[-1].dst_ids == seeds``. ``exclude``:
        sorted int64 keys ``dst * N + src`` of edges left out of every block after sampling
        (GraphStorm's exclusion of a step's target pairs)."""
        key = SampleKey(self.seed, epoch, step, salt)
        frontier = seeds.to(torch.int64)
        blocks = []
        num_nodes = self.indptr.numel() - 1
        for hop, fanout in enumerate(self.fanouts):
            src, dst_pos = sample_neighbors(
                self.indptr, self.indices, frontier, fanout, key.hop_key(hop)
            )
            src, dst_pos = drop_excluded(src, dst_pos, frontier, src, num_nodes, exclude)
            block = self.build_block(frontier, src, dst_pos)
            blocks.append(block)
            frontier = block.src_ids
        return blocks[::-1]
