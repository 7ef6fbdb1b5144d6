"""``bench sampler``: seeds/s of the suite's neighbour sampler against same-run baselines.

Three samplers see the same graph and the same seed batches, in one thread:

- ``ours``: :class:`~lightning_gnnscale.graph.sampler.NeighborSampler` (hash-keyed, without
  replacement, returns deduplicated blocks);
- ``plain_torch``: a minimal vectorised torch sampler, with replacement (``torch.randint`` per
  node and fanout slot, then ``torch.unique`` to deduplicate and relabel) - the "plain
  vectorised torch sampler" of the sampler yardstick (docs/benchmarks.md);
- ``pyg``: PyG's ``NeighborLoader``, only when ``pyg_lib`` or ``torch_sparse`` is importable
  (PyG has no sampling backend of its own); otherwise the report says it was not run and cites
  the earlier yardstick measurement (docs/benchmarks.md) as such.

``seeds/s`` = seeds of the timed batches / wall time of the timed batches (warm-up batches
excluded). ``edges/s`` counts the edges each sampler returns, over all hops. Seeds are drawn
uniformly from all nodes, so on R-MAT (about 38% isolated nodes at the default size) many seeds
cost nothing; ``--graph uniform`` builds the uniform random graph of the sampler yardstick (docs/benchmarks.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch_geometric
import torch_geometric.typing
from torch import Tensor

from ..callbacks import peak_rss_mb
from ..files import write_json_atomic
from ..graph.csc import csc_from_edges
from ..graph.generators import rmat
from ..graph.sampler import NeighborSampler
from .report import command_line, environment, environment_lines, fmt, markdown_table

PROGRESS_EVERY = 10  # batches between progress lines

# The sampler yardstick (docs/benchmarks.md), measured earlier on this kind of machine (1 thread;
# uniform random graph, 1M nodes,
# 16M edges, fanouts [15, 10, 5], batch 1024, no features). Cited, never re-measured here.
YARDSTICK = {
    "source": "DESIGN.md §8, an earlier measurement on this kind of machine, not this run",
    "graph": "uniform random, 1M nodes, 16M edges; fanouts [15, 10, 5], batch 1024, 1 thread",
    "pyg_neighborloader_torch_sparse_seeds_per_s": 1_000,
    "plain_vectorised_torch_seeds_per_s": 20_000,
}

# Sample one batch of seeds at a step; return (edges returned, input nodes of the batch).
SampleFn = Callable[[int, Tensor], tuple[int, int]]


@contextmanager
def _num_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads, restoring the caller's setting after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def pyg_backend() -> str | None:
    """The sampling backend PyG's ``NeighborLoader`` would use here, or None if it has none."""
    if torch_geometric.typing.WITH_PYG_LIB:
        return "pyg-lib"
    if torch_geometric.typing.WITH_TORCH_SPARSE:
        return "torch-sparse"
    return None


def build_graph(kind: str, nodes: int, edges: int, seed: int) -> tuple[Tensor, Tensor, str]:
    """CSC ``(indptr, indices)`` of the benchmark graph and a one-line description of it.

    ``rmat``: Graph500 R-MAT as ``dataset=rmat`` builds it, ``edges`` directed edges drawn, then
    stored undirected. ``uniform``: ``edges`` uniform random directed edges (the yardstick's graph, docs/benchmarks.md).
    """
    if kind == "rmat":
        graph = rmat(num_nodes=nodes, num_edges=edges, num_features=1, seed=seed).graph
        return (
            graph.indptr,
            graph.indices,
            (
                f"R-MAT, {nodes:,} nodes, {edges:,} directed edges drawn, stored undirected "
                "(duplicates and self-loops merged)"
            ),
        )
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(nodes, (edges,), generator=gen)
    dst = torch.randint(nodes, (edges,), generator=gen)
    indptr, indices = csc_from_edges(src, dst, nodes)
    return (
        indptr,
        indices,
        (
            f"uniform random, {nodes:,} nodes, {edges:,} directed edges drawn, stored directed "
            "(duplicates and self-loops merged)"
        ),
    )


def ours(indptr: Tensor, indices: Tensor, fanouts: list[int], seed: int) -> SampleFn:
    sampler = NeighborSampler(indptr, indices, fanouts, seed=seed)

    def sample(step: int, seeds: Tensor) -> tuple[int, int]:
        blocks = sampler.sample(seeds, epoch=0, step=step)
        return sum(b.num_edges for b in blocks), blocks[0].num_src

    return sample


