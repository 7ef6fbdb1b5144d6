"""``SancusDataModule``: this rank's row block, one full-graph batch per epoch (node tasks;
link prediction: one full-graph pass per step of training pairs)
(docs/systems/sancus.md#what-is-implemented, "Batches", and #link-prediction)."""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, replace
from typing import Any

import lightning as L
import torch
from typing_extensions import override

from ...config_types import ModelConfig
from ...contract import RankContext
from ...errors import ConfigError
from ...graph.batch import Batch
from ...graph.book import PartitionBook, relabel_graph
from ...graph.cache import cached_partition
from ...graph.csc import Graph, csc_from_edges
from ...graph.node_targets import NodeTargets
from ...graph.order import EpochOrder
from ...graph.partition_dir import (
    METADATA,
    PartitionDir,
    PartitionDirError,
    is_count,
    part_folder,
)
from ...kit.datamodule import GNNDataModule
from ...kit.link_partitioned import owned_link_statistics
from ...kit.partitions import assert_same_on_all_ranks, own_predictions
from ...tasks.base import split_statistics
from .callbacks import CacheMemory, StalenessLog
from .config import SancusConfig
from .layout import RowBlocks, check_symmetric, consumer_matrix, every_row_block, row_blocks
from .links import SPLITS, EndpointRows, LinkPart, RankLinks, owned_pairs, owned_relations
from .policy import StalenessPolicy
from .runtime import SancusGCN

# a partition directory's row-block files: the training structure's (every task), then link
# prediction's test structure (training + validation edges) and every edge (predictions)
LINK_BLOCKS = ("t", "f")
TRANSPOSED = "b"  # a typed graph's transposed row blocks (the backward's), per part


def _transposed(prefix: str) -> str:
    """The file prefix of a typed graph's transposed blocks of the row blocks ``prefix``
    (the training structure's ``b``; link prediction's stages ``tb``, ``fb``)."""
    return TRANSPOSED if prefix == "a" else f"{prefix}{TRANSPOSED}"


@dataclass(frozen=True)
class SancusPrepared:
    """The graph and the task's rows relabelled into row-block order, the task's training
    seeds in that order (bool ``[N]``) and the int64 ``[P + 1]`` row-block boundaries (rank
    ``i`` owns rows ``offsets[i]:offsets[i + 1]``).

    Link prediction: ``graph`` passes messages over the training edges only, ``test_graph``
    over training + validation edges and ``full_graph`` over every edge (predictions), all
    relabelled; ``targets`` is the task's edge split in original ids, ``owner`` the rank of
    every original id and ``is_seed`` all false (a step's seeds are training pairs)."""

    graph: Graph
    targets: Any
    is_seed: torch.Tensor
    offsets: torch.Tensor
    new2old: torch.Tensor  # original id of every relabelled row
    test_graph: Graph | None = None
    full_graph: Graph | None = None
    owner: torch.Tensor | None = None


@dataclass(frozen=True)
class SancusPart:
    """What rank ``i`` holds, in memory and from a partition directory alike: its row block of
    ``Â`` (:class:`RowBlocks`), its rows ``[n_i, ...]`` of ``X`` and of the task's targets
    (node tasks; ``None`` for link prediction, whose pairs are in ``link``), the global
    training count (nodes, or training pairs) and its rows' original ids ``[n_i]``."""

    layout: RowBlocks
    x: torch.Tensor
    targets: NodeTargets | None
    train_count: int
    own_ids: torch.Tensor
    link: LinkPart | None = None


def _part(prepared: SancusPrepared, layout: RowBlocks, link: LinkPart | None = None) -> SancusPart:
    """The part of ``layout``'s rank (its row block of ``prepared``'s graph)."""
    graph, offsets, rank = prepared.graph, prepared.offsets, layout.rank
    lo, hi = int(offsets[rank]), int(offsets[rank + 1])
    if link is not None:
        return SancusPart(
            layout, graph.x[lo:hi], None, link.num_train_pairs, prepared.new2old[lo:hi], link
        )
    return SancusPart(
        layout,
        graph.x[lo:hi],
        prepared.targets.rows(slice(lo, hi)),
        int(prepared.is_seed.sum()),
        prepared.new2old[lo:hi],
    )


