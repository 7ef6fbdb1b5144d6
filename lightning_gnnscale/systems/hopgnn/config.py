"""``HopGNNConfig``: the settings of ``strategy=hopgnn`` and its model-centric baseline
``strategy=hopgnn_mc`` (docs/systems/hopgnn.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from ...config_types import RunFacts, SystemConfig, choice, require
from ...graph.partition_config import PartitionConfig
from ...tasks import NODE_TASKS

MODES = ("micrograph", "model_centric")
PAYLOADS = ("params+grads", "params", "grads", "none")
DIRECTIONS = (1, -1)
MERGE_SCORES = ("sum_roots", "min_roots")
MERGE_POLICIES = ("model", "home")
TIME_SOURCES = ("modeled", "wall")

# name -> (one line for listings, the settings that differ from ``hopgnn``)
_PRESETS: dict[str, tuple[str, dict]] = {
    "hopgnn": (
        "HopGNN: micrographs trained on their root's server, model replicas migrate",
        {},
    ),
    "hopgnn_mc": (
        "HopGNN's model-centric baseline: each rank fetches every remote input row of its batch",
        {"mode": "model_centric", "merge_adaptive": False},
    ),
}
HOPGNN_PRESETS = {name: description for name, (description, _) in _PRESETS.items()}


@dataclass(frozen=True)
class HopGNNConfig(SystemConfig):
    """HopGNN's settings; ``hopgnn_mc`` differs only in ``mode`` (:meth:`preset`).

    Args:
        mode: ``micrograph`` (HopGNN: roots grouped by home server, the replicas rotate through
            the servers in time steps) | ``model_centric`` (every rank trains its own share of
            the global mini-batch in one step and fetches all its remote input rows).
        partition: the feature partition (one part per rank); ``metis`` by default, as the
            paper (``graph/partition.py``; cached by content hash).
        pregather: one deduplicated fetch per iteration of every remote row a rank needs over
            all its time steps; ``false``: one fetch per time step.
        steps: kept time steps per iteration ``T`` in ``[1, N]``; ``None`` = ``N``. ``T < N``
            merges the least-loaded steps away (spec §3.5); with ``merge_adaptive`` it is the
            starting ``T``. ``steps > N`` is refused (:meth:`check_world`, on every rank).
        merge_score: ``sum_roots`` (paper) | ``min_roots`` (artifact): the load of a step.
        merge_policy: ``model`` (a dropped step's roots stay with their model, spread over its
            kept steps) | ``home`` (they stay on their home server, change model).
        payload: what migrates between kept steps: ``params+grads`` (paper) | ``params`` |
            ``grads`` | ``none`` (the accumulators stay put; no bytes).
        direction: ``+1``: model ``d`` is on server ``(d + k) mod N`` at step ``k``; ``-1``:
            ``(d - k) mod N`` (the artifact's).
        barrier_per_step: a barrier after every time step (the artifact's synchronisation).
        merge_adaptive: the merging controller (on by default, as the paper): from epoch
            ``merge_start_epoch`` on, drop one more time step per epoch while the epoch time
            improves, then revert to the best ``T`` and freeze it.
        merge_start_epoch: the first epoch that may run with fewer steps (``>= 1``); the
            ``merge_monitor_epochs`` epochs before it are the baseline, earlier ones warm-up.
        merge_min_steps: the controller never goes below this ``T`` (``>= 1``).
        merge_recount: ``true``: each removal compares the steps' loads after the roots already
            moved (ours); ``false``: the original loads (the artifact's). ``None``: ``true``
            under ``merge_policy=model``; ``policy=home`` moves roots only after all removals,
            so it always compares original loads and refuses ``true``.
        merge_time_source: ``modeled`` (deterministic: training bytes over ``bandwidth`` plus
            ``step_overhead_s`` per time step) | ``wall`` (measured epoch time).
        merge_monitor_epochs: epochs measured per decision.
        bandwidth: bytes/s of the modeled time (10 GbE: ``1.25e9``).
        step_overhead_s: modeled cost of one time step (launches and barrier).
    """

    name: str = "hopgnn"
    mode: str = "micrograph"
    partition: PartitionConfig = field(default_factory=lambda: PartitionConfig(method="metis"))
    pregather: bool = True
    steps: int | None = None
    merge_score: str = "sum_roots"
    merge_policy: str = "model"
    payload: str = "params+grads"
    direction: int = 1
    barrier_per_step: bool = True
    merge_adaptive: bool = True
    merge_start_epoch: int = 1
    merge_min_steps: int = 1
    merge_recount: bool | None = None
    merge_time_source: str = "modeled"
    merge_monitor_epochs: int = 1
    bandwidth: float = 1.25e9
    step_overhead_s: float = 1e-3

    NAMES: ClassVar[tuple[str, ...]] = tuple(_PRESETS)
    # link prediction last: CI's conformance runs a preset's first two tasks
    TASKS: ClassVar[tuple[str, ...]] = (*NODE_TASKS, "link_prediction")
    # the task's head (task.decoder=mlp) is a module parameter: it migrates with the replica
    # and is summed with the net's gradients
    TRAINS_TASK_HEAD: ClassVar[bool] = True
    # task.exclude_target_edges: both samplers drop the step's positive pairs (original ids)
    EXCLUDES_TARGET_EDGES: ClassVar[bool] = True
    supports_partition_dir: ClassVar[bool] = True
    # typed graphs (node tasks): per-relation sampling over the replicated typed topology
    # (docs/systems/hopgnn.md, "Typed graphs")
    TYPED_GRAPHS: ClassVar[bool] = True
    # typed link prediction: a pair carries its relation through the plan, the training
    # structure's inverse relations are sampled per relation (docs/systems/hopgnn.md)
    TYPED_LINK_PREDICTION: ClassVar[bool] = True
    PRESETS: ClassVar[dict[str, dict]] = {n: s for n, (_, s) in _PRESETS.items()}

    def __post_init__(self) -> None:
        super().__post_init__()
        choice("strategy.mode", self.mode, MODES)
        require(
            self.steps is None or self.steps >= 1,
            f"strategy.steps={self.steps} must be >= 1 (or null = one step per rank)",
        )
        choice("strategy.merge_score", self.merge_score, MERGE_SCORES)
        choice("strategy.merge_policy", self.merge_policy, MERGE_POLICIES)
        choice("strategy.payload", self.payload, PAYLOADS)
        choice("strategy.direction", self.direction, DIRECTIONS)
        choice("strategy.merge_time_source", self.merge_time_source, TIME_SOURCES)
        require(
            self.merge_monitor_epochs >= 1,
            f"strategy.merge_monitor_epochs={self.merge_monitor_epochs} must be >= 1",
        )
        require(
            self.merge_start_epoch >= 1,
            f"strategy.merge_start_epoch={self.merge_start_epoch} must be >= 1 (epoch 0 is the "
            "first baseline)",
        )
        require(
            self.merge_min_steps >= 1,
            f"strategy.merge_min_steps={self.merge_min_steps} must be >= 1",
        )
        require(
            self.steps is None or self.merge_min_steps <= self.steps,
            f"strategy.merge_min_steps={self.merge_min_steps} must be <= strategy.steps="
            f"{self.steps} (the starting T)",
        )
        require(
            not (self.merge_recount and self.merge_policy == "home"),
            "strategy.merge_recount=true needs strategy.merge_policy=model: under policy=home "
            "the dropped roots move only after every removal, so there is nothing to recount; "
            "leave merge_recount null",
        )
        require(self.bandwidth > 0, f"strategy.bandwidth={self.bandwidth} must be > 0")
        require(
            self.step_overhead_s >= 0,
            f"strategy.step_overhead_s={self.step_overhead_s} must be >= 0",
        )
        require(
            self.mode == "micrograph" or not self.merge_adaptive,
            "strategy.mode=model_centric has one step per iteration: set "
            "strategy.merge_adaptive=false",
        )
        require(
            self.mode == "micrograph" or self.steps in (None, 1),
            f"strategy.mode=model_centric trains one step per iteration, but "
            f"strategy.steps={self.steps}; leave it null",
        )

    @classmethod
    def preset(cls, name: str) -> HopGNNConfig:
        """The settings of a registered name (``hopgnn`` or ``hopgnn_mc``)."""
        choice("strategy", name, tuple(_PRESETS))
        return replace(cls(), name=name, **_PRESETS[name][1])

    @property
    def recount(self) -> bool:
        """Whether each merge removal compares the loads after earlier removals' moves."""
        return self.merge_policy == "model" if self.merge_recount is None else self.merge_recount

    def check_world(self, world_size: int) -> None:
        """``steps`` and ``merge_min_steps`` fit ``world_size`` ranks (one time step per rank
        at most); raises :class:`ConfigError`. Called by :meth:`check_run` and by the
        DataModule's ``setup_rank`` on every rank (a plain Lightning script); not in
        ``preprocess``, which runs on one rank per node, so a refusal there left the others
        waiting in Lightning's barrier."""
        for key in ("steps", "merge_min_steps"):
            value = getattr(self, key)
            require(
                self.mode == "model_centric" or value is None or value <= world_size,
                f"strategy.{key}={value} must be <= the world size {world_size} (one time step "
                "per rank at most)",
            )

    def check_run(self, run: RunFacts) -> None:
        self.check_world(run.world_size)

    def kept_steps(self, world_size: int) -> int:
        """``T`` for ``world_size`` ranks (the starting ``T`` with the controller)."""
        if self.mode == "model_centric":
            return 1
        return world_size if self.steps is None else self.steps
