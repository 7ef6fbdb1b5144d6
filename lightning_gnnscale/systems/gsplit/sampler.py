"""GSplit's split-parallel sampling and the per-layer shuffle.

One global mini-batch per step is split by the partition map ``parts``: rank r samples only
the frontier vertices it owns. After every hop the new block's sources (the "mixed frontier"
M) are split by owner (one id all-to-all, ``structure``): each owner learns which of its
vertices other ranks need, and those become its next frontier D. The same exchange, reversed,
is the plan of the shuffle that runs before each layer. The first shuffle moves raw input
rows of boundary vertices (``feature``; the inputs need no gradient, so it has no backward);
the later ones move hidden rows (``activation`` forward, ``activation_grad`` backward). No
vertex is sampled, loaded or computed on two ranks, and the hash-keyed sampler draws exactly
what one process draws for the whole mini-batch (docs/systems/gsplit.md#split-parallel-sampling,
docs/systems/gsplit.md#shuffle).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ...comm import Comm, OwnerRoute, exchange_rows
from ...graph.block import Block
from ...graph.book import RangeBook
from ...graph.csc_rows import CSCRows
from ...graph.sampler import BlockBuilder, SampleKey, build_block_sorted


@dataclass(frozen=True)
class LayerPlan:
    """How rows move before one layer.

    Attributes:
        send_index: int64 rows of the owner's local set ``D`` to send, grouped by requesting rank.
        send_splits: rows sent to each rank (forward).
        recv_splits: rows received from each rank (forward).
        recv_order: int64 ``[|M|]``; received row ``j`` is mixed-frontier position
            ``recv_order[j]`` (received rows come grouped by owner rank).
    """

    send_index: Tensor
    send_splits: list[int]
    recv_splits: list[int]
    recv_order: Tensor

    def to(self, device) -> LayerPlan:
        return LayerPlan(
            self.send_index.to(device),
            self.send_splits,
            self.recv_splits,
            self.recv_order.to(device),
        )

    def rows_from_others(self, rank: int) -> int:
        """Rows that ``rank`` receives from the other ranks in the forward shuffle."""
        return sum(self.recv_splits) - self.recv_splits[rank]


def shuffle_category(layer: int) -> str:
    """Meter category of the forward shuffle before ``layer``: the rows entering layer 0 are
    input features (``feature``), later ones hidden rows (``activation``)."""
    return "feature" if layer == 0 else "activation"


def shuffle(h: Tensor, plan: LayerPlan, comm: Comm, layer: int) -> Tensor:
    """Rows of the owner's ``D`` (``h``, ``[|D|, d]``) -> rows of this rank's mixed frontier
    ``[|M|, d]`` before layer ``layer``; autograd sends the gradient rows back to their owners
    (``activation_grad``). Before layer 0 ``h`` holds input features, which need no gradient
    on any rank, so that shuffle has no backward exchange."""
    received = exchange_rows(
        h,
        plan.send_index,
        plan.send_splits,
        plan.recv_splits,
        comm,
        category=shuffle_category(layer),
        grad_category="activation_grad",
    )
    inverse = torch.empty_like(plan.recv_order)
    inverse[plan.recv_order] = torch.arange(plan.recv_order.numel(), device=inverse.device)
    return received.index_select(0, inverse)


class OwnerOrderBuilder(BlockBuilder):
    """:class:`~...graph.sampler.BlockBuilder` whose non-destination sources come in
    (owner, id) order: the order a partition directory's relabelled ids have, so both paths
    build the same blocks with no per-hop sort. The seen-mask is indexed by each vertex's
    position in that order (``rank``, an ``[N]`` permutation computed once), so its scan yields
    the new sources already ordered; two gathers replace the sort.

    Args:
        parts: int64 ``[N]`` owner of every vertex.
        degree: int64 ``[N]`` in-degrees.
    """

    def __init__(self, parts: Tensor, degree: Tensor):
        super().__init__(parts.numel(), degree)
        self.unrank = torch.argsort(parts, stable=True)  # position -> id: (owner, id) order
        self.rank = torch.empty_like(self.unrank)
        self.rank[self.unrank] = torch.arange(self.unrank.numel())

    def __call__(
        self, dst: Tensor, src: Tensor, dst_pos: Tensor, edge_type: Tensor | None = None
    ) -> Block:
        slot, seen = self.slot, self.seen
        n_dst = dst.numel()
        slot.index_copy_(0, dst, torch.arange(n_dst))
        seen.index_fill_(0, self.rank.index_select(0, src), True)
        seen.index_fill_(0, self.rank.index_select(0, dst), False)
        new_pos = seen.nonzero().flatten()
        seen.index_fill_(0, new_pos, False)
        new_ids = self.unrank.index_select(0, new_pos)
        slot.index_copy_(0, new_ids, torch.arange(n_dst, n_dst + new_ids.numel()))
        edge_index = torch.stack([slot.index_select(0, src), dst_pos])
        src_ids = torch.cat([dst, new_ids])
        slot.index_fill_(0, src_ids, -1)
        return Block(src_ids, n_dst, edge_index, self.degree.index_select(0, src_ids), edge_type)


class SplitSampler:
    """Split-parallel sampler (collective: all ranks call ``sample`` for every step).

    Args:
        comm: the data-exchange ``Comm``.
        parts: the split function ``f``: int64 ``[N]`` owner rank of every vertex, or a
            :class:`RangeBook` when every rank's vertices are one contiguous id range (a
            partition directory).
        topology: the CSC rows this rank holds: every vertex's (``topology: replicated``) or
            only its own (``partitioned``); only own rows are ever read.
        fanouts: by hop from the targets.
        seed: base of the sampling keys (the same keys as ``single``).
        node_keys: ``ids -> ids`` the sampling hash is keyed on, for a frontier of this rank's
            vertices (a relabelled graph passes the original ids); default the ids themselves.
        relation_fanouts: a typed graph's fanout of every relation per hop (``topology``
            carries the relations); each hop then samples per relation
            (:meth:`~...graph.csc_rows.CSCRows.sample_typed`) and the blocks carry
            ``edge_type``. ``None``: homogeneous.
    """

    def __init__(
        self,
        comm: Comm,
        parts: Tensor | RangeBook,
        topology: CSCRows,
        fanouts: list[int],
        seed: int,
        node_keys: Callable[[Tensor], Tensor] | None = None,
        relation_fanouts: list[tuple[int, ...]] | None = None,
    ):
        self.comm, self.parts, self.topology = comm, parts, topology
        self.fanouts, self.seed = list(fanouts), seed
        self.node_keys = node_keys
        if relation_fanouts is not None:
            if topology.edge_type is None:
                raise ValueError("relation fanouts need CSC rows that carry relations")
            if len(relation_fanouts) != len(self.fanouts):
                raise ValueError(
                    f"relation fanouts give {len(relation_fanouts)} hops, fanouts "
                    f"{len(self.fanouts)}"
                )
        elif topology.edge_type is not None:
            raise ValueError("CSC rows with relations need relation fanouts (a typed graph's)")
        self.relation_fanouts = relation_fanouts
        # Both builders give the non-destination sources in (owner, id) order: the relabelled
        # ids' own order from a directory, the owner-ranked seen-mask's in memory.
        if isinstance(parts, RangeBook):  # no [N] table: sources deduplicated by a sort
            self.build_block = lambda dst, src, dst_pos, edge_type=None: build_block_sorted(
                dst, src, dst_pos, topology.degree, edge_type
            )
        else:
            degree = topology.degree(torch.arange(parts.numel()))
            self.build_block = OwnerOrderBuilder(parts, degree)

    def owner(self, ids: Tensor) -> Tensor:
        """The rank that owns each of ``ids``."""
        if isinstance(self.parts, RangeBook):
            return self.parts.nid2part(ids)
        return self.parts.index_select(0, ids)

    def split(self, mixed: Tensor) -> tuple[Tensor, LayerPlan]:
        """Owner split of the mixed frontier ``mixed``: ``(D, plan)``, ``D`` this rank's sorted
        vertices that some rank needs."""
        route = OwnerRoute.build(self.comm, mixed, self.owner(mixed), category="structure")
        local, send_index = torch.unique(route.served, sorted=True, return_inverse=True)
        return local, LayerPlan(send_index, route.recv_splits, route.send_splits, route.order)

    def sample(
        self, targets: Tensor, epoch: int, step: int
    ) -> tuple[list[Block], list[LayerPlan], Tensor]:
        """``(blocks, plans, inputs)``: blocks input layer first (``blocks[-1]`` has this rank's
        sorted ``targets`` as destinations), ``plans[i]`` the shuffle before layer ``i``, and
        ``inputs`` the sorted vertices whose features this rank loads."""
        key = SampleKey(self.seed, epoch, step)
        frontier = torch.sort(targets.to(torch.int64)).values
        blocks, plans = [], []
        for hop, fanout in enumerate(self.fanouts):
            keys = None if self.node_keys is None else self.node_keys(frontier)
            if self.relation_fanouts is None:
                src, dst_pos = self.topology.sample(frontier, fanout, key.hop_key(hop), keys)
                types = None
            else:  # per relation, keyed as the whole typed graph's sampler keys it
                src, dst_pos, types = self.topology.sample_typed(
                    frontier, self.relation_fanouts[hop], key.hop_key(hop), keys
                )
            # sources in (owner, id) order
            block = self.build_block(frontier, src, dst_pos, types)
            frontier, plan = self.split(block.src_ids)
            blocks.append(block)
            plans.append(plan)
        return blocks[::-1], plans[::-1], frontier
