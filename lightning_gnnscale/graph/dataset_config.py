"""The dataset names and the options each takes: what a run config's ``dataset`` section is
checked against, before anything is imported to load one (no torch, numpy or PyG here).

:mod:`lightning_gnnscale.graph.datasets` loads them; ``tests/test_datasets.py`` checks that the
generator options below are the generators' own parameters.
"""

from __future__ import annotations

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
PLANETOID_OPTIONS = ("cache_dir", "download", "normalize_features")
OGB_OPTIONS = ("cache_dir", "download")

DATASETS: tuple[str, ...] = (*GENERATOR_OPTIONS, *PLANETOID, *OGB)


def check_dataset_options(name: str, options: dict, root: object = None) -> str:
    """Raise ValueError for an unknown name or option (listing the valid ones), or for a
    ``root`` given to a generated dataset (it reads no files); return the canonical name."""
    canonical = canonical_name(name)
    if canonical in GENERATOR_OPTIONS:
        if root is not None:
            raise ValueError(
                f"{canonical} is generated in memory and reads no files, but dataset.root="
                f"{root!r} was given; drop it. For a sweep that mixes generated and file "
                "datasets, set the file datasets' root once with paths.data_dir=<folder> (or "
                "the environment variable GNNSCALE_DATA_DIR): a generator ignores that one"
            )
        types = GENERATOR_OPTIONS[canonical]
        for option, value in options.items():
            expected = types.get(option)
            if expected is int and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"{canonical} option {option}={value!r} must be an integer")
            if expected is float and (
                not isinstance(value, int | float) or isinstance(value, bool)
            ):
                raise ValueError(f"{canonical} option {option}={value!r} must be a number")
        valid = tuple(types)
    else:
        valid = PLANETOID_OPTIONS if canonical in PLANETOID else OGB_OPTIONS
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"dataset {canonical!r} got unknown options {unknown}; valid: {list(valid)}"
        )
    return canonical


def canonical_name(name: str) -> str:
    """``name`` as :data:`DATASETS` spells it (case-insensitive, ``_`` = ``-``)."""
    by_key = {known.lower(): known for known in DATASETS}
    key = name.lower().replace("_", "-")
    if key not in by_key:
        raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    return by_key[key]
