"""Sharded node rows and learnable input embeddings, DistDGL's KV store and sparse
embeddings as shared machinery (docs/architecture.md, "Learnable inputs";
docs/systems/distdgl.md#kv-store).

Node-row tensors (features, task targets, learnable embeddings, optimiser state) are sharded
like the partition book: rank ``r`` stores the rows of its core gids ``[node_offsets[r],
node_offsets[r+1])``, nothing is replicated. ``pull`` reads any gid's rows, ``push`` sends rows
to their owners, who apply a handler (overwrite, add, an optimiser update).

Every method that communicates is *collective* (DistDGL's synchronous mode): all ranks
call it in the same order, also with no ids, and a push is applied before the call returns,
so runs are deterministic.

Counting conventions (what the sending rank's ``CommMeter`` records; a rank's own rows are
never network traffic and count nothing):

- ``pull``: the split exchange is ``control`` (8 B per peer); the requester sends each
  *distinct* remote gid once, 8 B, as ``structure``; the owner sends each requested row once,
  ``row bytes`` per distinct remote gid, under the pull's ``category`` (default ``feature``).
  Local gids are read straight from the shard.
- ``push``: ``control`` for the split exchange; 8 B per pushed remote row as ``structure`` and
  its data under the push's ``category`` (default ``parameter``; sparse-embedding gradients use
  ``gradient``). Rows for this rank's own gids travel as the collective's self chunk: not counted.
- ``gather`` (checkpoints): a gather to one rank (``Comm.gather_varlen``): every rank other than
  ``dst`` sends its whole shard to ``dst`` under the gather's ``category`` (default
  ``parameter``); ``dst`` sends no payload. Plus 8 B of ``control`` per peer for the sizes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from ..comm import Comm, OwnerRoute
from ..config_types import EMBEDDING_OPTIMIZERS
from ..graph.book import RangeBook
from ..graph.sampler import splitmix64

PushHandler = Callable[[Tensor, Tensor, Tensor], None]
"""``fn(shard, local_ids, data)``: apply pushed rows ``data`` at ``local_ids`` of ``shard``."""


def _overwrite(shard: Tensor, local_ids: Tensor, data: Tensor) -> None:
    """``shard[ids] = data``; for a repeated id the last occurrence wins (deterministically)."""
    unique_ids, inverse = torch.unique(local_ids, return_inverse=True)
    positions = torch.arange(local_ids.numel())
    last = positions.new_zeros(unique_ids.numel()).scatter_reduce_(0, inverse, positions, "amax")
    shard[unique_ids] = data[last]


def _add(shard: Tensor, local_ids: Tensor, data: Tensor) -> None:
    shard.index_add_(0, local_ids, data)


BUILTIN_HANDLERS: dict[str, PushHandler] = {"overwrite": _overwrite, "add": _add}


def coalesce_rows(ids: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """Sum the rows of repeated ids: ``(unique ids [u], summed rows [u, ...])``, ids sorted."""
    unique_ids, inverse = torch.unique(ids, return_inverse=True)
    summed = rows.new_zeros((unique_ids.numel(), *rows.shape[1:])).index_add_(0, inverse, rows)
    return unique_ids, summed


class KVStore:
    """Sharded node-row tensors addressed by global (relabelled) node id.

    Args:
        comm: the data-exchange ``Comm``; its world size must equal the book's part count.
        book: node ownership; rank ``r`` owns part ``r``.
    """

    def __init__(self, comm: Comm, book: RangeBook) -> None:
        if book.num_parts != comm.world_size:
            raise ValueError(f"book has {book.num_parts} parts for {comm.world_size} ranks")
        self.comm, self.book = comm, book
        self.first_gid = int(book.node_offsets[comm.rank])
        self.num_local = int(book.node_offsets[comm.rank + 1]) - self.first_gid
        self._shards: dict[str, Tensor] = {}
        self._handlers: dict[str, PushHandler] = dict(BUILTIN_HANDLERS)

    def init_data(self, name: str, local_rows: Tensor) -> None:
        """Register this rank's shard of ``name``: ``[n_r, *dims]`` rows of its core gids in gid
        order (stored as given, no copy). Every rank must use the same ``dims`` and dtype.
        Moves no data, so it is not collective."""
        if local_rows.dim() == 0 or local_rows.shape[0] != self.num_local:
            raise ValueError(
                f"{name!r}: rank {self.comm.rank} owns {self.num_local} rows, "
                f"got shape {tuple(local_rows.shape)}"
            )
        self._shards[name] = local_rows

    def local_shard(self, name: str) -> Tensor:
        """This rank's rows of ``name`` (the registered tensor itself, zero-copy)."""
        try:
            return self._shards[name]
        except KeyError:
            raise KeyError(f"no KV data {name!r}; known: {sorted(self._shards)}") from None

    def register_push_handler(self, name: str, fn: PushHandler) -> None:
        """Make ``fn(shard, local_ids, data)`` usable as ``push(..., handler=name)`` (replaces a
        handler registered under the same name; built-ins cannot be replaced)."""
        if name in BUILTIN_HANDLERS:
            raise ValueError(f"{name!r} is a built-in push handler")
        self._handlers[name] = fn

    def pull(self, name: str, gids: Tensor, *, category: str = "feature") -> Tensor:
        """Rows of ``name`` at ``gids``: ``[len(gids), *dims]`` in the order of ``gids``.

        ``gids``: int64 ``[n]``, any order, duplicates allowed, possibly empty. Collective.
        Remote gids are deduplicated before they are requested, so each distinct remote row
        crosses the network once; local gids never touch the network (see module docstring).
        """
        shard = self.local_shard(name)
        gids = gids.reshape(-1).to(torch.int64)
        is_local = (gids >= self.first_gid) & (gids < self.first_gid + self.num_local)
        local_pos = is_local.nonzero().squeeze(1)
        remote_pos = (~is_local).nonzero().squeeze(1)
        # Each distinct remote gid is requested once; the route answers in `requested` order.
        requested, inverse = torch.unique(gids[remote_pos], return_inverse=True)
        route = OwnerRoute.build(
            self.comm, requested, self.book.nid2part(requested), category="structure"
        )
        received = route.reply(self.comm, shard[route.served - self.first_gid], category=category)
        out = shard.new_empty((gids.numel(), *shard.shape[1:]))
        out[local_pos] = shard[gids[local_pos] - self.first_gid]
        out[remote_pos] = received[inverse]
        return out

    def push(
        self,
        name: str,
        gids: Tensor,
        data: Tensor,
        handler: str | PushHandler = "overwrite",
        *,
        category: str = "parameter",
    ) -> None:
        """Send rows ``data`` ``[len(gids), *dims]`` to the owners of ``gids``, who apply
        ``handler(shard, local_ids, data)`` before the call returns. Collective.

        Each owner applies one handler call to all rows it received, from every rank, ordered
        by source rank and then by position in that rank's ``gids``: for ``overwrite`` the last
        of those occurrences wins, ``add`` sums all of them, and optimiser handlers (see
        ``SparseOptimizer``) sum the rows of an id before updating, so several ranks' gradients
        for the same id combine as in synchronous SGD.
        """
        shard = self.local_shard(name)
        apply = handler if callable(handler) else self._handler(handler)
        gids = gids.reshape(-1).to(torch.int64)
        if data.shape != (gids.numel(), *shard.shape[1:]) or data.dtype != shard.dtype:
            raise ValueError(
                f"push to {name!r} needs {shard.dtype} rows of shape "
                f"({gids.numel()}, *{tuple(shard.shape[1:])}), got {data.dtype} "
                f"{tuple(data.shape)}"
            )
        route = OwnerRoute.build(self.comm, gids, self.book.nid2part(gids), category="structure")
        rows = route.push(self.comm, data, category=category)
        apply(shard, route.served - self.first_gid, rows)

    def _handler(self, name: str) -> PushHandler:
        try:
            return self._handlers[name]
        except KeyError:
            raise ValueError(
                f"unknown push handler {name!r}; known: {sorted(self._handlers)}"
            ) from None

    def gather(self, name: str, dst: int = 0, *, category: str = "parameter") -> Tensor | None:
        """Every rank's shard of ``name`` in gid order, ``[N, *dims]``, on rank ``dst`` only;
        ``None`` on the other ranks, which never hold more than their own shard (collective;
        for checkpoints, not for training steps)."""
        return self.comm.gather_varlen(self.local_shard(name), dst, category=category)

    def barrier(self) -> None:
        """Wait for every rank (counts nothing)."""
        self.comm.barrier()


