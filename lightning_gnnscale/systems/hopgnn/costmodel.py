"""HopGNN's cost model (spec §4): bytes and modelled time per iteration of model-centric (MC),
HopGNN (with and without pre-gathering), P³ and the naive feature-centric scheme, counted on
the planner's own plans; and the table of docs/systems/hopgnn.md:

    python -m lightning_gnnscale.systems.hopgnn.costmodel --nodes 20000 --ranks 2 3 4

Remote rows come from the same planner and sampler the training runs use (the dist tests check
that the metered ``feature`` bytes equal them), so the row counts are counts, not estimates;
the MC / HopGNN byte columns are those rows' feature bytes plus migration and the gradient
all-reduce, and exclude the ids sent with each fetch (``structure`` bytes in training). The P³
and naive entries and the times are modelled.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ...comm.collectives import ring_allreduce_bytes
from ...graph.block import Block
from ...graph.csc import Graph
from ...graph.order import EpochOrder
from ...graph.sampler import NeighborSampler
from .links import link_share, step_pairs
from .planner import (
    IterationPlan,
    micrograph_plan,
    model_centric_plan,
    remote_inputs,
    sample_steps,
)


@dataclass(frozen=True)
class CostParams:
    """What the byte counts depend on besides the plan.

    Attributes:
        feature_dim: ``D``. hidden: ``H``. out_dim: ``C``, the head's width. layers: ``L``.
        model_params: ``|theta|``.
        itemsize: bytes per value (4: fp32).
        bandwidth: bytes/s (10 GbE: 1.25e9). latency: s per message.
        step_overhead: s per time step (launches and barrier).
        payload_factor: model copies per migration (2: params + grads).
    """

    feature_dim: int
    hidden: int
    out_dim: int
    layers: int
    model_params: int
    itemsize: int = 4
    bandwidth: float = 1.25e9
    latency: float = 5e-5
    step_overhead: float = 1e-3
    payload_factor: int = 2


def gcn_param_count(d: int, h: int, c: int, layers: int) -> int:
    """Parameters of an ``L``-layer mean-GCN ``D -> H -> ... -> C`` (weights and biases)."""
    dims = [d] + [h] * (layers - 1) + [c]
    return sum(a * b + b for a, b in zip(dims[:-1], dims[1:]))


def _remote_union(sets: list[Tensor]) -> int:
    return torch.unique(torch.cat(sets)).numel() if sets else 0


def iteration_rows(
    plan: IterationPlan, sampler: NeighborSampler, part: Tensor, epoch: int, step: int
) -> tuple[Tensor, Tensor, list[list[list[Block] | None]]]:
    """Per server: remote rows without and with pre-gathering, and the sampled blocks."""
    no_pg, pg, blocks = [], [], []
    for rank in range(plan.world_size):
        steps = sample_steps(plan, rank, sampler, epoch, step)
        sets = [remote_inputs(b, part, rank) for b in steps]
        no_pg.append(sum(s.numel() for s in sets))
        pg.append(_remote_union(sets))
        blocks.append(steps)
    return torch.tensor(no_pg), torch.tensor(pg), blocks


def p3_bytes(blocks: list[list[Block] | None], n: int, cost: CostParams) -> int:
    """P³ per iteration: layer-1 partial activations to the owner and their gradients back
    (``(N-1) * H * |V1_d|`` each way), the layer-1 topology to every worker (16 B per edge),
    and the all-reduce of the other layers' parameters."""
    total = 0
    for b in blocks:
        if b is None:
            continue
        v1, e1 = b[0].num_dst, b[0].num_edges
        total += 2 * (n - 1) * cost.hidden * v1 * cost.itemsize + (n - 1) * e1 * 16
    rest = cost.model_params - (cost.feature_dim * cost.hidden + cost.hidden)
    return total + n * ring_allreduce_bytes(max(rest, 0) * cost.itemsize, n)


