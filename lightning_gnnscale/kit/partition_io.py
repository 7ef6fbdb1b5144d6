"""Partition directories as a DataModule sees them: what a directory must carry to serve a
run, opening and verifying it, and writing one (docs/partitioning.md)."""

from __future__ import annotations

from typing import Any

import torch

from ..config_types import SystemConfig, partition_dir_unsupported
from ..contract import RankContext
from ..errors import ConfigError
from ..graph.csc import Graph
from ..graph.dataset_config import DatasetConfig
from ..tasks import DEFAULT_TASK
from .partitions import assert_same_on_all_ranks

# the shared group of a partition directory that flags the nodes whose input rows are learned
FEATURELESS_GROUP = "learned_inputs"


class PartitionDirIO:
    """The partition-directory half of :class:`~.datamodule.GNNDataModule` (a mixin: it reads
    the DataModule's ``config``, ``seed``, ``partition_dir``, dataset settings,
    ``graph`` and prepared results)."""

    config: SystemConfig
    seed: int
    partition_dir: Any
    graph: Graph
    dataset_config: DatasetConfig | None
    _prepared: dict[int, Any]

    def partition_settings(self) -> dict[str, Any]:
        """What the system's partition depends on besides the dataset, seed and part count
        (``method``, ``partition_options``), recorded in and checked against a partition
        directory."""
        return {}

    def dataset_identity(self) -> dict | None:
        """The dataset's name and content settings (``None``: unknown, a DataModule built on
        a Graph or on ``None``)."""
        from ..graph.partition_dir import dataset_identity

        if self.dataset_config is None:
            return None
        return dataset_identity(self.dataset_config)

    def partition_expectation(self, world_size: int) -> dict[str, Any]:
        """The metadata a partition directory must carry to serve this run."""
        return {
            "system": self.config.name,
            "task": self.task.name,
            "num_parts": world_size,
            "seed": self.seed,
            "dataset": self.dataset_identity(),
            **self.task.partition_settings(),
            **self.partition_settings(),
        }

    def open_partition_dir(self, world_size: int):
        """Open ``data.partition_dir`` and check it was made for this run (dataset, system,
        method and options, seed, part count); raises ``PartitionDirError`` naming the key.
        A directory already opened for its metadata (:meth:`partition_meta`) is reused, with
        the parts it verified."""
        from ..graph.partition_dir import PartitionDir

        opened = self._opened_dir or PartitionDir.open(self.partition_dir)
        expected = self.partition_expectation(world_size)
        del expected["task"]
        opened.check(expected)
        self.check_partition_task(opened)
        self._opened_dir = opened
        return opened

    def check_partition_task(self, opened) -> None:
        """The directory was written for this DataModule's task (one written before tasks
        existed holds node classification's targets); else ``PartitionDirError`` naming both
        tasks and the directory's format version. Checked before anything reads the task's
        metadata (``target_dim``)."""
        from ..graph.partition_dir import PartitionDirError

        written_for = opened.meta.get("task", DEFAULT_TASK)
        if written_for != self.task.name:
            raise PartitionDirError(
                f"{opened.path}: it was written for task {written_for!r} (format version "
                f"{opened.meta.get('version')}) but this run has task={self.task.name!r}; "
                "partition for this task: python -m lightning_gnnscale.partition <overrides> "
                "task=<name> out=<dir>"
            )

    def verify_partition_parts(self, opened, ranks: list[int]) -> None:
        """The files of the parts of ``ranks`` (and their shared groups) against the metadata
        (``PartitionDir.verify_parts``: inside the directory, sizes, headers, digests, the
        format's counts), then the system's own counts (:meth:`check_partition_part`)."""
        opened.verify_parts(ranks)
        for k in ranks:
            self.check_partition_part(opened, k)

    def check_rank_part(self, context: RankContext, opened) -> None:
        """What every rank checks of a partition directory before its system loads its part,
        once for every system: it has a part for each of this run's ranks, and every rank
        opened the same directory (its digest: a rank that opened another copy would train on
        other rows, or hang in an exchange). Collective."""
        if opened.num_parts != context.world_size:
            raise ValueError(
                f"partitioned into {opened.num_parts} parts for {context.world_size} ranks"
            )
        digest = torch.tensor([int(opened.digest[:15], 16)])
        assert_same_on_all_ranks(context.comm, digest, "the partition directory")

    def check_partition_part(self, opened, k: int) -> None:
        """The system's metadata keys that size an allocation agree with part ``k``'s verified
        files (``opened.expect_shape``); default: nothing beyond the format's."""

    _opened_dir = None  # the directory as opened for the metadata, before any prepare

    def partition_meta(self) -> dict:
        """The metadata of ``data.partition_dir`` (opened once), its counts checked against
        the part files of this node's ranks that are here (a rank's copy may hold its own part
        only), and its task (:meth:`check_partition_task`), before a model is sized from it."""
        if self._prepared:
            return next(iter(self._prepared.values())).meta
        if self._opened_dir is None:
            from ..graph.partition_dir import PartitionDir, node_ranks, part_folder

            opened = PartitionDir.open(self.partition_dir)
            self.check_partition_task(opened)
            ranks = node_ranks(opened.num_parts)
            here = [k for k in ranks if (opened.path / part_folder(k)).is_dir()]
            self.verify_partition_parts(opened, here or ranks)
            self._opened_dir = opened
        return self._opened_dir.meta

    def write_partition_dir(self, out, world_size: int, log=print) -> dict:
        """Partition for ``world_size`` ranks (this DataModule's ``preprocess``) and write the
        partition directory ``out``; returns its metadata (``python -m
        lightning_gnnscale.partition``)."""
        from ..graph.cache import graph_fingerprint
        from ..graph.partition_dir import PartitionDirWriter

        if not self.config.supports_partition_dir:
            raise ConfigError(partition_dir_unsupported(self.config.name))
        graph = self.graph
        writer = PartitionDirWriter(out)
        extra = self.write_parts(world_size, writer, log)
        learned = self.featureless_nodes()
        if learned is not None:  # which nodes' input rows are learned, for every rank
            writer.write_shared(FEATURELESS_GROUP, {"learned": learned.to(torch.uint8)})
            for record in writer.parts.values():
                record["shared"] = sorted({*record.get("shared", ()), FEATURELESS_GROUP})
        identity = self.dataset_identity() or {"name": graph.name, "options": {}}
        return writer.finish(
            {
                **self.partition_expectation(world_size),
                "dataset": identity,
                "graph": graph_fingerprint(graph, self.fingerprint_targets()),
                "num_nodes": graph.num_nodes,
                "num_edges": graph.num_edges,
                "num_features": graph.num_features,
                "num_classes": self.node_dataset.num_classes,
                "target_dim": self.targets.out_dim,
                "feature_dtype": str(graph.x.dtype).removeprefix("torch."),
                # node types whose rows are zero padding (learned: docs/architecture.md)
                "featureless_node_types": list(graph.meta.get("featureless_node_types") or []),
                **extra,
            }
        )

    def fingerprint_targets(self):
        """The node rows the directory's ``graph`` fingerprint digests (default the task's
        :attr:`targets`; a system whose task's targets are not node rows, link prediction's,
        gives the node rows its partition holds)."""
        return self.targets

    def write_parts(self, world_size: int, writer, log) -> dict:
        """Write every part with ``writer.write_part``; return the system's metadata (at least
        ``node_offsets``). Systems that support partition directories implement it."""
        raise NotImplementedError