class DistEmbedding(nn.Module):
    """A learnable node-embedding table, sharded in the KV store like node features.

    For featureless graphs: ``forward(gids)`` pulls the rows (``feature`` bytes: they are the
    model's input rows) into a fresh leaf tensor that requires grad and remembers
    ``(gids, leaf)``; a ``SparseOptimizer`` later pushes the leaf gradients to the owners. The
    table is not an ``nn.Parameter``, so DDP and dense optimisers never see it.

    The trace belongs to the next ``SparseOptimizer.step``, whatever step the rows were for, so
    look rows up in the training step that uses them, never while building batches ahead: a
    prefetched batch's lookup would be pushed (gradient-less) by the step before its own, and
    its rows would miss that step's update (``DistDGLStrategy`` looks up in the step).

    Args:
        kv: the store holding the table under ``name``.
        name: KV name of the table.
        num_embeddings_local: rows of this rank's shard (its part size; checked, so that
            passing the global row count fails loudly).
        dim: embedding width.
        init: ``init(gids) -> [len(gids), dim]`` initial rows of the owned gids; keyed by gid,
            so the initial table does not depend on the partitioning.
    """

    def __init__(
        self,
        kv: KVStore,
        name: str,
        num_embeddings_local: int,
        dim: int,
        init: Callable[[Tensor], Tensor],
    ) -> None:
        super().__init__()
        if num_embeddings_local != kv.num_local:
            raise ValueError(
                f"{name!r}: rank {kv.comm.rank} owns {kv.num_local} rows, "
                f"not {num_embeddings_local}"
            )
        rows = init(kv.book.part_nodes(kv.comm.rank))
        if rows.shape != (num_embeddings_local, dim):
            raise ValueError(
                f"{name!r}: init returned {tuple(rows.shape)}, expected "
                f"({num_embeddings_local}, {dim})"
            )
        kv.init_data(name, rows)
        self.kv, self.name, self.dim = kv, name, dim
        self.trace: list[tuple[Tensor, Tensor]] = []

    def forward(self, gids: Tensor) -> Tensor:
        """Rows ``[len(gids), dim]`` as a leaf that requires grad. Collective (a KV pull)."""
        leaf = self.kv.pull(self.name, gids).requires_grad_(True)
        self.trace.append((gids.reshape(-1).to(torch.int64), leaf))
        return leaf

    def gradients(self) -> tuple[Tensor, Tensor]:
        """Gradients of the traced rows, duplicates summed: ``(unique gids, [u, dim] rows)``.
        A leaf that got no gradient contributes zeros."""
        table = self.kv.local_shard(self.name)
        gids = torch.cat([table.new_empty(0, dtype=torch.int64)] + [g for g, _ in self.trace])
        grads = [
            leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for _, leaf in self.trace
        ]
        return coalesce_rows(gids, torch.cat([table.new_empty(0, self.dim), *grads]))


