"""``bench granndis-e4``: GraNNDIS's redundancy experiment (spec §8.3 E4, paper Figs. 3b, 13a).

One training step of MB_base (a GraphSAGE MFG per worker, fanout 25 per layer) next to
cooperative batching (one co-batch per server, CoB-SAGE or CoB-EAS, split over the server's
workers) for the same targets, at several depths on an SBM graph: vertices per step and the
estimated activation memory (spec §4.8 estimator). Nothing is trained; it is all counting.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..files import write_json_atomic
from ..graph.generators import sbm
from ..systems.granndis.analysis import e4_compare
from .report import command_line, environment, environment_lines, markdown_table

SYSTEMS = ("mb_base", "cob_sage", "cob_eas")
LABELS = {"mb_base": "MB_base", "cob_sage": "CoB-SAGE", "cob_eas": "CoB-EAS"}


def run_granndis_e4_bench(
    *,
    nodes: int,
    avg_degree: float,
    layers: list[int],
    servers: int,
    workers: int,
    batch_per_worker: int,
    fanout: int,
    hidden: int,
    eas_hops: int,
    eas_fanout: int,
    seed: int,
    out: Path,
    argv: list[str],
) -> dict:
    """Run E4 at every depth in ``layers``; write ``granndis_e4.json`` and ``granndis_e4.md``
    under ``out``; return the report."""
    dataset = sbm(num_nodes=nodes, avg_degree=avg_degree, seed=seed)
    graph = dataset.graph
    results = []
    for num_layers in layers:
        start = time.perf_counter()
        r = e4_compare(
            graph,
            dataset.targets,
            num_layers=num_layers,
            num_servers=servers,
            workers_per_server=workers,
            fanout=fanout,
            batch_per_worker=batch_per_worker,
            hidden=hidden,
            eas_hops=eas_hops,
            eas_fanout=eas_fanout,
            seed=seed,
        )
        r["seconds"] = time.perf_counter() - start
        results.append(r)
        print(
            f"[bench granndis-e4] L={num_layers}: vertices MB_base "
            f"{r['mb_base']['vertices']:,}, CoB-SAGE {r['cob_sage']['vertices']:,}, CoB-EAS "
            f"{r['cob_eas']['vertices']:,} ({r['seconds']:.1f} s)",
            flush=True,
        )
    setup = {
        "nodes": nodes,
        "avg_degree": avg_degree,
        "num_edges": graph.num_edges,
        "layers": layers,
        "servers": servers,
        "workers_per_server": workers,
        "batch_per_worker": batch_per_worker,
        "fanout": fanout,
        "hidden": hidden,
        "eas_hops": eas_hops,
        "eas_fanout": eas_fanout,
        "seed": seed,
    }
    report = {
        "command": command_line(argv),
        "environment": environment(),
        "setup": setup,
        "results": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(str(out / "granndis_e4.json"), report)
    rows = []
    for r in results:
        base = r["mb_base"]
        for name in SYSTEMS:
            s = r[name]
            rows.append(
                [
                    str(r["setup"]["num_layers"]),
                    LABELS[name],
                    f"{s['targets']:,}",
                    f"{s['vertices']:,}",
                    f"{s['vertices'] / base['vertices']:.2f}",
                    f"{s['rows']:,}",
                    f"{s['act_bytes_sum'] / 2**20:.1f}",
                    f"{s['act_bytes_max'] / 2**20:.1f}",
                    f"{s['act_bytes_sum'] / base['act_bytes_sum']:.2f}",
                ]
            )
    table = markdown_table(
        [
            "L",
            "system",
            "targets",
            "vertices",
            "vs MB_base",
            "rows (with halos)",
            "act. MiB (all workers)",
            "act. MiB (worst worker)",
            "vs MB_base",
        ],
        rows,
    )
    lines = [
        "# bench granndis-e4: vertices and activation memory per step",
        "",
        "Command:",
        "",
        f"    {report['command']}",
        "",
        *environment_lines(report["environment"]),
        "",
        f"SBM with {nodes:,} nodes, {graph.num_edges:,} stored edges (mean degree "
        f"{avg_degree:g}); {servers} servers x {workers} workers; {batch_per_worker} targets "
        f"per worker; MB_base and CoB-SAGE fanout {fanout} per layer / hop; CoB-EAS h="
        f"{eas_hops}, f={eas_fanout}; GraphSAGE hidden {hidden}, float32. One step: the "
        "first co-batch of every server; MB_base deals the same targets to its workers. "
        "'vertices': distinct vertices of each worker's MFG (MB_base) or each server's "
        "graph (CoB), summed; 'rows' add CoB's halo copies. Memory is the spec §4.8 estimate "
        "(inputs and their gradients at every layer, 3 outputs per computed row).",
        "",
        *table,
        "",
    ]
    (out / "granndis_e4.md").write_text("\n".join(lines))
    print("\n".join(table), flush=True)
    print(f"[bench granndis-e4] wrote {out / 'granndis_e4.md'} and granndis_e4.json", flush=True)
    return report