def _link_part(prepared: SancusPrepared, rank: int, test_layout: RowBlocks) -> LinkPart:
    """Rank ``rank``'s :class:`LinkPart` of ``prepared`` (its full-graph row block built when
    first asked for)."""

    def full_layout() -> RowBlocks:
        return row_blocks(prepared.full_graph, prepared.offsets, rank, prepared.is_seed)

    split = prepared.targets.split
    pairs = owned_pairs(split, prepared.owner, rank)
    return LinkPart(
        test_layout,
        full_layout,
        pairs,
        prepared.new2old,
        int(split.train_pos.shape[1]),
        owned_relations(split, pairs),
        tuple(prepared.graph.relations),
        split.num_relations if split.is_typed else 0,
    )


def _relabelled(graph: Graph, structure: tuple[torch.Tensor, torch.Tensor], book) -> Graph:
    """``graph`` (already relabelled by ``book``) over ``structure`` (a CSC in original ids),
    relabelled the same way."""
    indptr, indices = structure
    n = indptr.numel() - 1
    dst = torch.repeat_interleave(torch.arange(n), indptr.diff())
    relabelled = csc_from_edges(
        book.old2new[indices], book.old2new[dst], n, remove_self_loops=False
    )
    return graph.with_structure(*relabelled)


def _csr_blocks(
    arrays: dict, prefix: str, sizes: list[int], rank: int, num_relations: int = 0
) -> list[torch.Tensor]:
    """The CSR of every column block ``prefix<j>_{crow,col,val}`` of a part's arrays
    (``[max(R, 1) * n_i, n_j]``: a typed graph's stacks its relations' rows)."""
    blocks, rows = [], max(num_relations, 1) * sizes[rank]
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        for j, cols in enumerate(sizes):
            crow, col, val = (arrays[f"{prefix}{j}_{name}"] for name in ("crow", "col", "val"))
            blocks.append(torch.sparse_csr_tensor(crow, col, val, (rows, cols)))
    return blocks


def _block_arrays(prefix: str, layout: RowBlocks) -> dict[str, torch.Tensor]:
    """``prefix<j>_{crow,col,val}`` of every column block (a typed graph's transposed
    blocks: ``<TRANSPOSED><j>_*``)."""
    arrays = {}
    stored = [(prefix, layout.blocks)]
    if layout.transposed is not None:
        stored.append((_transposed(prefix), layout.transposed))
    for name, blocks in stored:
        for j, block in enumerate(blocks):
            arrays[f"{name}{j}_crow"] = block.crow_indices()
            arrays[f"{name}{j}_col"] = block.col_indices()
            arrays[f"{name}{j}_val"] = block.values()
    return arrays


def _relation_count(meta: dict, where, key: str = "relations") -> int:
    """``R`` of a typed graph's partition directory (its ``relations``, the row blocks'; or
    ``pair_relations``, the triples'), ``0`` for a homogeneous one; ``PartitionDirError``
    unless the entry is a list of names."""
    if key not in meta:
        return 0
    relations = meta[key]
    if not (
        isinstance(relations, list)
        and relations
        and all(isinstance(name, str) for name in relations)
        and len(set(relations)) == len(relations)
    ):
        raise PartitionDirError(f"{where}: {key!r} is not a list of distinct relation names")
    return len(relations)


def _link_relation_count(meta: dict, where) -> int:
    """A typed link-prediction directory's ``R`` of the triples (``pair_relations``: the
    first names of ``relations``, which adds a directed split's inverses), ``0`` for a
    homogeneous one; ``PartitionDirError`` when the two disagree."""
    count = _relation_count(meta, where, "pair_relations")
    if bool(count) != ("relations" in meta) or meta.get("relations", [])[:count] != meta.get(
        "pair_relations", []
    ):
        raise PartitionDirError(
            f"{where}: 'pair_relations' (the triples' relations) must be the first names of "
            "'relations' (the row blocks'), both present or both absent"
        )
    return count


