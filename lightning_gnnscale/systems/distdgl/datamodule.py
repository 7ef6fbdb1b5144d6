"""``DistDGLDataModule``: partition-local data, KV-store features, distributed sampling.

Each rank keeps only its partition: the local CSC (core nodes + 1-hop halo) and the features
and labels of its core nodes, in the KV store. A training step samples through the owners
(``structure`` bytes), then pulls the input rows it does not own (``feature`` bytes: remote
input rows x F x itemsize, plus remote seed labels). Evaluation is full-graph layer-wise
inference: every rank computes each layer for its core nodes and pulls its halo's rows of the
previous layer from their owners (``activation`` bytes, the input layer as ``feature``).
Every step and every evaluation is collective, so loaders run in the main process.

With learnable embeddings (``embedding_dim > 0``) a batch leaves its input rows out: the
strategy looks them up at the start of the training step that uses them
(:meth:`DistDGLDataModule.lookup_inputs`), so the sparse optimiser step that follows pushes the
gradients of exactly that step's lookups, and the rows are read after every earlier update,
whatever number of batches the loader builds ahead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
from torch.utils.data import DataLoader

from ...graph.batch import Batch
from ...graph.block import Block
from ...graph.book import LocalPartition, PartitionBook, build_local_partition
from ...graph.csc import Graph
from ...graph.sampler import splitmix64
from ...models.gnn import BlockGNN
from ..base import GNNDataModule, assert_same_on_all_ranks, collective_train_loader
from .kvstore import DistEmbedding, KVStore
from .sampler import DistNeighborSampler, TrainerSplit


@dataclass(frozen=True)
class PartitionedGraph:
    """What ``prepare`` hands every rank: the graph in partition-relabelled ids and its book.

    The whole relabelled graph reaches the ranks through shared memory (no copies), but a rank
    reads only its own partition (``build_local_partition``) plus replicated metadata (degrees,
    the sorted training ids), as DistDGL's machines do.
    """

    graph: Graph
    book: PartitionBook
    report: dict


def embedding_init(dim: int, seed: int, dtype: torch.dtype = torch.float32):
    """Initial embedding rows keyed by gid (independent of partitioning): uniform(-1, 1)/sqrt(d),
    in ``dtype`` (the run's, so that the rows match the model)."""

    def init(gids: torch.Tensor) -> torch.Tensor:
        bits = splitmix64((gids.unsqueeze(1) * dim + torch.arange(dim)) ^ seed)
        unit = ((bits >> 11) & ((1 << 53) - 1)).double() / float(1 << 53)
        return ((unit * 2 - 1) / dim**0.5).to(dtype)

    return init


class DistDGLDataModule(GNNDataModule):
    """Args:
    data: the prepared (partitioned, relabelled) graph.
    fanouts: by hop from the seeds.
    batch_size: global seeds per step (each trainer takes ``batch_size / world``).
    seed: base of the trainer shuffles and sampling keys.
    embedding_dim: ``> 0`` trains a ``DistEmbedding`` of this width as the input instead of
        the node features (for featureless graphs), in the features' dtype; ``0`` uses the
        features. Batches then carry no input rows until :meth:`lookup_inputs`.
    """

    def __init__(
        self,
        data: PartitionedGraph,
        fanouts: list[int],
        batch_size: int,
        seed: int,
        embedding_dim: int = 0,
    ):
        super().__init__()
        self.data, self.fanouts, self.batch_size, self.seed = data, list(fanouts), batch_size, seed
        self.embedding_dim = embedding_dim
        self.input_dim = embedding_dim or data.graph.num_features
        self.num_classes = data.graph.num_classes
        self.embedding: DistEmbedding | None = None

    def setup(self, stage: str) -> None:
        if getattr(self, "local", None) is not None:
            return
        trainer, graph = self.trainer, self.data.graph
        rank, world = trainer.global_rank, trainer.world_size
        if world != self.data.book.num_parts:
            raise ValueError(f"partitioned into {self.data.book.num_parts} parts for {world} ranks")
        self.comm = trainer.strategy.comm
        assert_same_on_all_ranks(self.comm, self.data.book.new2old, "the DistDGL partition")
        self.local: LocalPartition = build_local_partition(graph, self.data.book, rank)
        self.degree = graph.in_degree()  # replicated metadata
        self.kv = KVStore(self.comm, self.data.book)
        self.kv.init_data("feat", self.local.x)
        self.kv.init_data("label", self.local.y)
        if self.embedding_dim:
            self.embedding = DistEmbedding(
                self.kv,
                "emb",
                self.local.num_core,
                self.embedding_dim,
                embedding_init(self.embedding_dim, self.seed, self.local.x.dtype),
            )
        self.sampler = DistNeighborSampler(
            self.comm, self.data.book, self.local, self.degree, self.fanouts, self.seed
        )
        self.split = TrainerSplit(graph.split_ids("train"), world, rank, self.batch_size, self.seed)

    @property
    def steps_per_epoch(self) -> int:
        return self.split.steps

    def make_batch(self, epoch: int, step: int) -> Batch:
        """This rank's step: sample through the owners, then pull input rows and labels.

        With embeddings, ``x`` is an empty ``[num_src, 0]`` placeholder (a model fed it fails
        on the width): the rows are looked up by :meth:`lookup_inputs` in the training step.
        """
        seeds = self.split.seeds(epoch, step)
        start = time.perf_counter()
        blocks = self.sampler.sample(seeds, epoch, step)
        sampled = time.perf_counter()
        if self.embedding is None:
            x = self.kv.pull("feat", blocks[0].src_ids, category="feature")
        else:
            x = self.local.x.new_empty((blocks[0].num_src, 0))
        y = self.kv.pull("label", seeds)
        stats = {
            "sample_s": sampled - start,
            "load_s": time.perf_counter() - sampled,
            "input_nodes": blocks[0].num_src,
        }
        return Batch(blocks, x, y, self.split.global_seed_count(step), epoch, step, stats)

    def lookup_inputs(self, batch: Batch, device: torch.device | str) -> Batch:
        """``batch`` with its input rows: the current embedding rows of ``blocks[0].src_ids``
        (a ``DistEmbedding`` lookup, collective, ``feature`` bytes), on ``device``.

        Call it in the training step that uses the rows, once per step on every rank: the
        lookup joins the embedding's trace, which the next sparse optimiser step consumes.
        Without embeddings the batch is returned as it is.
        """
        if self.embedding is None:
            return batch
        start = time.perf_counter()
        rows = self.embedding(batch.blocks[0].src_ids.cpu())
        batch.stats["load_s"] = batch.stats.get("load_s", 0.0) + time.perf_counter() - start
        return replace(batch, x=rows.to(device))

    def train_dataloader(self) -> DataLoader:
        return collective_train_loader(self)  # sampling runs collectives

    # ------------------------------------------------------------------------ evaluation
    def _local_block(self) -> Block:
        """Full-neighbourhood block of this rank's core nodes over core + halo sources."""
        local = self.local
        dst = torch.repeat_interleave(torch.arange(local.num_core), local.indptr.diff())
        return Block(
            src_ids=torch.arange(local.local2global.numel()),
            num_dst=local.num_core,
            edge_index=torch.stack([local.indices, dst]),
            src_deg=self.degree[local.local2global],
        )

    @torch.no_grad()
    def eval_counts(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """Layer-wise full-graph inference over the partitions; counts on this rank's core."""
        assert isinstance(net, BlockGNN)
        local, block = self.local, self._local_block()
        halo = local.local2global[local.num_core :]
        device = next(net.parameters()).device
        core_rows = (self.kv.local_shard("emb") if self.embedding is not None else local.x).to(
            device
        )
        for i in range(net.num_layers):
            self.kv.init_data("hidden", core_rows)
            halo_rows = self.kv.pull("hidden", halo, category="feature" if i == 0 else "activation")
            core_rows = net.layer_output(i, block.to(device), torch.cat([core_rows, halo_rows]))
        pred = core_rows.argmax(1).cpu()
        masks = {"train": local.train_mask, "val": local.val_mask, "test": local.test_mask}
        counts = torch.zeros(len(splits), 2, dtype=torch.float64)
        for i, split in enumerate(splits):
            mask = masks[split]
            counts[i, 0] = (pred[mask] == local.y[mask]).sum()
            counts[i, 1] = mask.sum()
        return counts
