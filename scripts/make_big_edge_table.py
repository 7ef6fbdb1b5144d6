"""A generated graph for the streaming ``construct`` benchmark (docs/benchmarks.md, "construct:
100M edges"): a node table and an edge table, Parquet (or CSV), and the spec naming them, in a
folder you give. Not committed: 100M edges are about 1.6 GB of Parquet.

    python scripts/make_big_edge_table.py /tmp/big [--nodes 10000000] [--edges 100000000]
    /usr/bin/time -v python -m lightning_gnnscale.construct spec=/tmp/big/spec.yaml out=/tmp/big/out

Node ids are sparse integers in shuffled order (``5 * i + 17``), so construct remaps them;
sources are uniform, destinations skewed (``N * u**2``: a few nodes have large in-degrees).
Written in blocks of ``--block`` rows (one Parquet row group each): the script's own memory is
O(nodes) and a block.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import yaml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--nodes", type=int, default=10_000_000)
    parser.add_argument("--edges", type=int, default=100_000_000)
    parser.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    parser.add_argument("--block", type=int, default=1 << 20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder: Path = args.folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    n = args.nodes
    ids = rng.permutation(n).astype(np.int64) * 5 + 17
    nodes = pa.table(
        {
            "id": ids,
            "label": rng.integers(0, 8, n),
            "f_0": rng.normal(size=n),
            "f_1": rng.normal(size=n),
        }
    )
    suffix = args.format
    write = pq.write_table if suffix == "parquet" else pa_csv.write_csv
    write(nodes, folder / f"nodes.{suffix}")
    del nodes
    edges_path = folder / f"edges.{suffix}"
    schema = pa.schema([("src", pa.int64()), ("dst", pa.int64())])
    writer = (
        pq.ParquetWriter(edges_path, schema)
        if suffix == "parquet"
        else pa_csv.CSVWriter(edges_path, schema)
    )
    with writer:
        for start in range(0, args.edges, args.block):
            rows = min(args.block, args.edges - start)
            src = ids[rng.integers(0, n, rows)]
            dst = ids[np.minimum((n * rng.random(rows) ** 2).astype(np.int64), n - 1)]
            writer.write_table(pa.table({"src": src, "dst": dst}, schema=schema))
    spec = {
        "name": f"big-{n}-{args.edges}",
        "nodes": {
            "file": f"nodes.{suffix}",
            "id": "id",
            "id_type": "int",
            "label": "label",
            "features": [{"prefix": "f_", "transform": "standardise"}],
            "split_fractions": {"train": 0.6, "val": 0.2, "seed": 0},
        },
        "edges": {"file": edges_path.name, "src": "src", "dst": "dst"},
    }
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    size = sum(p.stat().st_size for p in folder.iterdir()) / 2**30
    print(f"wrote {folder}: {n:,} nodes, {args.edges:,} edges ({size:.2f} GiB), spec.yaml")


if __name__ == "__main__":
    main()
