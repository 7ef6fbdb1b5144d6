"""``DistDGLDataModule``: partition-local data, KV-store features, distributed sampling.

Each rank keeps only its partition: the local CSC (core nodes + 1-hop halo) and the features
and task targets (:class:`~...graph.node_targets.NodeTargets` rows) of its core nodes, in the KV
store. A training step samples through the owners (``structure`` bytes), then pulls the input
rows it does not own (``feature`` bytes: remote input rows x F x itemsize, plus the remote
seeds' target rows). Evaluation is full-graph layer-wise
inference: every rank computes each layer for its core nodes and pulls its halo's rows of the
previous layer from their owners (``activation`` bytes, the input layer as ``feature``).
Every step and every evaluation is collective, so loaders run in the main process.

With learnable embeddings (``embedding_dim > 0``) a batch carries no input rows but a
reference to the DataModule's :class:`LearnableInputs`; the strategy looks the rows up at the
start of the training step that uses them (docs/systems/distdgl.md#node-embeddings).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor
from typing_extensions import override

from ...contract import RankContext
from ...errors import ConfigError
from ...graph.batch import Batch
from ...graph.block import Block
from ...graph.book import PartitionedGraph, partition_and_relabel
from ...graph.halo_part import HaloPart, write_halo_parts
from ...graph.partition_dir import PartitionDir
from ...graph.sampler import BlockBuilder, sample_edge_ids
from ...kit.datamodule import GNNDataModule
from ...kit.embeddings import KVStore, LearnableInputs
from ...kit.link_partitioned import owned_link_statistics
from ...kit.partitions import assert_same_on_all_ranks, core_statistics, own_predictions
from ...models.gnn import BlockGNN
from ...tasks.link.split import message_graph
from .config import DistDGLConfig
from .link import (
    TRAIN,
    VAL,
    IdDirectory,
    LinkHaloPart,
    LinkPart,
    PairOrder,
    link_partitioned,
    stage_partition,
)
from .sampler import DistNeighborSampler


def check_part_relations(local, num_relations: int, where) -> None:
    """A loaded part's relations (outside input) agree with its directory's ``relations``
    (``num_relations``, 0: homogeneous): an ``edge_type`` file exactly when typed, int64, one
    value in ``[0, R)`` per edge, each segment sorted by relation (what per-relation sampling
    slices by); else ``PartitionDirError`` naming the part."""
    from ...graph.partition_dir import PartitionDirError

    kinds, part = local.edge_type, f"{where}: part {local.part_id}'s edge_type"
    if kinds is None:
        if num_relations:
            raise PartitionDirError(f"{part} is missing, but the metadata lists relations")
        return
    if not num_relations:
        raise PartitionDirError(f"{part} is there, but the metadata lists no relations")
    if kinds.dtype != torch.int64 or kinds.shape != local.indices.shape:
        raise PartitionDirError(
            f"{part} must be int64 [{local.num_edges}], got {kinds.dtype} {list(kinds.shape)}"
        )
    if kinds.numel() and (int(kinds.min()) < 0 or int(kinds.max()) >= num_relations):
        raise PartitionDirError(f"{part} holds values outside [0, {num_relations})")
    segment = torch.repeat_interleave(torch.arange(local.num_core), local.indptr.diff())
    key = segment * num_relations + kinds
    if not bool((key[1:] >= key[:-1]).all()):
        raise PartitionDirError(f"{part} is not sorted by relation within each segment")


class DistDGLDataModule(GNNDataModule):
    """Partitioned graph, KV store, distributed sampler and DistDGL's even trainer split.

    ``preprocess`` partitions and relabels the graph (:class:`PartitionedGraph`); every rank
    keeps its partition and serves its rows and samples to the others. With
    ``data.partition_dir`` a rank loads only its own part (``write_parts`` writes them), holds
    the ``[P + 1]`` offsets as its book and pulls the degrees of sampled nodes from their
    owners (docs/partitioning.md). A batch's seeds are ``[n]`` per rank, each rank
    ``batch_size / world`` of them.

    Args: as :class:`~...kit.datamodule.GNNDataModule`; ``config`` defaults to ``DistDGLConfig()``.
    With ``config.embedding_dim > 0`` a learnable table of that width, in the features'
    dtype, is the input instead of the features (:class:`~...kit.embeddings.LearnableInputs`;
    a batch's ``x`` is then an empty ``[num_src, 0]`` placeholder that the strategy's
    lookup replaces in the training step).
    """

    def __init__(self, dataset, config: DistDGLConfig | None = None, data=None, **kwargs):
        super().__init__(dataset, config or DistDGLConfig(), data, **kwargs)
        self.link: LinkPart | None = None  # link prediction's part of the split (set up)
        # the last core_outputs' halo rows per layer: pulled (once per chunk that reads them)
        # and distinct, and the most one chunk held
        self.eval_halo_rows: dict = {"pulled": [], "distinct": [], "largest": 0}
        if self.is_link and self.task.config.filter_negatives:
            raise ConfigError(
                "task.filter_negatives=true is not supported by strategy=distdgl: a rank holds "
                "the in-edges of its own nodes only, not the training edges a negative of its "
                'pairs would be checked against (docs/systems/distdgl.md, "Link prediction"); '
                "set task.filter_negatives=false"
            )

    @property
    @override
    def input_dim(self) -> int:
        return self.config.embedding_dim or super().input_dim

    def _learned_gids(self, comm) -> Tensor | None:
        """bool ``[N]`` by gid: the nodes of featureless types whose input rows are learned
        (:meth:`featureless_nodes`, in memory or from the partition directory), each rank's
        core flags all-gathered in gid order (``N`` bytes of ``structure``, once); ``None``
        when none are."""
        flags = self.featureless_nodes(comm.rank)
        if flags is None:
            return None
        mine = flags[self.core_orig_ids].to(torch.uint8)
        every, _ = comm.all_gather_varlen(mine, category="structure")
        return every.bool()

    @property
    def is_link(self) -> bool:
        """Whether the task's seeds are edges (link prediction: :mod:`.link`)."""
        return self.task.spec.seeds == "edges"

    @override
    def preprocess(self, world_size: int) -> PartitionedGraph:
        """Partition once (cached on disk by content hash), relabel, report the balance. Under
        link prediction the whole graph is partitioned on the edge split's per-node view
        (``LinkTargets.node_rows``) and every relabelled edge keeps its stage; a typed graph's
        is the split's message graph (inverse relations included, :func:`~...tasks.link.split.message_graph`)."""
        partition = self.config.partition
        targets = self.targets.node_rows() if self.is_link else self.targets
        graph, stage = self.graph, None
        if self.is_link and self.graph.is_typed:
            graph, stage = message_graph(self.graph, self.targets.split)
        prepared = partition_and_relabel(
            graph,
            targets,
            partition.method,
            world_size,
            self.seed,
            self.cache_dir,
            system="distdgl",
            **partition.options(),
        )
        if self.is_link:
            return link_partitioned(prepared, graph, self.targets, stage)
        return prepared

    @override
    def partition_settings(self) -> dict[str, Any]:
        partition = self.config.partition
        return {"method": partition.method, "partition_options": partition.options()}

    @override
    def fingerprint_targets(self):
        return self.targets.node_rows() if self.is_link else self.targets

    @override
    def write_parts(self, world_size: int, writer, log) -> dict:
        """Every rank's :meth:`part_of`, with :func:`~...graph.halo_part.write_halo_parts`
        (under link prediction also the split's pair count)."""
        prepared = self.prepare(world_size)
        meta = write_halo_parts(prepared, self.part_of, writer, log)
        graph = prepared.graph
        if graph.is_typed:  # GNNDataModule.num_relations and relation_fanouts read them
            meta["relations"] = list(graph.relations)
            meta["node_types"] = list(graph.node_types)
        if self.is_link:
            split = prepared.link.split
            meta["link"] = {
                "num_train": split.train_pos.shape[1],
                "undirected": split.undirected,
            }
            if split.is_typed:  # the positives' relations (``relations``: the message ones)
                meta["pair_relations"] = list(self.graph.relations)
        return meta

    @override
    def check_partition_task(self, opened) -> None:
        """The base's check; a typed link-prediction directory's positive relations then name
        the task's (a decoder's relations, the evaluation's check of the pairs' relations)."""
        super().check_partition_task(opened)
        relations = opened.meta.get("pair_relations")
        if self.is_link and relations is not None:
            self.task.relations = tuple(relations)

    @override
    def part_of(self, prepared: PartitionedGraph, rank: int) -> HaloPart | LinkHaloPart:
        if self.is_link:  # no node seeds: the pairs are the LinkPart's
            halo = HaloPart.of(prepared, rank, torch.empty(0, dtype=torch.int64))
            return LinkHaloPart(halo, LinkPart.of(prepared, halo))
        return HaloPart.of(prepared, rank, self.task.train_seeds(prepared.targets))

    @override
    def load_part(self, opened: PartitionDir, rank: int) -> HaloPart | LinkHaloPart:
        halo = HaloPart.load(opened, rank, self.task.out_dim_of(opened.meta), self.dtype)
        check_part_relations(halo.local, len(opened.meta.get("relations", [])), opened.path)
        if self.is_link:
            meta = opened.meta["link"]
            link = LinkPart.from_arrays(
                opened.load_part(rank),
                meta["num_train"],
                meta["undirected"],
                len(opened.meta.get("pair_relations", ())),
                f"{opened.path}: part {rank}",
            )
            return LinkHaloPart(halo, link)
        return halo

    @override
    def setup_rank(self, context: RankContext, part: HaloPart | LinkHaloPart) -> None:
        link = part.link if isinstance(part, LinkHaloPart) else None
        if link is not None:
            part = part.halo
        comm, book = context.comm, part.book
        if part.agreed is not None:
            assert_same_on_all_ranks(comm, part.agreed, "the DistDGL partition")
        self.local, self.degree, self.local_degree = part.local, part.degree, part.local_degree
        self.core_orig_ids = part.orig_ids
        self.kv = KVStore(comm, book)
        self.kv.init_data("feat", self.local.x)
        # what training samples: the graph, or link prediction's training edges only
        self.link = link
        if link is None:
            self.kv.init_data("target", self.local.targets.target)
            sampled, degree, self.sample_degree = self.local, self.degree, self.local_degree
        else:
            sampled = stage_partition(self.local, link.edge_stage, TRAIN)
            degree, self.sample_degree = link.train_degree, link.stage_degree[TRAIN]
            self.ids = IdDirectory(comm, book, link.ids)
            self.pairs = PairOrder(
                link.train_pairs, link.num_train, self.data.batch_size, self.seed
            )
            self.link_targets = link.targets(book.num_nodes, self.task.out_dim_of({}), self.seed)
        if self.degree is None:
            self.kv.init_data("degree", self.sample_degree[: self.local.num_core])
        learned = None if self.config.embedding_dim else self._learned_gids(comm)
        if self.config.embedding_dim or learned is not None:
            self.learned_inputs = LearnableInputs(
                self.kv,
                self.config.embedding_dim or self.local.x.shape[1],
                self.seed,
                self.local.x.dtype,
                self.data.embedding_optimizer,
                self.data.embedding_lr,
                self.core_orig_ids,
                learned,
            )
        fanouts = list(self.data.fanouts)
        self.sampler = DistNeighborSampler(
            comm, book, sampled, degree, fanouts, self.seed, self.relation_fanouts
        )
        if link is None:
            self.split = part.seed_split(self.data.batch_size, self.seed)

    @property
    @override
    def steps_per_epoch(self) -> int:
        return self.split.steps if self.link is None else self.pairs.steps

    @override
    def make_batch(self, epoch: int, step: int) -> Batch:
        """This rank's step: sample through the owners, then pull input rows and the seeds'
        target rows (with embeddings the input rows are looked up in the training step).
        Under link prediction the seeds are the endpoints of this
        rank's positive pairs of the step and of their negatives (``task.step_rows``, original
        ids, mapped to gids through the owners) and ``y`` comes with them."""
        start = time.perf_counter()
        exclude = None
        if self.link is None:
            seeds = self.split.seeds(epoch, step)
            y = None
            count = self.split.global_seed_count(step)
        else:
            pairs, positions = self.pairs.seeds(epoch, step)
            nodes, y = self.task.step_rows(
                self.link_targets, pairs, positions, epoch=epoch, step=step
            )
            seeds = self.ids.gids(nodes)
            count = self.task.loss_terms(self.pairs.global_count(step))
            if self.task.config.exclude_target_edges:
                exclude = self._step_pair_keys(pairs)
        blocks = self.sampler.sample(seeds, epoch, step, exclude)
        if self.degree is None:  # no [N] degrees here: the owners'
            blocks = self._with_degrees(blocks)
        sampled = time.perf_counter()
        if self.learned_inputs is None or self.learned_inputs.learned is not None:
            x = self.kv.pull("feat", blocks[0].src_ids, category="feature")
        else:  # every input row is learned: looked up in the step
            x = self.local.x.new_empty((blocks[0].num_src, 0))
        if y is None:
            y = self.kv.pull("target", seeds)
        stats = {
            "sample_s": sampled - start,
            "load_s": time.perf_counter() - sampled,
            "input_nodes": blocks[0].num_src,
        }
        return Batch(blocks, x, y, count, epoch, step, stats)

    def _step_pair_keys(self, pairs: Tensor) -> Tensor:
        """``task.exclude_target_edges``: sorted keys ``dst * N + src`` (gids) of the whole
        step's positive pairs in both directions: every rank's pairs of the step (all-gathered,
        ``structure``: 16 bytes a pair) mapped to gids through the owners, so that every rank
        leaves out what one process leaves out."""
        mine = self.link_targets.split.train_pos[:, pairs].t().contiguous()
        every, _ = self.kv.comm.all_gather_varlen(mine, category="structure")
        gids = self.ids.gids(every.flatten()).view(-1, 2)
        src, dst, n = gids[:, 0], gids[:, 1], self.kv.book.num_nodes
        return torch.unique(torch.cat([dst * n + src, src * n + dst]))

    def _with_degrees(self, blocks: list[Block]) -> list[Block]:
        """``blocks`` with their ``src_deg``: every block's sources are a prefix of the input
        layer's, whose degrees come from this rank's core and halo where it has them, and from
        the owners for the rest (one KV pull, collective, ``structure`` bytes)."""
        ids = blocks[0].src_ids
        lid, held = self.local.find(ids)
        degree = torch.empty_like(ids)
        degree[held] = self.sample_degree[lid[held]]
        degree[~held] = self.kv.pull("degree", ids[~held], category="structure")
        return [replace(b, src_deg=degree[: b.num_src]) for b in blocks]

    # ------------------------------------------------------------------------ evaluation
    @override
    def predict_rows(
        self, net: torch.nn.Module, node_ids: torch.Tensor | None, output: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's core rows from the inference evaluation runs, in original node ids."""
        layers = net.num_layers - (output == "embeddings")
        rows = self.core_outputs(net, layers)
        return own_predictions(self.core_orig_ids, rows, node_ids, self.kv.book.num_nodes)

    @torch.no_grad()
    def core_outputs(self, net: torch.nn.Module, layers: int, stage: str | None = None) -> Tensor:
        """The core's rows ``[n_core, d]`` after ``layers`` layers of full-neighbourhood,
        layer-wise inference over the partitions.

        A layer runs over ``data.eval_chunk_size`` core rows at a time, and each chunk pulls
        the rows of its halo sources from their owners (``feature`` for the input layer, then
        ``activation``): a rank holds one chunk's halo rows at a time, never a layer's whole
        halo, so evaluation stays near the training peak (issue 38). A halo node that several
        chunks read is pulled once per chunk: those extra bytes are counted like the others
        (in the run's evaluation bytes) and this rank's row counts are kept in
        :attr:`eval_halo_rows` (per layer: pulled and distinct; the most one chunk held). Every rank runs as many chunks as the rank with the most (one
        ``control`` all-reduce per call), the extra ones empty.

        ``stage``: link prediction's message-passing structure (``"train"``: the training
        edges, ``"test"``: training and validation edges, with their in-degrees); ``None``:
        the whole graph."""
        if not isinstance(net, BlockGNN):
            raise TypeError(f"DistDGL evaluates a BlockGNN net, got {type(net).__name__}")
        local, degree = self.local, self.local_degree
        if stage is not None:
            code = {"train": TRAIN, "test": VAL}[stage]
            local = stage_partition(self.local, self.link.edge_stage, code)
            degree = self.link.stage_degree[code]
        n_core, chunk = local.num_core, self.data.eval_chunk_size
        rounds = torch.tensor([max(1, -(-n_core // chunk))], dtype=torch.int64)
        self.kv.comm.all_reduce(rounds, "max", category="control")
        builder = BlockBuilder(local.num_local, degree)
        device = next(net.parameters()).device
        core_rows = (
            local.x if self.learned_inputs is None else self.learned_inputs.own_rows(local.x)
        )
        core_rows = core_rows.to(device, copy=layers == 0)  # never the live table itself
        pulled, distinct, largest = [], [], 0
        for i in range(layers):
            self.kv.init_data("hidden", core_rows)
            category = "feature" if i == 0 else "activation"
            outs, seen, count = [], torch.zeros(local.num_halo, dtype=torch.bool), 0
            for r in range(int(rounds)):
                lo = min(r * chunk, n_core)
                dst = torch.arange(lo, min(lo + chunk, n_core))
                eids, dst_pos = sample_edge_ids(local.indptr, dst, -1, 0)
                types = None if local.edge_type is None else local.edge_type[eids]
                block = builder(dst, local.indices[eids], dst_pos, types)
                ids = block.src_ids
                halo = ids >= n_core
                rows = self.kv.pull("hidden", local.local2global[ids[halo]], category=category)
                h = rows.new_empty((ids.numel(), rows.shape[1]))
                h[halo.to(device)] = rows
                h[~halo.to(device)] = core_rows[ids[~halo].to(device)]
                if r == 0 or dst.numel():  # one (maybe empty) chunk gives the output width
                    outs.append(net.layer_output(i, block.to(device), h))
                count += int(halo.sum())
                largest = max(largest, int(halo.sum()))
                seen[ids[halo] - n_core] = True
            pulled.append(count)
            distinct.append(int(seen.sum()))
            core_rows = torch.cat(outs)
        self.eval_halo_rows = {"pulled": pulled, "distinct": distinct, "largest": largest}
        return core_rows

    @override
    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """The task's statistics on this rank's core, from :meth:`core_outputs`; under link
        prediction the pairs whose source it owns, scored with its core's embeddings over
        each stage's structure and the other rows pulled from their owners
        (:func:`~...kit.link_partitioned.owned_link_statistics`)."""
        if self.link is None:
            return core_statistics(
                self.task, self.local, self.core_outputs(net, net.num_layers), splits
            )
        return owned_link_statistics(
            self.task,
            lambda stage: self.core_outputs(net, net.num_layers, stage),
            self.core_orig_ids,
            self.ids.owner,
            {split: self.link.pairs(split) for split in splits},
            self.kv.book.num_nodes,
            self.seed,
            splits,
            self.kv.comm,
            {split: self.link.relations(split) for split in splits}
            if self.link.num_relations
            else None,
        )
