"""Metered collectives: every byte another rank receives is counted by the sending rank's meter.

Counting conventions (bytes are payload bytes; a rank's own "self" chunk is never counted;
one message per non-empty send to one peer; link class from the topology):

- ``all_to_all_single``: exactly the bytes of each peer's chunk.
- ``all_gather_*``: this rank's chunk to every peer (``all_gather_varlen``: only the real rows,
  not the padding, plus the size exchange as ``control``).
- ``gather_varlen``: every rank but ``dst`` sends its real rows (not the padding) to ``dst`` in
  one message; ``dst`` sends no payload. The size exchange (an all-gather, as in
  ``all_gather_varlen``) is ``control``.
- ``broadcast``: the source sends the tensor to every peer; the other ranks send nothing.
- ``all_reduce``: ring model. Each rank sends ``2 (P-1) / P * nbytes`` (rounded down) in
  ``2 (P-1)`` messages to its ring successor ``(rank + 1) % P``, and is charged that link class.
  Between two ranks a small CPU tensor is reduced by an all-gather instead (see
  :meth:`Comm.all_reduce`): the same ``nbytes`` per rank, in one message to the peer.
- ``barrier`` carries no payload and counts nothing.

With world size 1 every method is a local no-op that counts nothing (results may then alias
the input), so single-process code runs the same path as distributed code.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.futures import Future

from lightning_gnnscale.comm.audit import bookkeeping_call, metered_call
from lightning_gnnscale.comm.meter import (
    CommMeter,
    check_category,
    snapshot_from_vector,
    snapshot_to_vector,
    sum_snapshots,
)
from lightning_gnnscale.comm.topology import Topology

REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}
_INT64_BYTES = 8
# Element counts for which two ranks reduce a CPU tensor by all-gather + local reduction. On one
# host (docs/benchmarks.md) gloo's all-reduce took 1.7-2.4 ms from 16 to 50,000 elements and its
# all-gather about 1 ms; at 1 element the all-reduce won (0.36 ms), at 100,000 they were even and
# at 262,144 the all-reduce won. The window keeps clear of both ends.
GATHER_REDUCE_ELEMENTS = (64, 65_536)
_LOCAL_REDUCE = {"sum": torch.sum, "max": torch.amax, "min": torch.amin, "product": torch.prod}


def _write_back(tensor: Tensor, result: Tensor) -> Tensor:
    """``tensor`` holding ``result`` (in place, as ``dist.all_reduce`` leaves it, also for
    inference tensors and leaves that require grad); no copy when ``result`` is ``tensor``."""
    if result is not tensor:
        with torch.inference_mode(tensor.is_inference()):
            tensor.detach().copy_(result)
    return tensor


def ring_allreduce_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce of ``nbytes``: ``2 (P-1) / P * nbytes``."""
    return 2 * (world_size - 1) * nbytes // world_size


def _row_bytes(tensor: Tensor) -> int:
    """Bytes of one row (a slice along dim 0), also when there are no rows."""
    return math.prod(tensor.shape[1:]) * tensor.element_size()


