"""``SancusConfig``: the settings of ``strategy=sancus`` and ``strategy=cagnet``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...config_types import ModelConfig, RunFacts, SystemConfig, choice, require
from ...tasks import NODE_TASKS

POLICIES = ("none", "epoch_fixed", "adaptive", "variation", "skipg")
INPUT_POLICIES = ("once", "same_as_hidden")

ROW_ORDERS = ("contiguous", "random", "metis")
MODELS = ("gcn", "rgcn")  # rgcn on typed graphs only (SancusConfig.check_graph)
DOCS = "docs/systems/sancus.md"


@dataclass(frozen=True)
class SancusConfig(SystemConfig):
    """``strategy=sancus`` (staleness-aware skipped broadcasts) and ``strategy=cagnet`` (the
    same code with staleness bound 0). See docs/systems/sancus.md#policies.

    Args:
        policy: ``none`` (bound 0, the only one ``cagnet`` takes) | ``epoch_fixed`` |
            ``adaptive`` | ``variation`` | ``skipg``.
        epoch_bound: ε_E (``epoch_fixed``), ε_A (``adaptive``), ε_G (``skipg``), in epochs.
        variation_gap: ε_H (``variation``): relative Frobenius distance to the copy the
            others hold.
        input_policy: ``once`` (X broadcast at epoch 0 and cached; exact) or
            ``same_as_hidden`` (X follows the policy like a hidden layer).
        rows: the order of the nodes into row blocks: ``contiguous`` | ``random`` | ``metis``.
    """

    name: str = "sancus"
    policy: str = "adaptive"
    epoch_bound: int = 1
    variation_gap: float = 0.01
    input_policy: str = "once"
    rows: str = "contiguous"

    NAMES = ("sancus", "cagnet")
    # link prediction last: CI's conformance suite runs a preset's first two tasks
    TASKS = (*NODE_TASKS, "link_prediction")
    supports_partition_dir = True
    TYPED_GRAPHS = True  # RGCN over one row block per relation (docs: #typed-graphs)
    TYPED_LINK_PREDICTION = True  # triples through the same blocks (docs: #typed-graphs)
    # the head (mlp, distmult) is in the module: broadcast at start, its gradients summed
    TRAINS_TASK_HEAD = True
    PRESETS: ClassVar[dict[str, dict]] = {"cagnet": {"policy": "none"}}
    MODEL_SETTINGS: ClassVar[dict] = {"dropout": 0.0}  # full-graph SANCUS trains without dropout

    def __post_init__(self) -> None:
        super().__post_init__()
        choice("strategy.policy", self.policy, POLICIES)
        require(
            self.name != "cagnet" or self.policy == "none",
            f"strategy.policy={self.policy!r}: strategy=cagnet is SANCUS with policy none; "
            "use strategy=sancus for a staleness policy",
        )
        choice("strategy.input_policy", self.input_policy, INPUT_POLICIES)
        choice("strategy.rows", self.rows, ROW_ORDERS)
        require(self.epoch_bound >= 0, f"strategy.epoch_bound={self.epoch_bound} must be >= 0")
        require(
            self.variation_gap >= 0, f"strategy.variation_gap={self.variation_gap} must be >= 0"
        )

    def check_model(self, model: ModelConfig) -> None:
        """The net SANCUS can train: a GCN (its backward relies on a symmetric ``Â``), or on a
        typed graph an RGCN (:meth:`check_graph`), without dropout (a dropout mask on the
        cached X would freeze); ``model.init`` as ``BlockGNN``'s (unset: the task's
        default)."""
        require(
            model.name in MODELS,
            f"model={model.name}: strategy={self.name} trains GCN only, RGCN on typed graphs "
            f"(SAGE/GAT/custom are not implemented, {DOCS}"
            "#what-is-not-implemented-and-deviations)",
        )
        require(
            model.dropout == 0.0,
            f"model.dropout={model.dropout}: strategy={self.name} trains without dropout "
            f"({DOCS}#what-is-not-implemented-and-deviations); set model.dropout=0",
        )

    def check_graph(self, model: str, typed: bool) -> None:
        """The row blocks follow the graph: GCN's ``Â`` on a homogeneous graph, one block per
        relation on a typed one (RGCN's), so the model must match it."""
        require(
            model != "rgcn" or typed,
            f"model=rgcn: strategy={self.name} trains RGCN over a typed graph's row blocks "
            "per relation, and this dataset is homogeneous; use model=gcn (or a typed dataset, "
            f"{DOCS}#typed-graphs)",
        )
        require(
            model != "gcn" or not typed,
            f"model=gcn: the dataset is a typed graph, whose row blocks strategy={self.name} "
            "builds per relation for model=rgcn; use model=rgcn, or erase the types "
            f"(typed_sbm: dataset.typed=false; {DOCS}#typed-graphs)",
        )

    def check_run(self, run: RunFacts) -> None:
        require(
            not run.data.fanouts_per_relation,
            f"strategy={self.name} trains the full graph: data.fanouts_per_relation="
            f"{dict(run.data.fanouts_per_relation)} would have no effect; drop it",
        )
        if run.model is not None:
            self.check_model(run.model)
        if run.ckpt_path is not None:
            self.check_resumable(f"ckpt_path={run.ckpt_path}")

    def check_resumable(self, source: str, fresh_start: str = "use weights_from=") -> None:
        """Only policy ``none`` resumes: the others' staleness state is not checkpointed.
        ``fresh_start``: how the caller's entry point starts a new run from a checkpoint's
        weights (``train.py``'s key, or a plain script's way)."""
        require(
            self.policy == "none",
            f"{source}: strategy={self.name} with policy {self.policy!r} "
            "cannot resume from ckpt_path: each rank's staleness state (last broadcasts, "
            "cached blocks) is not in the checkpoint, so the resumed run would diverge from the "
            f"uninterrupted one; {fresh_start} to start a new run from its weights, or "
            "policy none",
        )
