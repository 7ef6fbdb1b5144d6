"""``DistDGLStrategy``: DDP for dense gradients; the suite strategy's learnable-input steps."""

from __future__ import annotations

from ...kit.strategies import MeteredDDPStrategy
from .config import DistDGLConfig


class DistDGLStrategy(MeteredDDPStrategy):
    """Synchronous DDP for the dense parameters, plus DistDGL's sparse embedding updates.

    Dense parameters: the metered DDP all-reduce. Learnable node embeddings (a batch whose
    ``inputs`` is set): the suite strategy looks the batch's input rows up in the training
    step and, after the dense optimiser step, pushes the gradients of the lookups to the
    owning ranks (``SystemStrategy``; docs/systems/distdgl.md#node-embeddings).

    Args: as :class:`~...kit.strategies.MeteredDDPStrategy`; ``config`` (a :class:`DistDGLConfig`)
    defaults to the DataModule's.
    """

    config_type = DistDGLConfig
