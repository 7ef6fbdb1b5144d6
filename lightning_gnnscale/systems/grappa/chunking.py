"""One-time chunking and the on-disk chunk store (spec §2.2).

``prepare`` (launching process) cuts the graph into ``C`` chunks and writes one file per chunk:
its nodes (sorted global ids), their in-edges (CSC over the chunk's nodes, sources as global ids,
in global segment order), features, labels, split masks and global in-degrees. A rank then
reads only the chunks its partition owns, plus the halo rows it needs from the others, so its
memory follows the partition's size, not the graph's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ...graph.cache import _atomic_write, cache_key, graph_fingerprint
from ...graph.csc import Graph
from ...graph.partition import partition

CHUNKINGS = ("random", "random_iid", "metis")


def chunk_assignment(graph: Graph, num_chunks: int, method: str, seed: int) -> Tensor:
    """int64 ``[N]`` chunk of every node.

    ``random``: a seeded permutation cut into ``C`` contiguous blocks (sizes differ by <= 1);
    ``random_iid``: an independent uniform chunk per node; ``metis``: pymetis k-way on the
    symmetrised graph.
    """
    n = graph.num_nodes
    gen = torch.Generator().manual_seed(seed)
    if method == "random":
        chunk = torch.empty(n, dtype=torch.int64)
        sizes = [len(b) for b in torch.arange(n).tensor_split(num_chunks)]
        chunk[torch.randperm(n, generator=gen)] = torch.repeat_interleave(
            torch.arange(num_chunks), torch.tensor(sizes)
        )
        return chunk
    if method == "random_iid":
        return torch.randint(num_chunks, (n,), generator=gen)
    if method == "metis":
        return partition(graph, "metis", num_chunks, seed=seed).to(torch.int64)
    raise ValueError(f"unknown chunking {method!r}; valid: {list(CHUNKINGS)}")


def chunk_payload(graph: Graph, nodes: Tensor) -> dict:
    """The stored record of one chunk (``nodes`` sorted global ids)."""
    start, end = graph.indptr[nodes], graph.indptr[nodes + 1]
    deg = end - start
    indptr = torch.zeros(nodes.numel() + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=indptr[1:])
    offsets = torch.arange(int(indptr[-1])) - torch.repeat_interleave(indptr[:-1], deg)
    eids = torch.repeat_interleave(start, deg) + offsets
    return {
        "nodes": nodes.clone(),
        "indptr": indptr,
        "indices": graph.indices[eids].clone(),
        "x": graph.x[nodes].clone(),
        "y": graph.y[nodes].clone(),
        "train_mask": graph.train_mask[nodes].clone(),
        "val_mask": graph.val_mask[nodes].clone(),
        "test_mask": graph.test_mask[nodes].clone(),
        "deg": deg.clone(),
    }


@dataclass(frozen=True)
class ChunkStore:
    """A written chunk store: its folder and the small replicated metadata.

    ``meta`` holds ``num_chunks``, ``num_nodes``, ``num_edges``, ``num_features``,
    ``num_classes``, ``name``, ``train_counts`` (per chunk), ``sizes`` (nodes per chunk).
    """

    path: str
    meta: dict

    @property
    def num_chunks(self) -> int:
        return int(self.meta["num_chunks"])

    def load(self, chunk: int, mmap: bool = True) -> dict:
        """Chunk ``chunk``'s record; memory-mapped, so only the rows a caller reads are paged in."""
        return torch.load(Path(self.path) / f"chunk_{chunk}.pt", mmap=mmap, weights_only=True)

    def chunk_ids(self) -> Tensor:
        """int64 ``[N]`` chunk of every node (reads every chunk's node list: O(N) int64)."""
        out = torch.empty(int(self.meta["num_nodes"]), dtype=torch.int64)
        for c in range(self.num_chunks):
            out[self.load(c)["nodes"]] = c
        return out


def write_chunk_store(
    graph: Graph, num_chunks: int, method: str, seed: int, cache_dir: str
) -> ChunkStore:
    """Chunk ``graph`` and write the store under ``cache_dir`` (content-keyed, reused)."""
    key = cache_key(
        {
            "kind": "grappa_chunks",
            "graph": graph_fingerprint(graph),
            "num_chunks": num_chunks,
            "method": method,
            "seed": seed,
            "dtype": str(graph.x.dtype),
        }
    )
    folder = Path(cache_dir) / f"grappa-chunks-{key[:24]}"
    meta_path = folder / "meta.json"
    if meta_path.exists():
        return ChunkStore(str(folder), json.loads(meta_path.read_text()))
    chunk = chunk_assignment(graph, num_chunks, method, seed)
    folder.mkdir(parents=True, exist_ok=True)
    train_counts, sizes = [], []
    for c in range(num_chunks):
        nodes = (chunk == c).nonzero().flatten()
        payload = chunk_payload(graph, nodes)
        train_counts.append(int(payload["train_mask"].sum()))
        sizes.append(nodes.numel())
        _atomic_write(folder / f"chunk_{c}.pt", lambda f, p=payload: torch.save(p, f))
    meta = {
        "num_chunks": num_chunks,
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "num_features": graph.num_features,
        "num_classes": graph.num_classes,
        "name": graph.name,
        "train_counts": train_counts,
        "sizes": sizes,
        "method": method,
    }
    _atomic_write(meta_path, lambda f: f.write(json.dumps(meta).encode()))
    return ChunkStore(str(folder), meta)
