"""GSplit's per-epoch statistics and the redundancy probe (paper Table 1)."""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
from typing_extensions import override

from ...contract import rank_context
from ...graph.sampler import NeighborSampler


class GSplitStats(L.Callback):
    """Per-step split statistics, reduced over ranks at epoch end (one all-gather, ``control``).

    Kept in ``summary.json`` under ``system`` (the scalars are also logged): the mean per-step
    load imbalance (max / mean over ranks of the edges a rank aggregates), the cross-split edge
    share (sampled edges whose source another rank owns), rows and bytes shuffled per step by
    layer (forward, from ``SplitBatch.traffic``), input rows loaded per step, the feature-cache
    hit rate, and the partitioner's prediction.

    Args:
        partition_report: returns the prepared partition's report (``method``,
            ``expected_cross_fraction``, ``presampled_batches``) once the data is set up.
    """

    def __init__(self, partition_report: Callable[[], dict]):
        self.partition_report = partition_report
        self.last: dict = {}

    @override
    def on_train_epoch_start(self, trainer, pl_module):
        self._rows: list[list[float]] = []

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        s, traffic = batch.stats, batch.traffic
        self._rows.append(
            [
                sum(s["edges"]),
                sum(s["cross_edges"]),
                s["input_nodes"],
                s["cache_hits"],
                s["cache_misses"],
                *traffic.rows,
                *traffic.bytes,
            ]
        )

    @override
    def on_train_epoch_end(self, trainer, pl_module):
        if not hasattr(self, "_rows"):
            return  # an epoch end Lightning re-runs on resume (see EpochStats)
        local = torch.tensor(self._rows, dtype=torch.float64)  # [steps, k]
        del self._rows
        comm = rank_context(trainer).comm
        gathered = comm.all_gather_tensor(local.flatten(), category="control")
        per_rank = gathered.view(comm.world_size, *local.shape)  # [P, steps, k]
        edges = per_rank[..., 0]
        imbalance = (edges.max(0).values / edges.mean(0).clamp(min=1e-12)).mean()
        totals = per_rank.sum((0, 1))
        steps = max(local.shape[0], 1)
        layers = (local.shape[1] - 5) // 2
        self.last = {
            "load_imbalance": float(imbalance),
            "cross_edge_share": float(totals[1] / totals[0].clamp(min=1)),
            "input_rows_per_step": float(totals[2] / steps),
            "cache_hit_rate": float(totals[3] / (totals[3] + totals[4]).clamp(min=1)),
            "rows_shuffled_per_step_by_layer": [float(t / steps) for t in totals[5 : 5 + layers]],
            "bytes_shuffled_per_step_by_layer": [float(t / steps) for t in totals[5 + layers :]],
        }
        pl_module.log_dict(
            {f"gsplit/{k}": v for k, v in self.last.items() if not isinstance(v, list)}
        )

    def summary_stats(self) -> dict:
        report = self.partition_report()
        if not report:  # the data was never set up
            return self.last
        return {
            **self.last,
            "partition_method": report["method"],
            "predicted_cross_edge_share": report["expected_cross_fraction"],
            "presampled_batches": report["presampled_batches"],
        }


class RedundancyProbe(L.Callback):
    """Table 1 of the paper: on the first ``steps`` steps, how many more input rows and edges
    ``P`` data-parallel micro-batches (the same step's targets split evenly, rank-salted
    sampling) load and compute than one split-parallel mini-batch. Rank 0 only; nothing is
    trained on the probe's samples and nothing is communicated. The sums travel in
    checkpoints, so a run resumed after the probed steps still reports them.

    Args:
        steps: steps of the first epoch to probe.
        step_seeds: ``(epoch, step) -> [B]`` the step's global seeds.
        make_sampler: builds the whole-graph sampler (``single``'s keys) on first use.
    """

    def __init__(
        self,
        steps: int,
        step_seeds: Callable[[int, int], torch.Tensor],
        make_sampler: Callable[[], NeighborSampler],
    ):
        self.steps, self.step_seeds, self.make_sampler = steps, step_seeds, make_sampler
        self.probed = 0  # steps measured
        self.sums = torch.zeros(4, dtype=torch.float64)  # dp rows, dp edges, split rows, edges

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank != 0 or trainer.current_epoch or batch_idx >= self.steps:
            return
        if not hasattr(self, "_sampler"):
            self._sampler = self.make_sampler()
        sampler = self._sampler
        seeds = self.step_seeds(batch.epoch, batch.step)
        whole = sampler.sample(seeds, batch.epoch, batch.step)
        micro = [
            sampler.sample(part, batch.epoch, batch.step, salt=r)
            for r, part in enumerate(torch.tensor_split(seeds, trainer.world_size))
        ]
        self.sums += torch.tensor(
            [
                sum(m[0].num_src for m in micro),
                sum(b.num_edges for m in micro for b in m),
                whole[0].num_src,
                sum(b.num_edges for b in whole),
            ],
            dtype=torch.float64,
        )
        self.probed += 1

    @override
    def state_dict(self) -> dict:
        return {"probed": self.probed, "sums": self.sums}

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        self.probed, self.sums = state_dict["probed"], state_dict["sums"].clone()

    def summary_stats(self) -> dict:
        if not self.sums[2]:
            return {}
        return {
            "redundancy_steps": self.probed,
            "dp_over_split_input_rows": float(self.sums[0] / self.sums[2]),
            "dp_over_split_edges": float(self.sums[1] / self.sums[3]),
        }