def naive_bytes(blocks: list[list[Block] | None], part: Tensor, cost: CostParams) -> int:
    """The naive feature-centric scheme (spec §4.4): per layer, the model visits every server
    owning a source row of that layer's block and carries its parameters, the topology still to
    consume, the partial aggregates of the layer's destinations and the activations saved so
    far."""
    total = 0
    dims = [cost.feature_dim] + [cost.hidden] * (cost.layers - 1) + [cost.out_dim]
    for b in blocks:
        if b is None:
            continue
        saved = 0
        for layer, block in enumerate(b):
            visits = torch.unique(part.index_select(0, block.src_ids)).numel()
            topology = sum(x.num_edges for x in b[layer:]) * 16
            partial = block.num_dst * dims[layer] * cost.itemsize
            per_hop = cost.model_params * cost.itemsize + topology + partial + saved
            total += visits * per_hop
            saved += block.num_dst * dims[layer + 1] * cost.itemsize
    return total


def link_plans(
    task, targets, seeds: Tensor, part: Tensor, n: int, step: int
) -> tuple[IterationPlan, IterationPlan, int]:
    """Link prediction's model-centric and HopGNN plans of one step with *node* roots (each
    rank's endpoints: model ``d``'s all on rank ``d``; HopGNN's
    :class:`~.links.LinkShare` nodes), and the output rows HopGNN exchanges (far endpoints)."""
    pairs = step_pairs(task, targets, seeds, n, 0, step)

    def home(ids: Tensor) -> Tensor:
        return part.index_select(0, ids)

    mc = model_centric_plan(seeds, n)
    ends = [torch.unique(torch.cat([pairs.src[b], pairs.dst[b]])) for b in pairs.batches]
    mc = replace(mc, roots=[ends])
    hop = micrograph_plan(seeds, home(pairs.src), n, batches=pairs.batches)
    roots, exchanged = [], 0
    for row in hop.roots:
        shares = [link_share(row, pairs, home, part.numel(), s) for s in range(n)]
        roots.append([share.nodes for share in shares])
        exchanged += sum(sum(share.recv_splits) for share in shares)
    return mc, replace(hop, roots=roots), exchanged


