"""Link prediction: seeds are training edges; BCE on dot-product scores; AUC, MRR, Hits@K.

On a typed graph (a knowledge graph) a pair is a triple ``(src, relation, dst)``: positives
keep their relation, negatives corrupt the destination under it, DistMult scores it, and
``task.evaluation=filtered`` ranks every evaluation triple against every entity, both
directions, the other true triples filtered out (docs/tasks.md, "Typed link prediction").

The split is PyG's ``RandomLinkSplit`` on the suite's CSC (:mod:`.link.split`): training
blocks and validation pass messages over the training edges only, test over training and
validation edges, so no evaluation edge reaches a training block. A step's seeds are positive
training pairs; its seed *nodes* are their endpoints and their negatives' (docs/tasks.md,
"Link prediction").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from ..graph.node_targets import NodeDataset, NodeTargets
from . import HITS_KS, TASKS, TaskConfig
from .base import NodeTask
from .link.decoders import DistMultDecoder, DotDecoder, MLPDecoder
from .link.metrics import (
    auc_of,
    auc_statistics,
    filtered_ranking_statistics,
    ranking_metrics,
    ranking_statistics,
)
from .link.negatives import evaluation_negatives, joint_negatives, uniform_negatives
from .link.split import (
    STAGES,
    EdgeLookup,
    LinkSplit,
    message_relations,
    random_link_split,
    triple_keys,
)

SPLIT_STAGE = {"val": "train", "test": "test"}  # the structure each split is scored over
MAX_STEP_PAIRS = 1 << 24  # scored pairs of one training step, over all ranks (Batch.y: 384 MiB)
SCORED_ELEMENTS = 1 << 24  # embedding elements gathered at once for scoring (64 MiB in float32)


@dataclass(frozen=True)
class LinkTargets:
    """Link prediction's targets: the edge split of the graph and the embedding width.

    Attributes:
        split: the positive pairs of each split and each stage's message-passing CSC.
        num_nodes: nodes of the graph (negatives are drawn among them).
        out_dim: the width of the node embeddings the decoder scores.
        seed: the run's seed, which keys the split and every negative.
    """

    split: LinkSplit
    num_nodes: int
    out_dim: int
    seed: int

    def to(self, dtype: torch.dtype) -> LinkTargets:
        """Itself: the pairs are ids, whatever the features' dtype."""
        return self

    @cached_property
    def train_lookup(self) -> EdgeLookup:
        """The training edges by endpoints (a typed graph's: and relation; what
        ``filter_negatives`` redraws against)."""
        split = self.split
        return EdgeLookup(
            *split.structure("train"), split.train_edge_type, max(1, len(split.relations))
        )

    def relations_of(self, split: str, rows: Tensor | None = None) -> Tensor | None:
        """The relations ``[n]`` of ``split``'s positives ``rows`` (all when ``None``), or
        ``None`` on a homogeneous graph."""
        rel = self.split.positive_relations(split)
        return rel if rel is None or rows is None else rel[rows]

    @cached_property
    def known_triples(self) -> tuple[Tensor, Tensor]:
        """Sorted int64 keys of every true triple of train + val + test (an undirected split's
        in both directions), for filtered ranking: ``(s * R + r) * N + t`` (tails of
        ``(s, r, ?)``) and ``(t * R + r) * N + s`` (heads of ``(?, r, t)``)."""
        split, n, r = self.split, self.num_nodes, self.split.num_relations
        pos = torch.cat([split.positives(s) for s in STAGES], 1)
        rel = [self.relations_of(s) for s in STAGES]
        rel = torch.zeros(pos.shape[1], dtype=torch.int64) if rel[0] is None else torch.cat(rel)
        src, dst = pos
        if split.undirected:
            src, dst, rel = torch.cat([src, dst]), torch.cat([dst, src]), torch.cat([rel, rel])
        tails = torch.unique(triple_keys(dst, src, rel, n, r))  # (src * R + rel) * N + dst
        heads = torch.unique(triple_keys(src, dst, rel, n, r))
        return tails, heads

    def known_mask(self, query: Tensor, rel: Tensor, keys: Tensor) -> Tensor:
        """bool ``[n, N]``: the entities ``e`` with ``(query[i] * R + rel[i]) * N + e`` in the
        sorted ``keys`` of :attr:`known_triples` (one ``searchsorted`` per query for the run
        of its true answers, then a scatter)."""
        n, r = self.num_nodes, self.split.num_relations
        base = (query * r + rel) * n
        lo = torch.searchsorted(keys, base)
        hi = torch.searchsorted(keys, base + n)
        counts = hi - lo
        row = torch.repeat_interleave(torch.arange(query.numel()), counts)
        first = torch.cumsum(counts, 0) - counts
        at = lo[row] + torch.arange(row.numel()) - first[row]
        mask = torch.zeros(query.numel(), n, dtype=torch.bool)
        mask[row, keys[at] - base[row]] = True
        return mask

    def node_rows(self) -> NodeTargets:
        """The split as unlabelled node rows: a node is in a split when it ends one of the
        split's pairs (what a partitioner balances and a partition's node rows hold, for a
        system that partitions the graph as for the node tasks)."""
        n, masks = self.num_nodes, []
        for name in ("train", "val", "test"):
            mask = torch.zeros(n, dtype=torch.bool)
            mask[self.split.positives(name).flatten()] = True
            masks.append(mask)
        return NodeTargets(torch.full((n,), -1, dtype=torch.int64), *masks, self.out_dim)


