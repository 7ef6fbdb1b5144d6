"""``SancusDataModule``: this rank's row block, one full-graph batch per epoch
(docs/systems/sancus.md#what-is-implemented, "Batches")."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from typing_extensions import override

from ...config_types import ModelConfig
from ...contract import RankContext
from ...graph.batch import Batch
from ...graph.book import PartitionBook, relabel_graph
from ...graph.cache import cached_partition
from ...graph.csc import Graph
from ...graph.node_targets import NodeTargets
from ...graph.partition_dir import METADATA, PartitionDir, PartitionDirError, part_folder
from ...kit.datamodule import GNNDataModule
from ...kit.partitions import assert_same_on_all_ranks, own_predictions
from ...tasks.base import split_statistics
from .callbacks import CacheMemory, StalenessLog
from .config import SancusConfig
from .layout import RowBlocks, check_symmetric, consumer_matrix, every_row_block, row_blocks
from .policy import StalenessPolicy
from .runtime import SancusGCN


@dataclass(frozen=True)
class SancusPrepared:
    """The graph and the task's rows relabelled into row-block order, the task's training
    seeds in that order (bool ``[N]``) and the int64 ``[P + 1]`` row-block boundaries (rank
    ``i`` owns rows ``offsets[i]:offsets[i + 1]``)."""

    graph: Graph
    targets: NodeTargets
    is_seed: torch.Tensor
    offsets: torch.Tensor
    new2old: torch.Tensor  # original id of every relabelled row


@dataclass(frozen=True)
class SancusPart:
    """What rank ``i`` holds, in memory and from a partition directory alike: its row block of
    ``Â`` (:class:`RowBlocks`), its rows ``[n_i, ...]`` of ``X`` and of the task's targets,
    the global training count and its rows' original ids ``[n_i]``."""

    layout: RowBlocks
    x: torch.Tensor
    targets: NodeTargets
    train_count: int
    own_ids: torch.Tensor


def _part(prepared: SancusPrepared, layout: RowBlocks) -> SancusPart:
    """The part of ``layout``'s rank (its row block of ``prepared``'s graph)."""
    graph, offsets, rank = prepared.graph, prepared.offsets, layout.rank
    lo, hi = int(offsets[rank]), int(offsets[rank + 1])
    return SancusPart(
        layout,
        graph.x[lo:hi],
        prepared.targets.rows(slice(lo, hi)),
        int(prepared.is_seed.sum()),
        prepared.new2old[lo:hi],
    )


