"""``GraNNDISDataModule``: server partition, server-graph extraction, one-hop plans per rank
(docs/systems/granndis.md).

In memory every rank holds the whole graph (as the artifact assumes a replicated dataset per
server), so the preloaded rows of a server graph are read locally, once; only halo rows move
during training. From a partition directory (``write_parts``) a rank holds its plans and its
server's preloaded rows only (:mod:`.partdir`). The layouts need the topology (servers x workers): the
constructor's ``topology`` (``train.py`` passes the run's), else the Trainer's world size and
nodes (one server per node). They are built in ``prepare_data`` (once per node, before any
rank's ``setup``): every server graph is extracted and split once, and each rank's plans are
cached on disk by content hash; each rank then loads only its own. The ranks check that
what each receives is what its owners send."""

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
)
from ...graph.partition import partition
from ...graph.partition_dir import METADATA, PartitionDir, PartitionDirError
from ...kit.datamodule import GNNDataModule
from ...kit.loaders import StepBatcher
from ...kit.partitions import own_predictions
from ...kit.sampled import ReplicatedGraphEvaluation
from ...models.gnn import BlockGNN
from ...tasks.base import split_statistics
from .callbacks import GraNNDISStats, LayoutReport, LayoutSummary
from .config import DIRECTORY_MODES, GraNNDISConfig
from .costmodel import choose_k, estimate_memory
from .expand import cobatches, eas_expand, khop_levels, sage_expand
from .partdir import EvalShare, eval_halos, eval_share, step_arrays, step_from_arrays
from .plan import OneHopPlan, StepPlan, build_layout

PLAN_PREFIX = "granndis-plans"  # cache files of one rank's plans
SPLITS = ("train", "val", "test")


def depth_tag(k: int | None) -> str:
    """The prefix of a preload depth's arrays in a part (``plan``: a mode without ``k``)."""
    return "plan" if k is None else f"k{k}"


def topology_record(topology: Topology) -> dict:
    """The servers x workers a partition directory was made for (``partition.json``)."""
    return {"servers": topology.num_servers, "workers_per_server": topology.workers_per_server}


@dataclass
class OneHopBatch(Batch):
    """One rank's step on one-hop graphs: ``blocks`` are ``plan.blocks``, ``x`` the input
    rows of ``plan.input_ids`` ``[n, F]``, ``y`` the labels of the loss rows.

    Attributes:
        plan: the rank's plans of this step (the strategy's layer hook exchanges their halos).
    """

    plan: StepPlan | None = None

    @override
    def to(self, device: torch.device | str) -> OneHopBatch:
        moved = super().to(device)
        return replace(moved, plan=None if self.plan is None else self.plan.to(device))


