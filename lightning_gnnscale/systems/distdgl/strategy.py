"""``DistDGLStrategy``: DDP for dense gradients plus the sparse-embedding optimiser step."""

from __future__ import annotations

from ..base import MeteredDDPStrategy
from .kvstore import SparseAdagrad, SparseSGD

SPARSE_OPTIMIZERS = {"sgd": SparseSGD, "adagrad": SparseAdagrad}


class DistDGLStrategy(MeteredDDPStrategy):
    """Dense parameters: synchronous DDP all-reduce (metered hook). Learnable node embeddings
    (when the datamodule has them): after every optimiser step, their gradients are pushed to
    the owning ranks, which apply the sparse optimiser to the touched rows (``gradient`` bytes).

    Args:
        sparse_optimizer: ``sgd`` | ``adagrad``.
        sparse_lr: its learning rate.
    """

    def __init__(self, sparse_optimizer: str = "adagrad", sparse_lr: float = 0.05, **kwargs):
        super().__init__(**kwargs)
        self.sparse_optimizer_name, self.sparse_lr = sparse_optimizer, sparse_lr
        self.sparse_optimizer = None

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        embedding = getattr(self.lightning_module.trainer.datamodule, "embedding", None)
        if embedding is not None:
            if self.sparse_optimizer is None:
                cls = SPARSE_OPTIMIZERS[self.sparse_optimizer_name]
                self.sparse_optimizer = cls([embedding], lr=self.sparse_lr)
            self.sparse_optimizer.step()
        return output
