"""``strategy=single``: one process, sampled or full-neighbourhood mini-batches; the oracle."""

from __future__ import annotations

from .. import lazy_exports
from .config import SingleConfig

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
__getattr__, __dir__ = lazy_exports(
    __name__, {"SingleStrategy": ".strategy", "SingleDataModule": ".datamodule"}
)

__all__ = ["SingleConfig", "SingleDataModule", "SingleStrategy"]