class SparseOptimizer:
    """Updates ``DistEmbedding`` tables on their owners from the traced leaf gradients.

    ``step()`` (collective, one KV push per embedding, ``gradient`` bytes) sums each rank's
    duplicate-id gradients, pushes them to the owners, which sum the gradients of an id over all
    ranks and apply ``update`` to the touched rows only; then it clears the traces. This is
    DGL's behaviour: ``step`` consumes the trace, so training loops need not call ``zero_grad``
    — which drops the traces without updating (e.g. to discard a step).
    """

    def __init__(self, embeddings: Iterable[DistEmbedding], lr: float) -> None:
        self.embeddings = list(embeddings)
        self.lr = lr
        for emb in self.embeddings:
            emb.kv.register_push_handler(self._handler_name(emb), self._make_handler(emb))

    def _handler_name(self, emb: DistEmbedding) -> str:
        return f"{emb.name}@{type(self).__name__}"

    def _make_handler(self, emb: DistEmbedding) -> PushHandler:
        def apply(table: Tensor, local_ids: Tensor, grads: Tensor) -> None:
            self.update(emb, table, *coalesce_rows(local_ids, grads))

        return apply

    def update(self, emb: DistEmbedding, table: Tensor, local_ids: Tensor, grads: Tensor) -> None:
        """Apply the summed gradients ``grads`` ``[u, dim]`` to the distinct rows ``local_ids``."""
        raise NotImplementedError

    def state_names(self, emb: DistEmbedding) -> tuple[str, ...]:
        """KV names of the optimiser's per-row state of ``emb`` (sharded like the table)."""
        return ()

    @torch.no_grad()
    def step(self) -> None:
        for emb in self.embeddings:
            gids, grads = emb.gradients()
            emb.kv.push(emb.name, gids, grads, self._handler_name(emb), category="gradient")
        self.zero_grad()

    def zero_grad(self) -> None:
        """Forget the traced lookups (their gradients are not applied)."""
        for emb in self.embeddings:
            emb.trace.clear()