class LinkPrediction(NodeTask):
    """Positive training pairs as seeds, ``num_negatives`` corrupted destinations per positive
    (or per step, ``joint``), the dot-product decoder, the sum of per-pair binary
    cross-entropies, and AUC, MRR and Hits@K over fixed evaluation negatives.

    ``Batch.y`` of a step is int64 ``[pairs, 3]``: each pair's source row and destination row
    in the step's output rows, and its label (1 positive, 0 negative); on a typed graph
    ``[pairs, 4]``, the pair's relation last.

    Statistics per split (summable; AUC's because every rank scores every AUC negative): twice
    the AUC wins and pairs, then the ranking statistics (count, ``1 / rank`` sum, hits per K).
    """

    spec = TASKS["link_prediction"]
    statistic_names = ("auc_wins_x2", "auc_pairs_x2", "count", "reciprocal_rank_sum") + tuple(
        f"hits@{k}" for k in HITS_KS
    )
    # PyG's GCNConv's: with nn.Linear's smaller weights the dot products start near 0 and the
    # loss sits on its 0.693 plateau (docs/tasks.md, "Link prediction")
    default_init = "glorot"

    def __init__(self, config: TaskConfig | None = None):
        config = config or TaskConfig(self.spec.name)
        if config.name != self.spec.name:
            raise ValueError(f"a {self.spec.name} task built from task.name={config.name!r}")
        super().__init__(config)
        self.decoder: DotDecoder | MLPDecoder | DistMultDecoder = DotDecoder()
        self.relations: tuple[str, ...] | None = None  # the graph's (() homogeneous), once seen
        self._undirected: dict[tuple, bool] = {}

    def undirected_for(self, graph) -> bool:
        """``task.undirected``, or (``None``) whether ``graph`` is symmetric (a typed graph:
        every edge's reverse under its relation)."""
        if self.config.undirected is not None:
            return self.config.undirected
        key = (id(graph), graph.indices.data_ptr(), graph.num_edges)  # one graph, once
        if key not in self._undirected:
            lookup = EdgeLookup(graph.indptr, graph.indices, graph.edge_type, graph.num_relations)
            reverse = lookup.find(graph.dst_of_edges(), graph.indices, graph.edge_type)
            self._undirected = {key: bool((reverse >= 0).all())}
        return self._undirected[key]

    def message_relations(self, graph) -> tuple[str, ...]:
        """A typed graph's relations messages pass over: its own, then (a directed split)
        their inverses ``<r>_inverse`` (:func:`~.link.split.message_relations`)."""
        self.relations = tuple(graph.relations)
        return message_relations(tuple(graph.relations), self.undirected_for(graph))

    def partition_settings(self) -> dict:
        """The split's settings: a directory holds its parts of one edge split, so a run with
        other fractions (or another ``undirected``) must not train from it."""
        c = self.config
        split = {"val_fraction": c.val_fraction, "test_fraction": c.test_fraction}
        return {"link_split": {**split, "undirected": c.undirected}}

    def trained_head(self) -> MLPDecoder | DistMultDecoder | None:
        """``task.decoder=mlp``: a fresh MLP decoder (drawn from torch's generator, as the net
        is, by the module that registers it), which this task then scores with;
        ``distmult``: a DistMult diagonal per relation of the graph (known once the graph was
        seen: ``prepare`` or ``message_relations``; one relation when it was not, as a system
        that only trains homogeneous graphs loads a partition directory); else ``None`` (the
        dot product has no parameters)."""
        width = self.config.embedding_dim
        if self.config.decoder == "mlp":
            self.decoder = MLPDecoder(width, width, num_layers=2)
            return self.decoder
        if self.config.decoder == "distmult":
            self.decoder = DistMultDecoder(max(1, len(self.relations or ())), width)
            return self.decoder
        return None

    def prepare(self, dataset: NodeDataset, seed: int) -> LinkTargets:
        """The seeded edge split of ``dataset``'s graph (``undirected`` when the graph is
        symmetric, unless the settings say)."""
        graph, c = dataset.graph, self.config
        fixed = dataset.edge_split
        if fixed is not None:
            changed = [
                f"task.{key}={getattr(c, key)}"
                for key in ("val_fraction", "test_fraction")
                if getattr(c, key) != getattr(TaskConfig, key)
            ]
            if changed:
                raise ConfigError(
                    f"{', '.join(changed)}: dataset {graph.name!r} carries its own edge split "
                    "(train / val / test edge tables), which the run uses; drop the fractions"
                )
        self.relations = tuple(graph.relations)
        try:
            split = random_link_split(
                graph.indptr,
                graph.indices,
                seed=seed,
                val=c.val_fraction,
                test=c.test_fraction,
                undirected=self.undirected_for(graph),
                edge_type=graph.edge_type,
                relations=tuple(graph.relations),
                fixed=fixed,
            )
        except ValueError as err:
            raise ConfigError(f"dataset {graph.name!r}: {err}") from None
        for name, pairs in (("val", split.val_pos), ("test", split.test_pos)):
            if pairs.shape[1] == 0 and fixed is not None:
                raise ConfigError(f"dataset {graph.name!r}: its edge split has no {name} pair")
            if pairs.shape[1] == 0:
                raise ConfigError(
                    f"task.{name}_fraction={getattr(c, f'{name}_fraction')} leaves no {name} "
                    f"pair of the graph's {split.edge_split.numel()} edges; raise it"
                )
        return LinkTargets(split, graph.num_nodes, c.embedding_dim, seed)

    def out_dim_of(self, meta: Mapping) -> int:
        return self.config.embedding_dim

    def train_seeds(self, targets: LinkTargets) -> Tensor:
        """Positions ``[n_train]`` of the training pairs."""
        return torch.arange(targets.split.train_pos.shape[1])

    def training_structure(self, graph, targets: LinkTargets) -> tuple[Tensor, Tensor]:
        """The CSC training blocks are sampled on: the training edges only."""
        return targets.split.structure("train")

    def training_edge_type(self, graph, targets: LinkTargets) -> Tensor | None:
        """The relation of each edge of :meth:`training_structure` (inverse edges: ``r + R``;
        ``None``: homogeneous)."""
        return targets.split.structure_edge_type("train")

    def stage_graph(self, graph, targets: LinkTargets, stage: str):
        """``graph``'s nodes over the message-passing structure of ``stage`` (a typed
        graph's with its message relations, inverses included)."""
        split = targets.split
        indptr, indices = split.structure(stage)
        if not graph.is_typed:
            return graph.with_structure(indptr, indices)
        return replace(
            graph,
            indptr=indptr,
            indices=indices,
            edge_type=split.structure_edge_type(stage),
            relations=split.relations,
            meta=dict(graph.meta),
        )

    def excluded_edges(self, targets: LinkTargets, global_seeds: Tensor) -> Tensor | None:
        """With ``exclude_target_edges``: the keys of the step's positive pairs in both
        directions (every rank leaves out the whole step's, so a step split over ranks samples
        what one process does); else ``None``."""
        if not self.config.exclude_target_edges:
            return None
        src, dst = targets.split.train_pos[:, global_seeds]
        n = targets.num_nodes
        return torch.unique(torch.cat([dst * n + src, src * n + dst]))

    def pairs_per_positive(self) -> int:
        """Loss terms per positive: itself and its negatives."""
        return 1 + self.config.num_negatives

    def check_step(self, batch_size: int) -> None:
        pairs = batch_size * self.pairs_per_positive()
        if pairs > MAX_STEP_PAIRS:
            raise ConfigError(
                f"a step of {batch_size:,} positive pairs x (1 + task.num_negatives="
                f"{self.config.num_negatives}) = {pairs:,} scored pairs, more than "
                f"{MAX_STEP_PAIRS:,}; lower data.batch_size (-1: every training pair) or "
                "task.num_negatives"
            )

    def loss_terms(self, global_seeds: int) -> int:
        return global_seeds * self.pairs_per_positive()

    def step_rows(
        self,
        targets: LinkTargets,
        seeds: Tensor,
        positions: Tensor,
        *,
        epoch: int,
        step: int,
    ) -> tuple[Tensor, Tensor]:
        """``(nodes, y)``: the sorted endpoints ``[n]`` of this share's positives ``seeds``
        (at ``positions`` of the step's global batch) and of their negatives, and ``y``
        ``[pairs, 3]`` (source row, destination row, label; rows index ``nodes``). The
        negatives are keyed by ``(seed, epoch, step, position)``: a step split over any
        number of ranks draws the same ones."""
        c, split = self.config, targets.split
        src, dst = split.train_pos[0, seeds], split.train_pos[1, seeds]
        rel = targets.relations_of("train", seeds)
        k, n = c.num_negatives, src.numel()
        if c.negatives == "uniform":
            lookup = targets.train_lookup if c.filter_negatives else None
            negs = uniform_negatives(
                src,
                positions,
                targets.num_nodes,
                seed=targets.seed,
                epoch=epoch,
                step=step,
                k=k,
                filter_by=lookup,
                rel=rel,
            ).flatten()
        else:
            shared = joint_negatives(
                targets.num_nodes, seed=targets.seed, epoch=epoch, step=step, k=k
            )
            negs = shared.repeat(n)
        pair_src = torch.cat([src, src.repeat_interleave(k)])
        pair_dst = torch.cat([dst, negs])
        labels = torch.cat(
            [torch.ones(n, dtype=torch.int64), torch.zeros(n * k, dtype=torch.int64)]
        )
        nodes, rows = torch.unique(torch.cat([pair_src, pair_dst]), return_inverse=True)
        m = pair_src.numel()
        columns = [rows[:m], rows[m:], labels]
        if rel is not None:  # a negative keeps its positive's relation
            columns.append(torch.cat([rel, rel.repeat_interleave(k)]))
        return nodes, torch.stack(columns, 1)

    def loss_sum(self, out: Tensor, target: Tensor, weight: Tensor | None = None) -> Tensor:
        if weight is not None:
            raise ValueError("link prediction takes no per-seed loss weights")
        rel = target[:, 3] if target.shape[1] == 4 else None
        scores = self.decoder(out[target[:, 0]], out[target[:, 1]], rel)
        return F.binary_cross_entropy_with_logits(
            scores, target[:, 2].to(scores.dtype), reduction="sum"
        )

    def link_statistics(
        self,
        embed: Callable[[tuple[Tensor, Tensor]], Tensor],
        targets: LinkTargets,
        splits: tuple[str, ...],
        rank: int,
        world_size: int,
    ) -> Tensor:
        """float64 ``[len(splits), k]``: this rank's statistics of each split.

        ``embed(stage)`` returns every node's embedding ``[N, d]`` over the message-passing
        structure of ``stage`` (:meth:`stage_graph`; called once per stage). A rank ranks the
        evaluation edges ``rank::world_size`` against their ``eval_negatives`` fixed negatives
        (``task.evaluation=filtered``: against every entity, both directions, the other true
        triples filtered), and counts its positives' AUC wins against every edge's AUC
        negative (its first fixed negative), so the sums over ranks are the one-process
        statistics."""
        embedded: dict[str, Tensor] = {}
        rows = []
        for split in splits:
            stage = SPLIT_STAGE[split]
            if stage not in embedded:
                embedded[stage] = embed(stage)
            rows.append(self._split_statistics(embedded[stage], targets, split, rank, world_size))
        return torch.stack(rows)

    def _split_statistics(
        self, emb: Tensor, targets: LinkTargets, split: str, rank: int, world_size: int
    ) -> Tensor:
        pos = targets.split.positives(split)
        index = torch.arange(pos.shape[1])
        m, width = self.config.eval_negatives, emb.shape[1]
        chunk = max(1, SCORED_ELEMENTS // (m * width))  # edges whose candidates fit at once
        auc_neg = torch.cat(
            [
                self.pair_scores(
                    emb[pos[0, rows]],
                    emb[self._negatives(targets, split, rows, 1)[:, 0]],
                    targets.relations_of(split, rows),
                )
                for rows in index.split(chunk * m)
            ]
        )
        total = torch.zeros(len(self.statistic_names), dtype=torch.float64)
        if self.config.evaluation == "filtered":
            per_entity = width if isinstance(self.decoder, MLPDecoder) else 1
            chunk = max(1, SCORED_ELEMENTS // (targets.num_nodes * per_entity))
            for rows in index[rank::world_size].split(chunk):
                h_src = emb[pos[0, rows]]
                rel = targets.relations_of(split, rows)
                pos_scores = self.pair_scores(h_src, emb[pos[1, rows]], rel)
                total += torch.cat(
                    [
                        auc_statistics(pos_scores, auc_neg),
                        self._filtered_statistics(emb, targets, split, rows),
                    ]
                )
            return total
        for rows in index[rank::world_size].split(chunk):
            h_src = emb[pos[0, rows]]
            rel = targets.relations_of(split, rows)
            pos_scores = self.pair_scores(h_src, emb[pos[1, rows]], rel)
            negs = self._negatives(targets, split, rows, m)
            neg_scores = self.decoder.score_candidates(h_src, emb[negs], rel)
            total += torch.cat(
                [auc_statistics(pos_scores, auc_neg), ranking_statistics(pos_scores, neg_scores)]
            )
        return total

    def _filtered_statistics(
        self, emb: Tensor, targets: LinkTargets, split: str, rows: Tensor
    ) -> Tensor:
        """The ranking statistics of ``split``'s triples ``rows``, each ranked as tail
        ``(h, r, ?)`` and as head ``(?, r, t)`` against every entity, the other true triples
        filtered: ``2 len(rows)`` rankings (the decoders are symmetric, so both directions
        score the fixed endpoint against every entity's row, :meth:`score_all`)."""
        pos = targets.split.positives(split)
        rel = targets.relations_of(split, rows)
        fixed_rel = torch.zeros(rows.numel(), dtype=torch.int64) if rel is None else rel
        tails, heads = targets.known_triples
        total = 0
        for query, answer, keys in (
            (pos[0, rows], pos[1, rows], tails),
            (pos[1, rows], pos[0, rows], heads),
        ):
            scores = self.decoder.score_all(emb[query], emb, rel)
            pos_scores = scores.gather(1, answer.unsqueeze(1)).squeeze(1)
            known = targets.known_mask(query, fixed_rel, keys)
            total = total + filtered_ranking_statistics(pos_scores, scores, known)
        return total

    def pair_scores(self, h_src: Tensor, h_dst: Tensor, rel: Tensor | None = None) -> Tensor:
        """Evaluation scores ``[n]`` of pairs (of relations ``rel`` on a typed graph), by the
        candidates' kernel (``score_candidates``), so that a fixed negative equal to the
        positive's destination scores exactly as the positive does (a tie, by OGB's rule)
        whatever the embeddings' last bits; the decoder's pairwise kernel sums in another
        order."""
        return self.decoder.score_candidates(h_src, h_dst.unsqueeze(1), rel).squeeze(1)

    @staticmethod
    def _negatives(targets: LinkTargets, split: str, rows: Tensor, m: int) -> Tensor:
        """The ``m`` fixed negatives ``[len(rows), m]`` of ``split``'s edges ``rows``."""
        pos = targets.split.positives(split)
        return evaluation_negatives(
            pos[0, rows], rows, targets.num_nodes, seed=targets.seed, split=split, m=m
        )

    def metric_values(self, stats: Tensor) -> dict[str, float]:
        return {"auc": auc_of(stats[:2])} | ranking_metrics(stats[2:])
