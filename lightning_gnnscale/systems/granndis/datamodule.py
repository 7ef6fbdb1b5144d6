"""``GraNNDISDataModule``: server partition, server-graph extraction, one-hop plans per rank
(docs/systems/granndis.md).

Every rank holds the whole graph (as the artifact assumes a replicated dataset per server), so
the preloaded rows of a server graph are read locally, once; only halo rows move during
training. The layouts need the topology (servers x workers), which the strategy knows only
once the process group exists, so they are built in :meth:`setup_rank`: each rank builds the
layout of its own server (FB_base: the whole-graph layout). Partitions of the whole graph are
cached on disk by content hash; everything else is deterministic in the seed, and the ranks of
a server check that they built the same layout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from ...comm import Topology
from ...graph.batch import Batch
from ...graph.cache import cached_partition
from ...graph.partition import partition
from ...schema import ModelConfig
from ..base import GNNDataModule, ReplicatedGraphEvaluation, StepBatcher
from ..contract import RankContext
from .callbacks import GraNNDISStats
from .config import GraNNDISConfig
from .costmodel import choose_k, estimate_memory
from .expand import cobatches, eas_expand, khop_levels, sage_expand
from .plan import OneHopPlan, StepPlan, build_layout


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


@dataclass(frozen=True)
class LayoutSummary:
    """Sizes of this rank's layouts, for the report callback.

    Attributes:
        server_vertices: ``|V_s|`` summed over this rank's steps (each step's server graph),
            or the owned vertices for FB_base; counted once per server (by the head).
        owned_rows, halo_rows: this rank's rows summed over its steps.
    """

    server_vertices: int
    owned_rows: int
    halo_rows: int


class GraNNDISDataModule(ReplicatedGraphEvaluation, GNNDataModule):
    """One-hop plans per step of this rank; evaluation by full-graph layer-wise inference
    split across ranks (every rank holds the graph).

    Modes (``config.mode``): ``fb_base`` (one whole-graph layout over all ranks), ``flx``
    (each server's ``L``-hop closure of its targets), ``flx_eas`` (each server's EAS graph
    from its partition), ``cob`` (``B`` co-batch graphs per server, built once), ``mb_base``
    (per-rank sampled mini-batches, no layout).

    Args: as :class:`~..base.GNNDataModule`; ``config`` defaults to ``GraNNDISConfig()``.
    """

    def __init__(self, dataset, config: GraNNDISConfig | None = None, data=None, **kwargs):
        super().__init__(dataset, config or GraNNDISConfig(), data, **kwargs)
        self.rank, self.world_size = 0, 1
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

    @property
    def num_layers(self) -> int:
        """``L``: one fanout per layer (checked against the model)."""
        return len(self.data.fanouts)

    # ------------------------------------------------------------------------- layouts
    def server_parts(self, num_servers: int) -> Tensor:
        """int64 ``[N]`` server of every vertex (``partition.server``; cached)."""
        method = self.config.partition.server
        return cached_partition(self.graph, method, num_servers, self.seed, self.cache_dir)

    def intra_owner(self, vertices: Tensor, server: int, workers: int) -> Tensor:
        """Owning rank of each of ``vertices`` (a server graph of ``server``): the server
        graph split over its ``workers`` ranks (``partition.intra``)."""
        sub = self.graph.induced_subgraph(vertices)
        parts = partition(sub, self.config.partition.intra, workers, seed=self.seed + server)
        return server * workers + parts

    def server_graph(self, inner: Tensor, server: int) -> tuple[Tensor, Tensor, str]:
        """``(vertices, level, gcn_degree)`` of the graph grown from ``inner`` by the mode's
        extraction (full-graph modes; CoB's samplers in :meth:`cobatch_graph`)."""
        if self.config.mode == "flx":
            return (*khop_levels(self.graph, inner, self.num_layers), "global")
        return self.eas_graph(inner, server)

    def eas_graph(self, inner: Tensor, server: int) -> tuple[Tensor, Tensor, str]:
        """``(vertices, level, "layout")``: ``inner`` grown by expansion-aware sampling
        (``config.eas``, keyed by ``(seed, server)``); GCN renormalises on the sampled graph."""
        eas = self.config.eas
        vertices, level = eas_expand(
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
        return vertices, level, "layout"

    def cobatch_graph(self, cobatch: Tensor, server: int) -> tuple[Tensor, Tensor, str]:
        """``(vertices, level, gcn_degree)`` of one co-batch's dependency graph (sampling
        keyed by ``(seed, server)``)."""
        cob, graph, num_layers, seed = self.config.cob, self.graph, self.num_layers, self.seed
        if cob.sampler == "none":
            return (*khop_levels(graph, cobatch, num_layers), "global")
        if cob.sampler == "sage":
            hops = num_layers if cob.hops is None else cob.hops
            return (
                *sage_expand(graph, cobatch, fanout=cob.fanout, hops=hops, seed=seed, salt=server),
                "layout",
            )
        return self.eas_graph(cobatch, server)

    def build_plans(
        self, topology: Topology, rank: int, k: int | None = None
    ) -> tuple[list[StepPlan], LayoutSummary]:
        """This rank's plans of every step of an epoch and its :class:`LayoutSummary`
        (``k``: FLX's preload depth, default the config's)."""
        config, graph, num_layers = self.config, self.graph, self.num_layers
        k = config.preload_depth(num_layers) if k is None else k
        world, workers = topology.world_size, topology.workers_per_server
        if config.mode == "fb_base":
            plan = self.base_layout(self.fb_base_owner(topology), world, num_layers)[rank]
            summary = LayoutSummary(plan.owned.numel(), plan.owned.numel(), plan.halo.numel())
            return [StepPlan(plan)], summary
        if config.mode == "flx" and k < num_layers:
            return self.partial_preload_plans(topology, rank, k)
        server = topology.server_of(rank)
        ranks = range(server * workers, (server + 1) * workers)
        mine = (self.server_parts(topology.num_servers) == server).nonzero().flatten()
        targets = mine[graph.train_mask[mine]]
        if config.mode == "cob":
            groups = cobatches(
                targets,
                config.cob.num_per_epoch,
                shuffle=config.cob.shuffle,
                seed=self.seed,
                epoch=0,
                server=server,
            )
            graphs = [self.cobatch_graph(c, server) for c in groups]
        else:
            inner = targets if config.mode == "flx" else mine
            graphs = [self.server_graph(inner, server)]
        plans, sizes = [], 0
        for vertices, level, gcn_degree in graphs:
            owner = self.intra_owner(vertices, server, workers)
            layout = build_layout(
                graph,
                vertices,
                level,
                owner,
                ranks,
                world,
                num_layers,
                is_target=graph.train_mask[vertices] & (level == 0),
                gcn_degree=gcn_degree,
                masking=config.masking,
            )
            plans.append(StepPlan(layout[rank]))
            sizes += vertices.numel()
        summary = LayoutSummary(
            sizes if rank == ranks[0] else 0,
            sum(p.final.owned.numel() for p in plans),
            sum(p.final.halo.numel() for p in plans),
        )
        return plans, summary

    def base_layout(self, owner: Tensor, world: int, num_layers: int) -> dict[int, OneHopPlan]:
        """Every rank's plan of the whole-graph layout ``owner`` (no masks, full-graph GCN
        degrees), running the model's last ``num_layers`` layers."""
        graph = self.graph
        vertices = torch.arange(graph.num_nodes)
        level = torch.zeros_like(vertices)
        ranks = range(world)
        return build_layout(
            graph, vertices, level, owner, ranks, world, num_layers,
            is_target=graph.train_mask, masking=False,
        )  # fmt: skip

    def partial_preload_plans(
        self, topology: Topology, rank: int, k: int
    ) -> tuple[list[StepPlan], LayoutSummary]:
        """FLX with ``k < L`` (spec §4.3): layers ``0..k-1`` on each server's ``k``-hop closure
        of its partition ``P_s``, then layers ``k..L-1`` on the base layout, where every vertex
        of ``P_s`` keeps the worker it had in the server graph (so the reshape is local)."""
        graph, config, num_layers = self.graph, self.config, self.num_layers
        world, workers = topology.world_size, topology.workers_per_server
        servers = self.server_parts(topology.num_servers)
        base_owner = torch.empty(graph.num_nodes, dtype=torch.int64)
        server = topology.server_of(rank)
        for s in range(topology.num_servers):
            vertices, level = khop_levels(graph, (servers == s).nonzero().flatten(), k)
            owner = self.intra_owner(vertices, s, workers)
            base_owner[vertices[level == 0]] = owner[level == 0]
            if s == server:
                ranks = range(s * workers, (s + 1) * workers)
                preload = build_layout(
                    graph, vertices, level, owner, ranks, world, k,
                    is_target=level == 0, masking=config.masking, final=False,
                )[rank]  # fmt: skip
                server_vertices = vertices.numel()
        final = self.base_layout(base_owner, world, num_layers - k)[rank]
        order = torch.argsort(preload.owned)
        reshape = order[torch.searchsorted(preload.owned[order], final.owned)]
        summary = LayoutSummary(
            server_vertices if rank == server * workers else 0,
            preload.owned.numel() + final.owned.numel(),
            preload.halo.numel() + final.halo.numel(),
        )
        return [StepPlan(final, preload, reshape)], summary

    def fb_base_owner(self, topology: Topology) -> Tensor:
        """FB_base's owner of every vertex: METIS into ``W`` parts (``flat``) or server parts
        split by ``partition.intra`` (``hierarchical``)."""
        graph, world = self.graph, topology.world_size
        if self.config.partition.fb_base == "flat":
            return cached_partition(graph, "metis", world, self.seed, self.cache_dir)
        servers = self.server_parts(topology.num_servers)
        owner = torch.empty(graph.num_nodes, dtype=torch.int64)
        for s in range(topology.num_servers):
            vertices = (servers == s).nonzero().flatten()
            owner[vertices] = self.intra_owner(vertices, s, topology.workers_per_server)
        return owner

    # ------------------------------------------------------------------------ set-up
    @override
    def setup_rank(self, context: RankContext, prepared) -> None:
        """Build this rank's plans (or, for ``mb_base``, its sampler) and the global loss
        denominators of every step (one all-reduce, ``control``)."""
        self.rank, self.world_size = context.rank, context.world_size
        graph = self.graph
        if not self.config.layout_mode:
            self.batcher = StepBatcher.on_graph(
                graph,
                self.data.fanouts,
                self.train_ids,
                self.batch_size,
                self.seed,
                self.rank,
                self.world_size,
                salt_by_rank=True,
            )
            return
        if self.config.preload_auto:
            self.preload_depth, plans, self.layout = self.choose_preload_depth(context)
        else:
            plans, self.layout = self.build_plans(context.topology, self.rank)
            if self.config.mode == "flx":
                self.preload_depth = self.config.preload_depth(self.num_layers)
        self.check_server_agreement(context, plans)
        local = torch.tensor([p.final.num_loss for p in plans], dtype=torch.int64)
        self.step_counts = context.comm.all_reduce(local, category="control").tolist()
        if sum(self.step_counts) != self.train_ids.numel():
            raise RuntimeError(
                f"the layouts' loss rows cover {sum(self.step_counts)} targets per epoch, but "
                f"there are {self.train_ids.numel()} training nodes"
            )
        self.plans = [p.to(context.device) for p in plans]
        self.inputs = [graph.x.index_select(0, p.input_ids).to(context.device) for p in plans]
        self.labels = [
            graph.y.index_select(0, p.final.owned[: p.final.num_loss]).to(context.device)
            for p in plans
        ]

    @override
    def build_model(self, model: ModelConfig) -> torch.nn.Module:
        """The net, also recording its widths and size for ``preload_auto``'s estimates."""
        net = super().build_model(model)
        self.model_dims = [self.input_dim, *[model.hidden] * (model.num_layers - 1)]
        self.model_dims.append(self.num_classes)
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
                value_bytes=self.graph.x.element_size(),
            ).total
            first += layers
        return total + self.model_params * self.graph.x.element_size() * 4

    def choose_preload_depth(
        self, context: RankContext
    ) -> tuple[int, list[StepPlan], LayoutSummary]:
        """FLX's ``k``: the largest whose worst-rank estimate fits the budget
        (:func:`~.costmodel.choose_k`; one all-reduce of the ``L + 1`` estimates, ``control``),
        with this rank's plans and summary for it."""
        built = [
            self.build_plans(context.topology, context.rank, k) for k in range(self.num_layers + 1)
        ]
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

    @override
    def callbacks(self) -> list[L.Callback]:
        """:class:`~.callbacks.GraNNDISStats` (reports only)."""
        return [GraNNDISStats(self)]
