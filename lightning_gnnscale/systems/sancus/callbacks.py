"""SANCUS's run statistics: the staleness log and the cache memory (spec §4.4)."""

from __future__ import annotations

import lightning as L
import torch

from .runtime import cache_bytes_formula


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
    hidden layer inputs, and the mean SCS-H distance; flags are the same on every rank, so rank
    0's log is the run's. ``summary_stats`` goes into ``summary.json`` under ``system``."""

    def __init__(self):
        self.last: dict = {}

    def on_train_epoch_end(self, trainer, pl_module):
        runtime = pl_module.net.runtime
        forward = flag_summary(runtime.forward_flags, runtime.num_layers)
        backward = flag_summary(runtime.backward_flags, runtime.num_layers)
        hidden = [v for layer, v in forward.items() if layer > 0]
        distances = [d for d in runtime.distances.values() if d != float("inf")]
        self.last = {
            **trainer.datamodule.prepared.report,
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
    """Cache bytes of every rank at the end of training, measured and by the spec's formula
    (one ``all_gather``, ``control``)."""

    def __init__(self):
        self.last: dict = {}

    def on_train_end(self, trainer, pl_module):
        net, dm = pl_module.net, trainer.datamodule
        runtime = net.runtime
        measured = runtime.cache_bytes()
        formula = cache_bytes_formula(
            dm.prepared.graph.num_nodes,
            runtime.layout.num_rows,
            net.widths,
            dm.x.element_size(),
            runtime.policy,
        )
        local = torch.tensor(
            [
                measured["embedding_cache"] + measured["own_last"],
                formula,
                measured["gradient_cache"],
            ],
            dtype=torch.int64,
        )
        rows = trainer.strategy.comm.all_gather_tensor(local, category="control").view(-1, 3)
        self.last = {
            "cache_bytes_by_rank": rows[:, 0].tolist(),
            "cache_bytes_formula_by_rank": rows[:, 1].tolist(),
            "gradient_cache_bytes_by_rank": rows[:, 2].tolist(),
        }

    def summary_stats(self) -> dict:
        return self.last
