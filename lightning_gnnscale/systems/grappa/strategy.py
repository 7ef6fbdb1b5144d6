"""``GrappaStrategy``: DDP whose only training traffic is the coverage-scaled gradient all-reduce."""

from __future__ import annotations

from typing_extensions import override

from ...kit.strategies import MeteredDDPStrategy
from .config import GrappaConfig


class GrappaStrategy(MeteredDDPStrategy):
    """Scales each rank's gradient by its batch's ``coverage / W`` before the SUM all-reduce.

    The batch (a :class:`~.datamodule.GrappaBatch`) carries the coverage factor ``c`` and its
    loss is the rank's seed mean ``g_w``, so the aggregate is exactly ``(1/W) sum_w c_w g_w``
    (docs/systems/grappa.md, "Loss normalisation"). ``scaling_impl=comm_hook`` scales inside
    the metered DDP comm hook (registered on CPU and GPU alike by the base class);
    ``loss_scale`` multiplies the loss instead (identical by linearity of backward).

    Args: as :class:`~...kit.strategies.MeteredDDPStrategy`; ``config`` is a :class:`GrappaConfig`.
    """

    config_type = GrappaConfig

    @override
    def training_step(self, *args, **kwargs):
        factor = args[0].coverage / self.world_size
        hook_scale, loss_scale = (
            (factor, 1.0) if self.system_config.scaling_impl == "comm_hook" else (1.0, factor)
        )
        if self.grad_hook_state is not None:
            self.grad_hook_state.scale = hook_scale
        out = super().training_step(*args, **kwargs)
        return out if loss_scale == 1.0 else out * loss_scale
