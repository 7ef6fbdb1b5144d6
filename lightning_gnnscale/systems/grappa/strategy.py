"""``GrappaStrategy``: DDP whose only training traffic is the coverage-scaled gradient all-reduce.

Every step the rank computes its batch's coverage factor ``c`` from the seed statistics the
DataModule attached (``kappa``, ``s``) and scales its gradient by ``c / W`` before the SUM
all-reduce. The loss is the rank's seed mean (``Batch.global_seed_count`` = local seeds), so
the aggregate is exactly ``(1/W) sum_w c_w g_w`` (spec A14). ``scaling_impl=comm_hook`` scales
inside the metered DDP comm hook (registered on CPU and GPU alike by the base class);
``loss_scale`` multiplies the loss instead (identical by linearity of backward).
"""

from __future__ import annotations

from ..base import MeteredDDPStrategy
from .estimators import batch_factor, c_uniform

SCALING_IMPLS = ("comm_hook", "loss_scale")


def coverage_scale(
    estimator: str, stats: dict, alpha: float, world_size: int
) -> tuple[float, float]:
    """``(c / W, c)`` for one rank's batch stats (``kappa``, ``s``): the factor the rank applies
    to its mean gradient before the SUM all-reduce."""
    c = batch_factor(estimator, stats["kappa"], stats["s"], alpha)
    return c / world_size, c


class GrappaStrategy(MeteredDDPStrategy):
    """Args:
    estimator: ``none`` | ``uniform`` | ``resampling`` | ``resampling_literal`` | ``node``.
    degree_smoothing: ``alpha`` in ``s + alpha`` (coverage itself comes with the batch).
    scaling_impl: ``comm_hook`` | ``loss_scale``.
    """

    def __init__(
        self,
        estimator: str = "resampling",
        degree_smoothing: float = 1.0,
        scaling_impl: str = "comm_hook",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if scaling_impl not in SCALING_IMPLS:
            raise ValueError(f"unknown scaling_impl {scaling_impl!r}; valid: {list(SCALING_IMPLS)}")
        self.estimator, self.alpha, self.scaling_impl = estimator, degree_smoothing, scaling_impl
        self.last_c, self.last_delta = 1.0, 0.0

    def step_factor(self, stats: dict) -> float:
        """``c / W`` for a batch's stats; also records ``c`` and the deficit ``1 - c_uniform``."""
        factor, self.last_c = coverage_scale(self.estimator, stats, self.alpha, self.world_size)
        self.last_delta = 1.0 - c_uniform(stats["kappa"])
        return factor

    def training_step(self, *args, **kwargs):
        factor = self.step_factor(args[0].stats)
        hook_scale, loss_scale = (
            (factor, 1.0) if self.scaling_impl == "comm_hook" else (1.0, factor)
        )
        if self.grad_hook_state is not None:
            self.grad_hook_state.scale = hook_scale
        out = super().training_step(*args, **kwargs)
        return out if loss_scale == 1.0 else out * loss_scale
