"""``GraNNDISDataModule``: server partition, server-graph extraction, one-hop plans per rank
(docs/systems/granndis.md).

A rank's part is its server's share (:class:`~.partdir.GraNNDISPart`): its plans, their
input rows and targets, and its share of full-graph inference, the same object whether
``part_of`` builds it in memory or ``load_part`` reads it from a partition directory
(``write_parts`` saves ``part_of``'s). Only halo rows move during training and inference. The
layouts need the topology (servers x workers): the constructor's ``topology`` (``train.py``
passes the run's), else the Trainer's world size and nodes (one server per node). They are
built in ``preprocess`` (once per node, before any rank's ``setup``): every server graph is
extracted and split once, and each rank's plans are cached on disk by content hash; each rank
then loads only its own. The ranks check that what each receives is what its owners send."""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict, astuple, dataclass, replace
from functools import cached_property
from typing import Any

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from ...comm import Topology
from ...config_types import ModelConfig, require
from ...contract import RankContext
from ...errors import ConfigError
from ...graph.batch import Batch
from ...graph.book import PartitionBook
from ...graph.cache import (
    CorruptArtifactError,
    artifact_path,
    cached,
    cached_partition,
    graph_fingerprint,
    read_verified,
    tensor_digest,
)
from ...graph.csc import Graph
from ...graph.node_targets import NodeTargets
from ...graph.order import epoch_permutation
from ...graph.partition import partition
from ...graph.partition_dir import METADATA, PartitionDir, PartitionDirError
from ...kit.datamodule import GNNDataModule
from ...kit.link_partitioned import owned_link_statistics
from ...kit.loaders import StepBatcher
from ...kit.partitions import own_predictions
from ...kit.sampled import ReplicatedGraphEvaluation
from ...models.gnn import BlockGNN
from ...tasks.base import split_statistics
from .callbacks import GraNNDISStats, LayoutReport, LayoutSummary
from .config import DIRECTORY_MODES, GraNNDISConfig
from .costmodel import choose_k, estimate_memory
from .expand import cobatches, eas_expand, khop_levels, sage_expand
from .link import STAGES, EndpointRows, LinkEval, LinkTrain, pair_positions
from .partdir import EvalShare, GraNNDISPart, RankLayout, eval_halos, eval_share
from .plan import OneHopPlan, StepPlan, build_layout

PLAN_PREFIX = "granndis-plans"  # cache files of one rank's plans
EVAL_PREFIX = "granndis-eval"  # cache files of the inference shares' owners


def topology_record(topology: Topology) -> dict:
    """The servers x workers a partition directory was made for (``partition.json``)."""
    return {"servers": topology.num_servers, "workers_per_server": topology.workers_per_server}


def recorded_topology(record: dict) -> Topology:
    """The :class:`Topology` of a :func:`topology_record`."""
    workers = record["workers_per_server"]
    return Topology(record["servers"] * workers, workers)


@dataclass
class OneHopBatch(Batch):
    """One rank's step on one-hop graphs: ``blocks`` are ``plan.blocks``, ``x`` the input
    rows of ``plan.input_ids`` ``[n, F]``, ``y`` the targets of the loss rows.

    Attributes:
        plan: the rank's plans of this step (the strategy's layer hook exchanges their halos).
        endpoints: link prediction: how the last layer's rows become the rows of the step's
            endpoint nodes, which ``y`` indexes (:class:`~.link.EndpointRows`; ``None`` for
            node tasks, whose ``y`` are the loss rows' targets).
    """

    plan: StepPlan | None = None
    endpoints: EndpointRows | None = None

    @override
    def to(self, device: torch.device | str) -> OneHopBatch:
        moved = super().to(device)
        return replace(
            moved,
            plan=None if self.plan is None else self.plan.to(device),
            endpoints=None if self.endpoints is None else self.endpoints.to(device),
        )


