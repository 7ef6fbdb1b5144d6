"""The dataset names and the options each takes: what a run config's ``dataset`` section is
checked against, before anything is imported to load one (no torch, numpy or PyG here).

Each name is one :class:`DatasetSource` in :data:`DATASETS` (its options and its loader, in one
place); :mod:`lightning_gnnscale.graph.datasets` holds the loaders. ``tests/test_datasets.py``
checks that the generator options below are the generators' own parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

# generated in memory: option -> the type of its default (an int option takes an int, a float
# option any number; a bool option is not checked)
GENERATOR_OPTIONS: dict[str, dict[str, type]] = {
    "sbm": {
        "num_nodes": int,
        "num_classes": int,
        "avg_degree": float,
        "homophily": float,
        "num_features": int,
        "feature_signal": float,
        "train_frac": float,
        "val_frac": float,
        "seed": int,
    },
    "rmat": {
        "num_nodes": int,
        "num_edges": int,
        "a": float,
        "b": float,
        "c": float,
        "num_features": int,
        "num_classes": int,
        "undirected": bool,
        "train_frac": float,
        "val_frac": float,
        "seed": int,
    },
}
# name -> PyG's Planetoid name (also the folder under root).
PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
# name -> (ogb split name, binary raw format, name of the folder inside ogb's zip).
OGB = {
    "ogbn-arxiv": ("time", False, "arxiv"),
    "ogbn-products": ("sales_ranking", False, "products"),
    "ogbn-papers100M": ("time", True, "papers100M-bin"),
}
PLANETOID_OPTIONS = {"cache_dir": None, "download": None, "normalize_features": None}
OGB_OPTIONS = {"cache_dir": None, "download": None}


@dataclass(frozen=True)
class DatasetSource:
    """One registered dataset name: the options ``dataset.<option>`` it takes and how it loads.

    Attributes:
        name: the name (``dataset.name``), as error messages spell it.
        options: option -> the type its value must have (``int``: an integer; ``float``: any
            number; ``None``: not checked here).
        loader: ``"<module>:<function>"``, imported on first use:
            ``function(name, root, **options) -> Graph``.
        generated: made in memory: it reads no files, so a ``dataset.root`` is refused.
        content: ``"<module>:<function>"``, ``function(root) -> str``: a digest of what
            ``root`` holds, for a source whose name and options do not fix its content
            (:func:`dataset_content`); ``None``: they do.
    """

    name: str
    options: dict[str, type | None]
    loader: str
    generated: bool = False
    content: str | None = None


# Every dataset name -> its source; a new source registers here (:func:`register_dataset`).
DATASETS: dict[str, DatasetSource] = {}


def register_dataset(source: DatasetSource) -> None:
    """Add ``source`` to :data:`DATASETS`; a name already registered is refused."""
    if source.name in DATASETS:
        raise ValueError(f"dataset {source.name!r} is registered twice")
    DATASETS[source.name] = source


_LOADERS = "lightning_gnnscale.graph.datasets"
for _name, _options in GENERATOR_OPTIONS.items():
    register_dataset(DatasetSource(_name, dict(_options), f"{_LOADERS}:generate", generated=True))
for _name in PLANETOID:
    register_dataset(DatasetSource(_name, PLANETOID_OPTIONS, f"{_LOADERS}:load_planetoid"))
for _name in OGB:
    register_dataset(DatasetSource(_name, OGB_OPTIONS, f"{_LOADERS}:load_ogb"))
# a folder written by ``python -m lightning_gnnscale.construct`` (dataset.root; no options)
_CONSTRUCTED = "lightning_gnnscale.graph.constructed"
register_dataset(
    DatasetSource(
        "constructed", {}, f"{_LOADERS}:load_constructed", content=f"{_CONSTRUCTED}:digest_at"
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


def check_dataset_options(name: str, options: dict, root: object = None) -> str:
    """Raise ValueError for an unknown name or option (listing the valid ones), or for a
    ``root`` given to a generated dataset (it reads no files); return the canonical name."""
    canonical = canonical_name(name)
    source = DATASETS[canonical]
    if source.generated and root is not None:
        raise ValueError(
            f"{canonical} is generated in memory and reads no files, but dataset.root="
            f"{root!r} was given; drop it. For a sweep that mixes generated and file "
            "datasets, set the file datasets' root once with paths.data_dir=<folder> (or "
            "the environment variable GNNSCALE_DATA_DIR): a generator ignores that one"
        )
    for option, value in options.items():
        expected = source.options.get(option)
        if expected is int and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{canonical} option {option}={value!r} must be an integer")
        if expected is float and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise ValueError(f"{canonical} option {option}={value!r} must be a number")
    unknown = sorted(set(options) - set(source.options))
    if unknown:
        raise ValueError(
            f"dataset {canonical!r} got unknown options {unknown}; valid: {list(source.options)}"
        )
    return canonical


def canonical_name(name: str) -> str:
    """``name`` as :data:`DATASETS` spells it (case-insensitive, ``_`` = ``-``)."""
    by_key = {known.lower(): known for known in DATASETS}
    key = name.lower().replace("_", "-")
    if key not in by_key:
        raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    return by_key[key]
