"""A task's rows per node, apart from the graph: targets and evaluation splits
(docs/architecture.md, "Tasks").

A system holds :class:`NodeTargets` rows beside the graph rows it holds, and only selects,
slices, concatenates, stores and hands them back; the task (``lightning_gnnscale.tasks``)
reads them. :class:`NodeDataset` is what a dataset source returns: the graph and the dataset's
own node classification targets (labels, splits, class count), from which each task derives
its own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .csc import Graph

SPLITS = ("train", "val", "test")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class NodeTargets:
    """Per-row targets and split membership, row ``i`` belonging to one node.

    Attributes:
        target: int64 labels ``[n]`` (``-1``: unlabelled) or floating targets ``[n, d]``.
        train, val, test: bool ``[n]``: the row's node is in that split.
        out_dim: width of the head these targets train (classes, or ``d``).
    """

    target: Tensor
    train: Tensor
    val: Tensor
    test: Tensor
    out_dim: int

    def __post_init__(self) -> None:
        n = self.target.shape[0] if self.target.dim() else -1
        _check(
            (self.target.dim() == 1 and self.target.dtype == torch.int64)
            or (self.target.dim() == 2 and self.target.is_floating_point()),
            f"NodeTargets.target must be int64 labels [n] or floating targets [n, d], got "
            f"{self.target.dtype} {tuple(self.target.shape)}",
        )
        for split in SPLITS:
            column = getattr(self, split)
            _check(
                column.shape == (n,) and column.dtype == torch.bool,
                f"NodeTargets.{split} must be bool [n={n}], got {column.dtype} "
                f"{tuple(column.shape)}",
            )
        unlabelled = not any(bool(getattr(self, split).any()) for split in SPLITS)
        _check(
            self.out_dim >= 1 or (self.out_dim == 0 and unlabelled),
            f"NodeTargets.out_dim must be >= 1 (0 only for a dataset without labels, whose "
            f"splits are empty), got {self.out_dim}",
        )

    @property
    def num_rows(self) -> int:
        return self.target.shape[0]

    def split(self, name: str) -> Tensor:
        """bool ``[n]``: the rows in split ``name`` (``train``, ``val`` or ``test``)."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; valid: {list(SPLITS)}")
        return getattr(self, name)

    def split_matrix(self) -> Tensor:
        """bool ``[n, 3]``: membership in train, val and test (what partitioners balance)."""
        return torch.stack([self.train, self.val, self.test], dim=1)

    def rows(self, index: Tensor | slice) -> NodeTargets:
        """The rows ``index`` (ids, a bool mask or a slice), in that order."""
        return replace(
            self,
            target=self.target[index],
            train=self.train[index],
            val=self.val[index],
            test=self.test[index],
        )

    def clone(self) -> NodeTargets:
        """A copy that owns its memory (a part cut from a whole graph's rows)."""
        return replace(
            self,
            target=self.target.clone(),
            train=self.train.clone(),
            val=self.val.clone(),
            test=self.test.clone(),
        )

    @classmethod
    def cat(cls, parts: list[NodeTargets], out_dim: int | None = None) -> NodeTargets:
        """The rows of ``parts`` one after another (``out_dim``: the first part's by
        default; required when ``parts`` is empty)."""
        if not parts:
            raise ValueError("NodeTargets.cat needs at least one part")
        return cls(
            target=torch.cat([p.target for p in parts]),
            train=torch.cat([p.train for p in parts]),
            val=torch.cat([p.val for p in parts]),
            test=torch.cat([p.test for p in parts]),
            out_dim=parts[0].out_dim if out_dim is None else out_dim,
        )

    def to(self, dtype: torch.dtype) -> NodeTargets:
        """Floating targets cast to ``dtype`` (labels stay int64)."""
        if not self.target.is_floating_point() or self.target.dtype == dtype:
            return self
        return replace(self, target=self.target.to(dtype))

    def to_device(self, device: torch.device | str) -> NodeTargets:
        return replace(
            self,
            target=self.target.to(device),
            train=self.train.to(device),
            val=self.val.to(device),
            test=self.test.to(device),
        )

    @staticmethod
    def array_names(prefix: str = "") -> tuple[str, ...]:
        """The names :meth:`arrays` gives its columns (the files of a partition directory)."""
        return tuple(f"{prefix}{name}" for name in ("y", *(f"{s}_mask" for s in SPLITS)))

    def arrays(self, prefix: str = "") -> dict[str, Tensor]:
        """The rows as named arrays (``y``, ``train_mask``, ``val_mask``, ``test_mask``, each
        name after ``prefix``): the files a partition directory stores."""
        names = self.array_names(prefix)
        return dict(zip(names, (self.target, self.train, self.val, self.test), strict=True))

    @classmethod
    def from_arrays(cls, arrays, out_dim: int, prefix: str = "") -> NodeTargets:
        """The rows of :meth:`arrays`' columns (memory-mapped arrays are used as they are)."""
        target, train, val, test = (arrays[name] for name in cls.array_names(prefix))
        return cls(target=target, train=train, val=val, test=test, out_dim=out_dim)


@dataclass(frozen=True)
class NodeDataset:
    """A dataset as a source returns it: the graph and its node classification targets
    (``targets.target``: labels, ``-1`` unlabelled; ``targets.out_dim``: class count)."""

    graph: Graph
    targets: NodeTargets
    # the data's own split of every edge, int8 [E] in CSC order (0 train, 1 val, 2 test), for
    # link prediction (a constructed dataset's train / val / test edge tables); None: none
    edge_split: Tensor | None = None

    def __post_init__(self) -> None:
        _check(
            self.targets.num_rows == self.graph.num_nodes,
            f"NodeDataset: {self.targets.num_rows} target rows for {self.graph.num_nodes} nodes",
        )
        _check(
            self.edge_split is None
            or (
                self.edge_split.dtype == torch.int8
                and self.edge_split.shape == (self.graph.num_edges,)
            ),
            f"NodeDataset.edge_split must be int8 [{self.graph.num_edges}]",
        )

    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def num_classes(self) -> int:
        return self.targets.out_dim

    def to(self, dtype: torch.dtype) -> NodeDataset:
        """Features (and floating targets) cast to ``dtype``."""
        return NodeDataset(self.graph.to(dtype), self.targets.to(dtype), self.edge_split)
