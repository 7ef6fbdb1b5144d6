"""Kinships (Denham, 1973; 104 entities, 25 relations) as a constructed typed dataset, from the
triples the PyKEEN wheel ships (``pykeen/datasets/kinships/{train,valid,test}.txt``), with
PyKEEN's fixed train / valid / test split kept as three edge tables declaring their ``split``.

    python scripts/kinships.py out=<dir>
    python train.py strategy=single task=link_prediction dataset=constructed \\
        dataset.root=<dir> experiment=kinships

The wheel alone is needed (``pip install --no-deps pykeen==1.11.1``, what scripts/install.sh
does); pykeen is never imported, its files are read by path. docs/datasets.md, "A typed graph
end to end".
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PARTS = {"train": "train", "valid": "val", "test": "test"}  # PyKEEN's file -> the split


def pykeen_folder(name: str) -> Path:
    """The folder of PyKEEN's ``name`` triples, found without importing pykeen."""
    found = importlib.util.find_spec("pykeen")
    if found is None or found.origin is None:
        raise SystemExit(
            "the pykeen wheel is not installed: pip install --no-deps pykeen==1.11.1 "
            "(scripts/install.sh installs it)"
        )
    folder = Path(found.origin).parent / "datasets" / name
    missing = [p for p in PARTS if not (folder / f"{p}.txt").is_file()]
    if missing:
        raise SystemExit(f"{folder} lacks {[f'{p}.txt' for p in missing]}")
    return folder


def spec(folder: Path, name: str = "kinships") -> dict:
    """The construct spec of a PyKEEN triple folder: edge-only (the entities come from the
    triples, with one-hot identity features), typed by the relation column, directed, one
    edge table per split."""
    return {
        "name": name,
        "id_type": "str",
        "undirected": False,
        "edges": [
            {
                "file": str(folder / f"{part}.txt"),
                "format": "tsv",
                "column_names": ["head", "relation", "tail"],
                "src": "head",
                "dst": "tail",
                "type": "relation",
                "split": split,
            }
            for part, split in PARTS.items()
        ],
    }


def build(out: str | Path, dataset: str = "kinships") -> dict:
    """Construct PyKEEN's ``dataset`` into the new folder ``out``; its metadata."""
    import yaml

    from lightning_gnnscale.construct import construct

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    spec_path = out.parent / f"{out.name}.spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec(pykeen_folder(dataset), dataset)))
    return construct(spec_path, out)


def main(argv: list[str]) -> None:
    given = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    unknown = sorted(set(given) - {"out", "dataset"}) + [a for a in argv if "=" not in a]
    if unknown or "out" not in given:
        raise SystemExit(
            f"usage: python scripts/kinships.py out=<dir> [dataset=kinships|nations|umls]"
            f"{f' (unknown: {unknown})' if unknown else ''}"
        )
    build(given["out"], given.get("dataset", "kinships"))


if __name__ == "__main__":
    main(sys.argv[1:])
