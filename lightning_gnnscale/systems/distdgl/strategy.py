"""``DistDGLStrategy``: DDP for dense gradients plus the sparse-embedding optimiser step."""

from __future__ import annotations

from typing_extensions import override

from ...kit.strategies import MeteredDDPStrategy
from .config import DistDGLConfig
from .datamodule import DistDGLBatch, LearnableInputs


class DistDGLStrategy(MeteredDDPStrategy):
    """Synchronous DDP for the dense parameters, plus DistDGL's sparse embedding updates.

    Dense parameters: the metered DDP all-reduce. Learnable node embeddings (a
    :class:`DistDGLBatch` whose ``inputs`` is set): the training step first looks up the
    batch's input rows ``[num_src, d]`` through ``batch.inputs``; after the dense optimiser
    step, that object's sparse optimiser pushes the gradients of the lookups made since the
    previous optimiser step (this step's, or those of the accumulated steps) to the owning
    ranks (``gradient`` bytes). Lookups happen in the step, never when a batch is built, so
    batches the loader builds ahead neither join this step's update nor read rows it has not
    applied (docs/systems/distdgl.md#node-embeddings).

    Args: as :class:`~...kit.strategies.MeteredDDPStrategy`; ``config`` (a :class:`DistDGLConfig`)
    defaults to the DataModule's.
    """

    config_type = DistDGLConfig

    def __init__(self, config: DistDGLConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        self._looked_up: LearnableInputs | None = None  # inputs of the steps since the last update

    @override
    def training_step(self, *args, **kwargs):
        batch, *rest = args
        if isinstance(batch, DistDGLBatch) and batch.inputs is not None:
            self._looked_up = batch.inputs
            args = (batch.inputs.lookup(batch, self.root_device), *rest)
        return super().training_step(*args, **kwargs)

    @override
    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self._looked_up is not None:
            self._looked_up.step()
            self._looked_up = None
        return output