def table(
    graph: Graph,
    train_ids: Tensor,
    part: Tensor,
    n: int,
    batch_size: int,
    fanouts: list[int],
    cost: CostParams,
    iterations: int = 5,
    seed: int = 0,
    link: tuple | None = None,
) -> dict[str, float]:
    """Mean per-iteration counts over the first ``iterations`` steps of epoch 0 (``train_ids``:
    the task's training seeds, in id order). ``link``: ``(task, targets)`` of link
    prediction, whose seeds are pairs and whose roots their endpoints (:func:`link_plans`,
    blocks over the training edges; HopGNN's bytes add the exchanged output rows and their
    gradients, ``C = out_dim`` values each)."""
    indptr, indices = graph.indptr, graph.indices
    if link is not None:
        indptr, indices = link[1].split.structure("train")
    sampler = NeighborSampler(indptr, indices, fanouts, seed)
    order = EpochOrder(train_ids, seed)
    row_bytes = cost.feature_dim * cost.itemsize
    model_bytes = cost.model_params * cost.itemsize
    allreduce = n * ring_allreduce_bytes(model_bytes, n)
    acc = dict.fromkeys(
        ("mc_rows", "mc_inputs", "hop_rows", "hop_pg_rows", "hop_inputs", "p3", "naive"), 0.0
    )
    acc["exchanged_rows"] = 0.0
    for step in range(iterations):
        seeds = order.step(0, step, batch_size)
        if link is None:
            mc, hop = model_centric_plan(seeds, n), micrograph_plan(seeds, part, n)
        else:
            mc, hop, exchanged = link_plans(*link, seeds, part, n, step)
            acc["exchanged_rows"] += exchanged
        mc_rows, _, mc_blocks = iteration_rows(mc, sampler, part, 0, step)
        hop_rows, hop_pg, hop_blocks = iteration_rows(hop, sampler, part, 0, step)
        acc["mc_rows"] += int(mc_rows.sum())
        acc["hop_rows"] += int(hop_rows.sum())
        acc["hop_pg_rows"] += int(hop_pg.sum())
        acc["mc_inputs"] += sum(b[0][0].num_src for b in mc_blocks if b[0] is not None)
        acc["hop_inputs"] += sum(
            s[0].num_src for per_rank in hop_blocks for s in per_rank if s is not None
        )
        acc["p3"] += p3_bytes([b[0] for b in mc_blocks], n, cost)
        acc["naive"] += naive_bytes([b[0] for b in mc_blocks], part, cost)
    mean = {k: v / iterations for k, v in acc.items()}
    migration = n * (n - 1) * cost.payload_factor * model_bytes

    def seconds(bytes_total: float, messages: float, steps: int) -> float:
        # every rank sends about 1/N of the cluster total; latency per message, overhead per step
        return (
            bytes_total / n / cost.bandwidth + messages * cost.latency + steps * cost.step_overhead
        )

    exchange = mean["exchanged_rows"] * 2 * cost.out_dim * cost.itemsize
    mc_bytes = mean["mc_rows"] * row_bytes + allreduce
    hop_bytes = mean["hop_rows"] * row_bytes + migration + allreduce + exchange
    hop_pg_bytes = mean["hop_pg_rows"] * row_bytes + migration + allreduce + exchange
    ring = 2 * (n - 1)
    return {
        "N": n,
        "mc_remote_rows": mean["mc_rows"],
        "mc_miss_rate": mean["mc_rows"] / max(mean["mc_inputs"], 1),
        "hop_remote_rows": mean["hop_rows"],
        "hop_pg_remote_rows": mean["hop_pg_rows"],
        "hop_miss_rate": mean["hop_rows"] / max(mean["hop_inputs"], 1),
        "feature_bytes_saved": (mean["mc_rows"] - mean["hop_pg_rows"]) * row_bytes,
        "migration_bytes": migration,
        "exchange_bytes": exchange,
        "alpha": mean["mc_rows"] * row_bytes / n / model_bytes,
        "mc_MB": mc_bytes / 1e6,
        "hop_MB": hop_bytes / 1e6,
        "hop_pg_MB": hop_pg_bytes / 1e6,
        "p3_MB": mean["p3"] / 1e6,
        "naive_MB": mean["naive"] / 1e6,
        "mc_ms": 1e3 * seconds(mc_bytes, 2 + ring, 1),
        "hop_ms": 1e3 * seconds(hop_bytes, 2 * n + (n - 1) + ring, n),
        "hop_pg_ms": 1e3 * seconds(hop_pg_bytes, 2 + (n - 1) + ring, n),
        "p3_ms": 1e3 * seconds(mean["p3"], 4 + ring, 1),
    }


def main(argv: list[str] | None = None) -> None:
    from ...graph.generators import sbm
    from ...graph.partition import partition
    from ...tasks import build_task

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=20000)
    parser.add_argument("--degree", type=float, default=12.0)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1024, help="global mini-batch")
    parser.add_argument("--fanouts", type=int, nargs="+", default=[10, 10])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument(
        "--task",
        default="node_classification",
        choices=("node_classification", "link_prediction"),
        help="link_prediction: --batch positive pairs a step, one negative each",
    )
    args = parser.parse_args(argv)
    # blocks = classes = the head's width
    dataset = sbm(args.nodes, args.classes, args.degree, num_features=args.features, seed=0)
    graph = dataset.graph
    task = build_task(args.task)
    targets = task.prepare(dataset, 0)
    train_ids = task.train_seeds(targets)
    link = (task, targets) if task.spec.seeds == "edges" else None
    out_dim = targets.out_dim
    layers = len(args.fanouts)
    cost = CostParams(
        args.features,
        args.hidden,
        out_dim,
        layers,
        gcn_param_count(args.features, args.hidden, out_dim, layers),
    )
    rows = []
    for n in args.ranks:
        part = partition(graph, "metis", n, seed=0)
        rows.append(
            table(
                graph,
                train_ids,
                part,
                n,
                args.batch,
                args.fanouts,
                cost,
                args.iterations,
                link=link,
            )
        )
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(f"{row[k]:.6g}" for k in keys) + " |")


if __name__ == "__main__":
    main()
