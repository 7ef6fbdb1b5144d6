"""``ByteGNNDataModule``: partitioned graph store, socket service and the S-Worker's batches.

``preprocess`` partitions (``bytegnn`` by default, cached) and relabels the graph. On every rank
``setup_rank`` keeps its partition in a :class:`GraphStore`, starts serving it to the other
ranks over the socket transport (on the address :func:`.address.service_address` chooses) and
builds the :class:`SWorker`. The DataModule owns both: ``train_dataloader`` starts the S-Worker,
``teardown`` (after a fit) and ``on_exception`` (Lightning calls it when a fit fails) stop them.
The train loader runs in the main process and takes the S-Worker's batches in step order,
exactly ``steps_per_epoch`` of them per epoch. Evaluation is layer-wise full-graph inference over the
partitions (halo rows pulled from their owners through ``comm``), as DistDGL's.

With ``data.partition_dir`` a rank loads only its own part (``write_parts`` writes them): its
partition (core in-edges as a local CSC, the halo's ids), the full-graph degrees of its core and
halo, its core's features and task targets (:class:`~...graph.node_targets.NodeTargets` rows),
and its chunk of the training ids with their degrees. Its book is the ``[P + 1]`` offsets; the degrees of vertices beyond its halo arrive
with the sampling answers of their owners (docs/systems/bytegnn.md#from-a-partition-directory).

A typed graph's part (:class:`~.typed.TypedHaloPart`) carries the relation of every in-edge it
holds, in memory and in the directory (the relation names in its metadata); the S-Worker then
samples each relation with its own fanout and evaluation runs over the relations
(docs/systems/bytegnn.md, "Typed graphs").
"""

from __future__ import annotations

import json
from typing import Any

import torch
from typing_extensions import override

from ...bounds import usable_cores
from ...comm import OwnerRoute
from ...comm.transport import SocketTransport
from ...contract import RankContext
from ...errors import ConfigError
from ...graph.block import Block
from ...graph.book import PartitionedGraph, partition_and_relabel
from ...graph.halo_part import write_halo_parts
from ...graph.partition_config import METHOD_OPTIONS
from ...graph.partition_dir import PartitionDir
from ...graph.seed_split import SeedSplit
from ...kit.datamodule import GNNDataModule, relation_fanouts
from ...kit.link_partitioned import owned_link_statistics
from ...kit.partitions import assert_same_on_all_ranks, core_statistics, own_predictions
from ...models.gnn import BlockGNN
from ...store_secret import require_secret
from .address import service_address
from .config import SECRET_REASON, ByteGNNConfig
from .link import (
    EVAL_SPLITS,
    LinkDag,
    LinkPart,
    LinkSteps,
    check_link_part,
    prepare_link,
    write_link_parts,
)
from .store import GraphStore
from .sworker import ByteGNNBatch, SWorker
from .typed import TypedHaloPart, check_typed_files, typed_meta


