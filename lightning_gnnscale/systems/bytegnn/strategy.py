"""``ByteGNNStrategy``: synchronous data parallel over the S-Worker's batches."""

from __future__ import annotations

from ..base import MeteredDDPStrategy
from .config import ByteGNNConfig


class ByteGNNStrategy(MeteredDDPStrategy):
    """DDP (a metered all-reduce of summed gradients) in place of ByteGNN's parameter server:
    the same synchronous SGD. The S-Worker and the graph-store service belong to the
    DataModule, which starts and stops them through its own hooks (``train_dataloader``,
    ``teardown``, ``on_exception``).

    Args: as :class:`~..base.MeteredDDPStrategy`; ``config`` (a :class:`ByteGNNConfig`)
    defaults to the DataModule's.
    """

    config_type = ByteGNNConfig