def _check_pair_relations(name: str, rel, index, num_relations: int, where) -> None:
    """A part's ``<split>_rel`` (outside input): int64, one per pair, in ``[0, R)``."""
    if rel.dtype != torch.int64 or rel.shape != index.shape:
        raise PartitionDirError(
            f"{where}: {name}_rel must be int64 {tuple(index.shape)} (one relation per "
            f"{name} pair), got {rel.dtype} {tuple(rel.shape)}"
        )
    if rel.numel() and (int(rel.min()) < 0 or int(rel.max()) >= num_relations):
        raise PartitionDirError(f"{where}: {name}_rel holds relations outside [0, {num_relations})")


class SancusDataModule(GNNDataModule):
    """Rank ``i`` keeps ``Â_i*`` (CSR per column block, :class:`RowBlocks`), ``X_i`` and its
    rows of the task's targets; the net (:class:`SancusGCN`, from :meth:`build_model`) holds
    the caches.

    Each training batch is the whole own block: ``Batch([row blocks], X_i [n_i, F], targets of
    the own training seeds [n_train_i], global train count)``. Evaluation is the exact
    stateless distributed forward.

    Link prediction (docs/systems/sancus.md#link-prediction): ``Â`` is built over the training
    edges; a step (``data.batch_size`` training pairs, ``-1``: every one) is one full-graph
    pass, ``Batch([row blocks, EndpointRows], X_i, y, the step's loss terms)``, the rank
    scoring the step's pairs whose source it owns. Evaluation embeds the own rows exactly
    per stage and scores the own pairs (``kit.link_partitioned.owned_link_statistics``).

    Args: as :class:`~...kit.datamodule.GNNDataModule`; ``config`` defaults to ``SancusConfig()``.
    """

    def __init__(self, dataset, config: SancusConfig | None = None, data=None, **kwargs):
        super().__init__(dataset, config or SancusConfig(), data, **kwargs)
        self.layout: RowBlocks | None = None
        self.links: RankLinks | None = None  # link prediction's view of this rank

    @property
    def is_link(self) -> bool:
        """Whether the task's seeds are edges (link prediction)."""
        return self.task.spec.seeds == "edges"

    @override
    def preprocess(self, world_size: int) -> SancusPrepared:
        """Order the nodes into row blocks (the partition cached under ``cache_dir``); link
        prediction: over the training edges, and the test stage's and every edge's ``Â``
        relabelled the same way."""
        graph, rows = self.graph, self.config.rows
        if self.checked_run is not None:  # train.py: before any rank is spawned
            self.config.check_graph(self.checked_run.model.name, graph.is_typed)
        if not graph.is_typed:  # a typed graph's backward has its transposed blocks
            check_symmetric(graph)
        if graph.num_nodes < world_size:
            raise ValueError(f"{graph.num_nodes} nodes cannot fill {world_size} row blocks")
        if self.is_link:
            return self._preprocess_links(world_size)
        parts = cached_partition(
            graph, rows, world_size, self.seed, self.cache_dir, targets=self.targets
        )
        book = self._book(parts, world_size)
        targets = self.targets.rows(book.new2old)
        return SancusPrepared(
            relabel_graph(graph, book),
            targets,
            self.task.is_train_seed(targets),
            book.node_offsets,
            book.new2old,
        )

    def _book(self, parts: torch.Tensor, world_size: int) -> PartitionBook:
        book = PartitionBook.from_parts(parts, world_size)
        sizes = (book.node_offsets[1:] - book.node_offsets[:-1]).tolist()
        print(f"[{self.config.name}] {self.config.rows} row blocks of {sizes} rows", flush=True)
        return book

    def _preprocess_links(self, world_size: int) -> SancusPrepared:
        """Row blocks ordered on the training edges (which no validation or test edge
        reaches), ``Â`` over them, over training + validation edges and over every edge."""
        graph, targets = self.graph, self.targets
        if graph.is_typed:  # per-relation blocks and their transposes: no symmetry needed
            return self._preprocess_typed_links(world_size)
        if not targets.split.undirected:
            raise ConfigError(
                f"task.undirected=false: strategy={self.config.name} needs Â symmetric over "
                "the training edges (its backward broadcasts δ through Âᵀ = Â), which a split "
                "of single directions breaks; use task.undirected=true (or null, the default, "
                "on an undirected graph)"
            )
        train = graph.with_structure(*self.task.training_structure(graph, targets))
        parts = cached_partition(
            train,
            self.config.rows,
            world_size,
            self.seed,
            self.cache_dir,
            targets=self.node_dataset.targets,
        )
        book = self._book(parts, world_size)
        full = relabel_graph(graph, book)
        return SancusPrepared(
            _relabelled(full, (train.indptr, train.indices), book),
            targets,
            torch.zeros(graph.num_nodes, dtype=torch.bool),
            book.node_offsets,
            book.new2old,
            test_graph=_relabelled(full, targets.split.structure("test"), book),
            full_graph=full,
            owner=parts.to(torch.int64),
        )

    def _preprocess_typed_links(self, world_size: int) -> SancusPrepared:
        """A typed graph's: the stage graphs of the task (training triples, and training +
        validation triples, each with a directed split's inverses ``r + R``), and every edge
        (predictions) over the same message relations (the inverses without edges, as a
        ``single`` net of ``2R`` relations predicts over the graph), relabelled into the row
        blocks ordered on the training structure."""
        graph, targets, task = self.graph, self.targets, self.task
        train = task.stage_graph(graph, targets, "train")
        parts = cached_partition(
            train,
            self.config.rows,
            world_size,
            self.seed,
            self.cache_dir,
            targets=self.node_dataset.targets,
        )
        book = self._book(parts, world_size)
        every = replace(graph, relations=train.relations, meta=dict(graph.meta))
        return SancusPrepared(
            relabel_graph(train, book),
            targets,
            torch.zeros(graph.num_nodes, dtype=torch.bool),
            book.node_offsets,
            book.new2old,
            test_graph=relabel_graph(task.stage_graph(graph, targets, "test"), book),
            full_graph=relabel_graph(every, book),
            owner=parts.to(torch.int64),
        )

    # ------------------------------------------------------------- partition directories
    @override
    def partition_settings(self) -> dict[str, Any]:
        # Â's values are computed in the features' dtype: a directory serves that dtype only
        dtype = str(self.dtype).removeprefix("torch.")
        options = {}
        if self.is_link:  # the edge split the parts hold
            c = self.task.config
            options = {"val_fraction": c.val_fraction, "test_fraction": c.test_fraction}
            options["undirected"] = c.undirected
        return {"method": self.config.rows, "partition_options": options, "feature_dtype": dtype}

    @override
    def part_of(self, prepared: SancusPrepared, rank: int) -> SancusPart:
        layout = row_blocks(prepared.graph, prepared.offsets, rank, prepared.is_seed)
        if prepared.test_graph is None:
            return _part(prepared, layout)
        test = row_blocks(prepared.test_graph, prepared.offsets, rank, prepared.is_seed)
        return _part(prepared, layout, _link_part(prepared, rank, test))

    @override
    def write_parts(self, world_size: int, writer, log) -> dict:
        """Per part (:meth:`part_of`'s, ``Â`` computed once for all): its row block of ``Â``
        as one CSR (``crow``, ``col``, ``val``) per column block, its rows of ``X`` and of the
        task's targets (:meth:`~...graph.node_targets.NodeTargets.arrays`), its training rows
        and original ids."""
        prepared = self.prepare(world_size)
        graph, offsets, seeds = prepared.graph, prepared.offsets, prepared.is_seed
        link = prepared.test_graph is not None
        stages = (  # link prediction's test-stage and every-edge row blocks of each part
            zip(
                every_row_block(prepared.test_graph, offsets, seeds),
                every_row_block(prepared.full_graph, offsets, seeds),
                strict=True,
            )
            if link
            else itertools.repeat(None)
        )
        if link:
            writer.write_shared("rows", {"new2old": prepared.new2old})
        for k, (layout, more) in enumerate(zip(every_row_block(graph, offsets, seeds), stages)):
            arrays = {"seed_rows": layout.seed_rows, **_block_arrays("a", layout)}
            if link:
                test, full = more
                part = _part(prepared, layout, _link_part(prepared, k, test))
                arrays |= _block_arrays("t", test) | _block_arrays("f", full)
                for name, (pos, index) in part.link.pairs.items():
                    arrays[f"{name}_pos"], arrays[f"{name}_index"] = pos, index
                for name, rel in (part.link.relations or {}).items():  # a typed split's
                    arrays[f"{name}_rel"] = rel
            else:
                part = _part(prepared, layout)
                arrays |= part.targets.arrays()
            arrays |= {"x": part.x, "own_ids": part.own_ids}
            sizes = {
                "nodes": layout.num_rows,
                "edges": sum(b.values().numel() for b in layout.blocks),
            }
            writer.write_part(k, arrays, sizes, shared=("rows",) if link else ())
            log(f"[partition] part {k + 1}/{world_size} written ({sizes})")
        meta = {
            "node_offsets": offsets.tolist(),
            "consumer": consumer_matrix(graph, offsets).tolist(),
        }
        if graph.is_typed:  # the blocks stack these relations' rows (GNNDataModule reads it)
            meta["relations"] = list(graph.relations)
            meta["node_types"] = list(graph.node_types)
        if link:
            meta["train_pairs"] = int(prepared.targets.split.train_pos.shape[1])
            if graph.is_typed:  # the triples' relations (``relations`` adds inverses)
                meta["pair_relations"] = list(self.graph.relations)
            for prefix, stage in zip(LINK_BLOCKS, (prepared.test_graph, prepared.full_graph)):
                meta[f"consumer_{prefix}"] = consumer_matrix(stage, offsets).tolist()
        else:
            meta["train_count"] = int(seeds.sum())
        return meta

    @override
    def check_partition_part(self, opened: PartitionDir, k: int) -> None:
        """``consumer`` is a ``P x P`` table of booleans (``train_count`` is the format's
        check), and part ``k`` holds one CSR per column block with ``nodes + 1`` row pointers."""
        meta, where, parts = opened.meta, opened.path / METADATA, opened.num_parts
        link = self.is_link
        for key in ("consumer", *(f"consumer_{p}" for p in LINK_BLOCKS if link)):
            consumer = meta.get(key)
            if not (
                isinstance(consumer, list)
                and len(consumer) == parts
                and all(isinstance(row, list) and len(row) == parts for row in consumer)
                and all(isinstance(value, bool) for row in consumer for value in row)
            ):
                raise PartitionDirError(
                    f"{where}: {key!r} is not a {parts} x {parts} table of booleans"
                )
        folder, nodes = part_folder(k), meta["parts"][k]["nodes"]
        if link and not is_count(meta.get("train_pairs")):
            raise PartitionDirError(f"{where}: 'train_pairs' is not a count of training pairs")
        num_rel = _relation_count(meta, where)
        if link:
            _link_relation_count(meta, where)
        rows = max(num_rel, 1) * nodes
        prefixes = ("a", *LINK_BLOCKS) if link else ("a",)
        for prefix in (*prefixes, *map(_transposed, prefixes)) if num_rel else prefixes:
            for j in range(parts):
                crow = opened.shape(folder, f"{prefix}{j}_crow")
                col = opened.shape(folder, f"{prefix}{j}_col")
                if crow is None or col is None or opened.shape(folder, f"{prefix}{j}_val") is None:
                    raise PartitionDirError(
                        f"{where}: part {k} does not list column block {j}'s CSR ({prefix}{j}_*)"
                    )
                key = f"part {k}'s 'nodes'" + (" times the relations" if num_rel else "")
                opened.expect_shape(folder, f"{prefix}{j}_crow", (rows + 1,), key)
                opened.expect_shape(
                    folder, f"{prefix}{j}_val", col, f"part {k}'s {prefix}{j}_col.npy"
                )
        for name in SPLITS if link else ():
            index = opened.shape(folder, f"{name}_index")
            if index is None or opened.shape(folder, f"{name}_pos") is None:
                raise PartitionDirError(f"{where}: part {k} does not list its {name} pairs")
            opened.expect_shape(folder, f"{name}_pos", (2, *index), f"part {k}'s {name}_index.npy")
            if num_rel:  # a typed split's triples keep their relations
                if opened.shape(folder, f"{name}_rel") is None:
                    raise PartitionDirError(
                        f"{where}: part {k} does not list its {name} pairs' relations"
                    )
                opened.expect_shape(folder, f"{name}_rel", index, f"part {k}'s {name}_index.npy")

    @override
    def load_part(self, opened: PartitionDir, rank: int) -> SancusPart:
        """Rank ``rank``'s part from its files only (memory-mapped): the CSR of each column
        block, its rows and the shared ``consumer`` table and training count."""
        offsets, arrays = opened.node_offsets, opened.load_part(rank)
        sizes = offsets.diff().tolist()
        consumer = torch.tensor(opened.meta["consumer"], dtype=torch.bool)
        seed_rows = arrays["seed_rows"]
        num_rel = _relation_count(opened.meta, opened.path / METADATA)
        blocks = _csr_blocks(arrays, "a", sizes, rank, num_rel)
        transposed = _csr_blocks(arrays, TRANSPOSED, sizes, rank, num_rel) if num_rel else None
        layout = RowBlocks(rank, offsets, blocks, consumer, seed_rows, num_rel, transposed)
        if not self.is_link:
            return SancusPart(
                layout,
                arrays["x"],
                NodeTargets.from_arrays(arrays, self.task.out_dim_of(opened.meta)),
                int(opened.meta["train_count"]),
                arrays["own_ids"],
            )

        def stage_layout(prefix: str) -> RowBlocks:
            blocks = _csr_blocks(arrays, prefix, sizes, rank, num_rel)
            back = (
                _csr_blocks(arrays, _transposed(prefix), sizes, rank, num_rel) if num_rel else None
            )
            stage_consumer = torch.tensor(opened.meta[f"consumer_{prefix}"], dtype=torch.bool)
            return RowBlocks(rank, offsets, blocks, stage_consumer, seed_rows, num_rel, back)

        pairs = {name: (arrays[f"{name}_pos"], arrays[f"{name}_index"]) for name in SPLITS}
        new2old = opened.load_shared("rows", rank)["new2old"]
        train_pairs = int(opened.meta["train_pairs"])
        typed = {}
        if num_rel:  # the triples' relations, checked (outside input); the task learns them
            where = opened.path / part_folder(rank)
            count = _link_relation_count(opened.meta, opened.path / METADATA)
            for name, (_, index) in pairs.items():
                _check_pair_relations(name, arrays[f"{name}_rel"], index, count, where)
            self.learn_pair_relations()
            typed = dict(
                relations={name: arrays[f"{name}_rel"] for name in SPLITS},
                message_relations=tuple(opened.meta["relations"]),
                num_pair_relations=count,
            )
        link = LinkPart(
            stage_layout("t"), lambda: stage_layout("f"), pairs, new2old, train_pairs, **typed
        )
        return SancusPart(layout, arrays["x"], None, train_pairs, arrays["own_ids"], link)

    @override
    def setup_rank(self, context: RankContext, part: SancusPart) -> None:
        offsets, world, device = part.layout.offsets, context.world_size, context.device
        if offsets.numel() - 1 != world:
            raise ValueError(f"row blocks for {offsets.numel() - 1} ranks, world size {world}")
        assert_same_on_all_ranks(context.comm, offsets, "the SANCUS row blocks")
        self.layout = part.layout.to(device)
        self.x = part.x.to(device)
        self.train_count, self.own_ids = part.train_count, part.own_ids
        self.comm = context.comm
        if part.link is None:
            self.own_targets = part.targets.to_device(device)
            return
        c = self.task.config
        self.links = RankLinks(
            part.link, part.layout, c.embedding_dim, self.seed, c.filter_negatives
        )
        self.stage_layouts = {"train": self.layout, "test": part.link.test_layout.to(device)}
        self.pair_order = EpochOrder(torch.arange(self.train_count), self.seed)

    @override
    def state_dict(self) -> dict:
        return {**super().state_dict(), "policy": self.config.policy}

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        """A resume (``trainer.fit(ckpt_path=...)``, also from a plain Lightning script) is
        refused unless the policy is ``none``: the staleness state is not in the checkpoint.
        Loading weights to evaluate or predict (``trainer.test(ckpt_path="best")``) is not a
        resume."""
        if self.trainer is not None and self.trainer.state.fn != "fit":
            return
        self.config.check_resumable(
            "resuming from a checkpoint",
            fresh_start="load its weights into the module (e.g. GNNModule.load_from_checkpoint) "
            "and call trainer.fit without ckpt_path",
        )
        super().load_state_dict(state_dict)

    @override
    def build_model(self, model: ModelConfig) -> SancusGCN:
        """The GCN whose layers broadcast the row blocks (``model`` must be a GCN without
        dropout, an RGCN on a typed graph; an unset ``model.init`` is the task's default, as
        ``BlockGNN``'s)."""
        self.config.check_model(model)
        self.config.check_graph(model.name, self.is_typed)
        self.learn_pair_relations()  # before the task's head is built
        return SancusGCN(
            self.input_dim,
            model.hidden,
            self.out_dim,
            model.num_layers,
            StalenessPolicy.of(self.config),
            init=model.init or self.task.default_init,
            kind=model.name,
            num_relations=self.num_relations,
            num_bases=model.num_bases,
        )

    @override
    def callbacks(self) -> list[L.Callback]:
        """The staleness log and the cache memory (``summary.json`` → ``system``)."""
        return [StalenessLog(self.config.rows), CacheMemory(self.cache_sizes)]

    def cache_sizes(self) -> tuple[int, int]:
        """``(N, bytes per embedding value)`` of the cache formula (after set-up: the row
        blocks' node count, the features' element size)."""
        return int(self.layout.offsets[-1]), self.x.element_size()

    @property
    def batch_size(self) -> int:
        """Global seeds per step: link prediction's training pairs (``-1``: every one) once
        the rank is set up (from its part: a rank of a partition directory has no dataset)."""
        if self.links is None:
            return super().batch_size
        size = self.data.batch_size
        return self.train_count if size == -1 else size

    @property
    def steps_per_epoch(self) -> int:
        """One full-graph step per epoch (node tasks); link prediction: one per
        ``data.batch_size`` training pairs."""
        if not self.is_link:
            return 1
        if self.links is None:
            return super().steps_per_epoch
        return -(-self.train_count // self.batch_size)

    @override
    def make_batch(self, epoch: int, step: int) -> Batch:
        stats = {"sample_s": 0.0, "load_s": 0.0, "input_nodes": self.x.shape[0]}
        if self.links is not None:
            return self._link_batch(epoch, step, stats)
        y = self.own_targets.target[self.layout.seed_rows]
        return Batch([self.layout], self.x, y, self.train_count, epoch, step, stats)

    def _link_batch(self, epoch: int, step: int, stats: dict) -> Batch:
        """The step's training pairs whose source this rank owns, their negatives (the task's,
        keyed by their positions in the step), and the route of their endpoints' rows.
        Collective (the endpoints' owners learn which rows to send)."""
        global_seeds = self.pair_order.step(epoch, step, self.batch_size)
        seeds, positions = self.links.own_seeds(global_seeds)
        nodes, y = self.task.step_rows(self.links.targets, seeds, positions, epoch=epoch, step=step)
        endpoints = EndpointRows.build(self.comm, nodes, self.links)
        terms = self.task.loss_terms(global_seeds.numel())
        return Batch([self.layout, endpoints], self.x, y, terms, epoch, step, stats)

    @override
    def predict_rows(
        self, net: torch.nn.Module, node_ids: torch.Tensor | None, output: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The own row block's rows (the exact pass evaluation runs), in original node ids;
        link prediction's over every edge of the graph, as ``single`` predicts."""
        sancus = SancusGCN.of(net)
        layers = sancus.num_layers - (output == "embeddings")
        rows = sancus.exact_logits(self.x, self.predict_layout(), layers=layers)
        return own_predictions(self.own_ids, rows, node_ids, int(self.layout.offsets[-1]))

    def predict_layout(self) -> RowBlocks:
        """The row blocks predictions pass messages over: every edge (link prediction's
        built or mapped on first use)."""
        if self.links is None:
            return self.layout
        if "full" not in self.stage_layouts:
            self.stage_layouts["full"] = self.links.part.full_layout().to(self.x.device)
        return self.stage_layouts["full"]

    @override
    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        sancus = SancusGCN.of(net)
        if self.links is None:
            out = sancus.exact_logits(self.x, self.layout)
            return split_statistics(self.task, out, self.own_targets, splits)
        links = self.links

        def embed(stage: str) -> torch.Tensor:
            return sancus.exact_logits(self.x, self.stage_layouts[stage]).cpu()

        return owned_link_statistics(
            self.task,
            embed,
            self.own_ids,
            links.owner,
            links.part.pairs,
            links.num_nodes,
            self.seed,
            splits,
            self.comm,
            relations=links.part.relations,
        )
