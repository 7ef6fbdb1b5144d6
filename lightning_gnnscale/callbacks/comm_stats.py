"""Training bytes by category and link class per epoch, summed over ranks."""

from __future__ import annotations

from ..comm import NetworkModel, diff_snapshots, sum_snapshots
from ..contract import rank_context
from .records import EpochRecords


class CommStats(EpochRecords):
    """Training bytes by category and link class per epoch, summed over ranks, plus modelled
    time; evaluation traffic (e.g. halo activations of distributed inference) is measured
    separately (``eval_bytes``) so it never inflates the training figures.

    The meter reduction itself is bookkeeping and is not counted.
    """

    def __init__(self, network: str):
        self.network = NetworkModel.from_name(network)
        super().__init__()

    def on_train_epoch_start(self, trainer, pl_module):
        self._start = rank_context(trainer).meter.snapshot()
        self._eval = rank_context(trainer).meter.delta(self._start)  # zeros

    def on_validation_epoch_start(self, trainer, pl_module):
        self._eval_start = rank_context(trainer).meter.snapshot()

    def on_validation_epoch_end(self, trainer, pl_module):
        if hasattr(self, "_eval"):  # validation outside fit (trainer.validate) is not tracked
            meter = rank_context(trainer).meter
            self._eval = sum_snapshots([self._eval, meter.delta(self._eval_start)])

    def on_train_epoch_end(self, trainer, pl_module):
        if not hasattr(self, "_start"):
            return  # an epoch end Lightning re-runs on resume (see EpochStats)
        comm, meter = rank_context(trainer).comm, rank_context(trainer).meter
        train_delta = diff_snapshots(meter.delta(self._start), self._eval)
        per_rank = comm.gather_meter(train_delta)
        total = {cat: sum(s["bytes"][cat] for s in per_rank) for cat in per_rank[0]["bytes"]}
        inter = sum(s["link_bytes"]["inter_server"] for s in per_rank)
        inter_by_category = {
            cat: sum(s["category_link_bytes"][cat]["inter_server"] for s in per_rank)
            for cat in per_rank[0]["bytes"]
        }
        modeled = max(self.network.modeled_time(s) for s in per_rank)
        eval_bytes = sum(comm.reduce_meter(self._eval)["bytes"].values())
        record = {
            "bytes": total,
            "inter_server_bytes": inter,
            "inter_server_category_bytes": inter_by_category,
            "modeled_time_s": modeled,
            "eval_bytes": eval_bytes,
        }
        self.epochs.append(record)
        del self._start
        metrics = {f"comm/{cat}_bytes": float(n) for cat, n in total.items()}
        metrics.update(
            {
                "comm/inter_server_bytes": float(inter),
                "comm/modeled_time_s": modeled,
                "comm/eval_bytes": float(eval_bytes),
            }
        )
        pl_module.log_dict(metrics)
