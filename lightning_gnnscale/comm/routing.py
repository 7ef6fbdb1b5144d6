"""Owner routing: send requests (ids) to the ranks that own them and bring the answers back.

The pattern "group my ids by owner rank, exchange the counts, all-to-all the ids, serve them,
all-to-all the answers back and put them in my request order" as one named primitive. Build an
:class:`OwnerRoute` with :meth:`OwnerRoute.build` (collective), serve ``route.served`` on the
owner side, then move data along the route:

- :meth:`OwnerRoute.reply`: one fixed-width answer row per request, back in request order;
- :meth:`OwnerRoute.reply_varlen`: a variable number of answer rows per request (counts first,
  then the payload), back in request order;
- :meth:`OwnerRoute.push`: rows that travel *with* the requests, to the owners.

Every method is collective: all ranks call it in the same order, also a rank with no ids.
Bytes are counted by ``Comm`` (a rank's own chunk is never counted), so a route costs exactly
what the hand-written exchange costs: the count exchange is ``control`` (8 B per peer), the ids
are counted under the category given to ``build`` (usually ``structure``) and the answers
under the category given to each method.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_gnnscale.comm.collectives import Comm


def _per_peer_sums(counts: Tensor, splits: list[int]) -> list[int]:
    """Sum of ``counts`` over each consecutive run of ``splits[q]`` entries, one per peer."""
    peer = torch.repeat_interleave(
        torch.arange(len(splits), device=counts.device),
        torch.tensor(splits, dtype=torch.int64, device=counts.device),
    )
    sums = torch.zeros(len(splits), dtype=torch.int64, device=counts.device)
    return sums.index_add_(0, peer, counts.to(torch.int64)).tolist()


@dataclass(frozen=True)
class OwnerRoute:
    """Where every request of this rank went, and which requests this rank serves.

    Attributes:
        order: int64 ``[n]`` request positions grouped by owner rank (stable: request order
            within an owner); the ids went out as ``ids[order]``.
        send_splits: ``world_size`` counts, requests this rank sent to each owner.
        recv_splits: ``world_size`` counts, requests this rank serves for each requester.
        served: ``[sum(recv_splits)]`` the ids this rank must answer, grouped by requesting
            rank in rank order, each requester's ids in its request order.
    """

    order: Tensor
    send_splits: list[int]
    recv_splits: list[int]
    served: Tensor

    @classmethod
    def build(
        cls, comm: Comm, ids: Tensor, owners: Tensor, *, category: str = "structure"
    ) -> OwnerRoute:
        """Send ``ids`` to their ``owners``. Collective.

        Args:
            comm: the metered communicator.
            ids: ``[n]`` requests (any dtype; usually int64 node ids), any order, duplicates
                and this rank's own ids allowed, possibly empty. Duplicates are sent as many
                times as they occur: deduplicate first to send each id once.
            owners: int64 ``[n]`` owner rank of each id, in ``[0, world_size)``.
            category: meter category of the ids.

        Meters: ``control`` for the count exchange (8 B per peer), then ``ids`` bytes sent to
        each peer under ``category``.
        """
        if owners.shape != ids.shape[:1]:
            raise ValueError(f"owners {tuple(owners.shape)} do not match ids {tuple(ids.shape)}")
        owners = owners.to(torch.int64)
        order = torch.argsort(owners, stable=True)
        send_splits = torch.bincount(owners, minlength=comm.world_size).tolist()
        recv_splits = comm.exchange_splits(send_splits)
        served = comm.all_to_all_single(ids[order], send_splits, recv_splits, category=category)
        return cls(order, send_splits, recv_splits, served)

    @property
    def num_requests(self) -> int:
        return self.order.numel()

    def _to_request_order(self, grouped: Tensor) -> Tensor:
        """Rows ``[n, ...]`` grouped by owner -> the same rows in request order."""
        out = grouped.new_empty(grouped.shape)
        out[self.order] = grouped
        return out

    def reply(self, comm: Comm, rows: Tensor, *, category: str) -> Tensor:
        """Answer every served request with one row; return this rank's answers in request
        order. Collective.

        Args:
            rows: ``[len(served), ...]`` the answer to ``served[i]`` at row ``i`` (any trailing
                shape and dtype, the same on every rank).

        Returns:
            ``[n, ...]``: row ``i`` answers ``ids[i]`` of :meth:`build`.

        Meters: the answer rows sent to each peer under ``category``.
        """
        received = comm.all_to_all_single(
            rows, self.recv_splits, self.send_splits, category=category
        )
        return self._to_request_order(received)

    def reply_varlen(
        self, comm: Comm, counts: Tensor, values: Tensor, *, category: str
    ) -> tuple[Tensor, Tensor]:
        """Answer every served request with a variable number of rows; return
        ``(counts, values)`` in request order. Collective.

        Args:
            counts: int64 ``[len(served)]`` rows answering each served request.
            values: ``[counts.sum(), ...]`` the answer rows, request after request in
                ``served`` order.

        Returns:
            ``counts`` int64 ``[n]`` rows answering ``ids[i]`` of :meth:`build`, and
            ``values`` ``[counts.sum(), ...]`` those rows, ``ids[0]``'s first.

        Meters: the counts (8 B each), then the answer rows sent to each peer, both under
        ``category``. Each peer's payload size follows from the counts, so no extra count
        exchange is needed.
        """
        counts = counts.to(torch.int64)
        if counts.shape != (sum(self.recv_splits),):
            raise ValueError(f"need {sum(self.recv_splits)} counts, got {tuple(counts.shape)}")
        if int(counts.sum()) != values.shape[0]:
            raise ValueError(f"counts sum to {int(counts.sum())}, values has {values.shape[0]}")
        grouped_counts = comm.all_to_all_single(
            counts, self.recv_splits, self.send_splits, category=category
        )
        values_back = comm.all_to_all_single(
            values,
            _per_peer_sums(counts, self.recv_splits),
            _per_peer_sums(grouped_counts, self.send_splits),
            category=category,
        )
        request_counts = self._to_request_order(grouped_counts)
        # Value j of the grouped layout belongs to grouped request k; it moves to the start of
        # request order[k]'s run in request order plus its offset within the run.
        grouped_start = torch.cumsum(grouped_counts, 0) - grouped_counts
        request_start = torch.cumsum(request_counts, 0) - request_counts
        device = grouped_counts.device
        k = torch.repeat_interleave(torch.arange(self.num_requests, device=device), grouped_counts)
        within = torch.arange(values_back.shape[0], device=device) - grouped_start[k]
        out = values_back.new_empty(values_back.shape)
        out[request_start[self.order[k]] + within] = values_back
        return request_counts, out

    def push(self, comm: Comm, rows: Tensor, *, category: str) -> Tensor:
        """Send one row per request, alongside the requests, to the owners. Collective.

        Args:
            rows: ``[n, ...]`` row ``i`` goes with ``ids[i]`` of :meth:`build`.

        Returns:
            ``[len(served), ...]``: the rows this rank received, row ``i`` with ``served[i]``.

        Meters: the rows sent to each peer under ``category``.
        """
        return comm.all_to_all_single(
            rows[self.order], self.send_splits, self.recv_splits, category=category
        )
