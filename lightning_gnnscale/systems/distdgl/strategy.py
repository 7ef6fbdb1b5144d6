"""``DistDGLStrategy``: DDP for dense gradients plus the sparse-embedding optimiser step."""

from __future__ import annotations

from ..base import MeteredDDPStrategy
from .kvstore import SparseAdagrad, SparseSGD

SPARSE_OPTIMIZERS = {"sgd": SparseSGD, "adagrad": SparseAdagrad}


class DistDGLStrategy(MeteredDDPStrategy):
    """Dense parameters: synchronous DDP all-reduce (metered hook). Learnable node embeddings
    (when the datamodule has them): each training step first looks up its batch's input rows
    (``DistDGLDataModule.lookup_inputs``); after the dense optimiser step, the gradients of the
    lookups made since the previous optimiser step (this step's, or those of the accumulated
    steps) are pushed to the owning ranks, which apply the sparse optimiser to the touched rows
    (``gradient`` bytes). Lookups happen in the step, never when a batch is built, so batches
    the loader builds ahead neither join this step's update nor read rows it has not applied.

    Args:
        sparse_optimizer: ``sgd`` | ``adagrad``.
        sparse_lr: its learning rate.
    """

    def __init__(self, sparse_optimizer: str = "adagrad", sparse_lr: float = 0.05, **kwargs):
        super().__init__(**kwargs)
        self.sparse_optimizer_name, self.sparse_lr = sparse_optimizer, sparse_lr
        self.sparse_optimizer = None

    def _embedding_datamodule(self):
        """The datamodule when it trains embeddings, else ``None``."""
        dm = self.lightning_module.trainer.datamodule
        return dm if getattr(dm, "embedding", None) is not None else None

    def training_step(self, *args, **kwargs):
        dm = self._embedding_datamodule()
        if dm is not None:
            batch, *rest = args
            args = (dm.lookup_inputs(batch, self.root_device), *rest)
        return super().training_step(*args, **kwargs)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        dm = self._embedding_datamodule()
        if dm is not None:
            if self.sparse_optimizer is None:
                cls = SPARSE_OPTIMIZERS[self.sparse_optimizer_name]
                self.sparse_optimizer = cls([dm.embedding], lr=self.sparse_lr)
            self.sparse_optimizer.step()
        return output