def _all_gather_into(output: Tensor, tensor: Tensor, group: Any, async_op: bool = False) -> Any:
    """Every rank's ``tensor`` into ``output`` (``[P * n, ...]``, rank order); the work handle."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, tensor, group=group, async_op=async_op)


class Comm:
    """A process group plus the meter, topology and rank that every metered collective needs.

    Build it with ``Comm.create`` (distributed, dedicated group) or ``Comm.local`` (one process).
    ``group=None`` means the default (world) group.
    """

    def __init__(
        self,
        meter: CommMeter,
        topology: Topology,
        rank: int = 0,
        group: Any = None,
        timeout: timedelta | None = None,
    ) -> None:
        self.meter = meter
        self.topology = topology
        self.rank = rank
        self.world_size = topology.world_size
        self.group = group
        self.timeout = timeout
        self._peer_links = topology.peer_link_classes(rank)
        self._successor_link = (
            topology.link_class(rank, (rank + 1) % self.world_size) if self.world_size > 1 else None
        )

    @classmethod
    def local(cls, meter: CommMeter | None = None) -> Comm:
        """A world-size-1 ``Comm``: every collective is a no-op that counts nothing."""
        return cls(meter if meter is not None else CommMeter(), Topology.single())

    @classmethod
    def create(
        cls,
        meter: CommMeter | None = None,
        topology: Topology | None = None,
        backend: str | None = None,
        timeout_s: float = 300.0,
    ) -> Comm:
        """A ``Comm`` on a new dedicated group over all ranks, or ``Comm.local`` when
        ``torch.distributed`` is not initialised. Collective: call it on every rank in the same
        order. ``topology`` defaults to all ranks on one server."""
        meter = meter if meter is not None else CommMeter()
        if not (dist.is_available() and dist.is_initialized()):
            return cls.local(meter)
        world_size, rank = dist.get_world_size(), dist.get_rank()
        topology = topology or Topology(world_size, world_size)
        if topology.world_size != world_size:
            raise ValueError(f"{topology} does not match world size {world_size}")
        timeout = timedelta(seconds=timeout_s)
        group = dist.new_group(backend=backend, timeout=timeout) if world_size > 1 else None
        return cls(meter, topology, rank, group, timeout)

    def with_group(self, group: Any) -> Comm:
        """The same meter, topology and rank on another group over the same ranks (e.g. DDP's)."""
        if self.world_size > 1 and dist.get_world_size(group) != self.world_size:
            raise ValueError("with_group needs a group over the same ranks")
        return Comm(self.meter, self.topology, self.rank, group, self.timeout)

    @contextmanager
    def _metered(
        self, category: str, counted_bytes: int, collective: str | None = None
    ) -> Iterator[None]:
        """Mark a ``torch.distributed`` call as metered (for the audit; ``collective``: the
        primitive it implements, if another) and add the wall time this rank spends inside it
        to ``meter.wait_s`` (an asynchronous call only adds its launch: the DDP gradient
        all-reduce overlaps backward)."""
        start = time.perf_counter()
        with metered_call(category, counted_bytes, collective):
            yield
        self.meter.wait_s += time.perf_counter() - start

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def group_name(self) -> str:
        """Name of the underlying process group (as the audit records it); ``local`` if none."""
        if not self.is_distributed:
            return "local"
        group = self.group if self.group is not None else dist.group.WORLD
        return str(group.group_name)

    def _splits(self, splits: Sequence[int] | Tensor, name: str) -> list[int]:
        values = splits.tolist() if isinstance(splits, Tensor) else [int(s) for s in splits]
        if len(values) != self.world_size or min(values) < 0:
            raise ValueError(f"{name} must be {self.world_size} non-negative counts, got {values}")
        return values

    def exchange_splits(self, send_splits: Sequence[int] | Tensor) -> list[int]:
        """Rows every peer will send to this rank, given the rows this rank sends to each peer.

        One int64 count per peer, counted as ``control``."""
        send = self._splits(send_splits, "send_splits")
        if not self.is_distributed:
            return send
        counts = torch.tensor(send, dtype=torch.int64)
        received = torch.empty_like(counts)
        per_peer = [_INT64_BYTES] * self.world_size
        self._all_to_all(received, counts, None, None, "control", per_peer)
        return received.tolist()

    def all_to_all_single(
        self,
        tensor: Tensor,
        send_splits: Sequence[int] | Tensor,
        recv_splits: Sequence[int] | Tensor | None = None,
        *,
        category: str,
    ) -> Tensor:
        """Send rows ``tensor[offsets[q]:offsets[q+1]]`` to rank ``q``; return the received rows
        ``[sum(recv_splits), *tensor.shape[1:]]`` in source-rank order.

        Splits count rows (dim 0) and may be uneven or zero. ``recv_splits=None`` exchanges the
        counts first (``exchange_splits``, counted as ``control``)."""
        check_category(category)
        send = self._splits(send_splits, "send_splits")
        if sum(send) != tensor.shape[0]:
            raise ValueError(f"send_splits sum to {sum(send)}, tensor has {tensor.shape[0]} rows")
        recv = (
            self.exchange_splits(send)
            if recv_splits is None
            else self._splits(recv_splits, "recv_splits")
        )
        if not self.is_distributed:
            if recv != send:
                raise ValueError(f"one rank receives what it sends: {recv} != {send}")
            return tensor
        tensor = tensor.contiguous()
        output = tensor.new_empty((sum(recv), *tensor.shape[1:]))
        row_bytes = _row_bytes(tensor)
        self._all_to_all(output, tensor, recv, send, category, [n * row_bytes for n in send])
        return output

    def _all_to_all(
        self,
        output: Tensor,
        tensor: Tensor,
        recv: list[int] | None,
        send: list[int] | None,
        category: str,
        bytes_per_peer: list[int],
    ) -> None:
        """``all_to_all_single`` of ``tensor`` into ``output``, metered per peer."""
        counted = sum(n for n, link in zip(bytes_per_peer, self._peer_links) if link is not None)
        with self._metered(category, counted):
            dist.all_to_all_single(output, tensor, recv, send, group=self.group)
        self.meter.record_per_peer(category, bytes_per_peer, self._peer_links)

    def _record_to_every_peer(self, category: str, nbytes: int) -> None:
        self.meter.record_per_peer(category, [nbytes] * self.world_size, self._peer_links)

    def all_gather_tensor(self, tensor: Tensor, *, category: str) -> Tensor:
        """Concatenate every rank's ``tensor`` (same shape on all ranks) along dim 0, in rank
        order: ``[P * n, ...]``."""
        check_category(category)
        if not self.is_distributed:
            return tensor
        tensor = tensor.contiguous()
        output = tensor.new_empty((self.world_size * tensor.shape[0], *tensor.shape[1:]))
        nbytes = tensor.numel() * tensor.element_size()
        with self._metered(category, nbytes * (self.world_size - 1)):
            _all_gather_into(output, tensor, self.group)
        self._record_to_every_peer(category, nbytes)
        return output

    def all_gather_varlen(self, tensor: Tensor, *, category: str) -> tuple[Tensor, list[int]]:
        """Concatenate every rank's ``tensor`` (first dim may differ, trailing dims equal) in
        rank order; also return the row count of every rank.

        Sizes are gathered first (``control``) and chunks padded to the largest; only the real
        rows are counted."""
        check_category(category)
        if not self.is_distributed:
            return tensor, [tensor.shape[0]]
        rows = self._gather_row_counts(tensor)
        longest = max(rows)
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        gathered = tensor.new_empty((self.world_size * longest, *tensor.shape[1:]))
        nbytes = tensor.shape[0] * _row_bytes(padded)
        with self._metered(category, nbytes * (self.world_size - 1)):
            _all_gather_into(gathered, padded, self.group)
        self._record_to_every_peer(category, nbytes)
        chunks = [gathered[q * longest : q * longest + n] for q, n in enumerate(rows)]
        return torch.cat(chunks), rows

    def gather_varlen(self, tensor: Tensor, dst: int = 0, *, category: str) -> Tensor | None:
        """Concatenate every rank's ``tensor`` (first dim may differ, trailing dims and dtype
        equal) in rank order on rank ``dst`` only: ``[sum of rows, *trailing]`` there, ``None``
        on every other rank. Collective.

        ``dist.gather`` moves equal shapes, so every rank must know the largest row count: the
        counts are all-gathered first (``control``, 8 B to every peer), then every chunk, padded
        to the largest, is gathered to ``dst``. Only the real rows are counted: a rank other
        than ``dst`` counts ``rows x row bytes`` as one message to ``dst`` (nothing if it has no
        rows), ``dst`` counts no payload. When no rank has a payload byte the gather is skipped.
        """
        check_category(category)
        if not 0 <= dst < self.world_size:
            raise ValueError(f"dst={dst} outside world of size {self.world_size}")
        if not self.is_distributed:
            return tensor
        rows = self._gather_row_counts(tensor)
        trailing = tuple(tensor.shape[1:])
        longest, row_bytes = max(rows), _row_bytes(tensor)
        if longest * row_bytes == 0:  # nothing on the wire: every rank knows it from the counts
            return tensor.new_empty((sum(rows), *trailing)) if self.rank == dst else None
        padded = tensor.new_zeros((longest, *trailing))
        padded[: tensor.shape[0]] = tensor
        chunks = [padded.new_empty(padded.shape) for _ in rows] if self.rank == dst else None
        nbytes = 0 if self.rank == dst else tensor.shape[0] * row_bytes
        with self._metered(category, nbytes):
            dist.gather(padded, chunks, dst=dst, group=self.group)
        per_peer = [nbytes if q == dst else 0 for q in range(self.world_size)]
        self.meter.record_per_peer(category, per_peer, self._peer_links)
        if chunks is None:
            return None
        return torch.cat([chunk[:n] for chunk, n in zip(chunks, rows, strict=True)])

    def _gather_row_counts(self, tensor: Tensor) -> list[int]:
        """Every rank's row count (dim 0), in rank order: an all-gather of one int64 per rank,
        8 B to every peer as ``control``."""
        size = torch.tensor([tensor.shape[0]], dtype=torch.int64)
        sizes = torch.empty(self.world_size, dtype=torch.int64)
        with self._metered("control", _INT64_BYTES * (self.world_size - 1)):
            _all_gather_into(sizes, size, self.group)
        self._record_to_every_peer("control", _INT64_BYTES)
        return sizes.tolist()

    def all_reduce(
        self, tensor: Tensor, op: str = "sum", *, category: str, async_op: bool = False
    ) -> Tensor | Future:
        """Reduce ``tensor`` in place over all ranks (``op`` in ``REDUCE_OPS``) and return it, or
        with ``async_op`` a ``Future`` whose value is the reduced tensor. Ring-model count.

        Two ranks reducing a CPU tensor of ``GATHER_REDUCE_ELEMENTS`` elements (the DDP gradient
        bucket of a small GNN, every step) all-gather it and reduce the two copies locally, in
        rank order, so both ranks get the same bits: the ring's bytes in one round instead of
        two, about twice as fast on gloo (docs/benchmarks.md, issue 16)."""
        check_category(category)
        if op not in REDUCE_OPS:
            raise ValueError(f"unknown reduce op {op!r}; valid: {list(REDUCE_OPS)}")
        if not self.is_distributed:
            if not async_op:
                return tensor
            done: Future = Future()
            done.set_result(tensor)
            return done
        low, high = GATHER_REDUCE_ELEMENTS
        if self.world_size == 2 and tensor.device.type == "cpu" and low <= tensor.numel() <= high:
            return self._all_reduce_by_gather(tensor, op, category, async_op)
        nbytes = ring_allreduce_bytes(tensor.numel() * tensor.element_size(), self.world_size)
        # gloo reduces a view's first elements of storage, not the view: reduce a contiguous copy.
        dense = tensor.contiguous()
        with self._metered(category, nbytes):
            work = dist.all_reduce(dense, op=REDUCE_OPS[op], group=self.group, async_op=async_op)
        if nbytes:
            self.meter.record(category, self._successor_link, nbytes, 2 * (self.world_size - 1))
        if async_op:
            return work.get_future().then(lambda fut: _write_back(tensor, fut.value()[0]))
        return _write_back(tensor, dense)

    def _all_reduce_by_gather(
        self, tensor: Tensor, op: str, category: str, async_op: bool
    ) -> Tensor | Future:
        """``all_reduce`` as an all-gather of ``tensor`` and a local reduction of the copies."""
        source = tensor.contiguous()
        gathered = source.new_empty((self.world_size, *source.shape))
        nbytes = source.numel() * source.element_size()
        with self._metered(category, nbytes * (self.world_size - 1), "all_reduce"):
            work = _all_gather_into(gathered.view(-1), source.view(-1), self.group, async_op)
        self._record_to_every_peer(category, nbytes)

        def reduce_into_tensor(done: Future | None = None) -> Tensor:
            if done is not None:
                done.wait()  # a failed gather raises here instead of reducing an empty buffer
            return _write_back(tensor, _LOCAL_REDUCE[op](gathered, dim=0))

        if async_op:
            return work.get_future().then(reduce_into_tensor)
        return reduce_into_tensor()

    def broadcast(self, tensor: Tensor, src: int, *, category: str) -> Tensor:
        """Copy ``tensor`` of rank ``src`` into ``tensor`` on every rank (in place); return it."""
        check_category(category)
        if not self.is_distributed:
            return tensor
        nbytes = tensor.numel() * tensor.element_size() if self.rank == src else 0
        # The source's rows do not change, but gloo's CUDA broadcast copies them back through a
        # host buffer, which bumps the version of a tensor autograd saved (CAGNET's ReLU output
        # failed backward on an H100): the source hands over a view outside autograd's count.
        payload = tensor.data if self.rank == src else tensor
        with self._metered(category, nbytes * (self.world_size - 1)):
            dist.broadcast(payload, src=src, group=self.group)
        self._record_to_every_peer(category, nbytes)
        return tensor

    def barrier(self) -> None:
        """Wait for every rank of the group; carries no payload and counts nothing."""
        if self.is_distributed:
            with self._metered("control", 0):
                dist.barrier(group=self.group)

    def gather_meter(self, snapshot: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every rank's ``snapshot`` (default: its meter now), in rank order. Bookkeeping: this
        all-gather is not counted."""
        vector = self.meter.to_vector() if snapshot is None else snapshot_to_vector(snapshot)
        if not self.is_distributed:
            return [snapshot_from_vector(vector)]
        local = torch.tensor(vector, dtype=torch.int64)
        gathered = local.new_empty(self.world_size * local.numel())
        with bookkeeping_call():
            _all_gather_into(gathered, local, self.group)
        return [snapshot_from_vector(row.tolist()) for row in gathered.view(self.world_size, -1)]

    def reduce_meter(self, snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
        """Sum of every rank's ``snapshot`` (default: its meter now); not counted."""
        return sum_snapshots(self.gather_meter(snapshot))
