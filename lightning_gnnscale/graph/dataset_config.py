"""The dataset names and their typed settings: what a run config's ``dataset`` section is, checked
before anything is imported to load one (no torch, numpy or PyG here).

Each name is one :class:`DatasetSource` in :data:`DATASETS`: its settings class (a frozen
:class:`DatasetConfig` subclass, also its Hydra schema) and its loader, in one place;
:mod:`lightning_gnnscale.graph.datasets` holds the loaders. ``tests/test_datasets.py`` checks
that the generators' settings classes are the generators' own parameters.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from omegaconf import MISSING

from ..errors import ConfigError, check_field_types

MAX_RELATIONS = 4096  # relations of a typed graph (each an RGCN weight per layer)
MAX_NODE_TYPES = 4096


@dataclass(frozen=True)
class DatasetConfig:
    """Base of every dataset's settings (``dataset:`` in the run config), validated once.

    Args:
        name: a registered name (:data:`DATASETS`; case-insensitive, ``_`` = ``-``).
        root: the folder a file dataset is read from (``None``: the loader's default); a
            generated dataset reads no files and refuses one.
    """

    name: str = MISSING
    root: str | None = None

    def __post_init__(self) -> None:
        check_field_types(self, "dataset.")
        source = self.source
        if type(self) is not source.config:
            raise ConfigError(
                f"dataset.name={self.name!r} takes {source.config.__name__}, not "
                f"{type(self).__name__}; pick it with dataset={source.name.replace('-', '_')}"
            )
        if source.generated and self.root is not None:
            raise ConfigError(
                f"{source.name} is generated in memory and reads no files, but dataset.root="
                f"{self.root!r} was given; drop it. For a sweep that mixes generated and file "
                "datasets, set the file datasets' root once with paths.data_dir=<folder> (or "
                "the environment variable GNNSCALE_DATA_DIR): a generator ignores that one"
            )

    @property
    def is_typed(self) -> bool:
        """The graph it loads carries relations (a typed graph; docs/architecture.md, "Typed
        graphs"), known from its settings before anything is loaded."""
        return False

    @property
    def source(self) -> DatasetSource:
        """The registered source of :attr:`name`."""
        return DATASETS[canonical_name(self.name)]

    @property
    def options(self) -> dict[str, Any]:
        """Every setting but ``name`` and ``root``: the loader's keyword arguments."""
        skip = ("name", "root")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


@dataclass(frozen=True)
class SBMConfig(DatasetConfig):
    """Stochastic block model (:func:`~.generators.sbm`; blocks = classes), made in memory.

    Args:
        homophily: fraction of each node's edges inside its class.
        feature_signal: norm of each class centroid against unit Gaussian noise.
        train_frac, val_frac: the split (test gets the remaining nodes).
    """

    name: str = "sbm"
    num_nodes: int = 10_000
    num_classes: int = 8
    avg_degree: float = 10.0
    homophily: float = 0.8
    num_features: int = 64
    feature_signal: float = 1.0
    train_frac: float = 0.3
    val_frac: float = 0.2
    seed: int = 0


@dataclass(frozen=True)
class TypedSBMConfig(DatasetConfig):
    """A typed stochastic block model (:func:`~.generators.typed_sbm`): one block model per
    relation, the classes ``rel_0``'s blocks, made in memory (docs/datasets.md, "typed_sbm").

    Args:
        num_relations: relations, each with its own blocks and ``avg_degree`` per node.
        num_node_types: node types (uniform, independent of the classes).
        homophily: fraction of each relation's edges inside its blocks.
        feature_signal: norm of each class centroid against unit Gaussian noise.
        typed: ``False``: the same graph with its types erased (a type-blind baseline).
        train_frac, val_frac: the split (test gets the remaining nodes).
        featureless_node_types: the last this many node types have no features (zero rows;
            ``data.featureless=learned`` learns them).
    """

    name: str = "typed-sbm"
    num_nodes: int = 10_000
    num_classes: int = 4
    num_relations: int = 4
    num_node_types: int = 2
    avg_degree: float = 5.0
    homophily: float = 0.9
    num_features: int = 32
    feature_signal: float = 0.5
    typed: bool = True
    train_frac: float = 0.3
    val_frac: float = 0.2
    seed: int = 0
    featureless_node_types: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.featureless_node_types <= self.num_node_types:
            raise ConfigError(
                f"dataset.featureless_node_types={self.featureless_node_types} must be in "
                f"[0, dataset.num_node_types={self.num_node_types}]"
            )
        if not 1 <= self.num_relations <= MAX_RELATIONS:
            raise ConfigError(
                f"dataset.num_relations={self.num_relations} must be in [1, {MAX_RELATIONS}]"
            )
        if not 1 <= self.num_node_types <= MAX_NODE_TYPES:
            raise ConfigError(
                f"dataset.num_node_types={self.num_node_types} must be in [1, {MAX_NODE_TYPES}]"
            )

    @property
    def is_typed(self) -> bool:
        return self.typed


@dataclass(frozen=True)
class RMATConfig(DatasetConfig):
    """Graph500 R-MAT graph (:func:`~.generators.rmat`) with random features and labels, made
    in memory.

    Args:
        num_edges: directed edges drawn, before symmetrisation and deduplication.
        a, b, c: the R-MAT quadrant probabilities.
        undirected: store both directions.
    """

    name: str = "rmat"
    num_nodes: int = 1 << 20
    num_edges: int = 1 << 24
    a: float = 0.57
    b: float = 0.19
    c: float = 0.19
    num_features: int = 16
    num_classes: int = 16
    undirected: bool = True
    train_frac: float = 0.3
    val_frac: float = 0.2
    seed: int = 0


@dataclass(frozen=True)
class FileDatasetConfig(DatasetConfig):
    """Settings every dataset read from files shares.

    Args:
        cache_dir: where processing output goes (``None``: the loader's default); ``root`` is
            only read.
        download: let PyG / ogb fetch missing files into ``root`` (needs internet); ``False``:
            missing files fail at once, naming what is expected.
    """

    cache_dir: str | None = None
    download: bool = False


@dataclass(frozen=True)
class PlanetoidConfig(FileDatasetConfig):
    """A Planetoid dataset (public split), read from ``<root>/<Cora|CiteSeer|PubMed>/raw/``.

    Args:
        normalize_features: row-normalise the bag-of-words features (the GCN / GAT papers).
    """

    normalize_features: bool = True


@dataclass(frozen=True)
class OGBConfig(FileDatasetConfig):
    """An OGB node-property dataset (ogb's split), read from ``<root>/<name with - as _>/`` in
    ogb's layout (``raw/``, ``split/``, ``processed/``); ``ogbn-mag`` is a typed graph."""

    @property
    def is_typed(self) -> bool:
        return self.source.name in OGB_TYPED


@dataclass(frozen=True)
class ConstructedConfig(DatasetConfig):
    """A folder ``python -m lightning_gnnscale.construct`` wrote (docs/datasets.md, "Your own
    tables"); ``root`` names it (required: a run composed without it stops at the config
    check)."""

    name: str = "constructed"
    root: str = MISSING

    def __post_init__(self) -> None:
        if self.root is None:
            raise ConfigError(
                "dataset=constructed needs dataset.root=<the folder python -m "
                "lightning_gnnscale.construct wrote>"
            )
        super().__post_init__()

    @property
    def is_typed(self) -> bool:
        """Its folder's edge tables had a type column (from the metadata)."""
        from .constructed import is_typed_at

        return is_typed_at(self.root)


@dataclass(frozen=True)
class DatasetSource:
    """One registered dataset name: its settings class and how it loads.

    Attributes:
        name: the name (``dataset.name``), as error messages spell it.
        config: its settings class (``dataset.<option>``; Hydra's schema ``schema/dataset/<name>``).
        loader: ``"<module>:<function>"``, imported on first use: ``function(config) -> Graph``.
        generated: made in memory: it reads no files, so a ``dataset.root`` is refused.
        content: ``"<module>:<function>"``, ``function(root) -> str``: a digest of what
            ``root`` holds, for a source whose name and options do not fix its content
            (:func:`dataset_content`); ``None``: they do.
    """

    name: str
    config: type[DatasetConfig]
    loader: str
    generated: bool = False
    content: str | None = None

    def default_config(self) -> DatasetConfig:
        """This name's settings with every default (its Hydra schema node)."""
        return self.config(name=self.name)


# Every dataset name -> its source; a new source registers here (:func:`register_dataset`).
DATASETS: dict[str, DatasetSource] = {}


def register_dataset(source: DatasetSource) -> None:
    """Add ``source`` to :data:`DATASETS`; a name already registered is refused."""
    if source.name in DATASETS:
        raise ValueError(f"dataset {source.name!r} is registered twice")
    DATASETS[source.name] = source


# name -> PyG's Planetoid name (also the folder under root).
PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
# name -> (ogb split name, binary raw format, name of the folder inside ogb's zip).
OGB = {
    "ogbn-arxiv": ("time", False, "arxiv"),
    "ogbn-products": ("sales_ranking", False, "products"),
    "ogbn-papers100M": ("time", True, "papers100M-bin"),
    "ogbn-mag": ("time", False, "mag"),  # typed (heterogeneous): loaded as a typed graph
}
OGB_TYPED = ("ogbn-mag",)

_LOADERS = "lightning_gnnscale.graph.datasets"
register_dataset(DatasetSource("sbm", SBMConfig, f"{_LOADERS}:generate", generated=True))
register_dataset(DatasetSource("rmat", RMATConfig, f"{_LOADERS}:generate", generated=True))
register_dataset(DatasetSource("typed-sbm", TypedSBMConfig, f"{_LOADERS}:generate", generated=True))
for _name in PLANETOID:
    register_dataset(DatasetSource(_name, PlanetoidConfig, f"{_LOADERS}:load_planetoid"))
for _name in OGB:
    register_dataset(DatasetSource(_name, OGBConfig, f"{_LOADERS}:load_ogb"))
# a folder written by ``python -m lightning_gnnscale.construct`` (dataset.root; no options)
_CONSTRUCTED = "lightning_gnnscale.graph.constructed"
register_dataset(
    DatasetSource(
        "constructed",
        ConstructedConfig,
        f"{_LOADERS}:load_constructed",
        content=f"{_CONSTRUCTED}:digest_at",
    )
)


def dataset_content(name: str, root: object) -> str | None:
    """The content digest of dataset ``name`` at ``root`` (its source's ``content``), read
    without loading it; ``None`` for a source whose name and options fix its content (or an
    unknown name: the config check names that)."""
    from importlib import import_module

    try:
        source = DATASETS[canonical_name(name)]
    except ValueError:
        return None
    if source.content is None:
        return None
    module, function = source.content.split(":")
    return getattr(import_module(module), function)(root)


def dataset_config(
    dataset: str | DatasetConfig, root: str | os.PathLike | None = None, **options: Any
) -> DatasetConfig:
    """The typed settings of ``dataset``: a :class:`DatasetConfig` as it is, or a name with its
    ``root`` and options (paths given as ``os.PathLike`` kept as strings). An unknown name or
    option is refused listing the valid ones, a value of the wrong type naming its key."""
    if isinstance(dataset, DatasetConfig):
        if root is not None or options:
            raise TypeError("pass a DatasetConfig alone, or a name with its root and options")
        return dataset
    source = DATASETS[canonical_name(dataset)]
    valid = [f.name for f in fields(source.config) if f.name not in ("name", "root")]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(f"dataset {source.name!r} got unknown options {unknown}; valid: {valid}")
    given = {"root": root, **options}
    paths = {k: os.fspath(v) for k, v in given.items() if isinstance(v, os.PathLike)}
    return source.config(name=dataset, **{**given, **paths})


def canonical_name(name: str) -> str:
    """``name`` as :data:`DATASETS` spells it (case-insensitive, ``_`` = ``-``)."""
    by_key = {known.lower(): known for known in DATASETS}
    key = str(name).lower().replace("_", "-")
    if key not in by_key:
        raise ConfigError(
            f"dataset.name={name!r} is an unknown dataset; valid: {', '.join(DATASETS)}"
        )
    return by_key[key]
