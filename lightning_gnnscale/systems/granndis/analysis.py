"""GraNNDIS analysis quantities: boundary share ``beta``, redundancy ``rho`` and the E4
comparison of per-step size and memory (spec §4.6, §8.3 E4; docs/systems/granndis.md).

E4 puts one training step of MB_base (every worker samples its own GraphSAGE MFG, fanout
``f`` per layer) next to one step of cooperative batching (one co-batch per server, its
sampled dependency graph split over the server's workers) for the same number of targets.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ...graph.csc import Graph
from ...graph.node_targets import NodeTargets
from ...graph.order import epoch_permutation
from ...graph.partition import partition
from ...graph.sampler import NeighborSampler
from ...tasks import build_task
from ...tasks.base import NodeTask
from .costmodel import (
    StepMemoryEstimate,
    estimate_memory,
    estimate_mfg_memory,
    sage_num_params,
)
from .expand import check_ids, cobatches, eas_expand, in_edges, num_cobatches, sage_expand


def boundary_share(graph: Graph, inner: Tensor) -> float:
    """``beta``: share of ``inner`` with at least one in-neighbour outside ``inner`` (§4.6)."""
    inner = check_ids(graph, inner, "inner")
    if inner.numel() == 0:
        raise ValueError("boundary_share needs a non-empty inner set")
    member = torch.zeros(graph.num_nodes, dtype=torch.bool)
    member[inner] = True
    src, pos = in_edges(graph, inner)
    outside = torch.bincount(pos[~member[src]], minlength=inner.numel())
    return float((outside > 0).sum()) / inner.numel()


def redundancy(server_vertex_counts: Sequence[int], num_nodes: int) -> float:
    """``rho = sum_s |V_s| / |V|``: how many copies of the graph the servers hold together."""
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    if any(c < 0 for c in server_vertex_counts):
        raise ValueError(f"vertex counts must be >= 0, got {list(server_vertex_counts)}")
    return sum(server_vertex_counts) / num_nodes


def one_hop_sizes(graph: Graph, parts: Tensor, num_parts: int) -> Tensor:
    """int64 ``[num_parts, 3]``: owned rows, halo rows and local edges of every part's
    one-hop graph (edges into owned vertices; halo = their sources owned elsewhere)."""
    src, dst = graph.edge_index()
    owner = parts[dst]
    owned = torch.bincount(parts, minlength=num_parts)
    edges = torch.bincount(owner, minlength=num_parts)
    remote = parts[src] != owner
    halo_key = torch.unique(owner[remote] * graph.num_nodes + src[remote])
    halo = torch.bincount(halo_key // max(graph.num_nodes, 1), minlength=num_parts)
    return torch.stack([owned, halo, edges], dim=1)


def _sum_estimates(estimates: list[StepMemoryEstimate]) -> dict:
    acts = [e.activations for e in estimates]
    totals = [e.total for e in estimates]
    return {
        "act_bytes_sum": sum(acts),
        "act_bytes_max": max(acts),
        "mem_bytes_max": max(totals),
    }


def e4_compare(
    graph: Graph,
    targets: NodeTargets,
    *,
    task: NodeTask | str | None = None,
    num_layers: int,
    num_servers: int,
    workers_per_server: int,
    fanout: int = 25,
    batch_per_worker: int = 1024,
    hidden: int = 64,
    eas_hops: int = 1,
    eas_fanout: int = 15,
    server_partition: str = "metis",
    intra_partition: str = "metis",
    seed: int = 0,
) -> dict:
    """One step of MB_base vs CoB-SAGE vs CoB-EAS on ``graph`` (spec §8.3 E4), whose nodes'
    rows of the task's targets are ``targets`` (``task``: default ``node_classification``;
    its training seeds are the step's targets, ``targets.out_dim`` the head's width).

    The step's targets are CoB's: server ``s`` (partition ``server_partition``) takes its
    first co-batch of ``workers_per_server * batch_per_worker`` training seeds. CoB extracts
    ``sage_expand`` (``fanout``, ``num_layers`` hops) or ``eas_expand`` (``eas_hops``,
    ``eas_fanout``) from it and splits the induced graph over the server's workers
    (``intra_partition``). MB_base deals the same targets, shuffled, to the
    ``W = num_servers * workers_per_server`` workers; each samples the suite's
    ``NeighborSampler`` MFG with ``[fanout] * num_layers`` (keyed by its rank).

    Returns plain numbers per system: ``targets``, ``vertices`` (distinct per worker MFG / per
    server graph, summed), ``rows`` (rows stored, halo copies included, summed over workers)
    and memory estimates (``act_bytes_sum`` / ``act_bytes_max`` over workers, worst worker's
    ``mem_bytes_max``; float32, GraphSAGE with ``hidden`` units).
    """
    if num_layers < 1 or num_servers < 1 or workers_per_server < 1 or batch_per_worker < 1:
        raise ValueError(
            "num_layers, num_servers, workers_per_server and batch_per_worker must be >= 1"
        )
    world = num_servers * workers_per_server
    dims = [graph.num_features] + [hidden] * num_layers
    params = sage_num_params(graph.num_features, hidden, targets.out_dim, num_layers)
    task = build_task(task)
    if task.spec.seeds != "nodes":
        raise ValueError(
            f"e4_compare compares steps of node targets; task={task.name} seeds "
            f"{task.spec.seeds} (under link prediction every node is a loss row: see "
            "docs/systems/granndis.md, 'Link prediction')"
        )
    train = task.train_seeds(targets)

    # the step's targets: the first co-batch of every server (CoB's step 0)
    splits = targets.split_matrix()
    server_of = partition(graph, server_partition, num_servers, seed=seed, splits=splits)
    targets = [train[server_of[train] == s] for s in range(num_servers)]
    per_step = num_cobatches(max(t.numel() for t in targets), batch_per_worker, workers_per_server)
    first = [cobatches(t, per_step, seed=seed, server=s)[0] for s, t in enumerate(targets)]

    # MB_base: the same targets, shuffled and dealt to the W workers; one MFG per worker
    sampler = NeighborSampler(graph.indptr, graph.indices, [fanout] * num_layers, seed)
    dealt = torch.tensor_split(epoch_permutation(torch.cat(first), seed, 0), world)
    mb_est, mb_vertices = [], 0
    for rank, seeds in enumerate(dealt):
        blocks = sampler.sample(seeds, epoch=0, step=0, salt=rank)
        mb_vertices += blocks[0].num_src
        mb_est.append(
            estimate_mfg_memory(
                src_rows=[b.num_src for b in blocks],
                dst_rows=[b.num_dst for b in blocks],
                num_edges=sum(b.num_edges for b in blocks),
                dims=dims,
                num_params=params,
            )
        )
    result = {
        "mb_base": {
            "targets": sum(t.numel() for t in dealt),
            "vertices": mb_vertices,
            "rows": mb_vertices,
            **_sum_estimates(mb_est),
        }
    }

    # CoB: one co-batch per server, its graph split over the server's workers
    extract = {
        "cob_sage": lambda c, s: sage_expand(
            graph, c, fanout=fanout, hops=num_layers, seed=seed, salt=s
        ),
        "cob_eas": lambda c, s: eas_expand(
            graph, c, hops=eas_hops, fanout=eas_fanout, seed=seed, salt=s
        ),
    }
    for name, grow in extract.items():
        est, vertices, rows = [], 0, 0
        for s, cobatch in enumerate(first):
            nodes, _ = grow(cobatch, s)
            sub = graph.induced_subgraph(nodes)
            parts = partition(
                sub, intra_partition, workers_per_server, seed=seed + s, splits=splits[nodes]
            )
            sizes = one_hop_sizes(sub, parts, workers_per_server)
            vertices += nodes.numel()
            rows += int(sizes[:, :2].sum())
            for n_owned, n_halo, n_edges in sizes.tolist():
                est.append(
                    estimate_memory(
                        n_owned=n_owned,
                        n_halo=n_halo,
                        num_edges=n_edges,
                        dims=dims,
                        num_params=params,
                    )
                )
        result[name] = {
            "targets": sum(c.numel() for c in first),
            "vertices": vertices,
            "rows": rows,
            **_sum_estimates(est),
        }
    result["setup"] = {
        "num_layers": num_layers,
        "num_servers": num_servers,
        "workers_per_server": workers_per_server,
        "fanout": fanout,
        "batch_per_worker": batch_per_worker,
        "hidden": hidden,
        "eas_hops": eas_hops,
        "eas_fanout": eas_fanout,
        "cobatches_per_epoch": per_step,
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
    }
    return result