class GraNNDISDataModule(ReplicatedGraphEvaluation, GNNDataModule):
    """One-hop plans per step of this rank; evaluation by full-graph layer-wise inference
    split across ranks (in memory every rank holds the graph; from a partition directory each
    holds its share and receives its halo rows, :class:`~.partdir.EvalShare`).

    Modes (``config.mode``): ``fb_base`` (one whole-graph layout over all ranks), ``flx``
    (each server's ``L``-hop closure of its targets), ``flx_eas`` (each server's EAS graph
    from its partition), ``cob`` (``B`` co-batch graphs per server, built once), ``mb_base``
    (per-rank sampled mini-batches, no layout).

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
        self.labels: list[Tensor] = []  # per step: labels of the loss rows
        # from a partition directory: this rank's part, its server's rows, its inference share
        self.part: dict[str, Tensor] | None = None
        self.server_x: Tensor | None = None
        self.eval_share: EvalShare | None = None

    @property
    def num_nodes(self) -> int:
        if self.partition_dir is not None:
            return int(self.partition_meta()["num_nodes"])
        return self.graph.num_nodes

    @property
    def value_bytes(self) -> int:
        """Bytes of one feature value in this run."""
        if self.partition_dir is not None:
            return self.dtype.itemsize
        return self.graph.x.element_size()

    @property
    def num_layers(self) -> int:
        """``L``: one fanout per layer (checked against the model)."""
        return len(self.data.fanouts)

    # ------------------------------------------------------------------- preprocessing
    @override
    def preprocess(self, world_size: int) -> None:
        """What the launcher can check and compute before any rank starts (the layouts need
        the servers x workers and are built in :meth:`prepare_data`):
        a ``cob.num_per_epoch`` above the training nodes, or a ``memory_budget_mb`` below what
        any depth needs, is refused here; FB_base's flat whole-graph partition is cached."""
        if not self.config.layout_mode:
            return None
        graph, config = self.graph, self.config
        num_train = self.train_ids.numel()
        require(
            config.mode != "cob" or config.cob.num_per_epoch <= num_train,
            f"strategy.cob.num_per_epoch={config.cob.num_per_epoch} exceeds the "
            f"{num_train} training nodes: co-batches past them would be empty on every server",
        )
        self.check_budget(world_size)
        if config.mode == "fb_base" and config.partition.fb_base == "flat":
            cached_partition(graph, "metis", world_size, self.seed, self.cache_dir)
        return None

    def check_budget(self, world_size: int) -> None:
        """``preload_auto``'s budget must fit some depth: for every k the stage that reads the
        inputs owns every vertex at least once (k = 0: the base layout; k > 0: the servers'
        closures cover their partitions), so the worst rank holds at least N / W input rows
        of F values."""
        budget = self.config.memory_budget_mb
        if not self.config.preload_auto or budget is None:
            return
        floor = -(-self.num_nodes // world_size) * self.input_dim * self.value_bytes
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
        self.check_budget(world_size)
        return opened

    @override
    def prepare_data(self) -> None:
        """Once per node, before any rank's ``setup`` (Lightning waits at its ``pre_setup``
        barrier): every rank's plans for :meth:`layout_topology`, built in this one process
        and cached per rank by content hash, so each rank then loads only its own."""
        super().prepare_data()
        topology = self.layout_topology()
        if self.config.layout_mode and topology is not None and self.partition_dir is None:
            self.prepare_layouts(topology)

    def layout_topology(self) -> Topology | None:
        """The servers x workers the in-memory layouts are built for: ``launch_topology`` (the
        constructor's ``topology``, or the run's from ``train.py``), else one server per node
        of the attached Trainer (``None``: neither is known)."""
        if self.launch_topology is not None:
            return self.launch_topology
        if self.trainer is None:
            return None
        return Topology.from_launch(self.trainer.world_size, self.trainer.num_nodes)

    def check_layout_topology(self, context: RankContext) -> None:
        """The strategy's servers x workers must be the ones :meth:`prepare_data` laid out
        (every rank decides alike: no rank waits on one that refused)."""
        expected = self.layout_topology()
        if expected is not None and expected != context.topology:
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
        """The graph's fingerprint (hashed once: it reads every byte of the structure)."""
        return graph_fingerprint(self.graph)

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
        """Build and cache every rank's plans for every depth of :meth:`depths` (what is
        cached already is skipped)."""
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
        """This rank's plans from its part (from a partition directory), else from the cache
        (built, for every rank, if they are not there: a DataModule set up without
        ``prepare_data``)."""
        if self.part is not None:
            tag = depth_tag(k)
            *summary, steps = self.part[f"{tag}_summary"].tolist()
            world = topology.world_size
            plans = [step_from_arrays(self.part, f"{tag}_s{i}_", world) for i in range(steps)]
            return plans, LayoutSummary(*summary)
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
        return cached_partition(self.graph, method, num_servers, self.seed, self.cache_dir)

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
        if method == "metis":
            sub = replace(self.graph.induced_subgraph(vertices), train_mask=is_target)
            parts = partition(sub, "metis_balanced", workers, seed=workers_seed, balance="train")
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
            return khop_levels(self.graph, inner, self.num_layers)
        return self.eas_graph(inner, server)

    def eas_graph(self, inner: Tensor, server: int) -> tuple[Tensor, Tensor]:
        """``(vertices, level)``: ``inner`` grown by expansion-aware sampling (``config.eas``,
        keyed by ``(seed, server)``)."""
        eas = self.config.eas
        return eas_expand(
            self.graph,
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
        cob, graph, num_layers, seed = self.config.cob, self.graph, self.num_layers, self.seed
        if cob.sampler == "none":
            return khop_levels(graph, cobatch, num_layers)
        if cob.sampler == "sage":
            hops = num_layers if cob.hops is None else cob.hops
            return sage_expand(graph, cobatch, fanout=cob.fanout, hops=hops, seed=seed, salt=server)
        return self.eas_graph(cobatch, server)

    def server_targets(self, topology: Topology) -> list[Tensor]:
        """The training nodes of every server's partition."""
        servers, train = self.server_parts(topology.num_servers), self.graph.train_mask
        return [((servers == s) & train).nonzero().flatten() for s in range(topology.num_servers)]

    def build_all_plans(
        self, topology: Topology, k: int | None = None
    ) -> list[tuple[list[StepPlan], LayoutSummary]]:
        """Every rank's plans of every step of an epoch and its :class:`LayoutSummary`, each
        server graph extracted and split once (``k``: FLX's preload depth, default the
        config's)."""
        config, graph, num_layers = self.config, self.graph, self.num_layers
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
                is_target = graph.train_mask[vertices] & (level == 0)
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
        """Every rank's plan of the whole-graph layout ``owner`` (no masks), running the
        model's last ``num_layers`` layers."""
        graph = self.graph
        vertices = torch.arange(graph.num_nodes)
        level = torch.zeros_like(vertices)
        ranks = range(world)
        return build_layout(
            graph, vertices, level, owner, ranks, world, num_layers,
            is_target=graph.train_mask, masking=False,
        )  # fmt: skip

    def partial_preload_plans(
        self, topology: Topology, k: int
    ) -> list[tuple[list[StepPlan], LayoutSummary]]:
        """FLX with ``k < L`` (spec §4.3): layers ``0..k-1`` on each server's ``k``-hop closure
        of its partition ``P_s``, then layers ``k..L-1`` on the base layout, where every vertex
        of ``P_s`` keeps the worker it had in the server graph (so the reshape is local)."""
        graph, config, num_layers = self.graph, self.config, self.num_layers
        world, workers = topology.world_size, topology.workers_per_server
        servers = self.server_parts(topology.num_servers)
        base_owner = torch.empty(graph.num_nodes, dtype=torch.int64)
        preload, server_vertices = {}, [0] * world
        for s in range(topology.num_servers):
            vertices, level = khop_levels(graph, (servers == s).nonzero().flatten(), k)
            is_target = graph.train_mask[vertices] & (level == 0)
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
        graph, world = self.graph, topology.world_size
        if self.config.partition.fb_base == "flat":
            return cached_partition(graph, "metis", world, self.seed, self.cache_dir)
        return self.server_owner(topology)

    def server_owner(self, topology: Topology) -> Tensor:
        """int64 ``[N]``: every server's partition split over its workers by
        ``partition.intra`` (training nodes balanced)."""
        graph = self.graph
        servers = self.server_parts(topology.num_servers)
        owner = torch.empty(graph.num_nodes, dtype=torch.int64)
        for s in range(topology.num_servers):
            vertices = (servers == s).nonzero().flatten()
            is_target = graph.train_mask[vertices]
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
            },
            "topology": None if topology is None else topology_record(topology),
        }

    @override
    def write_parts(self, world_size: int, writer, log) -> dict:
        """Per rank: its plans of every depth of :meth:`depths` (without the ids of their
        rows), the labels of their loss rows and its :class:`~.partdir.EvalShare`; per
        server, one shared group ``server<s>`` of input rows (each step's ``input_ids`` of
        each of its ranks, then its ranks' inference rows), which the parts address as
        ``[start, stop)`` ranges.

        Rank ``r`` owns the relabelled ids of its inference share: FB_base's owners, or in
        the server modes the server partition split over its workers (``partition.intra``),
        so server ``s`` owns ``[node_offsets[s W], node_offsets[(s + 1) W])``.

        The servers x workers must be known (``launch_topology``: the partition command sets
        it from the overrides); nothing defaults. Every rank's plans are built one depth at
        a time into the plan cache (as ``prepare_data`` does in memory), then each server is
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
        self.prepare(world_size)  # the launcher's checks (preprocess)
        graph = self.graph
        self.prepare_layouts(topology)  # every rank's plans of every depth, cached
        log("[partition] plans built")
        owner = self.fb_base_owner(topology) if self.config.mode == "fb_base" else None
        book = PartitionBook.from_parts(
            self.server_owner(topology) if owner is None else owner, world_size
        )
        offsets, halos = book.node_offsets.tolist(), eval_halos(graph, book)
        for server in range(topology.num_servers):
            self.write_server(server, topology, book, halos, writer, log)
        return {
            "node_offsets": offsets,
            "topology": topology_record(topology),
            "train_count": int(graph.train_mask.sum()),
        }

    def write_server(
        self, server: int, topology: Topology, book: PartitionBook, halos, writer, log
    ) -> None:
        """Write server ``server``'s group of input rows, then its ranks' parts
        (:meth:`write_parts`); ``halos``: every rank's inference halo."""
        graph, offsets = self.graph, book.node_offsets.tolist()
        workers = topology.workers_per_server
        ranks = range(server * workers, (server + 1) * workers)
        parts: dict[int, dict[str, Tensor]] = {rank: {} for rank in ranks}
        row_ids: list[Tensor] = []  # the group's rows, in order, as original ids
        count = 0

        def server_range(ids: Tensor) -> Tensor:
            """Append ``ids``'s rows to the server's group: their ``[start, stop)``."""
            nonlocal count
            row_ids.append(ids)
            count += ids.numel()
            return torch.tensor([count - ids.numel(), count], dtype=torch.int64)

        for k in self.depths():
            tag = depth_tag(k)
            for rank in ranks:
                plans, summary = self.rank_plans(topology, rank, k)
                arrays = parts[rank]
                arrays[f"{tag}_summary"] = torch.tensor([*astuple(summary), len(plans)])
                for i, step in enumerate(plans):
                    prefix = f"{tag}_s{i}_"
                    arrays |= step_arrays(step, prefix)
                    arrays[prefix + "x_range"] = server_range(step.input_ids)
                    loss_rows = step.final.owned[: step.final.num_loss]
                    arrays[prefix + "y"] = graph.y.index_select(0, loss_rows)
        for rank in ranks:
            core = book.new2old[offsets[rank] : offsets[rank + 1]]
            parts[rank] |= eval_share(graph, book, halos, rank).arrays()
            parts[rank]["eval_x_range"] = server_range(core)
            parts[rank]["eval_y"] = graph.y.index_select(0, core)
            for split in SPLITS:
                parts[rank][f"eval_{split}_mask"] = getattr(graph, f"{split}_mask")[core]
            parts[rank]["orig_ids"] = core
        # the group's rows gathered once, into one tensor
        x = graph.x.index_select(0, torch.cat([torch.empty(0, dtype=torch.int64), *row_ids]))
        row_ids.clear()
        writer.write_shared(f"server{server}", {"x": x})
        log(f"[partition] server {server}: {count:,} input rows")
        del x
        for rank in ranks:
            arrays = parts.pop(rank)
            share = EvalShare.from_arrays(arrays)
            sizes = {
                "nodes": offsets[rank + 1] - offsets[rank],
                "halo": share.degree.numel() - share.num_core,
                "edges": share.indices.numel(),
            }
            writer.write_part(rank, arrays, sizes, shared=[f"server{server}"])
            log(f"[partition] part {rank + 1}/{topology.world_size} written ({sizes})")

    def open_part(self, context: RankContext, opened: PartitionDir) -> None:
        """This rank's part and its server's shared rows (memory-mapped), after checking the
        directory was made for this servers x workers topology."""
        have, want = opened.meta.get("topology"), topology_record(context.topology)
        if have != want:
            raise PartitionDirError(
                f"{opened.path / METADATA}: 'topology' is {have} but this run has {want}; "
                "partition for these servers x workers (trainer.num_nodes, trainer.devices, "
                "topology.servers): python -m lightning_gnnscale.partition <overrides> out=<dir>"
            )
        self.part = opened.load_part(context.rank)
        server = context.topology.server_of(context.rank)
        self.server_x = opened.load_shared(f"server{server}", context.rank)["x"]
        self.eval_share = EvalShare.from_arrays(self.part)
        self.train_count = int(opened.meta["train_count"])

    def server_rows(self, name: str) -> Tensor:
        """The rows of the server group this part addresses as ``<name>_x_range`` (a slice
        of the mapping, cast to the run's dtype)."""
        start, stop = self.part[f"{name}_x_range"].tolist()
        return self.server_x[start:stop].to(self.dtype)

    def step_data(self, plans: list[StepPlan], k: int | None) -> tuple[list, list]:
        """Per step: the input rows of ``input_ids`` and the labels of the loss rows."""
        if self.part is not None:
            prefixes = [f"{depth_tag(k)}_s{i}" for i in range(len(plans))]
            return (
                [self.server_rows(p) for p in prefixes],
                [self.part[f"{p}_y"] for p in prefixes],
            )
        graph = self.graph
        return (
            [graph.x.index_select(0, p.input_ids) for p in plans],
            [graph.y.index_select(0, p.final.owned[: p.final.num_loss]) for p in plans],
        )

    @cached_property
    def train_count(self) -> int:
        """Training nodes of the whole graph (from a partition directory: its metadata)."""
        return self.train_ids.numel()

    # ------------------------------------------------------------------------ set-up
    @override
    def setup_rank(self, context: RankContext, prepared) -> None:
        """Load this rank's plans (or, for ``mb_base``, build its sampler) and the global
        loss denominators of every step (one all-reduce, ``control``)."""
        self.rank, self.world_size = context.rank, context.world_size
        if isinstance(prepared, PartitionDir):
            self.open_part(context, prepared)
        if not self.config.layout_mode:
            self.batcher = StepBatcher.on_graph(
                self.graph,
                self.data.fanouts,
                self.train_ids,
                self.batch_size,
                self.seed,
                self.rank,
                self.world_size,
                salt_by_rank=True,
            )
            return
        if not isinstance(prepared, PartitionDir):
            self.check_layout_topology(context)
        if self.config.preload_auto:
            self.preload_depth, plans, self.layout = self.choose_preload_depth(context)
        else:
            k = self.depths()[0]
            plans, self.layout = self.rank_plans(context.topology, self.rank, k)
            self.preload_depth = k
        self.check_server_agreement(context, plans)
        local = torch.tensor([p.final.num_loss for p in plans], dtype=torch.int64)
        self.step_counts = context.comm.all_reduce(local, category="control").tolist()
        if sum(self.step_counts) != self.train_count:
            raise RuntimeError(
                f"the layouts' loss rows cover {sum(self.step_counts)} targets per epoch, but "
                f"there are {self.train_count} training nodes"
            )
        self.plan_bytes = sum(p.nbytes() for p in plans)
        self.plans = [p.to(context.device) for p in plans]
        inputs, labels = self.step_data(plans, self.preload_depth)
        self.inputs = [x.to(context.device) for x in inputs]
        self.labels = [y.to(context.device) for y in labels]

    @override
    def build_model(self, model: ModelConfig) -> torch.nn.Module:
        """The net, also recording its widths and size for ``preload_auto``'s estimates."""
        net = super().build_model(model)
        self.model_dims = [self.input_dim, *[model.hidden] * (model.num_layers - 1)]
        self.model_dims.append(self.out_dim)
        self.model_params = sum(p.numel() for p in net.parameters())
        return net

    def memory_estimate(self, step: StepPlan) -> int:
        """Estimated bytes of one step on this rank (spec §4.8): each stage's rows, edges
        and masks over its layers' widths, plus the parameters with their optimiser state."""
        if self.model_dims is None:
            raise RuntimeError(
                "strategy.preload_auto=true estimates memory from the model's widths: build "
                "the net with this DataModule's build_model(model_config) before training"
            )
        dims, total, first = self.model_dims, 0, 0
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
                value_bytes=self.value_bytes,
            ).total
            first += layers
        return total + self.model_params * self.value_bytes * 4

    def choose_preload_depth(
        self, context: RankContext
    ) -> tuple[int, list[StepPlan], LayoutSummary]:
        """FLX's ``k``: the largest whose worst-rank estimate fits the budget
        (:func:`~.costmodel.choose_k`; one all-reduce of the ``L + 1`` estimates, ``control``),
        with this rank's plans and summary for it."""
        built = [self.rank_plans(context.topology, context.rank, k) for k in self.depths()]
        local = torch.tensor(
            [max(self.memory_estimate(s) for s in plans) for plans, _ in built],
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
        return k, *built[k]

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
            self.labels[step],
            self.step_counts[step],
            epoch,
            step,
            stats,
            plan=plan,
        )

    # ------------------------------------------------------------------------ evaluation
    @override
    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """In memory: layer-wise inference split across ranks, each holding the graph. From a
        partition directory: the same inference over the ranks' shares, the halo rows sent
        by their owners before every layer; scored on this rank's share."""
        if self.eval_share is None:
            return super().eval_statistics(net, splits)
        out = self.share_rows(net, net.num_layers)
        masks = {split: self.part[f"eval_{split}_mask"] for split in splits}
        return split_statistics(self.task, out, self.part["eval_y"], masks, splits)

    def share_rows(self, net: torch.nn.Module, layers: int) -> Tensor:
        """The first ``layers`` layers' rows of this rank's inference share."""
        if not isinstance(net, BlockGNN):
            raise TypeError(
                f"inference from a partition directory needs a BlockGNN net, got "
                f"{type(net).__name__}"
            )
        device = next(net.parameters()).device
        x = self.server_rows("eval").to(device)
        comm, chunk = self.context.comm, self.data.eval_chunk_size
        return self.eval_share.rows(net, x, comm, chunk, layers)

    @override
    def predict_rows(
        self, net: torch.nn.Module, node_ids: Tensor | None, output: str
    ) -> tuple[Tensor, Tensor]:
        """From a partition directory: this rank's share (original ids), as evaluation runs
        it; in memory: the base class's node ranges."""
        if self.eval_share is None:
            return super().predict_rows(net, node_ids, output)
        if not isinstance(net, BlockGNN):
            raise TypeError(f"predictions need a BlockGNN net, got {type(net).__name__}")
        rows = self.share_rows(net, net.num_layers - (output == "embeddings"))
        return own_predictions(self.part["orig_ids"], rows, node_ids, self.num_nodes)

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
