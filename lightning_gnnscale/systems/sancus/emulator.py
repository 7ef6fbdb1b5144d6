"""Single-process SANCUS emulator: ``P`` virtual ranks over a dense ``Â``, versioned blocks and
the same staleness policies, with a hand-written backward through the layers (the task's
loss and its gradient at the output come from autograd). The tests check that the
distributed run reproduces it (flags, losses, parameters) for every policy.

Because every broadcast reaches every rank, one copy per (layer input, root) stands for all the
receivers' caches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from ...graph.csc import Graph
from ...graph.node_targets import NodeTargets
from ...tasks.base import NodeTask
from .layout import normalized_adjacency
from .policy import NEVER, StalenessPolicy, variation_flag


@dataclass
class EmulatorTrace:
    """What the emulator saw per epoch: ``forward_flags[(e, l)]`` / ``backward_flags[(e, l)]``
    (bool ``[P]``), ``distances[(e, l)]`` (``[P]``, variation), ``losses`` and the final
    parameters ``[(weight, bias)]`` per layer."""

    forward_flags: dict = field(default_factory=dict)
    backward_flags: dict = field(default_factory=dict)
    distances: dict = field(default_factory=dict)
    losses: list = field(default_factory=list)
    params: list = field(default_factory=list)


def emulate(
    graph: Graph,
    targets: NodeTargets,
    task: NodeTask,
    offsets: Tensor,
    params: list[tuple[Tensor, Tensor]],
    policy: StalenessPolicy,
    epochs: int,
    lr: float = 0.01,
    weight_decay: float = 0.0,
    step_loss: Callable[[int, Tensor], tuple[Tensor, int]] | None = None,
) -> EmulatorTrace:
    """Train a GCN (``params[l] = (weight [out, in], bias [out])``) full-graph for ``epochs``
    epochs with Adam on ``task``'s loss over its training seeds of ``targets``, as
    ``P = len(offsets) - 1`` ranks running SANCUS would.

    ``graph`` and ``targets`` (one row per node) must already be in row-block order (rank
    ``i`` owns ``offsets[i]:offsets[i+1]``). ``step_loss(e, out)`` -> ``(loss sum, loss
    terms)`` of SANCUS epoch (step) ``e`` from every row's output ``out [N, C]`` replaces the
    task's loss over ``targets`` (link prediction: a step's pairs; ``targets`` is then unused).
    """
    n, p = graph.num_nodes, offsets.numel() - 1
    rows, cols, values = normalized_adjacency(graph)
    adj = torch.zeros(n, n, dtype=graph.x.dtype).index_put_((rows, cols), values, accumulate=True)
    spans = [slice(int(offsets[j]), int(offsets[j + 1])) for j in range(p)]
    consumer = torch.zeros(p, p, dtype=torch.bool)
    for k in range(p):
        for j in range(p):
            consumer[k, j] = k != j and bool(adj[spans[k], spans[j]].any())
    weights = [(w.detach().clone(), b.detach().clone()) for w, b in params]
    flat = [t for pair in weights for t in pair]
    optimizer = torch.optim.Adam(flat, lr=lr, weight_decay=weight_decay)
    num_layers = len(weights)
    cache = [[None] * p for _ in range(num_layers)]  # what receivers hold of root j
    last = [torch.full((p,), NEVER, dtype=torch.int64) for _ in range(num_layers)]
    grad_cache = [[None] * p for _ in range(num_layers)]
    grad_last = [torch.full((p,), NEVER, dtype=torch.int64) for _ in range(num_layers)]
    if step_loss is None:
        train = task.is_train_seed(targets)
        target, n_train = targets.target[train], int(train.sum())

        def step_loss(epoch: int, out: Tensor) -> tuple[Tensor, int]:
            return task.loss_sum(out[train], target), n_train

    trace = EmulatorTrace()

    def mix(layer_cache, fresh: Tensor) -> Tensor:
        """Row block ``i`` of ``Â H̃``: own block fresh, the others from the caches."""
        out = []
        for i in range(p):
            acc = adj[spans[i], spans[i]] @ fresh[spans[i]]
            for j in range(p):
                if j != i and consumer[i, j]:
                    acc = acc + adj[spans[i], spans[j]] @ layer_cache[j]
            out.append(acc)
        return torch.cat(out)

    for epoch in range(epochs):
        h, saved = graph.x, []
        for layer, (w, b) in enumerate(weights):
            flags = policy.local_flags(layer, epoch, last[layer], consumer)
            if flags is None:
                decided = [
                    variation_flag(h[spans[j]], cache[layer][j], policy.variation_gap)
                    for j in range(p)
                ]
                flags = torch.tensor([a for a, _ in decided])
                trace.distances[(epoch, layer)] = torch.tensor([d for _, d in decided])
            trace.forward_flags[(epoch, layer)] = flags.clone()
            for j in range(p):
                if flags[j]:
                    cache[layer][j] = h[spans[j]].clone()
            last[layer][flags] = epoch
            aggregated = mix(cache[layer], h)
            z = aggregated @ w.t() + b
            saved.append((aggregated, z))
            h = F.relu(z) if layer < num_layers - 1 else z
        out = h.detach().requires_grad_()
        loss_sum, terms = step_loss(epoch, out)
        trace.losses.append(float(loss_sum.detach()))
        (grad,) = torch.autograd.grad(loss_sum / terms, out)
        for layer in reversed(range(num_layers)):
            w, b = weights[layer]
            aggregated, _ = saved[layer]
            w.grad, b.grad = grad.t() @ aggregated, grad.sum(0)
            if layer == 0:
                break
            flags = policy.gradient_flags(epoch, grad_last[layer])
            trace.backward_flags[(epoch, layer)] = flags.clone()
            for j in range(p):
                if flags[j]:
                    grad_cache[layer][j] = grad[spans[j]].clone()
            grad_last[layer][flags] = epoch
            grad_h = mix(grad_cache[layer], grad) @ w
            grad = grad_h * (saved[layer - 1][1] > 0).to(grad.dtype)
        optimizer.step()
    trace.params = [(w.detach().clone(), b.detach().clone()) for w, b in weights]
    return trace
