"""``ByteGNNStrategy``: synchronous data parallel over the S-Worker's batches."""

from __future__ import annotations

import os

from ...bounds import externally_launched
from ...kit.strategies import MeteredDDPStrategy
from ...store_secret import SECRET_ENV, give_local_ranks_a_secret, read_secret
from .config import ByteGNNConfig


class ByteGNNStrategy(MeteredDDPStrategy):
    """DDP (a metered all-reduce of summed gradients) in place of ByteGNN's parameter server:
    the same synchronous SGD. The S-Worker and the graph-store service belong to the
    DataModule, which starts and stops them through its own hooks (``train_dataloader``,
    ``teardown``, ``on_exception``).

    Told by the Trainer that it runs on one node (``num_nodes``, set before any rank starts) in
    a process that will start its ranks itself (a plain script's ``Trainer``, which starts the
    others with its environment), it puts a fresh store secret in that environment unless the
    user gave one (docs/systems/bytegnn.md, "Who may connect"). On several nodes it leaves the
    secret to the user, withdrawing one it made itself: each node would make its own.

    Args: as :class:`~...kit.strategies.MeteredDDPStrategy`; ``config`` (a :class:`ByteGNNConfig`)
    defaults to the DataModule's.
    """

    config_type = ByteGNNConfig

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._made_secret: str | None = None  # the secret this strategy put in os.environ

    @MeteredDDPStrategy.num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        MeteredDDPStrategy.num_nodes.fset(self, num_nodes)
        if num_nodes > 1:
            if self._made_secret is not None and os.environ.get(SECRET_ENV) == self._made_secret:
                del os.environ[SECRET_ENV]
            self._made_secret = None
            return
        one_node = not {"NODE_RANK", "MASTER_ADDR"} & set(os.environ)
        if one_node and not externally_launched() and read_secret() is None:
            give_local_ranks_a_secret(os.environ)
            self._made_secret = os.environ[SECRET_ENV]
