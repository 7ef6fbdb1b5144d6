"""GraNNDIS's share of full-graph layer-wise inference (:class:`EvalShare`), apart from the
rank part (:mod:`.partdir`) so that link prediction's shares (:mod:`.link`) use it without an
import circle."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...comm import Comm, exchange_rows
from ...graph.sampler import BlockBuilder
from ...models.gnn import BlockGNN
from ...models.inference import layer_rows


@dataclass(frozen=True)
class EvalShare:
    """One rank's share of full-graph layer-wise inference: it owns the relabelled ids
    ``[lo, hi)`` (its ``node_offsets`` range) and holds their in-edges.

    Attributes:
        indptr: int64 ``[n_core + 1]`` CSC of the core's in-edges, each core vertex's
            sources in the whole graph's order (so a row sums its messages in that order).
        indices: int64 ``[E]`` sources as local rows ``[core | halo]``.
        degree: int64 ``[n_core + n_halo]`` whole-graph in-degrees of the local rows (GCN).
        send_index, send_splits, recv_splits: the halo exchange before every layer (the
            halo is ascending in relabelled ids, so grouped by owner in rank order).
        edge_type: int64 ``[E]`` a typed graph's relation of every edge of ``indices``
            (``None``: homogeneous).
    """

    indptr: Tensor
    indices: Tensor
    degree: Tensor
    send_index: Tensor
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]
    edge_type: Tensor | None = None

    @property
    def num_core(self) -> int:
        return self.indptr.numel() - 1

    def arrays(self, prefix: str = "eval_") -> dict[str, Tensor]:
        splits = torch.tensor([self.send_splits, self.recv_splits], dtype=torch.int64)
        arrays = {
            prefix + "indptr": self.indptr,
            prefix + "indices": self.indices,
            prefix + "degree": self.degree,
            prefix + "send_index": self.send_index,
            prefix + "splits": splits,
        }
        if self.edge_type is not None:
            arrays[prefix + "edge_type"] = self.edge_type
        return arrays

    @classmethod
    def from_arrays(cls, part: dict[str, Tensor], prefix: str = "eval_") -> EvalShare:
        send, recv = part[prefix + "splits"].tolist()
        return cls(
            part[prefix + "indptr"],
            part[prefix + "indices"],
            part[prefix + "degree"],
            part[prefix + "send_index"],
            tuple(send),
            tuple(recv),
            part.get(prefix + "edge_type"),
        )

    @torch.no_grad()
    def rows(
        self, net: BlockGNN, x: Tensor, comm: Comm, chunk_size: int, layers: int | None = None
    ) -> Tensor:
        """The first ``layers`` (default all) layers' output rows of the core ``[n_core, d]``
        from its input rows ``x``: before each layer the owners send the halo rows
        (``feature``, then ``activation``)."""
        layers = net.num_layers if layers is None else layers
        builder = BlockBuilder(self.degree.numel(), self.degree)
        h = x
        send_index = self.send_index.to(x.device)
        for i in range(layers):
            category = "feature" if i == 0 else "activation"
            halo = exchange_rows(h, send_index, self.send_splits, self.recv_splits, comm, category)
            rows = torch.cat([h, halo])
            h = layer_rows(
                net, i, builder, self.indptr, self.indices, rows, 0, self.num_core, chunk_size,
                edge_type=self.edge_type,
            )  # fmt: skip
        return h