def plain_torch(indptr: Tensor, indices: Tensor, fanouts: list[int], seed: int) -> SampleFn:
    """With-replacement draws of ``k`` in-neighbours per node, deduplicated per hop."""
    gen = torch.Generator().manual_seed(seed)

    def sample(step: int, seeds: Tensor) -> tuple[int, int]:
        frontier, edges = seeds, 0
        for k in fanouts:
            start = indptr.index_select(0, frontier)
            deg = indptr.index_select(0, frontier + 1) - start
            has_in = (deg > 0).nonzero().flatten()
            start, deg = start[has_in], deg[has_in]
            draws = torch.randint(1 << 62, (has_in.numel(), k), generator=gen) % deg.unsqueeze(1)
            src = indices.index_select(0, (start.unsqueeze(1) + draws).flatten())
            nodes, local = torch.unique(torch.cat([frontier, src]), return_inverse=True)
            edge_index = torch.stack(
                [local[frontier.numel() :], local[has_in].repeat_interleave(k)]
            )
            edges += edge_index.shape[1]
            frontier = nodes
        return edges, frontier.numel()

    return sample


def pyg(
    indptr: Tensor, indices: Tensor, fanouts: list[int], seed_batches: list[Tensor]
) -> tuple[SampleFn, float]:
    """PyG's ``NeighborLoader`` over the same batches in order; returns it and its setup time."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    start = time.perf_counter()
    num_nodes = indptr.numel() - 1
    dst = torch.repeat_interleave(torch.arange(num_nodes), indptr.diff())
    data = Data(edge_index=torch.stack([indices, dst]), num_nodes=num_nodes)
    loader = NeighborLoader(
        data,
        num_neighbors=fanouts,
        batch_size=seed_batches[0].numel(),
        input_nodes=torch.cat(seed_batches),
        shuffle=False,
    )
    batches = iter(loader)
    next(batches)  # the first batch triggers PyG's CSC conversion: setup, not sampling
    setup_s = time.perf_counter() - start

    def sample(step: int, seeds: Tensor) -> tuple[int, int]:
        batch = next(batches)
        return batch.edge_index.shape[1], batch.num_nodes

    return sample, setup_s


def time_sampler(name: str, sample: SampleFn, seed_batches: list[Tensor], warmup: int) -> dict:
    """Run ``warmup`` untimed batches, then time the rest; report rates per second."""
    for step, seeds in enumerate(seed_batches[:warmup]):
        sample(step, seeds)
    timed = seed_batches[warmup:]
    edges = input_nodes = 0
    start = time.perf_counter()
    for i, seeds in enumerate(timed, 1):
        e, n = sample(warmup + i - 1, seeds)
        edges += e
        input_nodes += n
        if i % PROGRESS_EVERY == 0 and i < len(timed):
            seeds_done = sum(s.numel() for s in timed[:i])
            print(
                f"[bench sampler] {name}: batch {i}/{len(timed)}, "
                f"{seeds_done / (time.perf_counter() - start):,.0f} seeds/s so far",
                flush=True,
            )
    seconds = time.perf_counter() - start
    seeds_total = sum(s.numel() for s in timed)
    result = {
        "batches": len(timed),
        "seconds": seconds,
        "seeds_per_s": seeds_total / seconds,
        "edges_per_s": edges / seconds,
        "ms_per_batch": 1e3 * seconds / len(timed),
        "mean_edges_per_batch": edges / len(timed),
        "mean_input_nodes_per_batch": input_nodes / len(timed),
    }
    print(
        f"[bench sampler] {name}: {result['seeds_per_s']:,.0f} seeds/s, "
        f"{result['edges_per_s']:,.0f} edges/s",
        flush=True,
    )
    return result


def run_sampler_bench(
    *,
    graph: str,
    nodes: int,
    edges: int,
    fanouts: list[int],
    batch_size: int,
    batches: int,
    warmup: int,
    threads: int,
    seed: int,
    out: Path,
    argv: list[str],
) -> dict:
    """Build the graph, time every available sampler, write ``sampler.md`` / ``sampler.json``."""
    env = environment()  # the date is the start of the invocation
    with _num_threads(threads):
        print(f"[bench sampler] building {graph}: {nodes:,} nodes, {edges:,} edges", flush=True)
        rss_before_mb = peak_rss_mb()
        start = time.perf_counter()
        indptr, indices, description = build_graph(graph, nodes, edges, seed)
        build_s = time.perf_counter() - start
        degree = indptr.diff()
        graph_info = {
            "kind": graph,
            "description": description,
            "num_nodes": nodes,
            "edges_drawn": edges,
            "stored_edges": indices.numel(),
            "isolated_fraction": float((degree == 0).double().mean()),
            "median_in_degree": int(degree.median()),
            "build_s": build_s,
            "peak_rss_mb_before_build": rss_before_mb,
            "peak_rss_mb_after_build": peak_rss_mb(),
        }
        print(
            f"[bench sampler] graph built in {build_s:.1f} s: {indices.numel():,} stored edges, "
            f"peak RSS {graph_info['peak_rss_mb_after_build']:.0f} MB",
            flush=True,
        )

        gen = torch.Generator().manual_seed(seed)
        seed_batches = [
            torch.randperm(nodes, generator=gen)[:batch_size] for _ in range(warmup + batches)
        ]
        results = {
            "ours": time_sampler(
                "ours", ours(indptr, indices, fanouts, seed), seed_batches, warmup
            ),
            "plain_torch": time_sampler(
                "plain_torch", plain_torch(indptr, indices, fanouts, seed), seed_batches, warmup
            ),
        }
        backend = pyg_backend()
        if backend is None:
            pyg_status = {
                "run": False,
                "reason": "neither pyg_lib nor torch_sparse is importable,"
                " and PyG's NeighborLoader needs one of them to sample",
            }
            print(f"[bench sampler] PyG NeighborLoader not run: {pyg_status['reason']}", flush=True)
        else:
            sample, setup_s = pyg(indptr, indices, fanouts, seed_batches)
            # The loader's first batch was consumed by its setup, so it sees one warm-up fewer.
            results["pyg"] = time_sampler("pyg", sample, seed_batches[1:], warmup - 1)
            pyg_status = {"run": True, "backend": backend, "setup_s": setup_s}

    report = {
        "command": command_line(argv),
        "environment": env,
        "torch_geometric": torch_geometric.__version__,
        "settings": {
            "fanouts": fanouts,
            "batch_size": batch_size,
            "batches": batches,
            "warmup_batches": warmup,
            "threads": threads,
            "seed": seed,
        },
        "graph": graph_info,
        "results": results,
        "pyg": pyg_status,
        "ratios": {
            f"ours/{name}": results["ours"]["seeds_per_s"] / r["seeds_per_s"]
            for name, r in results.items()
            if name != "ours"
        },
        "yardstick": YARDSTICK,
        "peak_rss_mb": peak_rss_mb(),
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(str(out / "sampler.json"), report)
    (out / "sampler.md").write_text(sampler_markdown(report))
    print(f"[bench sampler] wrote {out / 'sampler.md'} and sampler.json", flush=True)
    return report


def sampler_markdown(report: dict) -> str:
    """The human report of one sampler benchmark."""
    settings, graph, results = report["settings"], report["graph"], report["results"]
    ours_rate = results["ours"]["seeds_per_s"]
    rows = [
        [
            name,
            f"{r['seeds_per_s']:,.0f}",
            f"{r['edges_per_s']:,.0f}",
            fmt(r["ms_per_batch"]),
            f"{r['mean_edges_per_batch']:,.0f}",
            f"{r['mean_input_nodes_per_batch']:,.0f}",
            f"{ours_rate / r['seeds_per_s']:.2f}x",
        ]
        for name, r in results.items()
    ]
    pyg_status = report["pyg"]
    if pyg_status["run"]:
        pyg_lines = [
            f"PyG `NeighborLoader` ran on the {pyg_status['backend']} backend (setup, "
            f"incl. its CSC conversion and first batch: {pyg_status['setup_s']:.2f} s, "
            "not timed)."
        ]
    else:
        cited = ours_rate / YARDSTICK["pyg_neighborloader_torch_sparse_seeds_per_s"]
        pyg_lines = [
            f"**PyG `NeighborLoader` was not run**: {pyg_status['reason']}.",
            "",
            f"Cited yardstick ({YARDSTICK['source']}; {YARDSTICK['graph']}): PyG `NeighborLoader` on the torch-sparse backend "
            f"~{YARDSTICK['pyg_neighborloader_torch_sparse_seeds_per_s']:,} seeds/s; a plain "
            f"vectorised torch sampler ~{YARDSTICK['plain_vectorised_torch_seeds_per_s']:,} "
            f"seeds/s. Against that PyG figure `ours` would be ~{cited:.0f}x (another run, "
            "machine load and possibly graph: indicative only).",
        ]
    lines = [
        "# bench sampler",
        "",
        "Command:",
        "",
        f"    {report['command']}",
        "",
        *environment_lines(report["environment"]),
        f"- torch_geometric {report['torch_geometric']}; {settings['threads']} torch thread(s)",
        "",
        f"Graph: {graph['description']}: {graph['stored_edges']:,} stored edges, "
        f"{graph['isolated_fraction']:.1%} of nodes without in-edges, median in-degree "
        f"{graph['median_in_degree']}. Build: {graph['build_s']:.1f} s, peak RSS "
        f"{graph['peak_rss_mb_after_build']:,.0f} MB after the build "
        f"({graph['peak_rss_mb_before_build']:,.0f} MB before; whole process, measured).",
        "",
        f"Sampling: fanouts {settings['fanouts']} (by hop from the seeds), batch "
        f"{settings['batch_size']}, {settings['batches']} timed batches after "
        f"{settings['warmup_batches']} warm-up batches; seeds drawn uniformly from all nodes, the "
        "same batches for every sampler; no features.",
        "",
        "All rates are measured: seeds/s = timed seeds / wall time of the timed batches; "
        "edges/s counts the edges each sampler returns over all hops (`plain_torch` samples "
        "with replacement, so it returns `fanout` edges even for nodes of lower degree).",
        "",
        *markdown_table(
            [
                "sampler",
                "seeds/s",
                "edges sampled/s",
                "ms/batch",
                "edges/batch",
                "input nodes/batch",
                "ours / this",
            ],
            rows,
        ),
        "",
        *pyg_lines,
        "",
    ]
    return "\n".join(lines)
