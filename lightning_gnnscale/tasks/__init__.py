"""Tasks: what a run learns, apart from how a system distributes it (docs/architecture.md,
"Tasks").

A system decides who holds which rows, how a step's seed outputs are computed across ranks and
what crosses the network; the task decides which seeds a step trains on, the targets, the head's
width, the loss, the metrics and the evaluation splits. :data:`TASKS` names every task; its
entries are torch-free (the schema checks ``task.name`` against them before torch is imported)
and :meth:`TaskSpec.build` imports the implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from ..errors import check_field_types, choice, require
from .spec import TaskSpec

if TYPE_CHECKING:
    from .base import NodeTask


HITS_KS = (1, 3, 10)  # link prediction's Hits@K
LINK_NEGATIVES = ("uniform", "joint")
LINK_DECODERS = ("dot", "mlp", "distmult")
TRAINED_DECODERS = ("mlp", "distmult")  # decoders with parameters: TRAINS_TASK_HEAD systems
LINK_EVALUATIONS = ("fixed", "filtered")
MAX_NEGATIVES = 10_000  # training negatives per positive and fixed negatives per evaluation edge
MAX_EMBEDDING_DIM = 65_536

TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "node_classification", "node_classification:NodeClassification", ("acc",), "acc", "max"
        ),
        TaskSpec(
            "node_regression", "node_regression:NodeRegression", ("rmse", "mae"), "rmse", "min"
        ),
        TaskSpec(
            "link_prediction",
            "link_prediction:LinkPrediction",
            ("auc", "mrr", *(f"hits@{k}" for k in HITS_KS)),
            "mrr",
            "max",
            seeds="edges",
        ),
    )
}
NODE_TASKS = tuple(name for name, spec in TASKS.items() if spec.seeds == "nodes")
DEFAULT_TASK = "node_classification"


def task_spec(name: str) -> TaskSpec:
    """The spec of task ``name``; a :class:`~..errors.ConfigError` lists the valid names."""
    choice("task.name", name, TASKS)
    return TASKS[name]


@dataclass(frozen=True)
class TaskConfig:
    """What the run learns (``task=<name>``, ``conf/task/<name>.yaml``): one of
    :data:`TASKS` (docs/tasks.md), and link prediction's settings.

    Args:
        name: the task.
        val_fraction, test_fraction: link prediction: the pairs held out for validation and
            test (``RandomLinkSplit``'s ``num_val``, ``num_test``).
        undirected: link prediction: a pair is both directions of an edge, kept in one split;
            ``None``: true when the graph is symmetric.
        negatives: link prediction's training negatives: ``uniform`` (``num_negatives`` per
            positive) or ``joint`` (``num_negatives`` shared by a step's positives).
        num_negatives: training negatives per positive (``uniform``) or per step (``joint``).
        filter_negatives: redraw training negatives that are true training edges.
        eval_negatives: the fixed negatives each evaluation edge is ranked against (MRR,
            Hits@K; K = 1, 3, 10 must stay below it).
        embedding_dim: the width of the node embeddings the decoder scores.
        decoder: link prediction's pair scorer: ``dot`` (the dot product), ``mlp`` (an MLP
            on the endpoints' Hadamard product, ``embedding_dim`` wide, 2 layers, trained with
            the net) or ``distmult`` (a learned diagonal per relation, trained with the net;
            for knowledge graphs).
        evaluation: ``fixed``: MRR and Hits@K against ``eval_negatives`` fixed negatives per
            edge; ``filtered``: against every node, as tail and as head, the other true pairs
            of train + val + test filtered out (the knowledge-graph literature's protocol).
        exclude_target_edges: GraphStorm's exclusion: a training step's blocks also leave out
            the step's own positive pairs, both directions (on top of the training structure,
            which already holds no validation or test edge).
    """

    name: str = DEFAULT_TASK
    val_fraction: float = 0.05
    test_fraction: float = 0.1
    undirected: bool | None = None
    negatives: str = "uniform"
    num_negatives: int = 1
    filter_negatives: bool = False
    eval_negatives: int = 100
    embedding_dim: int = 64
    decoder: str = "dot"
    exclude_target_edges: bool = False
    evaluation: str = "fixed"

    def __post_init__(self) -> None:
        check_field_types(self, "task.")
        spec = task_spec(self.name)
        if spec.seeds == "nodes":
            changed = [
                f.name
                for f in fields(self)
                if f.name != "name" and getattr(self, f.name) != f.default
            ]
            require(
                not changed,
                f"task.{', task.'.join(changed)}: link_prediction settings, but task={self.name}",
            )
            return
        for key in ("val_fraction", "test_fraction"):
            value = getattr(self, key)
            require(0.0 < value < 1.0, f"task.{key}={value} must be in (0, 1)")
        require(
            self.val_fraction + self.test_fraction < 1.0,
            f"task.val_fraction + task.test_fraction = "
            f"{self.val_fraction + self.test_fraction} must be below 1",
        )
        choice("task.negatives", self.negatives, LINK_NEGATIVES)
        choice("task.decoder", self.decoder, LINK_DECODERS)
        choice("task.evaluation", self.evaluation, LINK_EVALUATIONS)
        require(
            self.evaluation == "fixed" or self.eval_negatives == 100,
            f"task.eval_negatives={self.eval_negatives}: task.evaluation=filtered ranks against "
            "every node, not fixed negatives; drop it",
        )
        require(
            not (self.filter_negatives and self.negatives == "joint"),
            "task.filter_negatives=true filters uniform negatives only (one joint set cannot "
            "avoid every source's edges); use task.negatives=uniform or leave it false",
        )
        require(
            1 <= self.num_negatives <= MAX_NEGATIVES,
            f"task.num_negatives={self.num_negatives} must be in [1, {MAX_NEGATIVES}]",
        )
        require(
            max(HITS_KS) < self.eval_negatives <= MAX_NEGATIVES,
            f"task.eval_negatives={self.eval_negatives} must be in "
            f"[{max(HITS_KS) + 1}, {MAX_NEGATIVES}] (Hits@{max(HITS_KS)} needs more negatives)",
        )
        require(
            1 <= self.embedding_dim <= MAX_EMBEDDING_DIM,
            f"task.embedding_dim={self.embedding_dim} must be in [1, {MAX_EMBEDDING_DIM}]",
        )


def build_task(task: str | TaskConfig | NodeTask | None = None) -> NodeTask:
    """``task`` itself if it is a task; else the task of that name (default
    ``node_classification``) with default settings, or of a :class:`TaskConfig`."""
    if task is None or isinstance(task, str):
        task = TaskConfig(task or DEFAULT_TASK)
    if isinstance(task, TaskConfig):
        return task_spec(task.name).build(task)
    return task