class GraNNDISDataModule(ReplicatedGraphEvaluation, GNNDataModule):
    """One-hop plans per step of this rank; evaluation by full-graph layer-wise inference
    over the ranks' shares, each receiving its halo rows (:class:`~.partdir.EvalShare`;
    ``mb_base``: split across ranks that each hold the whole graph).

    Modes (``config.mode``): ``fb_base`` (one whole-graph layout over all ranks), ``flx``
    (each server's ``L``-hop closure of its targets), ``flx_eas`` (each server's EAS graph
    from its partition), ``cob`` (``B`` co-batch graphs per server, built once), ``mb_base``
    (per-rank sampled mini-batches, no layout).

    Link prediction (:mod:`.link`): the layouts run over the training edges with every node a
    loss row; a step scores every training pair on its source's rank, the other endpoint rows
    routed to it; evaluation embeds each rank's core per stage and scores its evaluation edges
    with :func:`~...kit.link_partitioned.owned_link_statistics`.

    Args: as :class:`~...kit.datamodule.GNNDataModule`; ``config`` defaults to ``GraNNDISConfig()``;
    ``topology``: the run's servers x workers (sets ``launch_topology``), needed where it is
    not one server per Trainer node (a strategy given ``servers``).
    """

    def __init__(
        self,
        dataset,
        config: GraNNDISConfig | None = None,
        data=None,
        *,
        topology: Topology | None = None,
        **kwargs,
    ):
        super().__init__(dataset, config or GraNNDISConfig(), data, **kwargs)
        if topology is not None:
            self.launch_topology = topology
        self.config.check_layers(self.num_layers)
        self.config.check_task_mode(self.task.name)
        self.is_link = self.task.spec.seeds == "edges"
        self.rank, self.world_size = 0, 1
        self.plan_bytes = 0  # bytes of this rank's plans (every step's), once set up
        self.plans: list[StepPlan] = []
        self.step_counts: list[int] = []
        self.layout: LayoutSummary | None = None
        self.batcher: StepBatcher | None = None
        self.model_dims: list[int] | None = None
        self.model_params = 0
        self.preload_depth: int | None = None  # FLX's k once set up (None in other modes)
        self.memory_by_k: list[float] | None = None  # preload_auto's estimates, k = 0..L
        self.inputs: list[Tensor] = []  # per step: input rows of plan.input_ids
        self.loss_targets: list[Tensor] = []  # per step: targets of the loss rows
        self.part: GraNNDISPart | None = None  # this rank's part (None in mb_base)
        self.num_nodes = 0  # |V|, once set up
        self._eval_books: dict[Topology, tuple[PartitionBook, list[Tensor]]] = {}
        self._stage_halos: dict[tuple[Topology, str], list[Tensor]] = {}
        # link prediction, once set up: this rank's training pairs, the ids of its loss rows
        # per step, its pairs' targets view and the epoch order's permutation
        self.link_train: LinkTrain | None = None
        self.loss_ids: list[Tensor] = []
        self.link_targets = None
        self.link_context: RankContext | None = None
        self._pair_order: tuple[int, Tensor] | None = None

    @property
    def num_layers(self) -> int:
        """``L``: one fanout per layer (checked against the model)."""
        return len(self.data.fanouts)

    # ------------------------------------------------------------------- preprocessing
    @override
    def preprocess(self, world_size: int) -> Topology | None:
        """What the launcher can check and compute before any rank starts: a
        ``cob.num_per_epoch`` above the training nodes, or a ``memory_budget_mb`` below what
        any depth needs, is refused here; FB_base's flat whole-graph partition is cached; and
        once the servers x workers are known (:meth:`layout_topology`), every rank's plans
        and the inference shares' owners are built and cached (:meth:`prepare_layouts`).
        Returns that topology (``None``: ``mb_base``, or not known)."""
        if not self.config.layout_mode:
            return None
        graph, config = self.layout_graph, self.config
        num_train = self.train_ids.numel()
        if self.is_link:  # a full-graph step scores every training pair
            self.task.check_step(num_train)
        require(
            config.mode != "cob" or config.cob.num_per_epoch <= num_train,
            f"strategy.cob.num_per_epoch={config.cob.num_per_epoch} exceeds the "
            f"{num_train} training nodes: co-batches past them would be empty on every server",
        )
        self.check_budget(world_size, graph.num_nodes, graph.x.element_size())
        if config.mode == "fb_base" and config.partition.fb_base == "flat":
            cached_partition(
                graph, "metis", world_size, self.seed, self.cache_dir, targets=self.layout_targets
            )
        topology = self.layout_topology()
        if topology is not None:
            self.prepare_layouts(topology)
        return topology

    def check_budget(self, world_size: int, num_nodes: int, value_bytes: int) -> None:
        """``preload_auto``'s budget must fit some depth: for every k the stage that reads the
        inputs owns every vertex at least once (k = 0: the base layout; k > 0: the servers'
        closures cover their partitions), so the worst rank holds at least N / W input rows
        of F values (``value_bytes`` each)."""
        budget = self.config.memory_budget_mb
        if not self.config.preload_auto or budget is None:
            return
        floor = -(-num_nodes // world_size) * self.input_dim * value_bytes
        require(
            floor <= budget * 2**20,
            f"strategy.memory_budget_mb={budget} is below what any preload depth needs: "
            f"every k holds >= {floor / 2**20:.3f} MB of input rows on the busiest of "
            f"{world_size} ranks; raise the budget or use strategy.mode=cob",
        )

    @override
    def open_partition_dir(self, world_size: int) -> PartitionDir:
        """The directory, checked (base class), and ``preload_auto``'s budget against its
        sizes: both before any rank starts."""
        opened = super().open_partition_dir(world_size)
        self.check_budget(world_size, int(opened.meta["num_nodes"]), self.dtype.itemsize)
        return opened

    def layout_topology(self) -> Topology | None:
        """The servers x workers the in-memory layouts are built for: ``launch_topology`` (the
        constructor's ``topology``, or the run's from ``train.py``), else one server per node
        of the attached Trainer (``None``: neither is known)."""
        if self.launch_topology is not None:
            return self.launch_topology
        if self.trainer is None:
            return None
        return Topology.from_launch(self.trainer.world_size, self.trainer.num_nodes)

    def check_layout_topology(self, expected: Topology, context: RankContext) -> None:
        """The strategy's servers x workers must be the ones the part's plans were laid out
        for (every rank decides alike: no rank waits on one that refused)."""
        if expected != context.topology:
            raise ConfigError(
                f"the GraNNDIS plans were laid out for {expected} but the strategy runs "
                f"{context.topology}: pass topology=Topology({context.topology.world_size}, "
                f"{context.topology.workers_per_server}) to GraNNDISDataModule (a strategy "
                "given servers=... splits the ranks into other servers than the Trainer's nodes)"
            )

    def depths(self) -> list[int | None]:
        """FLX's preload depths to lay out: every ``k`` for ``preload_auto``, else the
        config's (``None`` in the other modes)."""
        if self.config.preload_auto:
            return list(range(self.num_layers + 1))
        if self.config.mode == "flx":
            return [self.config.preload_depth(self.num_layers)]
        return [None]

    @cached_property
    def graph_identity(self) -> dict:
        """The layouts' graph's and targets' fingerprint (hashed once: it reads every byte
        of the structure), with a typed graph's relations (the plans carry them)."""
        identity = graph_fingerprint(self.layout_graph, self.layout_targets)
        if self.layout_graph.edge_type is not None:
            identity["edge_type"] = tensor_digest(self.layout_graph.edge_type)
        return identity

    @cached_property
    def layout_graph(self) -> Graph:
        """The graph the layouts pass messages over: the task's training structure (node
        tasks: the graph; link prediction: the training edges only, so no validation or test
        edge reaches a training layout; a typed graph's with their relations, a directed
        split's inverse edges under ``<r>_inverse``)."""
        if self.is_link:
            return self.task.stage_graph(self.graph, self.targets, "train")
        structure = self.task.training_structure(self.graph, self.targets)
        if structure[0] is self.graph.indptr and structure[1] is self.graph.indices:
            return self.graph
        return self.graph.with_structure(
            *structure, self.task.training_edge_type(self.graph, self.targets)
        )

    @cached_property
    def untyped_layout_graph(self) -> Graph:
        """:attr:`layout_graph` with a typed graph's relations erased (what METIS cuts inside
        a server: the structure, each pair of nodes once)."""
        return self.layout_graph.without_types()

    @cached_property
    def layout_targets(self) -> NodeTargets:
        """The per-node rows the layouts are built from: the task's targets (node tasks), or
        for link prediction every node a "training" row and none labelled otherwise (any
        node may be a step's endpoint: the negatives are drawn over the whole graph), which
        partitions balance and the layouts make loss rows."""
        if not self.is_link:
            return self.targets
        n = self.graph.num_nodes
        no = torch.zeros(n, dtype=torch.bool)
        return NodeTargets(torch.zeros(n, dtype=torch.int64), ~no, no, no, 1)

    @cached_property
    def is_seed(self) -> Tensor:
        """bool ``[N]``: the nodes whose output rows a step needs (the layouts' loss rows):
        the task's training seeds, or every node for link prediction."""
        if self.is_link:
            return self.layout_targets.train
        return self.task.is_train_seed(self.targets)

    @property
    def loss_row_count(self) -> int:
        """Loss rows of an epoch over all ranks: the training nodes, or (link prediction)
        every node."""
        return int(self.is_seed.sum()) if self.is_link else self.train_ids.numel()

    def layout_key(self, topology: Topology, k: int | None, rank: int) -> dict:
        """What one rank's plans depend on (the artifact cache key)."""
        config = self.config
        return {
            "kind": "granndis-plans",
            "graph": self.graph_identity,
            "mode": config.mode,
            "partition": asdict(config.partition),
            "eas": asdict(config.eas) if config.mode in ("flx_eas", "cob") else None,
            "cob": asdict(config.cob) if config.mode == "cob" else None,
            "masking": config.masking,
            "num_layers": self.num_layers,
            "k": k,
            "seed": self.seed,
            "world_size": topology.world_size,
            "workers_per_server": topology.workers_per_server,
            "rank": rank,
        }

    def prepare_layouts(self, topology: Topology) -> None:
        """Build and cache every rank's plans for every depth of :meth:`depths`, and the
        inference shares' owners (what is cached already is skipped)."""
        self.eval_owner(topology)
        for k in self.depths():
            keys = [self.layout_key(topology, k, r) for r in range(topology.world_size)]
            if all(artifact_path(key, self.cache_dir, prefix=PLAN_PREFIX).exists() for key in keys):
                continue
            start = time.perf_counter()
            built = self.build_all_plans(topology, k)
            for key, (plans, summary) in zip(keys, built, strict=True):
                state = {"steps": [p.state() for p in plans], "summary": list(astuple(summary))}
                cached(key, lambda state=state: state, self.cache_dir, prefix=PLAN_PREFIX)
            print(
                f"[granndis] {self.config.mode} plans of {topology.world_size} ranks"
                f"{'' if k is None else f' (k={k})'}: built and cached in "
                f"{time.perf_counter() - start:.1f} s",
                flush=True,
            )

    def rank_plans(
        self, topology: Topology, rank: int, k: int | None
    ) -> tuple[list[StepPlan], LayoutSummary]:
        """This rank's plans from the cache (built, for every rank, if they are not there: a
        DataModule set up without ``prepare_data``)."""
        key = self.layout_key(topology, k, rank)
        path = artifact_path(key, self.cache_dir, prefix=PLAN_PREFIX)
        state = None
        if path.exists():
            try:
                state = read_verified(path)
            except CorruptArtifactError as err:
                warnings.warn(f"{err}; rebuilding it", stacklevel=2)
        if state is None:
            plans, summary = self.build_all_plans(topology, k)[rank]
            return plans, summary
        return (
            [StepPlan.from_state(p) for p in state["steps"]],
            LayoutSummary(*state["summary"]),
        )

    # ------------------------------------------------------------------------- layouts
    def server_parts(self, num_servers: int) -> Tensor:
        """int64 ``[N]`` server of every vertex (``partition.server``; cached)."""
        method = self.config.partition.server
        return cached_partition(
            self.layout_graph,
            method,
            num_servers,
            self.seed,
            self.cache_dir,
            targets=self.layout_targets,
        )

    def intra_owner(self, vertices: Tensor, is_target: Tensor, server: int, workers: int) -> Tensor:
        """Owning rank of each of ``vertices`` (a server graph of ``server``): the server
        graph split over its ``workers`` ranks (``partition.intra``), with the loss rows
        ``is_target`` balanced across the workers as well as the vertices (``metis``:
        :func:`~...graph.partition.partition`'s ``metis_balanced`` on [target, 1, in-degree];
        ``contiguous`` / ``random``: targets and the other vertices cut separately, in id
        order or in a seeded random order)."""
        workers_seed = self.seed + server
        method = self.config.partition.intra
        if workers == 1 or vertices.numel() == 0:
            return torch.full_like(vertices, server * workers)
        if method == "metis":  # METIS cuts the structure: a typed graph's relations merged
            sub = self.untyped_layout_graph.induced_subgraph(vertices)
            splits = replace(self.layout_targets.rows(vertices), train=is_target).split_matrix()
            parts = partition(
                sub, "metis_balanced", workers, seed=workers_seed, splits=splits, balance="train"
            )
            return server * workers + parts
        parts = torch.empty_like(vertices)
        gen = torch.Generator().manual_seed(workers_seed)
        for group in (is_target.nonzero().flatten(), (~is_target).nonzero().flatten()):
            if method == "random":
                group = group[torch.randperm(group.numel(), generator=gen)]
            parts[group] = torch.arange(group.numel()) * workers // max(group.numel(), 1)
        return server * workers + parts

    def server_graph(self, inner: Tensor, server: int) -> tuple[Tensor, Tensor]:
        """``(vertices, level)`` of a server graph from the inner set: FLX's ``L``-hop closure
        of the server's targets, or FLX-EAS's sampled expansion of its partition."""
        if self.config.mode == "flx":
            return khop_levels(self.layout_graph, inner, self.num_layers)
        return self.eas_graph(inner, server)

    def eas_graph(self, inner: Tensor, server: int) -> tuple[Tensor, Tensor]:
        """``(vertices, level)``: ``inner`` grown by expansion-aware sampling (``config.eas``,
        keyed by ``(seed, server)``)."""
        eas = self.config.eas
        return eas_expand(
            self.layout_graph,
            inner,
            hops=eas.hops,
            fanout=eas.fanout,
            selection=eas.selection,
            fanout_scope=eas.fanout_scope,
            frontier=eas.frontier,
            seed=self.seed,
            salt=server,
        )

    def cobatch_graph(self, cobatch: Tensor, server: int) -> tuple[Tensor, Tensor]:
        """``(vertices, level)`` of one co-batch's dependency graph (sampling keyed by
        ``(seed, server)``)."""
        cob, graph, num_layers, seed = (
            self.config.cob,
            self.layout_graph,
            self.num_layers,
            self.seed,
        )
        if cob.sampler == "none":
            return khop_levels(graph, cobatch, num_layers)
        if cob.sampler == "sage":
            hops = num_layers if cob.hops is None else cob.hops
            return sage_expand(graph, cobatch, fanout=cob.fanout, hops=hops, seed=seed, salt=server)
        return self.eas_graph(cobatch, server)

    def server_targets(self, topology: Topology) -> list[Tensor]:
        """The training seeds of every server's partition."""
        servers, seeds = self.server_parts(topology.num_servers), self.is_seed
        return [((servers == s) & seeds).nonzero().flatten() for s in range(topology.num_servers)]

    def build_all_plans(
        self, topology: Topology, k: int | None = None
    ) -> list[tuple[list[StepPlan], LayoutSummary]]:
        """Every rank's plans of every step of an epoch and its :class:`LayoutSummary`, each
        server graph extracted and split once (``k``: FLX's preload depth, default the
        config's)."""
        config, graph, num_layers = self.config, self.layout_graph, self.num_layers
        k = config.preload_depth(num_layers) if k is None else k
        world, workers = topology.world_size, topology.workers_per_server
        if config.mode == "fb_base":
            plans = self.base_layout(self.fb_base_owner(topology), world, num_layers)
            return [
                ([StepPlan(p)], LayoutSummary(p.owned.numel(), p.owned.numel(), p.halo.numel()))
                for p in (plans[r] for r in range(world))
            ]
        if config.mode == "flx" and k < num_layers:
            return self.partial_preload_plans(topology, k)
        targets = self.server_targets(topology)
        if config.mode == "cob":
            most = max(t.numel() for t in targets)
            require(
                config.cob.num_per_epoch <= most,
                f"strategy.cob.num_per_epoch={config.cob.num_per_epoch} exceeds the {most} "
                f"training nodes of the largest of {topology.num_servers} servers: steps past "
                f"them would be empty on every server (an optimiser step on nothing); set it "
                f"<= {most}",
            )
        steps: list[list[StepPlan]] = [[] for _ in range(world)]
        sizes = [0] * world
        for server in range(topology.num_servers):
            ranks = range(server * workers, (server + 1) * workers)
            if config.mode == "cob":
                groups = cobatches(
                    targets[server],
                    config.cob.num_per_epoch,
                    shuffle=config.cob.shuffle,
                    seed=self.seed,
                    epoch=0,
                    server=server,
                )
                graphs = [self.cobatch_graph(c, server) for c in groups]
            else:
                mine = (self.server_parts(topology.num_servers) == server).nonzero().flatten()
                inner = targets[server] if config.mode == "flx" else mine
                graphs = [self.server_graph(inner, server)]
            for vertices, level in graphs:
                is_target = self.is_seed[vertices] & (level == 0)
                owner = self.intra_owner(vertices, is_target, server, workers)
                layout = build_layout(
                    graph, vertices, level, owner, ranks, world, num_layers,
                    is_target=is_target, masking=config.masking,
                )  # fmt: skip
                for r in ranks:
                    steps[r].append(StepPlan(layout[r]))
                sizes[ranks[0]] += vertices.numel()
        return [
            (
                plans,
                LayoutSummary(
                    sizes[r],
                    sum(p.final.owned.numel() for p in plans),
                    sum(p.final.halo.numel() for p in plans),
                ),
            )
            for r, plans in enumerate(steps)
        ]

    def base_layout(self, owner: Tensor, world: int, num_layers: int) -> dict[int, OneHopPlan]:
        """Every rank's plan of the whole-graph layout ``owner`` (unmasked), running the
        model's last ``num_layers`` layers."""
        graph = self.layout_graph
        vertices = torch.arange(graph.num_nodes)
        level = torch.zeros_like(vertices)
        ranks = range(world)
        return build_layout(
            graph, vertices, level, owner, ranks, world, num_layers,
            is_target=self.is_seed, masking=False,
        )  # fmt: skip

    def partial_preload_plans(
        self, topology: Topology, k: int
    ) -> list[tuple[list[StepPlan], LayoutSummary]]:
        """FLX with ``k < L`` (spec §4.3): layers ``0..k-1`` on each server's ``k``-hop closure
        of its partition ``P_s``, then layers ``k..L-1`` on the base layout, where every vertex
        of ``P_s`` keeps the worker it had in the server graph (so the reshape is local)."""
        graph, config, num_layers = self.layout_graph, self.config, self.num_layers
        world, workers = topology.world_size, topology.workers_per_server
        servers = self.server_parts(topology.num_servers)
        base_owner = torch.empty(graph.num_nodes, dtype=torch.int64)
        preload, server_vertices = {}, [0] * world
        for s in range(topology.num_servers):
            vertices, level = khop_levels(graph, (servers == s).nonzero().flatten(), k)
            is_target = self.is_seed[vertices] & (level == 0)
            owner = self.intra_owner(vertices, is_target, s, workers)
            base_owner[vertices[level == 0]] = owner[level == 0]
            ranks = range(s * workers, (s + 1) * workers)
            preload.update(
                build_layout(
                    graph, vertices, level, owner, ranks, world, k,
                    is_target=level == 0, masking=config.masking, final=False,
                )
            )  # fmt: skip
            server_vertices[ranks[0]] = vertices.numel()
        finals = self.base_layout(base_owner, world, num_layers - k)
        out = []
        for rank in range(world):
            first, final = preload[rank], finals[rank]
            order = torch.argsort(first.owned)
            reshape = order[torch.searchsorted(first.owned[order], final.owned)]
            summary = LayoutSummary(
                server_vertices[rank],
                first.owned.numel() + final.owned.numel(),
                first.halo.numel() + final.halo.numel(),
            )
            out.append(([StepPlan(final, first, reshape)], summary))
        return out

    def fb_base_owner(self, topology: Topology) -> Tensor:
        """FB_base's owner of every vertex: METIS into ``W`` parts (``flat``) or server parts
        split by ``partition.intra`` (``hierarchical``)."""
        graph, world = self.layout_graph, topology.world_size
        if self.config.partition.fb_base == "flat":
            return cached_partition(
                graph, "metis", world, self.seed, self.cache_dir, targets=self.layout_targets
            )
        return self.server_owner(topology)

    def server_owner(self, topology: Topology) -> Tensor:
        """int64 ``[N]``: every server's partition split over its workers by
        ``partition.intra`` (training nodes balanced)."""
        graph = self.layout_graph
        servers = self.server_parts(topology.num_servers)
        owner = torch.empty(graph.num_nodes, dtype=torch.int64)
        for s in range(topology.num_servers):
            vertices = (servers == s).nonzero().flatten()
            is_target = self.is_seed[vertices]
            owner[vertices] = self.intra_owner(vertices, is_target, s, topology.workers_per_server)
        return owner

    # ------------------------------------------------------------- partition directories
    def check_layout_mode(self) -> None:
        """``mb_base`` samples the whole graph on every rank: it has no part to write."""
        if not self.config.layout_mode:
            raise ConfigError(
                f"strategy.mode={self.config.mode} samples mini-batches from the whole graph on "
                f"every rank, so it has no partition directory; the GraNNDIS modes that train "
                f"from one: {list(DIRECTORY_MODES)}"
            )

    @override
    def partition_settings(self) -> dict[str, Any]:
        """Everything the plans depend on: the mode and its settings, the depth(s) laid out
        (every ``k`` for ``preload_auto``), the number of layers, and the servers x workers
        (checked before spawn when the launcher knows them, else in :meth:`setup_rank`)."""
        self.check_layout_mode()
        config = self.config
        topology = self.launch_topology
        return {
            "method": config.mode,
            "partition_options": {
                "partition": asdict(config.partition),
                "eas": asdict(config.eas) if config.mode in ("flx_eas", "cob") else None,
                "cob": asdict(config.cob) if config.mode == "cob" else None,
                "masking": config.masking,
                "num_layers": self.num_layers,
                "preload_depths": self.depths(),
            }
            | self.link_split_settings(),
            "topology": None if topology is None else topology_record(topology),
        }

    def link_split_settings(self) -> dict[str, Any]:
        """Link prediction: the edge split's settings, which the parts' pairs and structures
        follow (none for node tasks)."""
        if not self.is_link:
            return {}
        c = self.task.config
        return {
            "link_split": {
                "val_fraction": c.val_fraction,
                "test_fraction": c.test_fraction,
                "undirected": c.undirected,
            }
        }

    @override
    def write_parts(self, world_size: int, writer, log) -> dict:
        """Per server, one shared group ``server<s>`` of input rows (its ranks' ``x``, rank
        after rank), then each of its ranks' part (:meth:`part_of`, saved by
        :meth:`~.partdir.GraNNDISPart.arrays` with its ranges into the group): its plans of
        every depth of :meth:`depths` (without the ids of their rows), the targets of their
        loss rows and its :class:`~.partdir.EvalShare`.

        Rank ``r`` owns the relabelled ids of its inference share: FB_base's owners, or in
        the server modes the server partition split over its workers (``partition.intra``),
        so server ``s`` owns ``[node_offsets[s W], node_offsets[(s + 1) W])``.

        The servers x workers must be known (``launch_topology``: the partition command sets
        it from the overrides); nothing defaults. Every rank's plans are built one depth at
        a time into the plan cache (:meth:`preprocess`, as in memory), then each server is
        written in turn, its group and then its ranks' parts, so what is held at once is one
        server's output."""
        self.check_layout_mode()
        topology = self.launch_topology
        if topology is None:
            raise ConfigError(
                "GraNNDIS's plans depend on the servers x workers, which this DataModule does "
                "not know: set datamodule.launch_topology = Topology(world_size, "
                "workers_per_server) before write_partition_dir, or partition with python -m "
                "lightning_gnnscale.partition <overrides> out=<dir> (trainer.num_nodes, "
                "trainer.devices, topology.servers)"
            )
        if topology.world_size != world_size:
            raise ConfigError(f"topology {topology} is not for {world_size} ranks")
        self.prepare(world_size)  # the launcher's checks, every rank's plans cached
        log("[partition] plans built")
        for server in range(topology.num_servers):
            self.write_server(server, topology, writer, log)
        book, _ = self.eval_book(topology)
        graph = self.graph
        typed = {}
        if graph.is_typed:  # the relations messages pass over (link prediction: inverses too)
            typed["relations"] = list(self.task.message_relations(graph))
            if self.is_link:  # the relations of the pairs (what the decoder scores)
                typed["pair_relations"] = list(graph.relations)
        if graph.node_type is not None:
            typed["node_types"] = list(graph.node_types)
        return {
            "node_offsets": book.node_offsets.tolist(),
            "topology": topology_record(topology),
            "train_count": self.loss_row_count,
            **typed,
        }

    def write_server(self, server: int, topology: Topology, writer, log) -> None:
        """Write server ``server``'s group of input rows, then its ranks' parts
        (:meth:`write_parts`)."""
        workers = topology.workers_per_server
        ranks = range(server * workers, (server + 1) * workers)
        parts = [self.part_of(topology, rank) for rank in ranks]
        x = [part.input_rows() for part in parts]
        starts = torch.tensor([0] + [rows.shape[0] for rows in x]).cumsum(0).tolist()
        x = torch.cat(x)
        writer.write_shared(f"server{server}", {"x": x})
        log(f"[partition] server {server}: {x.shape[0]:,} input rows")
        del x
        for rank, part, start in zip(ranks, parts, starts[:-1], strict=True):
            share = part.eval_share
            sizes = {
                "nodes": share.num_core,
                "halo": share.degree.numel() - share.num_core,
                "edges": share.indices.numel(),
            }
            writer.write_part(rank, part.arrays(start), sizes, shared=[f"server{server}"])
            log(f"[partition] part {rank + 1}/{topology.world_size} written ({sizes})")

    # ------------------------------------------------------------------------ parts
    def eval_owner(self, topology: Topology) -> Tensor:
        """int64 ``[N]``: the rank that owns each vertex in full-graph inference: FB_base's
        owners, or in the server modes each server's partition split over its workers
        (cached by content hash: built once per node, in :meth:`prepare_layouts`)."""
        config = self.config
        key = {
            "kind": "granndis-eval-owner",
            "graph": self.graph_identity,
            "fb_base": config.mode == "fb_base",
            "partition": asdict(config.partition),
            "seed": self.seed,
            "world_size": topology.world_size,
            "workers_per_server": topology.workers_per_server,
        }
        owner = self.fb_base_owner if config.mode == "fb_base" else self.server_owner
        return cached(key, lambda: owner(topology), self.cache_dir, prefix=EVAL_PREFIX)

    def eval_book(self, topology: Topology) -> tuple[PartitionBook, list[Tensor]]:
        """The inference shares' book (rank ``r`` owns the relabelled ids ``[node_offsets[r],
        node_offsets[r + 1])``) and every rank's inference halo (:func:`~.partdir.eval_halos`),
        once per topology."""
        if topology not in self._eval_books:
            book = PartitionBook.from_parts(self.eval_owner(topology), topology.world_size)
            self._eval_books[topology] = book, eval_halos(self.graph, book)
        return self._eval_books[topology]

    def stage_graph(self, stage: str) -> Graph:
        """Link prediction's graph over a stage's structure (``train``: validation's; ``test``:
        train + validation edges; a typed graph's with the message relations)."""
        return self.task.stage_graph(self.graph, self.targets, stage)

    def stage_share(self, topology: Topology, stage: str, rank: int) -> EvalShare:
        """Rank ``rank``'s inference share (the whole-graph share's core) over ``stage``'s
        structure; every rank's halo of it computed once per topology and stage."""
        book, _ = self.eval_book(topology)
        graph = self.stage_graph(stage)
        if (topology, stage) not in self._stage_halos:
            self._stage_halos[topology, stage] = eval_halos(graph, book)
        return eval_share(graph, book, self._stage_halos[topology, stage], rank)

    def train_owner(self, topology: Topology, k: int | None) -> Tensor:
        """Link prediction: int64 ``[N]`` the rank whose last layer computes each node's
        output row at depth ``k`` (every node is one rank's loss row; cached)."""
        key = {**self.layout_key(topology, k, -1), "kind": "granndis-train-owner"}

        def build() -> Tensor:
            owner = torch.full((self.graph.num_nodes,), -1, dtype=torch.int64)
            for r in range(topology.world_size):
                for p in self.rank_plans(topology, r, k)[0]:
                    owner[p.final.owned[: p.final.num_loss]] = r
            if bool((owner < 0).any()):
                raise RuntimeError("the layouts leave nodes without an output row")
            return owner

        return cached(key, build, self.cache_dir, prefix=PLAN_PREFIX)

    def link_eval(self, topology: Topology, rank: int) -> LinkEval:
        """Link prediction: rank ``rank``'s evaluation share: its core over each stage's
        structure and the validation and test edges whose source is in its core."""
        owner = self.eval_owner(topology)
        shares = {stage: self.stage_share(topology, stage, rank) for stage in STAGES}
        pairs, relations = {}, {}
        for split in ("val", "test"):
            pos = self.targets.split.positives(split)
            mine = (owner[pos[0]] == rank).nonzero().flatten()
            pairs[split] = (pos[:, mine], mine)
            rel = self.targets.relations_of(split, mine)
            if rel is not None:  # a typed graph's: each pair keeps its relation
                relations[split] = rel
        return LinkEval(owner, shares, pairs, relations or None)

    @override
    def part_of(self, prepared: Topology | None, rank: int) -> GraNNDISPart | None:
        """Rank ``rank``'s share of its server for the servers x workers :meth:`preprocess`
        laid out (if it knew none, :meth:`layout_topology`'s now, its plans built if not
        cached): its plans of every depth, their input rows' ids and the targets of their loss
        rows, and its inference share with its core's rows (``None`` in ``mb_base``: its
        ranks sample the whole graph)."""
        if not self.config.layout_mode:
            return None
        topology = prepared if prepared is not None else self.layout_topology()
        if topology is None or rank >= topology.world_size:
            what = (
                "no servers x workers are known to lay the GraNNDIS plans out for"
                if topology is None
                else f"the GraNNDIS plans were laid out for {topology}, which has no rank {rank}"
            )
            raise ConfigError(
                f"{what}: pass topology=Topology(world_size, workers_per_server) to "
                "GraNNDISDataModule"
            )
        graph = self.graph
        row_ids: list[Tensor] = []  # the part's rows, in order, as original ids
        count = 0

        def take(ids: Tensor) -> tuple[int, int]:
            """Append ``ids``'s rows to the part's ``x``: their ``[start, stop)``."""
            nonlocal count
            row_ids.append(ids)
            count += ids.numel()
            return count - ids.numel(), count

        layouts = {}
        for k in self.depths():
            plans, summary = self.rank_plans(topology, rank, k)
            loss_rows = [p.final.owned[: p.final.num_loss] for p in plans]
            x_ranges = [take(p.input_ids) for p in plans]
            if self.is_link:
                no_rows = torch.empty(0, dtype=torch.int64)
                link = LinkTrain.build(self.train_owner(topology, k), rank, self.targets)
                layouts[k] = RankLayout(
                    plans, summary, x_ranges, [no_rows] * len(plans), loss_rows, link
                )
                continue
            layouts[k] = RankLayout(
                plans,
                summary,
                x_ranges,
                [self.targets.target.index_select(0, rows) for rows in loss_rows],
            )
        book, halos = self.eval_book(topology)
        lo, hi = book.node_offsets[rank : rank + 2].tolist()
        core = book.new2old[lo:hi]
        eval_x_range = take(core)
        return GraNNDISPart(
            topology=topology,
            layouts=layouts,
            x=graph.x,
            x_ids=torch.cat(row_ids),
            dtype=graph.x.dtype,
            eval_share=eval_share(graph, book, halos, rank),
            eval_x_range=eval_x_range,
            eval_targets=self.layout_targets.rows(core),
            orig_ids=core,
            num_nodes=graph.num_nodes,
            train_count=self.loss_row_count,
            link=self.link_eval(topology, rank) if self.is_link else None,
        )

    @override
    def check_rank_part(self, context: RankContext, opened: PartitionDir) -> None:
        """The directory was made for this servers x workers topology (before any
        collective), then the kit's checks."""
        have, want = opened.meta.get("topology"), topology_record(context.topology)
        if have != want:
            raise PartitionDirError(
                f"{opened.path / METADATA}: 'topology' is {have} but this run has {want}; "
                "partition for these servers x workers (trainer.num_nodes, trainer.devices, "
                "topology.servers): python -m lightning_gnnscale.partition <overrides> out=<dir>"
            )
        super().check_rank_part(context, opened)

    @override
    def load_part(self, opened: PartitionDir, rank: int) -> GraNNDISPart:
        """Rank ``rank``'s part as :meth:`part_of` builds it, from its files; its ``x`` is its
        server's shared group (memory-mapped, cast to the run's dtype slice by slice); a
        typed graph's edge types checked against the metadata's relations."""
        topology = recorded_topology(opened.meta["topology"])
        server_x = opened.load_shared(f"server{topology.server_of(rank)}", rank)["x"]
        part = GraNNDISPart.from_arrays(
            opened.load_part(rank),
            server_x,
            self.depths(),
            self.task.out_dim_of(opened.meta),
            topology=topology,
            dtype=self.dtype,
            num_nodes=int(opened.meta["num_nodes"]),
            train_count=int(opened.meta["train_count"]),
        )
        message, pairs = self.link_relations()
        try:  # a typed graph's relations ride with every plan (outside input: checked)
            part.check_relations(len(message), f"part {rank}", len(pairs))
        except ValueError as err:
            raise PartitionDirError(f"{opened.path}: {err}") from None
        return part

    def link_relations(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(message, pairs)``: a typed graph's relations messages pass over (link
        prediction: a directed split's inverses too) and those of link prediction's pairs
        (``()`` for node tasks and homogeneous graphs); from a directory, its metadata's,
        checked (outside input: the pairs' relations lead the message relations, which add
        at most their inverses). Link prediction's task learns the pairs' relations here
        (the relations ``owned_link_statistics`` checks and DistMult sizes from)."""
        message, pairs = self.relation_names()
        if self.is_link and (
            message[: len(pairs)] != pairs or len(message) not in (len(pairs), 2 * len(pairs))
        ):
            raise PartitionDirError(
                f"{self.partition_dir}: the metadata's pair_relations {list(pairs)} do not lead "
                f"its relations {list(message)} (a link-prediction directory of a typed graph "
                "names both: the pairs' relations, then any inverses); partition again"
            )
        if self.is_link and message:
            self.task.relations = pairs
        return message, pairs

    # ------------------------------------------------------------------------ set-up
    @override
    def setup_rank(self, context: RankContext, part: GraNNDISPart | None) -> None:
        """This rank's plans, input rows and targets from its part (or, for ``mb_base``, its
        sampler over the whole graph) and the global loss denominators of every step (one
        all-reduce, ``control``)."""
        self.rank, self.world_size = context.rank, context.world_size
        if not self.config.layout_mode:
            self.num_nodes = self.graph.num_nodes
            self.batcher = self.whole_graph_batcher()
            return
        self.check_layout_topology(part.topology, context)
        self.part, self.num_nodes = part, part.num_nodes
        if self.config.preload_auto:
            self.preload_depth = self.choose_preload_depth(context)
        else:
            self.preload_depth = self.depths()[0]
        self.part = part = part.at_depth(self.preload_depth)  # the others' plans are freed
        layout = part.layouts[self.preload_depth]
        plans, self.layout = layout.plans, layout.summary
        self.check_server_agreement(context, plans)
        local = torch.tensor([p.final.num_loss for p in plans], dtype=torch.int64)
        self.step_counts = context.comm.all_reduce(local, category="control").tolist()
        if sum(self.step_counts) != part.train_count:
            raise RuntimeError(
                f"the layouts' loss rows cover {sum(self.step_counts)} targets per epoch, but "
                f"there are {part.train_count} training nodes"
            )
        if self.is_link:
            if layout.link is None or part.link is None:
                raise ConfigError(
                    "task=link_prediction, but this GraNNDIS part holds no link-prediction "
                    "share (a partition directory written for another task)"
                )
            self.task.check_step(layout.link.num_pairs)  # a full-graph step scores them all
            self.link_train, self.loss_ids = layout.link, layout.loss_ids
            self.link_context = context
            message, pairs = self.link_relations()
            self.link_targets = layout.link.targets(
                part.num_nodes, self.out_dim, self.seed, message, max(1, len(pairs))
            )
        self.plan_bytes = sum(p.nbytes() for p in plans)
        self.plans = [p.to(context.device) for p in plans]
        self.inputs = [part.rows(span).to(context.device) for span in layout.x_ranges]
        self.loss_targets = [y.to(context.device) for y in layout.targets]

    def whole_graph_batcher(self) -> StepBatcher:
        """``mb_base``'s batch maker: rank-salted samples of the whole graph (over the task's
        training structure) for this rank's share of each step."""
        return StepBatcher.on_graph(
            self.graph,
            self.targets,
            self.task,
            self.data.fanouts,
            self.train_ids,
            self.batch_size,
            self.seed,
            self.rank,
            self.world_size,
            salt_by_rank=True,
            relation_fanouts=self.relation_fanouts,
        )

    @override
    def build_model(self, model: ModelConfig) -> torch.nn.Module:
        """The net, also recording its widths and size for ``preload_auto``'s estimates (link
        prediction's task learns a directory's relations first: a trained head sizes from
        them)."""
        if self.is_link:
            self.link_relations()
        net = super().build_model(model)
        self.model_dims = [self.input_dim, *[model.hidden] * (model.num_layers - 1)]
        self.model_dims.append(self.out_dim)
        self.model_params = sum(p.numel() for p in net.parameters())
        return net

    def memory_estimate(self, step: StepPlan) -> int:
        """Estimated bytes of one step on this rank (spec §4.8): each stage's rows, edges
        and keep-mask rows over its layers' widths, plus the parameters with their optimiser
        state."""
        if self.model_dims is None:
            raise RuntimeError(
                "strategy.preload_auto=true estimates memory from the model's widths: build "
                "the net with this DataModule's build_model(model_config) before training"
            )
        dims, total, first = self.model_dims, 0, 0
        value_bytes = self.part.dtype.itemsize
        for plan in (step.preload, step.final):
            layers = 0 if plan is None else len(plan.blocks)
            if layers == 0:  # FLX(k = 0): no preload stage to hold
                continue
            total += estimate_memory(
                n_owned=plan.owned.numel(),
                n_halo=plan.halo.numel(),
                num_edges=sum(b.num_edges for b in plan.blocks),
                dims=dims[first : first + layers + 1],
                num_params=0,
                value_bytes=value_bytes,
                typed=plan.edge_type is not None,
            ).total
            first += layers
        return total + self.model_params * value_bytes * 4

    def choose_preload_depth(self, context: RankContext) -> int:
        """FLX's ``k``: the largest whose worst-rank estimate of this rank's part fits the
        budget (:func:`~.costmodel.choose_k`; one all-reduce of the ``L + 1`` estimates,
        ``control``)."""
        layouts = [self.part.layouts[k] for k in self.depths()]
        local = torch.tensor(
            [max(self.memory_estimate(s) for s in layout.plans) for layout in layouts],
            dtype=torch.float64,
        )
        worst = context.comm.all_reduce(local, "max", category="control").tolist()
        budget = self.config.memory_budget_mb
        k = choose_k(worst, None if budget is None else budget * 2**20)
        if k is None:
            raise RuntimeError(
                f"no preload depth fits strategy.memory_budget_mb={budget}: the estimates per "
                f"worker for k = 0..{self.num_layers} are {[round(m / 2**20, 2) for m in worst]} "
                f"MB; raise the budget or use strategy.mode=cob"
            )
        self.memory_by_k = worst
        return k

    def check_server_agreement(self, context: RankContext, steps: list[StepPlan]) -> None:
        """Every rank must receive what its owners send (the plans of a server are built
        independently on each of its ranks): all-gather per-pair row counts (``control``)."""
        world = context.world_size
        plans = [p for step in steps for p in (step.preload, step.final) if p is not None]
        sent = torch.tensor([p.send_splits for p in plans], dtype=torch.int64).reshape(-1, world)
        recv = torch.tensor([p.recv_splits for p in plans], dtype=torch.int64).reshape(-1, world)
        steps = torch.tensor([len(plans)], dtype=torch.int64)
        all_steps = context.comm.all_gather_tensor(steps, category="control")
        if bool((all_steps != all_steps[0]).any()):
            raise RuntimeError(f"ranks have different numbers of steps: {all_steps.tolist()}")
        sent_all = context.comm.all_gather_tensor(sent, category="control")
        sent_all = sent_all.view(world, len(plans), world)  # [sender, step, receiver]
        expected = sent_all[:, :, context.rank].T  # [step, sender]
        agrees = torch.equal(expected, recv)
        # every rank fails together (a rank that agrees would wait in the next collective)
        flags = torch.tensor([0 if agrees else 1], dtype=torch.int64)
        flags = context.comm.all_gather_tensor(flags, category="control")
        if bool(flags.any()):
            detail = (
                ""
                if agrees
                else f"; this rank expects {recv.tolist()} halo rows per step and sender, the "
                f"owners send {expected.tolist()}"
            )
            raise RuntimeError(
                f"ranks {flags.nonzero().flatten().tolist()} receive halo rows other than what "
                f"their owners send: the ranks of a server built different layouts{detail}"
            )

    # -------------------------------------------------------------------------- training
    @property
    @override
    def steps_per_epoch(self) -> int:
        if not self.config.layout_mode:
            return super().steps_per_epoch
        if self.config.mode == "cob":
            return self.config.cob.num_per_epoch
        return 1

    @override
    def make_batch(self, epoch: int, step: int) -> Batch:
        if self.batcher is not None:
            return self.batcher[epoch, step]
        if not self.config.layout_mode:  # not set up: this rank's share as ``rank`` says
            return self.whole_graph_batcher()[epoch, step]
        if not self.plans:
            raise RuntimeError(
                f"strategy.mode={self.config.mode}'s steps run on the layouts set up for a "
                "servers x workers topology: set the DataModule up on its ranks first "
                "(setup_rank, which the Trainer's setup calls)"
            )
        if self.is_link:
            return self.link_batch(epoch, step)
        start = time.perf_counter()
        plan = self.plans[step]
        stats = {
            "sample_s": 0.0,
            "load_s": time.perf_counter() - start,
            "input_nodes": plan.input_ids.numel(),
        }
        return OneHopBatch(
            list(plan.blocks),
            self.inputs[step],
            self.loss_targets[step],
            self.step_counts[step],
            epoch,
            step,
            stats,
            plan=plan,
        )

    def pair_order(self, epoch: int) -> Tensor:
        """The epoch's permutation of the training pairs (``single``'s ``EpochOrder`` over
        them: a full-graph step is its one batch of every pair)."""
        if self._pair_order is None or self._pair_order[0] != epoch:
            ids = torch.arange(self.link_train.num_pairs)
            self._pair_order = epoch, epoch_permutation(ids, self.seed, epoch)
        return self._pair_order[1]

    def link_batch(self, epoch: int, step: int) -> OneHopBatch:
        """Link prediction's step on this rank (collective): its training pairs (those whose
        source's output row it computes) at their positions in the epoch's order, their
        negatives and endpoints (``task.step_rows``), and the route of the endpoint rows
        other ranks compute (:class:`~.link.EndpointRows`: ids ``structure``, rows
        ``activation``). ``y`` indexes the endpoint rows; the loss is divided by the task's
        terms of every training pair."""
        start = time.perf_counter()
        link, plan = self.link_train, self.plans[step]
        positions = pair_positions(link.index, link.num_pairs, self.pair_order(epoch))
        seeds = torch.arange(link.index.numel())
        nodes, y = self.task.step_rows(self.link_targets, seeds, positions, epoch=epoch, step=step)
        context = self.link_context
        endpoints = EndpointRows.route(context.comm, nodes, link.owner, self.loss_ids[step])
        stats = {
            "sample_s": time.perf_counter() - start,
            "load_s": 0.0,
            "input_nodes": plan.input_ids.numel(),
            "endpoint_rows_received": endpoints.num_received,
        }
        device = context.device
        return OneHopBatch(
            list(plan.blocks),
            self.inputs[step],
            y.to(device),
            self.task.loss_terms(link.num_pairs),
            epoch,
            step,
            stats,
            plan=plan,
            endpoints=endpoints.to(device),
        )

    # ------------------------------------------------------------------------ evaluation
    @override
    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """Layer-wise inference over the ranks' shares, the halo rows sent by their owners
        before every layer, scored on this rank's share (``mb_base``: split across ranks,
        each holding the graph)."""
        if not self.config.layout_mode:
            return super().eval_statistics(net, splits)
        if self.is_link:
            return self.link_statistics(net, splits)
        out = self.share_rows(net, net.num_layers)
        return split_statistics(self.task, out, self.part.eval_targets, splits)

    def link_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> Tensor:
        """Link prediction: this rank's core embedded over each stage's structure (its halo
        rows sent by their owners before every layer, as for node tasks), then its share of
        the evaluation edges scored, the rows of their far endpoints and fixed negatives
        pulled from their owners round by round
        (:func:`~...kit.link_partitioned.owned_link_statistics`): no rank holds every node's
        embedding."""
        link = self.part.link

        def embed(stage: str) -> Tensor:
            return self.share_rows(net, net.num_layers, link.shares[stage])

        return owned_link_statistics(
            self.task,
            embed,
            self.part.orig_ids,
            lambda ids: link.owner[ids],
            link.pairs,
            self.num_nodes,
            self.seed,
            splits,
            self.context.comm,
            relations=link.relations,
        )

    def share_rows(
        self, net: torch.nn.Module, layers: int, share: EvalShare | None = None
    ) -> Tensor:
        """The first ``layers`` layers' rows of this rank's inference share (``share``: over
        another structure than the whole graph's, on the same core)."""
        if not isinstance(net, BlockGNN):
            raise TypeError(f"GraNNDIS's inference needs a BlockGNN net, got {type(net).__name__}")
        device = next(net.parameters()).device
        x = self.part.rows(self.part.eval_x_range).to(device)
        comm, chunk = self.context.comm, self.data.eval_chunk_size
        share = self.part.eval_share if share is None else share
        return share.rows(net, x, comm, chunk, layers)

    @override
    def predict_rows(
        self, net: torch.nn.Module, node_ids: Tensor | None, output: str
    ) -> tuple[Tensor, Tensor]:
        """This rank's share (original ids), as evaluation runs it (``mb_base``: the base
        class's node ranges)."""
        if not self.config.layout_mode:
            return super().predict_rows(net, node_ids, output)
        rows = self.share_rows(net, net.num_layers - (output == "embeddings"))
        return own_predictions(self.part.orig_ids, rows, node_ids, self.num_nodes)

    @override
    def callbacks(self) -> list[L.Callback]:
        """:class:`~.callbacks.GraNNDISStats` (reports only)."""
        return [GraNNDISStats(self.num_layers, self.layout_report)]

    def layout_report(self) -> LayoutReport:
        """This rank's layout figures as set up, for :class:`~.callbacks.GraNNDISStats`."""
        return LayoutReport(
            mode=self.config.mode,
            num_nodes=self.num_nodes,
            steps_per_epoch=self.steps_per_epoch,
            plan_bytes=self.plan_bytes,
            layout=self.layout,
            preload_depth=self.preload_depth,
            memory_by_k=self.memory_by_k,
        )