class ByteGNNDataModule(GNNDataModule):
    """ByteGNN's data side (see the module docstring).

    Args: as :class:`~...kit.datamodule.GNNDataModule`; ``config`` defaults to ``ByteGNNConfig()``.
    """

    def __init__(self, dataset, config: ByteGNNConfig | None = None, data=None, **kwargs):
        super().__init__(dataset, config or ByteGNNConfig(), data, **kwargs)
        if self.link_prediction and self.task.config.filter_negatives:
            raise ConfigError(
                "strategy=bytegnn: task.filter_negatives=true is not built (a rank holds its "
                "partition's in-edges, not every training edge of the sources it seeds, which "
                "a negative is checked against); leave it false (DGL's and GraphStorm's "
                "default)"
            )
        self.sworker: SWorker | None = None
        self.transport: SocketTransport | None = None
        self.link_part: LinkPart | None = None

    @property
    def link_prediction(self) -> bool:
        """Whether this run's seeds are edges (link prediction, ``link.py``)."""
        return self.task.spec.seeds == "edges"

    def partition_options(self) -> dict[str, Any]:
        """The partitioner's options; K-hop blocks get ``hops`` = the model's depth unless set."""
        partition = self.config.partition
        options = dict(partition.options)
        if "hops" in METHOD_OPTIONS[partition.method]:  # K-hop blocks: K = the model's depth
            options.setdefault("hops", len(self.data.fanouts))
        return options

    @override
    def preprocess(self, world_size: int) -> PartitionedGraph:
        """Partition once (cached on disk by content hash), relabel, report the balance
        (link prediction: with every edge's split, ``link.prepare_link``)."""
        if self.link_prediction:
            return prepare_link(
                self.graph,
                self.targets,
                self.config.partition.method,
                world_size,
                self.seed,
                self.cache_dir,
                **self.partition_options(),
            )
        return partition_and_relabel(
            self.graph,
            self.targets,
            self.config.partition.method,
            world_size,
            self.seed,
            self.cache_dir,
            system="bytegnn",
            **self.partition_options(),
        )

    @override
    def partition_settings(self) -> dict[str, Any]:
        options = json.loads(json.dumps(self.partition_options(), default=str))  # as stored
        return {"method": self.config.partition.method, "partition_options": options}

    @override
    def write_parts(self, world_size: int, writer, log) -> dict:
        """Every rank's :meth:`part_of`, with :func:`~...graph.halo_part.write_halo_parts`
        (link prediction: :func:`~.link.write_link_parts`)."""
        write = write_link_parts if self.link_prediction else write_halo_parts
        prepared = self.prepare(world_size)
        meta = write(prepared, self.part_of, writer, log)
        # a typed graph's relation names (link prediction: its message graph's, inverses too)
        return {**meta, **typed_meta(prepared.graph)}

    @override
    def check_partition_part(self, opened, k: int) -> None:
        if self.link_prediction:
            check_link_part(opened, k)
        else:
            check_typed_files(opened, k)
        # and the per-relation fanouts name its relations (in the launcher)
        relation_fanouts(self.data, opened.meta.get("relations") or (), str(opened.path))

    @override
    def part_of(self, prepared: PartitionedGraph, rank: int) -> TypedHaloPart | LinkPart:
        """With the training ids' degrees (for the task costs and GCN) where a rank holds no
        ``[N]`` degrees, and a typed graph's relations; link prediction's
        :class:`~.link.LinkPart`."""
        if self.link_prediction:
            return LinkPart.of(prepared, rank)
        seeds = self.task.train_seeds(prepared.targets)
        return TypedHaloPart.of(prepared, rank, seeds, seed_degrees=True)

    @override
    def load_part(self, opened: PartitionDir, rank: int) -> TypedHaloPart | LinkPart:
        if self.link_prediction and opened.meta.get("pair_relations"):
            self.task.relations = tuple(opened.meta["pair_relations"])  # the triples' (R)
        kind = LinkPart if self.link_prediction else TypedHaloPart
        return kind.load(opened, rank, self.task.out_dim_of(opened.meta), self.dtype)

    @override
    def fingerprint_targets(self):
        """Node rows for the directory's graph fingerprint (link prediction's
        ``LinkTargets.node_rows``)."""
        return self.targets.node_rows() if self.link_prediction else self.targets

    @override
    def setup_rank(self, context: RankContext, part: TypedHaloPart | LinkPart) -> None:
        comm, rank, world, book = context.comm, context.rank, context.world_size, part.book
        if part.agreed is not None:
            assert_same_on_all_ranks(comm, part.agreed, "the ByteGNN partition")
        self.local, self.degree, self.local_degree = part.local, part.degree, part.local_degree
        self.core_orig_ids = part.orig_ids
        self.edge_type = getattr(part, "edge_type", None)  # a typed graph's (local CSC order)
        link = None
        if self.link_prediction:
            store, split, link = self._link_store(part, rank)
        else:
            split = part.seed_split(self.data.batch_size, self.seed)
            store = GraphStore(
                self.local,
                book,
                self.degree,
                None,
                local_degree=self.local_degree,
                seed_ids=part.trainer_seeds,
                seed_degree=part.seed_degree,
                edge_type=self.edge_type,
                num_relations=self.num_relations,
            )
        self.book = book
        config = self.config
        timeout_s = comm.timeout.total_seconds() if comm.timeout is not None else 300.0
        config.dag.check_seeds_per_step(max(1, int(split.sizes.min()) // split.steps), "per rank")
        if world > 1:
            host = service_address(config.host)
            secret = require_secret(SECRET_REASON)
            self.transport = SocketTransport(rank, context.topology, timeout_s, secret, host)
            self.transport.start(store.serve, comm, store.request_bytes, store.max_in_degree)
            store.transport = self.transport
        self.store = store
        local_ranks = self.trainer.num_devices if self.trainer is not None else 1
        self.sworker = SWorker(
            store,
            split,
            list(self.data.fanouts),
            self.seed,
            config.dag,
            config.scheduler,
            config.sampling_threads,
            timeout_s,
            cores=usable_cores() / max(1, local_ranks),
            link=link,
            relation_fanouts=self.relation_fanouts,
        )

    def _link_store(self, part: LinkPart, rank: int) -> tuple[GraphStore, SeedSplit, LinkDag]:
        """Link prediction's store (the training edges of this rank's partition, the
        degrees they give, the id-map shard), its pair split and its DAG parts."""
        self.link_part = part
        none = torch.zeros(0, dtype=torch.int64)
        store = GraphStore(
            part.stage_partition("train"),
            part.book,
            None,
            None,
            local_degree=part.stage_local_degree("train"),
            seed_ids=none,
            seed_degree=none,
            id_shard=(part.id_offsets, part.id_gid, part.id_degree),
            edge_type=part.stage_edge_type("train"),  # a typed graph's, inverses included
            num_relations=self.num_relations,
        )
        pairs = part.pair_ids.numel()
        split = SeedSplit.from_chunk(
            torch.arange(pairs), part.pair_sizes, rank, self.data.batch_size, self.seed
        )
        steps = LinkSteps(split, part.pair_ids, int(part.pair_sizes.sum()), self.seed)
        targets = part.local_targets(self.seed, self.out_dim, len(self.task.relations or ()))
        return store, split, LinkDag(self.task, targets, steps)

    # ------------------------------------------------------------------------ lifetime
    @override
    def train_dataloader(self):
        """Starts the S-Worker (once), launching nothing past the fit's last epoch."""
        if not self.sworker.started:
            max_epochs = self.trainer.max_epochs if self.trainer is not None else -1
            self.sworker.last_epoch = max_epochs - 1 if max_epochs >= 0 else None
            self.sworker.start()
        return super().train_dataloader()

    @override
    def teardown(self, stage: str) -> None:
        if stage == "fit":
            self.stop_service()

    @override
    def on_exception(self, exception: BaseException) -> None:
        """A failed fit skips ``teardown``: stop the service and the threads here."""
        self.stop_service()

    @property
    @override
    def steps_per_epoch(self) -> int:
        return self.sworker.split.steps

    @override
    def make_batch(self, epoch: int, step: int) -> ByteGNNBatch:
        """The S-Worker's batch of ``(epoch, step)`` (waits for its DAG); moves the bytes the
        service threads counted into the run's meter."""
        try:
            return self.sworker.take(epoch, step)
        finally:
            self.flush_meter()

    def flush_meter(self) -> None:
        """Add the transport's counted bytes to the run's meter (main thread)."""
        if self.transport is not None and self.context is not None:
            self.transport.flush(self.context.meter)

    def stop_service(self) -> None:
        """Close the transport, then stop the S-Worker (idempotent; ``teardown`` calls it after
        a fit, ``on_exception`` after a failure). Closing first aborts the requests that
        sampling threads still wait on (a hung peer would hold them for the whole timeout,
        longer than the threads' join); a rank tears down only once the fit is over for it,
        so no peer still needs this rank's store then, or it fails anyway."""
        errors = []
        for stop in (
            self.transport.close if self.transport else None,
            self.sworker.stop if self.sworker else None,
        ):
            if stop is not None:
                try:
                    stop()
                except RuntimeError as exc:
                    errors.append(exc)
        self.flush_meter()
        if errors:
            raise errors[0]

    @override
    def callbacks(self):
        from .callbacks import ByteGNNStats

        return [ByteGNNStats(lambda: self.sworker)]

    # ------------------------------------------------------------------------ evaluation
    @override
    def predict_rows(
        self, net: torch.nn.Module, node_ids: torch.Tensor | None, output: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's core rows from the inference evaluation runs, in original node ids."""
        layers = net.num_layers - (output == "embeddings")
        rows = self.core_outputs(net, layers)
        return own_predictions(self.core_orig_ids, rows, node_ids, self.book.num_nodes)

    @torch.no_grad()
    def core_outputs(
        self, net: torch.nn.Module, layers: int, stage: str | None = None
    ) -> torch.Tensor:
        """The core's rows ``[n_core, d]`` after ``layers`` layers of full-neighbourhood,
        layer-wise inference over the partitions: each layer's halo rows come from their
        owners (``feature``, then ``activation``). ``stage`` (link prediction): over that
        stage's edges of the partition (``train``, or ``test``: train + validation) with
        their degrees; ``None``: every edge."""
        if not isinstance(net, BlockGNN):
            raise TypeError(f"ByteGNN evaluates a BlockGNN net, got {type(net).__name__}")
        local, degree, comm = self.local, self.local_degree, self.context.comm
        edge_type = self.edge_type  # a typed graph's: the layers weigh each edge by it
        if stage is not None:
            local = self.link_part.stage_partition(stage)
            edge_type = self.link_part.stage_edge_type(stage)
            degree = self.link_part.stage_local_degree(stage)
        halo = local.local2global[local.num_core :]
        dst = torch.repeat_interleave(torch.arange(local.num_core), local.indptr.diff())
        block = Block(
            torch.arange(local.num_local),
            local.num_core,
            torch.stack([local.indices, dst]),
            degree,
            edge_type,
        )
        device = next(net.parameters()).device
        route = OwnerRoute.build(comm, halo, self.book.nid2part(halo), category="structure")
        first = int(self.book.node_offsets[comm.rank])
        rows = local.x.to(device, copy=layers == 0)  # never the partition's own rows
        for i in range(layers):
            served = rows.index_select(0, (route.served - first).to(device)).cpu()
            category = "feature" if i == 0 else "activation"
            halo_rows = route.reply(comm, served, category=category).to(device)
            rows = net.layer_output(i, block.to(device), torch.cat([rows, halo_rows]))
        return rows

    @override
    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """The task's statistics on this rank's core, from :meth:`core_outputs` (link
        prediction: :meth:`link_statistics`)."""
        if self.link_prediction:
            return self.link_statistics(net, splits)
        return core_statistics(
            self.task, self.local, self.core_outputs(net, net.num_layers), splits
        )

    def link_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """Link prediction's statistics: this rank's core embedded once per stage (over its
        partition's training edges for validation, training + validation edges for test),
        and the evaluation pairs whose source it owns scored by
        :func:`~...kit.link_partitioned.owned_link_statistics`, which pulls the other rows
        from their owners. A node's owner comes from its id-map shard (collective:
        ``structure`` bytes)."""
        part, comm = self.link_part, self.context.comm
        offsets = part.id_offsets
        first = int(offsets[comm.rank])

        def owner(ids: torch.Tensor) -> torch.Tensor:
            shard = torch.searchsorted(offsets[1:], ids, right=True)
            route = OwnerRoute.build(comm, ids, shard, category="structure")
            gids = part.id_gid.index_select(0, route.served - first)
            return self.book.nid2part(route.reply(comm, gids, category="structure"))

        pairs = {s: (part.eval_pos[s], part.eval_index[s]) for s in EVAL_SPLITS}
        relations = None if part.pair_rel is None else {s: part.pair_rel[s] for s in EVAL_SPLITS}
        return owned_link_statistics(
            self.task,
            lambda stage: self.core_outputs(net, net.num_layers, stage).cpu(),
            self.core_orig_ids,
            owner,
            pairs,
            part.num_nodes,
            self.seed,
            splits,
            comm,
            relations=relations,
        )