class SparseSGD(SparseOptimizer):
    """``w <- w - lr * g`` on the touched rows."""

    def update(self, emb: DistEmbedding, table: Tensor, local_ids: Tensor, grads: Tensor) -> None:
        table[local_ids] -= self.lr * grads


class SparseAdagrad(SparseOptimizer):
    """``s <- s + g^2; w <- w - lr * g / (sqrt(s) + eps)`` on the touched rows (``torch.optim.
    Adagrad`` with zero initial accumulator, no decay). The sum of squares ``s`` is sharded in
    the KV store next to the table, as ``f"{name}@adagrad_state"``."""

    def __init__(self, embeddings: Iterable[DistEmbedding], lr: float, eps: float = 1e-10) -> None:
        super().__init__(embeddings, lr)
        self.eps = eps
        for emb in self.embeddings:
            table = emb.kv.local_shard(emb.name)
            emb.kv.init_data(self.state_name(emb), torch.zeros_like(table))

    @staticmethod
    def state_name(emb: DistEmbedding) -> str:
        return f"{emb.name}@adagrad_state"

    def state_names(self, emb: DistEmbedding) -> tuple[str, ...]:
        return (self.state_name(emb),)

    def update(self, emb: DistEmbedding, table: Tensor, local_ids: Tensor, grads: Tensor) -> None:
        state = emb.kv.local_shard(self.state_name(emb))
        state[local_ids] += grads * grads
        table[local_ids] -= self.lr * grads / (state[local_ids].sqrt() + self.eps)


SPARSE_OPTIMIZERS: dict[str, type[SparseOptimizer]] = {"sgd": SparseSGD, "adagrad": SparseAdagrad}

if set(SPARSE_OPTIMIZERS) != set(EMBEDDING_OPTIMIZERS):  # the config's names (no torch there)
    raise ImportError(f"EMBEDDING_OPTIMIZERS {EMBEDDING_OPTIMIZERS} != {sorted(SPARSE_OPTIMIZERS)}")
LEARNED_TABLE = "learned_inputs"  # KV name of the learnable input table


def embedding_init(dim: int, seed: int, dtype: torch.dtype = torch.float32):
    """Initial embedding rows keyed by gid (independent of partitioning and world size):
    uniform(-1, 1)/sqrt(d), in ``dtype`` (the run's, so that the rows match the model)."""

    def init(gids: Tensor) -> Tensor:
        bits = splitmix64((gids.unsqueeze(1) * dim + torch.arange(dim)) ^ seed)
        unit = ((bits >> 11) & ((1 << 53) - 1)).double() / float(1 << 53)
        return ((unit * 2 - 1) / dim**0.5).to(dtype)

    return init


