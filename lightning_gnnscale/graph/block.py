"""Bipartite message-flow blocks: one per GNN layer of a sampled mini-batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Block:
    """One bipartite layer ``src -> dst``; the destination nodes are a prefix of the sources.

    Attributes:
        src_ids: int64 ``[n_src]`` global ids of the source nodes; ``src_ids[:n_dst]`` are the
            destinations, the rest are new nodes, each once, in the builder's order (increasing
            id for :class:`~.sampler.BlockBuilder` and :func:`~.sampler.build_block_sorted`;
            GSplit's builder gives (owner, id) order, HopGNN from a partition directory
            reorders them by original id).
        num_dst: number of destination nodes.
        edge_index: int64 ``[2, E_b]`` local positions (row 0 into ``src_ids``, row 1 into the
            dst prefix), grouped by destination in increasing position, and within one
            destination in the order the sampler returned them (its CSC segment's order for
            :func:`~.sampler.sample_neighbors`; not necessarily by source id).
        src_deg: int64 ``[n_src]`` full-graph in-degree of every source node (used by GCN's
            symmetric normalisation, which must not depend on what was sampled).
        edge_type: int64 ``[E_b]`` relation of each edge of a typed graph's block, ``None``
            for a homogeneous graph (what a relational layer weighs each message by).
    """

    src_ids: Tensor
    num_dst: int
    edge_index: Tensor
    src_deg: Tensor
    edge_type: Tensor | None = None

    def __post_init__(self) -> None:
        if self.src_ids.dim() != 1 or self.num_dst > self.src_ids.numel():
            raise ValueError("Block: num_dst must not exceed the number of sources")
        if self.edge_index.dim() != 2 or self.edge_index.shape[0] != 2:
            raise ValueError(f"Block.edge_index must be [2, E], got {tuple(self.edge_index.shape)}")
        if self.src_deg.shape != self.src_ids.shape:
            raise ValueError("Block.src_deg must have one entry per source node")
        if self.edge_type is not None and self.edge_type.shape != (self.edge_index.shape[1],):
            raise ValueError("Block.edge_type must have one entry per edge")

    @property
    def num_src(self) -> int:
        return self.src_ids.numel()

    @property
    def num_edges(self) -> int:
        return self.edge_index.shape[1]

    @property
    def dst_ids(self) -> Tensor:
        return self.src_ids[: self.num_dst]

    def to(self, device: torch.device | str) -> Block:
        return Block(
            self.src_ids.to(device),
            self.num_dst,
            self.edge_index.to(device),
            self.src_deg.to(device),
            None if self.edge_type is None else self.edge_type.to(device),
        )


def blocks_to_subgraph(blocks: list[Block]) -> Tensor:
    """Union of the blocks' edges as one ``[2, E]`` edge list over the input nodes.

    Blocks of one mini-batch are nested (each block's sources are a prefix-extension of the
    next block's), so all local positions index ``blocks[0].src_ids``. This is what a plain
    PyG model ``model(x, edge_index)`` needs to run on a sampled mini-batch.
    """
    return torch.unique(torch.cat([b.edge_index for b in blocks], dim=1), dim=1)
