"""``GrappaConfig``: Grappa's settings (``strategy:`` of ``strategy=grappa*``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...config_types import RunFacts, SystemConfig, choice, require
from ...tasks import NODE_TASKS
from .schedule import SCHEDULES, SWEEP_ORDERS, Schedule

CHUNKINGS = ("random", "random_iid", "metis")
ESTIMATORS = ("none", "uniform", "resampling", "resampling_literal", "node")

MODES = ("minibatch", "fullgraph")
EVAL_MODES = ("global_fullgraph", "isolated", "none")
# link prediction: which training pairs a partition trains (docs/systems/grappa.md, "Link
# prediction"): both endpoints owned, or also those whose source is a halo node
PAIR_SOURCES = ("owned", "held")
NEIGHBOR_WEIGHTINGS = ("uniform", "gcn")
# ``partitions_per_rank: null`` takes the fewest phases giving at least this many pinned-sweep
# chunks, so a partition owns at most half of the graph at any world size (docs/systems/grappa.md,
# "Partitions per rank")
MIN_AUTO_CHUNKS = 4
SCALING_IMPLS = ("comm_hook", "loss_scale")

# name -> (one line for listings, the settings that differ from ``grappa``); the paper's
# ablations (docs/systems/grappa.md, "Ablation").
_PRESETS: dict[str, tuple[str, dict]] = {
    "grappa": (
        "Grappa: isolated partitions, periodic repartitioning, coverage-scaled gradients",
        {},
    ),
    "grappa_uw": ("Grappa-UW ablation: no coverage correction", {"estimator": "none"}),
    "grappa_fp": ("Grappa-FP ablation: fixed partitions", {"schedule": "fixed"}),
    "grappa_naive": (
        "Grappa ablation: fixed, uncorrected partitions",
        {"estimator": "none", "schedule": "fixed"},
    ),
    "grappa_50s": (
        "Grappa-50S ablation: half of the frontier expanded by its owner",
        {"remote_sample_frac": 0.5},
    ),
}
GRAPPA_PRESETS = {name: description for name, (description, _) in _PRESETS.items()}


@dataclass(frozen=True)
class EarlyTriggerConfig:
    """``strategy.early_trigger``: switch super-epochs early on a large coverage deficit.

    A rank votes to switch at an epoch end when the mean deficit ``1 - c_uniform`` of its last
    ``window_steps`` steps is above ``threshold`` and the super-epoch has lasted ``min_epochs``
    epochs; the ranks' votes are combined by a MAX all-reduce (``control``).
    """

    enabled: bool = False
    threshold: float = 0.9
    window_steps: int = 20
    min_epochs: int = 1

    def __post_init__(self) -> None:
        require(
            self.window_steps >= 1,
            f"strategy.early_trigger.window_steps={self.window_steps} must be >= 1",
        )
        require(
            0.0 <= self.threshold < 1.0,
            f"strategy.early_trigger.threshold={self.threshold} must be in [0, 1)",
        )


@dataclass(frozen=True)
class GrappaConfig(SystemConfig):
    """Grappa's settings; the presets differ only in a few of them (:meth:`preset`).

    Args:
        mode: ``minibatch`` | ``fullgraph`` (one step per phase on the whole local graph).
        chunking: ``random`` (balanced permutation) | ``random_iid`` | ``metis``.
        num_chunks: ``C``; ``None`` derives it (:meth:`chunk_count`).
        schedule: ``pinned_sweep`` | ``tournament`` | ``fixed``.
        sweep_order: ``cyclic`` | ``shuffled`` (each cycle's order permuted, seeded).
        super_epoch_len: epochs per super-epoch: an int >= 1, or ``"auto"`` / ``None`` =
            ``max(1, max_epochs // cycle)`` (the Trainer's ``max_epochs``).
        early_trigger: see :class:`EarlyTriggerConfig`.
        partitions_per_rank: phases per epoch ``k`` (``P = k W`` partitions); ``None`` derives it
            (:meth:`phases`) so that every partition is a strict subset of the graph.
        halo_hops: ``0`` (strict isolation) | ``1`` (every in-neighbour of the owned nodes).
        count_halo_as_local: count halo in-neighbours in the coverage ``ell``.
        pair_sources: link prediction: ``owned`` (a partition trains the pairs whose
            endpoints it both owns; one with a halo source is excluded that super-epoch) |
            ``held`` (also those, scored through the halo).
        degree_smoothing: ``alpha``, the self term of ``kappa = (ell + alpha) / (D + alpha)``.
        neighbor_weighting: ``uniform`` | ``gcn`` (the neighbour probabilities behind kappa).
        estimator: ``none`` | ``uniform`` | ``resampling`` | ``resampling_literal`` | ``node``.
        scaling_impl: ``comm_hook`` | ``loss_scale`` (identical results).
        eval_mode: ``global_fullgraph`` (ranks hold the graph) | ``isolated`` | ``none``.
        remote_sample_frac: share of the frontier expanded by its owner (Grappa-50S only).
        cache_partitions: keep every built partition in memory (small graphs).
        audit_collectives: fail if a training step issues anything but gradient all-reduces.
    """

    name: str = "grappa"
    mode: str = "minibatch"
    chunking: str = "random"
    num_chunks: int | None = None
    schedule: str = "pinned_sweep"
    sweep_order: str = "cyclic"
    super_epoch_len: int | str | None = "auto"
    early_trigger: EarlyTriggerConfig = field(default_factory=EarlyTriggerConfig)
    partitions_per_rank: int | None = None
    halo_hops: int = 1
    count_halo_as_local: bool = False
    pair_sources: str = "owned"
    degree_smoothing: float = 1.0
    neighbor_weighting: str = "uniform"
    estimator: str = "resampling"
    scaling_impl: str = "comm_hook"
    eval_mode: str = "global_fullgraph"
    remote_sample_frac: float = 0.0
    cache_partitions: bool = False
    audit_collectives: bool = False

    # link prediction last (CI's conformance runs a preset's first two tasks)
    TASKS: ClassVar[tuple[str, ...]] = (*NODE_TASKS, "link_prediction")
    NAMES: ClassVar[tuple[str, ...]] = tuple(_PRESETS)
    PRESETS: ClassVar[dict[str, dict]] = {n: s for n, (_, s) in _PRESETS.items()}
    # the paper's setting: L2 is added after the coverage-scaled all-reduce, unscaled
    MODEL_SETTINGS: ClassVar[dict] = {"weight_decay": 0.0}
    supports_partition_dir: ClassVar[bool] = True  # its chunks as shared groups (directory.py)
    # every preset: RGCN inside isolated partitions, coverage per relation (docs: #typed-graphs)
    TYPED_GRAPHS: ClassVar[bool] = True
    # and link prediction on them: each pair with its relation (docs: #typed-graphs)
    TYPED_LINK_PREDICTION: ClassVar[bool] = True
    # a task head (task.decoder=mlp, distmult) is a module parameter like the net's: DDP's
    # coverage-scaled all-reduce syncs its gradient with the net's (docs: #link-prediction)
    TRAINS_TASK_HEAD: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        choice("strategy.mode", self.mode, MODES)
        choice("strategy.chunking", self.chunking, CHUNKINGS)
        choice("strategy.schedule", self.schedule, SCHEDULES)
        choice("strategy.sweep_order", self.sweep_order, SWEEP_ORDERS)
        choice("strategy.estimator", self.estimator, ESTIMATORS)
        choice("strategy.scaling_impl", self.scaling_impl, SCALING_IMPLS)
        choice("strategy.eval_mode", self.eval_mode, EVAL_MODES)
        choice("strategy.neighbor_weighting", self.neighbor_weighting, NEIGHBOR_WEIGHTINGS)
        choice("strategy.halo_hops", self.halo_hops, (0, 1))
        choice("strategy.pair_sources", self.pair_sources, PAIR_SOURCES)
        require(
            self.pair_sources == "owned" or self.halo_hops == 1,
            f"strategy.pair_sources={self.pair_sources} trains pairs with a halo source, but "
            "strategy.halo_hops=0 holds no halo: it has no effect (leave it at owned)",
        )
        require(
            self.num_chunks is None or self.num_chunks >= 1,
            f"strategy.num_chunks={self.num_chunks} must be >= 1 (or null to derive it)",
        )
        require(
            self.partitions_per_rank is None or self.partitions_per_rank >= 1,
            f"strategy.partitions_per_rank={self.partitions_per_rank} must be >= 1 (or null to "
            "derive it)",
        )
        require(
            self.neighbor_weighting != "gcn" or self.halo_hops == 1,
            "strategy.neighbor_weighting=gcn needs strategy.halo_hops=1: the GCN coverage is "
            "the local share of each seed's in-neighbour mass, and without the halo the "
            "partition has neither the seeds' remote in-edges nor their sources' degrees "
            "(kappa would be 1 everywhere)",
        )
        require(
            self.degree_smoothing >= 0,
            f"strategy.degree_smoothing={self.degree_smoothing} must be >= 0",
        )
        length = self.super_epoch_len
        require(
            length in (None, "auto") or (isinstance(length, int) and length >= 1),
            f"strategy.super_epoch_len={length!r} must be 'auto' or an int >= 1",
        )
        frac = self.remote_sample_frac
        require(0.0 <= frac <= 1.0, f"strategy.remote_sample_frac={frac} must be in [0, 1]")
        require(
            frac == 0 or (self.schedule != "tournament" and self.mode == "minibatch"),
            f"strategy.remote_sample_frac={frac} > 0 (Grappa-50S) needs a pinned_sweep or fixed "
            "schedule and mode=minibatch (chunk c then has one owner, rank c mod W)",
        )

    @classmethod
    def preset(cls, name: str) -> GrappaConfig:
        """The settings of preset ``name`` (what ``strategy=<name>`` composes)."""
        choice("strategy", name, tuple(_PRESETS))
        return cls(name=name, **_PRESETS[name][1])

    @property
    def auto_length(self) -> bool:
        """``super_epoch_len`` follows ``max_epochs`` (``auto`` / ``None``)."""
        return self.super_epoch_len in (None, "auto")

    def phases(self, world_size: int) -> int:
        """``k``: ``partitions_per_rank``; else from ``num_chunks`` (``P / W``); else the fewest
        phases giving at least :data:`MIN_AUTO_CHUNKS` chunks (``C = kW`` for the pinned sweep
        and fixed schedules, ``2kW`` for the tournament)."""
        if self.partitions_per_rank is not None:
            return self.partitions_per_rank
        if self.num_chunks is not None:
            return max(1, Schedule(self.schedule, self.num_chunks).num_partitions // world_size)
        per_phase = world_size * (2 if self.schedule == "tournament" else 1)
        return -(-MIN_AUTO_CHUNKS // per_phase)

    def chunk_count(self, world_size: int) -> int:
        """``C``: ``num_chunks``, else ``P = k W`` (pinned sweep, fixed) or ``2P`` (tournament)."""
        if self.num_chunks is not None:
            return self.num_chunks
        parts = self.phases(world_size) * world_size
        return 2 * parts if self.schedule == "tournament" else parts

    def check_world(self, world_size: int) -> None:
        """The chunk count fits ``world_size`` ranks (the schedule has ``k W`` partitions) and
        gives partitions that are strict subsets of the graph (raises :class:`ConfigError`).

        With ``C = 2`` chunks every partition owns both, i.e. the whole graph: plain data
        parallelism over a replicated graph, whatever the estimator or schedule, so it is
        refused. ``C = 1`` (one partition, one rank) is the explicit reduction to ``ddp`` and
        only warned about (:meth:`whole_graph`)."""
        c, k = self.chunk_count(world_size), self.phases(world_size)
        have, parts = Schedule(self.schedule, c).num_partitions, k * world_size
        require(
            have == parts,
            f"strategy.num_chunks={c} gives {have} partitions with strategy.schedule="
            f"{self.schedule}, but partitions_per_rank x world size = {k} x {world_size} = "
            f"{parts}; leave num_chunks=null to derive it",
        )
        require(
            c != 2,
            f"strategy.num_chunks={c} (partitions_per_rank={k} x {world_size} ranks): with 2 "
            "chunks every partition owns both, i.e. the whole graph, so Grappa would be plain "
            "data parallelism and its estimators and repartitioning would do nothing; leave "
            "strategy.partitions_per_rank=null (it derives at least "
            f"{MIN_AUTO_CHUNKS} chunks) or set num_chunks >= 3",
        )

    def check_graph(self, num_nodes: int, world_size: int) -> None:
        """At most one chunk per node of the ``num_nodes``-node graph (an empty chunk seeds
        nothing, and building millions of them spins for minutes); raises
        :class:`ConfigError` naming the setting the chunk count came from."""
        c = self.chunk_count(world_size)
        if self.num_chunks is not None:
            source = f"strategy.num_chunks={c}"
        else:
            k = self.phases(world_size)
            per = " x 2 (tournament)" if self.schedule == "tournament" else ""
            source = (
                f"strategy.partitions_per_rank={k} gives {k} x {world_size} ranks{per} = {c} "
                "chunks, which"
            )
        require(
            c <= num_nodes,
            f"{source} exceeds the graph's {num_nodes} nodes (a chunk needs at least one); "
            "lower it, or leave strategy.num_chunks and strategy.partitions_per_rank null",
        )

    def whole_graph(self, world_size: int) -> bool:
        """Every partition is the whole graph (``C = 1``): Grappa reduces to ``ddp``."""
        return self.chunk_count(world_size) == 1

    def check_run(self, run: RunFacts) -> None:
        self.check_world(run.world_size)
        if run.task == "link_prediction":
            self.check_link_prediction()
        require(
            run.task == "link_prediction" or self.pair_sources == "owned",
            f"strategy.pair_sources={self.pair_sources} chooses link prediction's training "
            f"pairs; task={run.task} has none (leave it at owned, or use "
            "task=link_prediction)",
        )

    @property
    def trains_halo_pairs(self) -> bool:
        """Link prediction: a partition also trains the pairs whose source is a halo node
        (``pair_sources=held`` with the 1-hop halo)."""
        return self.halo_hops == 1 and self.pair_sources == "held"

    def check_link_prediction(self) -> None:
        """The settings link prediction cannot honour (docs/systems/grappa.md, "Link
        prediction"): ``estimator=node`` weights each seed node's loss, and a pair's loss has
        no per-node weight; ``eval_mode=isolated`` scores each node from its own partition,
        and an evaluation pair's endpoints lie in partitions of different phases."""
        require(
            self.estimator != "node",
            "strategy.estimator=node weights each seed node's loss by its coverage, but a "
            "link-prediction loss term is a pair (task=link_prediction takes no per-seed "
            "weights); use a batch-level estimator (resampling, uniform, resampling_literal "
            "or none)",
        )
        require(
            self.eval_mode != "isolated",
            "strategy.eval_mode=isolated scores each node from its own partition alone, but "
            "a link-prediction evaluation pair's endpoints may lie in partitions that run in "
            "different phases; use eval_mode=global_fullgraph (the home chunks' embeddings, "
            "rows pulled per pair from their owners) or none",
        )
