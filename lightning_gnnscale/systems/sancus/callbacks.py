"""SANCUS's run statistics: the staleness log and the cache memory
(docs/systems/sancus.md#cache-memory). Reports only: training is the same without them."""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
from typing_extensions import override

from ...contract import rank_context
from .runtime import SancusGCN, cache_bytes_formula


def flag_summary(flags: dict, num_layers: int) -> dict:
    """Share of (epoch, root) broadcasts made per layer, from ``{(epoch, l): bool [P]}``."""
    out = {}
    for layer in range(num_layers):
        rows = [f for (_, lay), f in sorted(flags.items()) if lay == layer]
        if rows:
            out[layer] = float(torch.stack(rows).float().mean())
    return out


class StalenessLog(L.Callback):
    """ACTIVE share per layer input (forward) and per layer (backward δ), the skip ratio of the
    hidden layer inputs, and the mean SCS-H distance, read from the module's
    :class:`SancusGCN`; flags are the same on every rank, so rank 0's log is the run's.
    ``summary_stats`` goes into ``summary.json`` under ``system``.

    Args:
        rows: the row order (``strategy.rows``), reported with the row-block sizes.
    """

    def __init__(self, rows: str):
        self.rows = rows
        self.last: dict = {}

    @override
    def on_train_epoch_end(self, trainer, pl_module):
        runtime = SancusGCN.of(pl_module).runtime
        forward = flag_summary(runtime.forward_flags, runtime.num_layers)
        backward = flag_summary(runtime.backward_flags, runtime.num_layers)
        hidden = [v for layer, v in forward.items() if layer > 0]
        distances = [d for d in runtime.distances.values() if d != float("inf")]
        self.last = {
            "rows": self.rows,
            "row_block_sizes": runtime.layout.sizes,
            "policy": runtime.policy.name,
            "forward_active_share_by_layer": [forward.get(k) for k in range(runtime.num_layers)],
            "backward_active_share_by_layer": [backward.get(k) for k in range(runtime.num_layers)],
            "hidden_skip_ratio": 1.0 - sum(hidden) / len(hidden) if hidden else 0.0,
            "mean_variation_distance": sum(distances) / len(distances) if distances else None,
        }
        pl_module.log("sancus/hidden_skip_ratio", self.last["hidden_skip_ratio"])

    def summary_stats(self) -> dict:
        return self.last


class CacheMemory(L.Callback):
    """Cache bytes of every rank at the end of training, measured and by the formula
    (one ``all_gather``, ``control``).

    Args:
        sizes: ``() -> (N, bytes per embedding value)``: the graph's node count and the
            features' element size, read at the end of training (the rank's set-up knows them).
    """

    def __init__(self, sizes: Callable[[], tuple[int, int]]):
        self.sizes = sizes
        self.last: dict = {}

    @override
    def on_train_end(self, trainer, pl_module):
        net = SancusGCN.of(pl_module)
        runtime = net.runtime
        measured = runtime.cache_bytes()
        num_nodes, element_size = self.sizes()
        formula = cache_bytes_formula(
            num_nodes, runtime.layout.num_rows, net.widths, element_size, runtime.policy
        )
        local = torch.tensor(
            [
                measured["embedding_cache"] + measured["own_last"],
                formula,
                measured["gradient_cache"],
            ],
            dtype=torch.int64,
        )
        comm = rank_context(trainer).comm
        rows = comm.all_gather_tensor(local, category="control").view(-1, 3)
        self.last = {
            "cache_bytes_by_rank": rows[:, 0].tolist(),
            "cache_bytes_formula_by_rank": rows[:, 1].tolist(),
            "gradient_cache_bytes_by_rank": rows[:, 2].tolist(),
        }

    def summary_stats(self) -> dict:
        return self.last