class LearnableInputs:
    """Learnable input rows: a sharded :class:`DistEmbedding` ``[N, d]`` (rank ``r`` holds the
    rows of the gids its book gives it) and the sparse optimiser that updates it.

    A node's input row is its table row when ``learned`` says so (every node when ``learned``
    is ``None``: a featureless graph), else its feature row. Batches reference this object
    (``Batch.learned_inputs``); the strategy calls :meth:`lookup` in the training step and :meth:`step`
    after the dense optimiser step (``SystemStrategy``). :meth:`shard_state` /
    :meth:`load_shard_state` carry this rank's rows of the table and of the optimiser state
    through checkpoints, per rank (``RANK_SHARD``), never gathered.

    Args:
        kv: the store to shard the table in (its book's ranges are the ranks' rows).
        dim: the rows' width.
        seed: the run's seed (the initial rows are keyed by original id and seed).
        dtype: the rows' dtype.
        optimizer, lr: the sparse optimiser's name (``SPARSE_OPTIMIZERS``) and rate.
        orig_ids: original ids of this rank's rows ``[n_r]`` (gid order).
        learned: bool ``[N]`` by gid, whose nodes' inputs are learned; ``None``: every node's.
    """

    def __init__(
        self,
        kv: KVStore,
        dim: int,
        seed: int,
        dtype: torch.dtype,
        optimizer: str,
        lr: float,
        orig_ids: Tensor,
        learned: Tensor | None = None,
    ):
        if orig_ids.shape != (kv.num_local,):
            raise ValueError(f"{kv.num_local} rows on this rank, {tuple(orig_ids.shape)} ids")
        if learned is not None and learned.shape != (kv.book.num_nodes,):
            raise ValueError(f"learned must be bool [{kv.book.num_nodes}]")
        init = embedding_init(dim, seed, dtype)
        self.embedding = DistEmbedding(
            kv, LEARNED_TABLE, kv.num_local, dim, lambda _: init(orig_ids)
        )
        self.optimizer = SPARSE_OPTIMIZERS[optimizer]([self.embedding], lr)
        self.orig_ids, self.learned = orig_ids, learned

    def _learned_positions(self, gids: Tensor) -> Tensor | None:
        return None if self.learned is None else self.learned[gids].nonzero().squeeze(1)

    def lookup(self, batch: Any, device: torch.device | str) -> Any:
        """``batch`` with its input rows ``[num_src, d]`` of ``blocks[0].src_ids``: the learned
        rows the table's current ones (a ``DistEmbedding`` lookup, collective, ``feature``
        bytes; gradients reach them), the others ``batch.x``'s, on ``device``. Once per step on
        every rank: the lookup joins the embedding's trace, which the next :meth:`step`
        consumes."""
        start = time.perf_counter()
        gids = batch.blocks[0].src_ids.cpu()
        at = self._learned_positions(gids)
        if at is None:
            x = self.embedding(gids).to(device)
        else:
            x = batch.x.to(device).index_put((at.to(device),), self.embedding(gids[at]).to(device))
        batch.stats["load_s"] = batch.stats.get("load_s", 0.0) + time.perf_counter() - start
        return replace(batch, x=x)

    @torch.no_grad()
    def input_rows(self, gids: Tensor, x: Tensor | None) -> Tensor:
        """Evaluation's input rows of ``gids`` (collective): ``x`` ``[len(gids), d]`` with the
        learned rows the table's (``x=None``: every node learned). No gradient, no trace."""
        at = self._learned_positions(gids)
        if at is None:
            return self.embedding.kv.pull(LEARNED_TABLE, gids)
        out = x.clone()
        out[at] = self.embedding.kv.pull(LEARNED_TABLE, gids[at]).to(x.dtype)
        return out

    @torch.no_grad()
    def own_rows(self, x_own: Tensor) -> Tensor:
        """This rank's own input rows ``[n_r, d]`` (no communication): ``x_own``'s with the
        learned rows the table's (every row the table's when every node is learned); a copy,
        never the live table."""
        table = self.embedding.kv.local_shard(LEARNED_TABLE)
        if self.learned is None:
            return table.clone()
        kv = self.embedding.kv
        out = x_own.clone()
        mask = self.learned[kv.first_gid : kv.first_gid + kv.num_local]
        out[mask] = table[mask].to(out.dtype)
        return out

    def step(self) -> None:
        """Push the gradients of the lookups since the last step to their owners, which apply
        the sparse optimiser to the touched rows (collective, ``gradient`` bytes)."""
        self.optimizer.step()

    def _names(self) -> tuple[str, ...]:
        return (self.embedding.name, *self.optimizer.state_names(self.embedding))

    def shard_state(self) -> dict[str, Tensor]:
        """This rank's rows of the table and of the optimiser state, with their original ids
        (``orig_ids``), for the rank's own checkpoint shard."""
        kv = self.embedding.kv
        return {"orig_ids": self.orig_ids, **{n: kv.local_shard(n) for n in self._names()}}

    def load_shard_state(self, state: dict[str, Tensor]) -> None:
        """Take this rank's rows from its checkpoint shard (outside input: the ids, names,
        shapes and dtypes must be this rank's)."""
        kv = self.embedding.kv
        expected = {"orig_ids", *self._names()}
        if set(state) != expected:
            raise ValueError(
                f"the learnable-input shard holds {sorted(state)}, expected {sorted(expected)}"
            )
        if not torch.equal(state["orig_ids"], self.orig_ids):
            raise ValueError(
                "the learnable-input shard holds other nodes' rows than this rank's: resume "
                "with the partitioning (and world size) the checkpoint was written with"
            )
        for name in self._names():
            table = kv.local_shard(name)
            rows = state[name]
            if rows.shape != table.shape or rows.dtype != table.dtype:
                raise ValueError(
                    f"{name!r} in the shard is {rows.dtype} {tuple(rows.shape)}, this rank's "
                    f"is {table.dtype} {tuple(table.shape)}"
                )
            table.copy_(rows)
