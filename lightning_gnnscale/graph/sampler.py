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
from .csc import relation_indptr

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
    eids, dst_pos = sample_edge_ids(indptr, dst, fanout, key, node_keys)
    return indices.index_select(0, eids), dst_pos


def sample_edge_ids(
    indptr: Tensor, dst: Tensor, fanout: int, key: int, node_keys: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """:func:`sample_neighbors`'s draw as CSC positions: ``(eids, dst_pos)``, int64 ``[E_s]``
    (the sources are ``indices[eids]``; a typed graph's relations ``edge_type[eids]``)."""
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
    return eids, dst_pos


def sample_typed_edge_ids(
    slot_indptr: Tensor,
    dst: Tensor,
    fanouts: tuple[int, ...],
    key: int,
    node_keys: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-relation sampling of a typed CSC: ``fanouts[r]`` in-edges of each ``dst`` node under
    relation ``r`` (``-1``: all), as DGL's and PyG's heterogeneous samplers draw.

    ``slot_indptr`` is the CSC over ``(node, relation)`` slots (:meth:`~.csc.Graph.
    relation_indptr`, ``[N * R + 1]``); slot ``v * R + r`` is sampled as one node of
    :func:`sample_edge_ids`, its hash keyed on ``node_keys[i] * R + r`` (``node_keys``:
    ``dst`` by default, the global ids where a partition samples its local CSC), so with one
    relation this is :func:`sample_edge_ids` itself. Returns ``(eids, dst_pos)`` sorted by
    ``dst_pos``, and within one destination by relation, then in segment order.
    """
    num_relations = len(fanouts)
    if num_relations == 1:
        return sample_edge_ids(slot_indptr, dst, fanouts[0], key, node_keys)
    hashed = dst if node_keys is None else node_keys
    parts = []
    for fanout in sorted(set(fanouts)):  # one draw per distinct fanout (bounded by R)
        relations = torch.tensor([r for r, f in enumerate(fanouts) if f == fanout])
        slots = (dst.unsqueeze(1) * num_relations + relations).flatten()
        keys = (hashed.unsqueeze(1) * num_relations + relations).flatten()
        eids, at = sample_edge_ids(slot_indptr, slots, fanout, key, keys)
        # the slot's position in the (destination, relation) order of every relation's slots
        order = (at // relations.numel()) * num_relations + relations[at % relations.numel()]
        parts.append((eids, order))
    eids = torch.cat([e for e, _ in parts])
    order = torch.cat([o for _, o in parts])
    if len(parts) > 1:
        by_slot = torch.sort(order, stable=True).indices
        eids, order = eids[by_slot], order[by_slot]
    return eids, order // num_relations


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

    def __call__(
        self, dst: Tensor, src: Tensor, dst_pos: Tensor, edge_type: Tensor | None = None
    ) -> Block:
        """Sources are ``dst`` followed by the ids new in ``src``, in increasing id order;
        edges in ``src``'s order (``edge_type``: their relations, a typed graph's)."""
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
            edge_type=edge_type,
        )


def build_block_sorted(
    dst: Tensor, src: Tensor, dst_pos: Tensor, src_deg=None, edge_type: Tensor | None = None
) -> Block:
    """:class:`BlockBuilder`'s block without its ``[N]`` tables: sources deduplicated by a sort
    (``O(E_s log E_s)``), for a rank that holds no global array. ``src_deg``:
    ``fn(src_ids) -> degrees``; ``None`` leaves zeros for the caller to fill
    (``dataclasses.replace``). ``edge_type``: the edges' relations (a typed graph's)."""
    n_dst = dst.numel()
    candidates = torch.unique(src)  # sorted
    new_ids = candidates[~torch.isin(candidates, dst)]
    src_ids = torch.cat([dst, new_ids])
    order = torch.argsort(src_ids)
    position = order[torch.searchsorted(src_ids[order], src)]
    degree = torch.zeros_like(src_ids) if src_deg is None else src_deg(src_ids)
    return Block(src_ids, n_dst, torch.stack([position, dst_pos]), degree, edge_type)


def build_block_carried(
    dst: Tensor,
    dst_deg: Tensor,
    src: Tensor,
    dst_pos: Tensor,
    src_deg: Tensor,
    edge_type: Tensor | None = None,
) -> Block:
    """:func:`build_block_sorted`'s block (equal to :class:`BlockBuilder`'s) whose degrees
    travel with the ids: ``dst_deg`` ``[n_dst]`` of the destinations and ``src_deg``
    ``[E_s]`` of each sampled source, as the sources' owners answered them (a rank that holds
    no ``[N]`` degree array, ByteGNN from a partition directory). ``edge_type``: the edges'
    relations (a typed graph's)."""
    n_dst = dst.numel()
    candidates, inverse = torch.unique(src, return_inverse=True)  # sorted
    candidate_deg = torch.zeros_like(candidates).scatter_(0, inverse, src_deg)
    new = ~torch.isin(candidates, dst)
    src_ids = torch.cat([dst, candidates[new]])
    order = torch.argsort(src_ids)
    position = order[torch.searchsorted(src_ids[order], src)]
    degree = torch.cat([dst_deg, candidate_deg[new]])
    return Block(src_ids, n_dst, torch.stack([position, dst_pos]), degree, edge_type)


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
    kept = kept_edges(dst_ids[dst_pos], src_ids, num_nodes, exclude)
    return src[kept], dst_pos[kept]


def kept_edges(dst: Tensor, src: Tensor, num_nodes: int, exclude: Tensor) -> Tensor:
    """bool ``[E_s]``: the edges ``src -> dst`` whose key ``dst * N + src`` is not in
    ``exclude`` (sorted int64, not empty)."""
    keys = dst * num_nodes + src
    at = torch.searchsorted(exclude, keys).clamp_(max=exclude.numel() - 1)
    return exclude[at] != keys


class NeighborSampler:
    """Multi-hop hash-keyed sampler producing a list of blocks, input layer first.

    Args:
        indptr, indices: CSC structure of the graph (int64).
        fanouts: neighbours per node by hop *from the seeds* (``[15, 10, 5]``: seeds keep 15);
            ``-1`` keeps the full neighbourhood.
        seed: base seed of every key.
        edge_type: a typed graph's relation per edge ``[E]`` (its segments sorted by
            relation, :class:`~.csc.Graph`); ``None``: homogeneous.
        relation_fanouts: with ``edge_type``, per hop the fanout of every relation
            (``[(10, 5), (10, 5)]`` for two relations); default ``fanouts[hop]`` for each.
        num_relations: ``R`` of ``edge_type``.
    """

    def __init__(
        self,
        indptr: Tensor,
        indices: Tensor,
        fanouts: list[int],
        seed: int = 0,
        edge_type: Tensor | None = None,
        relation_fanouts: list[tuple[int, ...]] | None = None,
        num_relations: int = 1,
    ):
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
        self.edge_type = edge_type
        self.relation_fanouts, self.slot_indptr = relation_plan(
            indptr, edge_type, self.fanouts, relation_fanouts, num_relations
        )

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
            if self.edge_type is None:
                src, dst_pos = sample_neighbors(
                    self.indptr, self.indices, frontier, fanout, key.hop_key(hop)
                )
                src, dst_pos = drop_excluded(src, dst_pos, frontier, src, num_nodes, exclude)
                block = self.build_block(frontier, src, dst_pos)
            else:
                eids, dst_pos = sample_typed_edge_ids(
                    self.slot_indptr, frontier, self.relation_fanouts[hop], key.hop_key(hop)
                )
                if exclude is not None and exclude.numel():
                    kept = kept_edges(frontier[dst_pos], self.indices[eids], num_nodes, exclude)
                    eids, dst_pos = eids[kept], dst_pos[kept]
                src = self.indices.index_select(0, eids)
                block = self.build_block(frontier, src, dst_pos, self.edge_type[eids])
            blocks.append(block)
            frontier = block.src_ids
        return blocks[::-1]


def relation_plan(
    indptr: Tensor,
    edge_type: Tensor | None,
    fanouts: list[int],
    relation_fanouts: list[tuple[int, ...]] | None,
    num_relations: int,
) -> tuple[list[tuple[int, ...]] | None, Tensor | None]:
    """A typed CSC's sampling plan: every relation's fanout per hop (``relation_fanouts``,
    default ``fanouts[hop]`` for each, checked) and the (node, relation) slots' CSC
    (:func:`~.csc.relation_indptr`); ``(None, None)`` for a homogeneous one."""
    if edge_type is None:
        return None, None
    plan = check_relation_fanouts(
        relation_fanouts or [(f,) * num_relations for f in fanouts], len(fanouts), num_relations
    )
    return plan, relation_indptr(indptr, edge_type, num_relations)


def check_relation_fanouts(
    relation_fanouts: list[tuple[int, ...]], hops: int, num_relations: int
) -> list[tuple[int, ...]]:
    """``relation_fanouts`` as a list of ``hops`` tuples of ``num_relations`` fanouts, each
    ``> 0`` or ``-1``; anything else is refused."""
    out = [tuple(int(f) for f in hop) for hop in relation_fanouts]
    if len(out) != hops or any(len(hop) != num_relations for hop in out):
        raise ValueError(
            f"relation fanouts must give {hops} hops of {num_relations} relations, got {out}"
        )
    if any(f == 0 or f < -1 for hop in out for f in hop):
        raise ValueError(f"relation fanouts must be positive or -1 (full), got {out}")
    return out
