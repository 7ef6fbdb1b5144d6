"""``GraNNDISConfig``: the settings of ``strategy=granndis`` (FLX-EAS) and its presets
``granndis_flx``, ``granndis_cob``, ``granndis_fb_base``, ``granndis_mb_base``
(docs/systems/granndis.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from ...config_types import DataConfig, RunFacts, SystemConfig, choice, require

MODES = ("fb_base", "flx", "flx_eas", "cob", "mb_base")
DIRECTORY_MODES = ("fb_base", "flx", "flx_eas", "cob")  # those with a layout to write per rank
SERVER_PARTITIONS = ("metis", "contiguous", "random")
INTRA_PARTITIONS = ("metis", "contiguous", "random")
FB_BASE_LAYOUTS = ("flat", "hierarchical")
SELECTIONS = ("uniform", "degree_topk", "degree_prob")
FANOUT_SCOPES = ("external", "all")
FRONTIERS = ("new", "all")
COB_SAMPLERS = ("none", "sage", "eas")
GRAD_SYNCS = ("ddp", "hierarchical")

# name -> (one line for listings, the settings that differ from ``granndis``)
_PRESETS: dict[str, tuple[str, dict]] = {
    "granndis": (
        "GraNNDIS FLX-EAS: server-level preloading with expansion-aware sampling, one-hop "
        "graph masking, no inter-server feature or activation traffic",
        {},
    ),
    "granndis_flx": (
        "GraNNDIS FLX: each server preloads the L-hop in-neighbourhood of its targets (exact)",
        {"mode": "flx"},
    ),
    "granndis_cob": (
        "GraNNDIS CoB: one co-batch per server and step, split over its workers",
        {"mode": "cob"},
    ),
    "granndis_fb_base": (
        "GraNNDIS's FB_base: flat full-graph halo exchange over all ranks (PipeGCN, no staleness)",
        {"mode": "fb_base"},
    ),
    "granndis_mb_base": (
        "GraNNDIS's MB_base: per-worker sampled mini-batches (DistDGL / SALIENT++ style)",
        {"mode": "mb_base"},
    ),
}
GRANNDIS_PRESETS = {name: description for name, (description, _) in _PRESETS.items()}


def _mode_preset(mode: str) -> str:
    """The preset whose settings select ``mode`` (``granndis`` for its own ``flx_eas``)."""
    named = [n for n, (_, diff) in _PRESETS.items() if diff.get("mode", "flx_eas") == mode]
    return f"strategy={named[0]}" if named else "strategy=granndis"


@dataclass(frozen=True)
class GraNNDISPartitionConfig:
    """How vertices are placed.

    Args:
        server: the server-level partition ``P_s`` (``metis`` | ``contiguous`` (the
            artifact's) | ``random``).
        intra: how a server graph is split over the server's workers (same choices).
        fb_base: FB_base's layout: ``flat`` (METIS into ``W`` parts, server boundaries
            ignored: the paper's baseline) | ``hierarchical`` (server parts, then ``intra``).
    """

    server: str = "metis"
    intra: str = "metis"
    fb_base: str = "flat"

    def __post_init__(self) -> None:
        choice("strategy.partition.server", self.server, SERVER_PARTITIONS)
        choice("strategy.partition.intra", self.intra, INTRA_PARTITIONS)
        choice("strategy.partition.fb_base", self.fb_base, FB_BASE_LAYOUTS)


@dataclass(frozen=True)
class EASConfig:
    """Expansion-aware sampling (spec §4.5): from the inner set, at most ``fanout`` external
    neighbours per frontier vertex (``-1``: all) for ``hops`` hops; ``selection``,
    ``fanout_scope`` and ``frontier`` as in the spec (defaults: the paper's text on scope and
    frontier, the artifact's uniform selection)."""

    hops: int = 1
    fanout: int = 15
    selection: str = "uniform"
    fanout_scope: str = "external"
    frontier: str = "new"

    def __post_init__(self) -> None:
        require(self.hops >= 0, f"strategy.eas.hops={self.hops} must be >= 0")
        require(
            self.fanout >= 1 or self.fanout == -1,
            f"strategy.eas.fanout={self.fanout} must be >= 1 or -1 (all)",
        )
        choice("strategy.eas.selection", self.selection, SELECTIONS)
        choice("strategy.eas.fanout_scope", self.fanout_scope, FANOUT_SCOPES)
        choice("strategy.eas.frontier", self.frontier, FRONTIERS)


@dataclass(frozen=True)
class CoBConfig:
    """Cooperative batching (spec §4.4).

    Args:
        num_per_epoch: co-batches ``B`` per server and epoch (the same on every server).
        sampler: ``none`` (exact ``L``-hop closure) | ``sage`` (ShaDow-style, ``fanout`` per
            collected vertex and hop) | ``eas`` (the ``eas`` settings, from the co-batch).
        fanout: ``sage``'s fanout.
        hops: ``sage``'s hops; ``None`` = the number of layers.
        shuffle: shuffle the server's targets before cutting co-batches (seeded); the
            co-batches are built once and reused every epoch (the artifact's static mode).
    """

    num_per_epoch: int = 1
    sampler: str = "sage"
    fanout: int = 25
    hops: int | None = None
    shuffle: bool = True

    def __post_init__(self) -> None:
        require(
            self.num_per_epoch >= 1, f"strategy.cob.num_per_epoch={self.num_per_epoch} must be >= 1"
        )
        choice("strategy.cob.sampler", self.sampler, COB_SAMPLERS)
        require(self.fanout >= 1, f"strategy.cob.fanout={self.fanout} must be >= 1")
        require(
            self.hops is None or self.hops >= 0,
            f"strategy.cob.hops={self.hops} must be >= 0 (or null = the number of layers)",
        )


@dataclass(frozen=True)
class GraNNDISConfig(SystemConfig):
    """GraNNDIS's settings; the presets differ only in ``mode`` (:meth:`preset`).

    Args:
        mode: ``flx_eas`` (default) | ``flx`` | ``cob`` | ``fb_base`` | ``mb_base``.
        partition: vertex placement (:class:`GraNNDISPartitionConfig`).
        eas: expansion-aware sampling (``flx_eas``, and ``cob`` with ``sampler=eas``).
        cob: cooperative batching (``cob``).
        preload_k: FLX's preload depth ``k`` in ``[0, L]``; ``None`` = ``L`` (nothing but
            gradients crosses servers). With ``k < L`` the first ``k`` layers run on the
            server graphs of ``k``-hop closures, then the rows are reshaped (locally) onto the
            base layout (the servers' partitions, all ranks) for the remaining layers.
        preload_auto: FLX picks ``k`` itself: the largest whose estimated memory per worker
            (spec §4.8, :func:`~.costmodel.estimate_memory`, worst rank) fits
            ``memory_budget_mb`` (the paper's "largest k that fits"; no budget: ``k = L``).
        memory_budget_mb: the per-worker budget of ``preload_auto``; ``None`` = unlimited.
        masking: the per-layer vertex masking of one-hop graph masking (spec §4.2.1); ``false``
            keeps every row at every layer (the loss still covers level-0 targets only).
        grad_sync: ``ddp`` (the metered DDP all-reduce over all ranks) | ``hierarchical``
            (after backward: sum inside each server, among the server heads, then broadcast
            inside each server, so the gradient crosses servers once per head; ours, not the
            paper's).
    """

    name: str = "granndis"
    supports_partition_dir: ClassVar[bool] = True
    TYPED_GRAPHS: ClassVar[bool] = True  # every mode (docs/systems/granndis.md, "Typed graphs")
    # link prediction on typed graphs too: pairs keep their relations, layouts the training
    # edges' (every mode; docs/systems/granndis.md, "Typed graphs")
    TYPED_LINK_PREDICTION: ClassVar[bool] = True
    # the task's head (task.decoder=mlp | distmult) is a module parameter, summed with the
    # net's gradients (DDP or hierarchical) from each rank's pairs
    TRAINS_TASK_HEAD: ClassVar[bool] = True
    mode: str = "flx_eas"
    partition: GraNNDISPartitionConfig = field(default_factory=GraNNDISPartitionConfig)
    eas: EASConfig = field(default_factory=EASConfig)
    cob: CoBConfig = field(default_factory=CoBConfig)
    preload_k: int | None = None
    preload_auto: bool = False
    memory_budget_mb: float | None = None
    masking: bool = True
    grad_sync: str = "ddp"

    NAMES: ClassVar[tuple[str, ...]] = tuple(_PRESETS)
    # link prediction last: CI's conformance runs a preset's first two tasks
    TASKS: ClassVar[tuple[str, ...]] = ("node_classification", "node_regression", "link_prediction")
    PRESETS: ClassVar[dict[str, dict]] = {n: s for n, (_, s) in _PRESETS.items()}

    def __post_init__(self) -> None:
        super().__post_init__()
        choice("strategy.mode", self.mode, MODES)
        choice("strategy.grad_sync", self.grad_sync, GRAD_SYNCS)
        require(
            self.preload_k is None or self.preload_k >= 0,
            f"strategy.preload_k={self.preload_k} must be >= 0 (or null = the number of layers)",
        )
        require(
            not self.preload_auto or (self.mode == "flx" and self.preload_k is None),
            "strategy.preload_auto=true chooses k for strategy.mode=flx: set mode=flx and "
            "leave preload_k null",
        )
        require(
            self.memory_budget_mb is None or self.memory_budget_mb > 0,
            f"strategy.memory_budget_mb={self.memory_budget_mb} must be > 0 (or null)",
        )
        require(
            self.memory_budget_mb is None or self.preload_auto,
            f"strategy.memory_budget_mb={self.memory_budget_mb} is the budget of "
            "strategy.preload_auto, which is false: set preload_auto=true (with mode=flx) or "
            "leave memory_budget_mb null",
        )
        preset_mode = _PRESETS.get(self.name, (None, {}))[1].get("mode")
        require(
            self.name == "granndis" or preset_mode is None or self.mode == preset_mode,
            f"strategy={self.name} is the {preset_mode} preset, but strategy.mode={self.mode}: "
            f"pick the preset of that mode ({_mode_preset(self.mode)}), or strategy=granndis "
            f"strategy.mode={self.mode}",
        )
        require(
            self.preload_k is None or self.mode == "flx",
            f"strategy.preload_k={self.preload_k} applies to strategy.mode=flx only (mode is "
            f"{self.mode}); leave it null",
        )

    @classmethod
    def loads_partition_dir(cls, name: str) -> bool:
        """Every preset but ``granndis_mb_base`` (no layout: it samples the whole graph)."""
        return _PRESETS.get(name, (None, {}))[1].get("mode", "flx_eas") in DIRECTORY_MODES

    @classmethod
    def preset(cls, name: str) -> GraNNDISConfig:
        """The settings of a registered name."""
        choice("strategy", name, tuple(_PRESETS))
        return replace(cls(), name=name, **_PRESETS[name][1])

    def preload_depth(self, num_layers: int) -> int:
        """FLX's ``k`` for a model of ``num_layers`` layers."""
        return num_layers if self.preload_k is None else self.preload_k

    def check_data(self, data: DataConfig) -> None:
        super().check_data(data)
        require(
            self.mode in DIRECTORY_MODES or not data.partition_dir,
            f"strategy.mode={self.mode} samples mini-batches from the whole graph on every "
            f"rank, so it cannot train from data.partition_dir; the GraNNDIS modes that can: "
            f"{list(DIRECTORY_MODES)}",
        )
        require(
            not self.layout_mode or not data.fanouts_per_relation,
            f"data.fanouts_per_relation={dict(data.fanouts_per_relation)} with strategy.mode="
            f"{self.mode}: its steps run on whole one-hop graphs (every relation's edges among "
            "the server graph's vertices), so no fanout is used; drop it, or use "
            "strategy=granndis_mb_base (sampled mini-batches)",
        )

    def check_run(self, run: RunFacts) -> None:
        if run.model is not None:  # a plain LightningModule that states no model settings
            self.check_layers(run.model.num_layers)
        if run.task is not None:
            self.check_task_mode(run.task)

    def check_task_mode(self, task: str) -> None:
        """Rules between the mode and the task (a run's check, and the DataModule's for plain
        Lightning scripts). CoB's co-batches are node sets fixed before training, each
        step's outputs computed for one of them only; a link-prediction step's endpoints
        include negatives drawn anywhere in the graph at every step, so only one co-batch per
        server (all of its nodes) holds them."""
        require(
            task != "link_prediction" or self.mode != "cob" or self.cob.num_per_epoch == 1,
            f"strategy.cob.num_per_epoch={self.cob.num_per_epoch} with task=link_prediction: "
            "a co-batch computes the outputs of its own nodes only, but a link-prediction "
            "step's negatives are drawn over the whole graph at every step; set "
            "strategy.cob.num_per_epoch=1 (one co-batch of every node per server)",
        )

    def check_layers(self, layers: int) -> None:
        """Rules between these settings and the model's depth ``L`` (a run's check, and the
        DataModule's for plain Lightning scripts): depths past ``L`` only add rows that every
        layer drops, so they are refused where the mode uses them."""
        require(
            self.preload_k is None or self.preload_k <= layers,
            f"strategy.preload_k={self.preload_k} must be <= model.num_layers={layers}",
        )
        uses_eas = self.mode == "flx_eas" or (self.mode == "cob" and self.cob.sampler == "eas")
        require(
            not uses_eas or self.eas.hops <= layers,
            f"strategy.eas.hops={self.eas.hops} must be <= model.num_layers={layers}: vertices "
            "past L hops are masked at every layer (loaded and exchanged for nothing)",
        )
        uses_sage = self.mode == "cob" and self.cob.sampler == "sage"
        require(
            not uses_sage or self.cob.hops is None or self.cob.hops <= layers,
            f"strategy.cob.hops={self.cob.hops} must be <= model.num_layers={layers} (or null = "
            "L): vertices past L hops are masked at every layer",
        )

    @property
    def layout_mode(self) -> bool:
        """Whether steps run on one-hop graphs with halo exchange (all modes but ``mb_base``)."""
        return self.mode != "mb_base"
