"""``HopGNNConfig``: the settings of ``strategy=hopgnn`` and its model-centric baseline
``strategy=hopgnn_mc`` (``conf/strategy/hopgnn*.yaml``; docs/systems/hopgnn.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from ...schema import RunFacts, SystemConfig, choice, require
from ..distdgl.config import PartitionConfig

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
        {"mode": "model_centric"},
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
        steps: kept time steps per iteration ``T`` in ``[1, N]``; ``None`` = ``N`` (no
            merging). ``T < N`` merges the least-loaded steps away (spec §3.5).
        merge_score: ``sum_roots`` (paper) | ``min_roots`` (artifact): the load of a step.
        merge_policy: ``model`` (a dropped step's roots stay with their model, spread over its
            kept steps) | ``home`` (they stay on their home server, change model).
        payload: what migrates between kept steps: ``params+grads`` (paper) | ``params`` |
            ``grads`` | ``none`` (the accumulators stay put; no bytes).
        direction: ``+1``: model ``d`` is on server ``(d + k) mod N`` at step ``k``; ``-1``:
            ``(d - k) mod N`` (the artifact's).
        barrier_per_step: a barrier after every time step (the artifact's synchronisation).
        merge_adaptive: the merging controller: from the second epoch on, drop one more time
            step per epoch while the epoch time improves, then revert to the best ``T`` and
            freeze it (``steps`` is then the starting ``T``).
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
    merge_adaptive: bool = False
    merge_time_source: str = "modeled"
    merge_monitor_epochs: int = 1
    bandwidth: float = 1.25e9
    step_overhead_s: float = 1e-3

    NAMES: ClassVar[tuple[str, ...]] = tuple(_PRESETS)
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

    def check_run(self, run: RunFacts) -> None:
        world = run.world_size
        require(
            self.steps is None or self.steps <= world,
            f"strategy.steps={self.steps} must be <= the world size {world} (one time step "
            f"per rank at most)",
        )

    def kept_steps(self, world_size: int) -> int:
        """``T`` for ``world_size`` ranks."""
        if self.mode == "model_centric":
            return 1
        return world_size if self.steps is None else min(self.steps, world_size)
