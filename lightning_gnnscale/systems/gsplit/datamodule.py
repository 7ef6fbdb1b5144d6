"""``GSplitDataModule``: one global mini-batch per step, split by the partition map.

Every rank draws the same global seeds as ``single`` (the shared epoch permutation), keeps
the targets it owns, samples split-parallel (collective, so in the main process), and loads
input features only for the vertices it owns, through a partition-aligned cache ranked by
pre-sampled input frequency (hit / miss counters; on CPU both are RAM, only the counts mean
anything). With ``topology: replicated`` every rank holds the whole CSC and evaluation is
full-graph layer-wise inference; with ``partitioned`` a rank holds only its own vertices' CSC
rows and evaluates them layer by layer, the rows of in-neighbours owned elsewhere pulled from
their owners (docs/systems/gsplit.md#topology).

With ``data.partition_dir`` (``write_parts``) the vertices are relabelled so that each rank
owns one contiguous id range (the split function becomes the ``[P + 1]`` offsets). The
topology, in those ids with every in-edge segment in its original order, is one shared group
every rank of a machine maps once (``replicated``, with the training ids and every vertex's
original id, the redundancy probe's sampling keys) or split into the parts, each holding its
own vertices' rows (``partitioned``; the shared group then holds the training ids and the
in-degrees). A rank's part holds its own vertices' features, labels, masks, original ids (the
sampling keys) and pre-sampled input counts. Evaluation and prediction then compute each
rank's own rows layer by layer, the rows of in-neighbours it does not own pulled from their
owners (docs/systems/gsplit.md#from-a-partition-directory).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import lightning as L
import torch
from typing_extensions import override

from ...contract import RankContext
from ...graph.batch import Batch
from ...graph.book import PartitionBook, RangeBook, relabel_csc
from ...graph.csc_rows import CSCRows
from ...graph.partition_dir import PartitionDir, shared_folder
from ...graph.sampler import NeighborSampler, SampleKey, sample_neighbors
from ...kit.datamodule import GNNDataModule
from ...kit.partitions import assert_same_on_all_ranks, own_predictions
from ...kit.sampled import ReplicatedGraphEvaluation
from ...models.inference import owned_rows
from ...tasks.base import split_statistics
from .callbacks import GSplitStats, RedundancyProbe
from .config import GSplitConfig
from .partition import cached_probabilistic_partition
from .sampler import LayerPlan, SplitSampler

PRESAMPLE_SEED_SALT = 0x5EED  # pre-sampling must not replay the training samples themselves


@dataclass(frozen=True)
class GSplitPrepared:
    """What every rank needs from preprocessing.

    Attributes:
        parts: int64 ``[N]``: the owner rank of every vertex (the split function).
        input_frequency: int64 ``[N]``: pre-sampled input-layer counts ``k0_v`` (ranks the
            feature cache).
        report: ``method``, ``expected_cross_fraction`` (predicted cross-split edge share),
            ``presampled_batches``.
    """

    parts: torch.Tensor
    input_frequency: torch.Tensor
    report: dict


class LayerTraffic:
    """What this rank receives from the other ranks in one step's forward shuffles.

    ``rows[i]`` and ``bytes[i]`` (ints, one per layer, input layer first) are written by the
    layer hook before layer ``i`` and read by :class:`~.callbacks.GSplitStats`. A plain object,
    not a dataclass: a wrapper that copies a dataclass batch field by field (Lightning's
    ``apply_to_collection`` does) keeps it, the one object the hook writes and callbacks read.
    """

    def __init__(self, num_layers: int):
        self.rows = [0] * num_layers
        self.bytes = [0] * num_layers

    def record(self, layer: int, rows: int, row_bytes: int) -> None:
        """``rows`` rows of ``row_bytes`` each were received before ``layer``."""
        self.rows[layer], self.bytes[layer] = rows, rows * row_bytes


@dataclass
class SplitBatch(Batch):
    """A :class:`Batch` plus what the shuffle needs.

    Attributes:
        plans: ``plans[i]``: how rows move before layer ``i`` (one per layer).
        traffic: this step's received rows and bytes per layer (written during forward).
    """

    plans: list[LayerPlan] = field(kw_only=True)
    traffic: LayerTraffic = field(kw_only=True)

    def to(self, device) -> SplitBatch:
        return replace(super().to(device), plans=[p.to(device) for p in self.plans])


class PartitionedFeatureCache:
    """Rank ``r`` caches the ``capacity`` of its own vertices most often in pre-sampled input
    layers (``policy=presample_freq``) or the lowest ids (``id_order``); no row is cached twice.

    ``load(ids)`` returns the rows of ``ids`` and counts hits, misses and host bytes.

    Args:
        x: feature rows; vertex ``v``'s is row ``v - first_id`` (the whole graph's, or a
            partition directory's part).
        owned: this rank's vertex ids, sorted.
        frequency: pre-sampled input counts, indexed like ``x``'s rows.
        fraction, policy: as :class:`~.config.FeatureCacheConfig`.
        first_id: the id of row 0.
    """

    def __init__(
        self,
        x: torch.Tensor,
        owned: torch.Tensor,
        frequency: torch.Tensor,
        fraction: float,
        policy: str,
        first_id: int = 0,
    ):
        capacity = round(fraction * owned.numel())
        rows = owned - first_id
        if policy == "presample_freq":
            rows = rows[torch.argsort(frequency[rows], descending=True, stable=True)]
        self.cached = torch.zeros(x.shape[0], dtype=torch.bool)
        self.cached[rows[:capacity]] = True
        self.x, self.capacity, self.first_id = x, capacity, first_id
        self.hits = self.misses = 0

    def load(self, ids: torch.Tensor) -> torch.Tensor:
        rows = ids - self.first_id
        hit = int(self.cached[rows].sum())
        self.hits += hit
        self.misses += ids.numel() - hit
        return self.x.index_select(0, rows)

    @property
    def row_bytes(self) -> int:
        return self.x.shape[1] * self.x.element_size()


class OrigKeyedSampler(NeighborSampler):
    """:class:`NeighborSampler` over a relabelled CSC whose hash is keyed on the original ids
    (``orig_ids``, ``[N]``: new id -> original id): the same samples as the in-memory graph's,
    in relabelled ids (GSplit's redundancy probe from a partition directory)."""

    def __init__(self, indptr, indices, fanouts: list[int], seed: int, orig_ids: torch.Tensor):
        super().__init__(indptr, indices, fanouts, seed)
        self.orig_ids = orig_ids

    @override
    def sample(self, seeds, epoch: int = 0, step: int = 0, salt: int = 0):
        key = SampleKey(self.seed, epoch, step, salt)
        frontier = seeds.to(torch.int64)
        blocks = []
        for hop, fanout in enumerate(self.fanouts):
            keys = self.orig_ids.index_select(0, frontier)
            src, dst_pos = sample_neighbors(
                self.indptr, self.indices, frontier, fanout, key.hop_key(hop), keys
            )
            block = self.build_block(frontier, src, dst_pos)
            blocks.append(block)
            frontier = block.src_ids
        return blocks[::-1]


class GSplitDataModule(ReplicatedGraphEvaluation, GNNDataModule):
    """Split-parallel mini-batches: rank ``r`` samples, loads and computes the vertices it
    owns of every step's global mini-batch (``single``'s).

    Batches are :class:`SplitBatch`: ``blocks`` input layer first, ``x`` ``[|inputs|, F]`` of
    the owned inputs, ``y`` of the owned targets, ``plans`` the shuffle before each layer.

    Args: as :class:`~...kit.datamodule.GNNDataModule`; ``config`` defaults to ``GSplitConfig()``.
    """

    def __init__(self, dataset, config: GSplitConfig | None = None, data=None, **kwargs):
        super().__init__(dataset, config or GSplitConfig(), data, **kwargs)
        self.rank, self.world_size = 0, 1
        self.report: dict = {}  # GSplitPrepared.report of the run's world size

    # ---------------------------------------------------------------------- preprocessing
    @override
    def preprocess(self, world_size: int) -> GSplitPrepared:
        """Pre-sample and partition (cached on disk by content hash under ``cache_dir``)."""
        p = self.config.partition
        artifact = cached_probabilistic_partition(
            self.graph,
            world_size,
            method=p.method,
            fanouts=list(self.data.fanouts),
            batch_size=self.data.batch_size,
            presample_epochs=p.presample_epochs,
            seed=self.seed ^ PRESAMPLE_SEED_SALT,
            cache_dir=self.cache_dir,
            metis_seed=self.seed,
            ufactor=p.ufactor,
            zero_edge_policy=p.zero_edge_policy,
        )
        print(
            f"[gsplit] {p.method} split into {world_size}: predicted cross-split edge share "
            f"{artifact['expected_cross_fraction']:.1%} ({artifact['num_batches']} pre-sampled "
            f"mini-batches)",
            flush=True,
        )
        report = {
            "method": p.method,
            "expected_cross_fraction": artifact["expected_cross_fraction"],
            "presampled_batches": artifact["num_batches"],
        }
        return GSplitPrepared(artifact["parts"], artifact["k0_v"], report)

    # ------------------------------------------------------------- partition directories
    @override
    def partition_settings(self) -> dict[str, Any]:
        """The partitioner, what pre-sampling runs (the training schedule's fanouts and batch
        size) and the topology (``replicated``: one shared copy per machine; ``partitioned``:
        each part holds its own vertices' rows)."""
        p = self.config.partition
        options = {
            "presample_epochs": p.presample_epochs,
            "ufactor": p.ufactor,
            "zero_edge_policy": p.zero_edge_policy,
            "fanouts": list(self.data.fanouts),
            "batch_size": self.data.batch_size,
            "topology": self.config.topology,
        }
        return {"method": p.method, "partition_options": options}

    @override
    def write_parts(self, world_size: int, writer, log) -> dict:
        """Relabel so that each rank owns one contiguous id range; per part write its
        vertices' ``x``, ``y``, masks, ``orig_ids`` and pre-sampled ``input_frequency``. The
        topology (CSC, segments in their original order) is, with ``replicated``, the shared
        group ``topology`` (with the training ids and every vertex's original id, ``orig_ids``
        ``[N]``: the redundancy probe's sampling keys); with ``partitioned``, each part's own
        rows (``indptr`` ``[n_k + 1]`` from 0, ``indices``), next to a shared group
        ``vertices`` of the training ids and the in-degrees ``degree`` ``[N]``."""
        prepared, graph = self.prepare(world_size), self.graph
        book = PartitionBook.from_parts(prepared.parts, world_size)
        indptr, indices = relabel_csc(graph.indptr, graph.indices, book)
        train_ids = book.old2new[graph.split_ids("train")]  # in original id order
        partitioned = self.config.topology == "partitioned"
        if partitioned:
            group = "vertices"
            writer.write_shared(group, {"train_ids": train_ids, "degree": indptr[1:] - indptr[:-1]})
        else:
            group = "topology"
            shared = {"indptr": indptr, "indices": indices, "train_ids": train_ids}
            writer.write_shared(group, {**shared, "orig_ids": book.new2old})
        for k in range(world_size):
            lo, hi = int(book.node_offsets[k]), int(book.node_offsets[k + 1])
            own = book.new2old[lo:hi]
            arrays = {
                "x": graph.x[own],
                "y": graph.y[own],
                "train_mask": graph.train_mask[own],
                "val_mask": graph.val_mask[own],
                "test_mask": graph.test_mask[own],
                "orig_ids": own,
                "input_frequency": prepared.input_frequency[own],
            }
            if partitioned:
                arrays["indptr"] = indptr[lo : hi + 1] - indptr[lo]
                arrays["indices"] = indices[indptr[lo] : indptr[hi]]
            sizes = {"nodes": hi - lo, "edges": int(indptr[hi] - indptr[lo])}
            writer.write_part(k, arrays, sizes, shared=[group])
            log(f"[partition] part {k + 1}/{world_size} written ({sizes})")
        return {"node_offsets": book.node_offsets.tolist(), "report": prepared.report}

    @override
    def check_partition_part(self, opened: PartitionDir, k: int) -> None:
        """The shared group's ``[N]`` arrays have ``num_nodes`` rows (``indptr`` one more)."""
        nodes, key = opened.meta["num_nodes"], "'num_nodes'"
        topology, vertices = shared_folder("topology"), shared_folder("vertices")
        opened.expect_shape(topology, "indptr", (nodes + 1,), key)
        opened.expect_shape(topology, "orig_ids", (nodes,), key)
        opened.expect_shape(vertices, "degree", (nodes,), key)

    # ------------------------------------------------------------------------ rank set-up
    @override
    def setup_rank(self, context: RankContext, prepared: GSplitPrepared | PartitionDir) -> None:
        self.rank, self.world_size = context.rank, context.world_size
        if isinstance(prepared, PartitionDir):
            self._setup_from_dir(context, prepared)
            return
        graph, parts = self.graph, prepared.parts
        assert_same_on_all_ranks(context.comm, parts, "the GSplit split function")
        if int(parts.max()) >= context.world_size:
            raise ValueError(f"split function has parts >= world size {context.world_size}")
        self.parts, self.report = parts, prepared.report
        self.labels = graph.y
        own = (parts == self.rank).nonzero().flatten()
        if self.config.topology == "partitioned":
            topology = CSCRows.owned(graph.indptr, graph.indices, own)
            self.own_topology = topology
        else:
            topology = CSCRows.whole(graph.indptr, graph.indices)
        fanouts = list(self.data.fanouts)
        self.sampler = SplitSampler(context.comm, parts, topology, fanouts, self.seed)
        cache = self.config.cache
        self.cache = PartitionedFeatureCache(
            graph.x, own, prepared.input_frequency, cache.fraction, cache.policy
        )

    def _setup_from_dir(self, context: RankContext, prepared: PartitionDir) -> None:
        """This rank's part and the shared group, memory-mapped: with ``replicated`` the whole
        topology (no ``[N]`` array but its ``indptr``), with ``partitioned`` the part's own
        rows and the in-degrees ``[N]``."""
        book = RangeBook(prepared.node_offsets)
        part = prepared.load_part(self.rank)
        own = book.part_nodes(self.rank)
        first, stop = int(book.node_offsets[self.rank]), int(book.node_offsets[self.rank + 1])
        if self.config.topology == "partitioned":
            shared = prepared.load_shared("vertices", self.rank)
            degree = shared["degree"]
            topology = CSCRows(
                part["indptr"], part["indices"], lambda ids: degree.index_select(0, ids), own
            )
            self.own_topology = topology
        else:
            shared = prepared.load_shared("topology", self.rank)
            topology = CSCRows.whole(shared["indptr"], shared["indices"])
            self.orig_ids = shared["orig_ids"]
            self.own_topology = CSCRows(
                topology.indptr[first : stop + 1], topology.indices, topology.degree, own
            )
        self.parts, self.report, self.part = book, prepared.meta["report"], part
        if shared["train_ids"].numel() == 0:  # as the base's train_ids
            raise ValueError(f"partition directory {self.partition_dir}: no training nodes")
        self.train_ids = shared["train_ids"]
        orig_ids = part["orig_ids"]
        self.labels = part["y"]
        self.sampler = SplitSampler(
            context.comm,
            book,
            topology,
            list(self.data.fanouts),
            self.seed,
            node_keys=lambda ids: orig_ids.index_select(0, ids - first),
        )
        x = part["x"] if part["x"].dtype == self.dtype else part["x"].to(self.dtype)
        cache = self.config.cache
        self.cache = PartitionedFeatureCache(
            x,
            own,
            part["input_frequency"],
            cache.fraction,
            cache.policy,
            first_id=first,
        )

    # --------------------------------------------------------------------------- training
    def step_seeds(self, epoch: int, step: int) -> torch.Tensor:
        """The global mini-batch of a step: exactly ``single``'s."""
        return self.order.step(epoch, step, self.batch_size)

    def whole_batch_sampler(self) -> NeighborSampler:
        """The sampler ``single`` draws whole mini-batches with (same keys as the split one;
        from a partition directory keyed on the original ids, so it draws the same samples,
        in relabelled ids)."""
        topology, fanouts = self.sampler.topology, list(self.data.fanouts)
        if topology.ids is not None:
            raise RuntimeError("whole mini-batches need the whole topology (topology: replicated)")
        indptr, indices = topology.indptr, topology.indices
        if self.partition_dir is None:
            return NeighborSampler(indptr, indices, fanouts, self.seed)
        return OrigKeyedSampler(indptr, indices, fanouts, self.seed, self.orig_ids)

    @override
    def make_batch(self, epoch: int, step: int) -> SplitBatch:
        seeds = self.step_seeds(epoch, step)
        owner = self.sampler.owner
        targets = seeds[owner(seeds) == self.rank]
        start = time.perf_counter()
        blocks, plans, inputs = self.sampler.sample(targets, epoch, step)
        sampled = time.perf_counter()
        hits, misses = self.cache.hits, self.cache.misses
        x = self.cache.load(inputs)
        y = self.labels.index_select(0, blocks[-1].dst_ids - self.cache.first_id)
        stats = {
            "sample_s": sampled - start,
            "load_s": time.perf_counter() - sampled,
            "input_nodes": inputs.numel(),
            "cache_hits": self.cache.hits - hits,
            "cache_misses": self.cache.misses - misses,
            "edges": [b.num_edges for b in blocks],
            "cross_edges": [
                int((owner(b.src_ids[b.edge_index[0]]) != self.rank).sum()) for b in blocks
            ],
        }
        return SplitBatch(
            blocks,
            x,
            y,
            seeds.numel(),
            epoch,
            step,
            stats,
            plans=plans,
            traffic=LayerTraffic(len(plans)),
        )

    @override
    def callbacks(self) -> list[L.Callback]:
        """:class:`GSplitStats`, and the :class:`RedundancyProbe` when
        ``redundancy_probe_steps > 0``."""
        stats = GSplitStats(partition_report=lambda: self.report)
        steps = self.config.redundancy_probe_steps
        if not steps:
            return [stats]
        return [stats, RedundancyProbe(steps, self.step_seeds, self.whole_batch_sampler)]

    # ------------------------------------------------------------------------ evaluation
    own_topology: CSCRows | None = None  # own vertices' CSC rows; None: replicated evaluation

    def own_array(self, name: str) -> torch.Tensor:
        """``name`` (``x``, ``y``, a mask or ``orig_ids``) of this rank's own vertices, in id
        order: its part's array from a directory, else the in-memory graph's rows."""
        if self.partition_dir is not None:
            return self.cache.x if name == "x" else self.part[name]
        own = self.own_topology.ids
        return own if name == "orig_ids" else getattr(self.graph, name).index_select(0, own)

    @override
    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """Replicated in memory: layer-wise inference over the whole graph. Otherwise (a
        partition directory, or ``topology: partitioned``): this rank's own rows
        (:meth:`own_rows`), scored on its own vertices."""
        if self.own_topology is None:
            return super().eval_statistics(net, splits)
        out = self.own_rows(net, net.num_layers)
        masks = {split: self.own_array(f"{split}_mask") for split in splits}
        return split_statistics(self.task, out, self.own_array("y"), masks, splits)

    @override
    def predict_rows(
        self, net: torch.nn.Module, node_ids: torch.Tensor | None, output: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The requested (original) ids this rank owns, and their rows (:meth:`own_rows`);
        replicated in memory, the base's node-range split."""
        if self.own_topology is None:
            return super().predict_rows(net, node_ids, output)
        rows = self.own_rows(net, net.num_layers - (output == "embeddings"))
        if self.partition_dir is None:
            num_nodes = self.graph.num_nodes
        else:
            num_nodes = int(self.partition_meta()["num_nodes"])
        return own_predictions(self.own_array("orig_ids").clone(), rows, node_ids, num_nodes)

    def own_rows(self, net: torch.nn.Module, layers: int) -> torch.Tensor:
        """The first ``layers`` layers' full-neighbourhood rows ``[n_own, d]`` of this rank's
        own vertices, from their CSC rows (:func:`~...models.inference.owned_rows`: the in-neighbours'
        rows come from their owners)."""
        return owned_rows(
            net,
            self.context.comm,
            self.sampler.owner,
            self.own_topology,
            self.own_array("x"),
            layers,
            self.data.eval_chunk_size,
        )