class SancusDataModule(GNNDataModule):
    """Rank ``i`` keeps ``Â_i*`` (CSR per column block, :class:`RowBlocks`), ``X_i`` and its
    rows of the task's targets; the net (:class:`SancusGCN`, from :meth:`build_model`) holds
    the caches.

    Each training batch is the whole own block: ``Batch([row blocks], X_i [n_i, F], targets of
    the own training seeds [n_train_i], global train count)``. Evaluation is the exact
    stateless distributed forward.

    Args: as :class:`~...kit.datamodule.GNNDataModule`; ``config`` defaults to ``SancusConfig()``.
    """

    def __init__(self, dataset, config: SancusConfig | None = None, data=None, **kwargs):
        super().__init__(dataset, config or SancusConfig(), data, **kwargs)
        self.layout: RowBlocks | None = None

    @override
    def preprocess(self, world_size: int) -> SancusPrepared:
        """Order the nodes into row blocks (the partition cached under ``cache_dir``)."""
        graph, rows = self.graph, self.config.rows
        check_symmetric(graph)
        if graph.num_nodes < world_size:
            raise ValueError(f"{graph.num_nodes} nodes cannot fill {world_size} row blocks")
        parts = cached_partition(
            graph, rows, world_size, self.seed, self.cache_dir, targets=self.targets
        )
        book = PartitionBook.from_parts(parts, world_size)
        sizes = (book.node_offsets[1:] - book.node_offsets[:-1]).tolist()
        print(f"[{self.config.name}] {rows} row blocks of {sizes} rows", flush=True)
        targets = self.targets.rows(book.new2old)
        return SancusPrepared(
            relabel_graph(graph, book),
            targets,
            self.task.is_train_seed(targets),
            book.node_offsets,
            book.new2old,
        )

    # ------------------------------------------------------------- partition directories
    @override
    def partition_settings(self) -> dict[str, Any]:
        # Â's values are computed in the features' dtype: a directory serves that dtype only
        dtype = str(self.dtype).removeprefix("torch.")
        return {"method": self.config.rows, "partition_options": {}, "feature_dtype": dtype}

    @override
    def part_of(self, prepared: SancusPrepared, rank: int) -> SancusPart:
        layout = row_blocks(prepared.graph, prepared.offsets, rank, prepared.is_seed)
        return _part(prepared, layout)

    @override
    def write_parts(self, world_size: int, writer, log) -> dict:
        """Per part (:meth:`part_of`'s, ``Â`` computed once for all): its row block of ``Â``
        as one CSR (``crow``, ``col``, ``val``) per column block, its rows of ``X`` and of the
        task's targets (:meth:`~...graph.node_targets.NodeTargets.arrays`), its training rows
        and original ids."""
        prepared = self.prepare(world_size)
        graph, offsets = prepared.graph, prepared.offsets
        for k, layout in enumerate(every_row_block(graph, offsets, prepared.is_seed)):
            part = _part(prepared, layout)
            arrays = {
                "x": part.x,
                **part.targets.arrays(),
                "seed_rows": layout.seed_rows,
                "own_ids": part.own_ids,
            }
            for j, block in enumerate(layout.blocks):
                arrays[f"a{j}_crow"] = block.crow_indices()
                arrays[f"a{j}_col"] = block.col_indices()
                arrays[f"a{j}_val"] = block.values()
            sizes = {
                "nodes": layout.num_rows,
                "edges": sum(b.values().numel() for b in layout.blocks),
            }
            writer.write_part(k, arrays, sizes)
            log(f"[partition] part {k + 1}/{world_size} written ({sizes})")
        return {
            "node_offsets": offsets.tolist(),
            "consumer": consumer_matrix(graph, offsets).tolist(),
            "train_count": int(prepared.is_seed.sum()),
        }

    @override
    def check_partition_part(self, opened: PartitionDir, k: int) -> None:
        """``consumer`` is a ``P x P`` table of booleans (``train_count`` is the format's
        check), and part ``k`` holds one CSR per column block with ``nodes + 1`` row pointers."""
        meta, where, parts = opened.meta, opened.path / METADATA, opened.num_parts
        consumer = meta.get("consumer")
        if not (
            isinstance(consumer, list)
            and len(consumer) == parts
            and all(isinstance(row, list) and len(row) == parts for row in consumer)
            and all(isinstance(value, bool) for row in consumer for value in row)
        ):
            raise PartitionDirError(
                f"{where}: 'consumer' is not a {parts} x {parts} table of booleans"
            )
        folder, nodes = part_folder(k), meta["parts"][k]["nodes"]
        for j in range(parts):
            crow, col = opened.shape(folder, f"a{j}_crow"), opened.shape(folder, f"a{j}_col")
            if crow is None or col is None or opened.shape(folder, f"a{j}_val") is None:
                raise PartitionDirError(f"{where}: part {k} does not list column block {j}'s CSR")
            opened.expect_shape(folder, f"a{j}_crow", (nodes + 1,), f"part {k}'s 'nodes'")
            opened.expect_shape(folder, f"a{j}_val", col, f"part {k}'s a{j}_col.npy")

    @override
    def load_part(self, opened: PartitionDir, rank: int) -> SancusPart:
        """Rank ``rank``'s part from its files only (memory-mapped): the CSR of each column
        block, its rows and the shared ``consumer`` table and training count."""
        offsets, arrays = opened.node_offsets, opened.load_part(rank)
        sizes = offsets.diff().tolist()
        blocks = []
        with warnings.catch_warnings():  # "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            for j, cols in enumerate(sizes):
                crow, col, val = (arrays[f"a{j}_{name}"] for name in ("crow", "col", "val"))
                blocks.append(torch.sparse_csr_tensor(crow, col, val, (sizes[rank], cols)))
        consumer = torch.tensor(opened.meta["consumer"], dtype=torch.bool)
        return SancusPart(
            RowBlocks(rank, offsets, blocks, consumer, arrays["seed_rows"]),
            arrays["x"],
            NodeTargets.from_arrays(arrays, self.task.out_dim_of(opened.meta)),
            int(opened.meta["train_count"]),
            arrays["own_ids"],
        )

    @override
    def setup_rank(self, context: RankContext, part: SancusPart) -> None:
        offsets, world, device = part.layout.offsets, context.world_size, context.device
        if offsets.numel() - 1 != world:
            raise ValueError(f"row blocks for {offsets.numel() - 1} ranks, world size {world}")
        assert_same_on_all_ranks(context.comm, offsets, "the SANCUS row blocks")
        self.layout = part.layout.to(device)
        self.x, self.own_targets = part.x.to(device), part.targets.to_device(device)
        self.train_count, self.own_ids = part.train_count, part.own_ids

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
        dropout)."""
        self.config.check_model(model)
        return SancusGCN(
            self.input_dim,
            model.hidden,
            self.out_dim,
            model.num_layers,
            StalenessPolicy.of(self.config),
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
    def steps_per_epoch(self) -> int:
        return 1

    @override
    def make_batch(self, epoch: int, step: int) -> Batch:
        stats = {"sample_s": 0.0, "load_s": 0.0, "input_nodes": self.x.shape[0]}
        y = self.own_targets.target[self.layout.seed_rows]
        return Batch([self.layout], self.x, y, self.train_count, epoch, step, stats)

    @override
    def predict_rows(
        self, net: torch.nn.Module, node_ids: torch.Tensor | None, output: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The own row block's rows (the exact pass evaluation runs), in original node ids."""
        sancus = SancusGCN.of(net)
        layers = sancus.num_layers - (output == "embeddings")
        rows = sancus.exact_logits(self.x, self.layout, layers=layers)
        return own_predictions(self.own_ids, rows, node_ids, int(self.layout.offsets[-1]))

    @override
    def eval_statistics(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        out = SancusGCN.of(net).exact_logits(self.x, self.layout)
        return split_statistics(self.task, out, self.own_targets, splits)
