"""The system contract: what a strategy hands the other components of a run, once.

A system is a :class:`~.base.SystemStrategy` subclass, a :class:`~.base.GNNDataModule`
subclass and a :class:`~lightning_gnnscale.schema.SystemConfig` subclass that both receive.
The pieces meet through three typed objects (docs/architecture.md, "The system contract"):

- :class:`RankContext`: this rank's metered ``comm`` (rank, world size, topology, meter) and
  device. The strategy makes it once the process group exists; the DataModule receives it when
  it binds to the strategy (:func:`bind_datamodule`), callbacks read it with
  :func:`rank_context`.
- :class:`ModuleRuntime`: what the LightningModule needs from the strategy (the context and,
  for systems that move rows between layers, the layer hook), handed once in the strategy's
  ``setup`` through :meth:`RuntimeAware.configure_runtime`.
- :class:`Evaluation`: the one item of the validation and test loaders; it runs this rank's
  share of full-graph evaluation and sums the counts over ranks.

Per-step inputs of an algorithm travel in typed fields of the system's ``Batch`` subclass;
``Batch.stats`` holds timings and counts for reports only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from ..comm import Comm, CommMeter, Topology
from ..graph.batch import Batch
from ..models.gnn import LayerHook

if TYPE_CHECKING:
    import lightning as L

    from ..schema import SystemConfig


@dataclass(frozen=True)
class RankContext:
    """This rank's metered communication and device.

    Attributes:
        comm: the metered collectives on the strategy's data-exchange group (world size 1: a
            local ``Comm`` whose collectives are no-ops).
        device: where this rank's model and batches live.
    """

    comm: Comm
    device: torch.device

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    @property
    def meter(self) -> CommMeter:
        return self.comm.meter

    @property
    def topology(self) -> Topology:
        return self.comm.topology


@dataclass(frozen=True)
class ModuleRuntime:
    """What a LightningModule receives from the strategy before training starts.

    Attributes:
        context: the rank's context (e.g. to reduce epoch figures through the meter).
        layer_hook: ``make(batch) -> hook(i, h)`` for systems that move rows before every
            layer (GSplit's shuffle); ``None`` for the others.
    """

    context: RankContext
    layer_hook: Callable[[Batch], LayerHook] | None = None


@runtime_checkable
class RuntimeAware(Protocol):
    """A LightningModule (or net) that accepts the strategy's :class:`ModuleRuntime`."""

    def configure_runtime(self, runtime: ModuleRuntime) -> None: ...


@dataclass(frozen=True)
class Evaluation:
    """The single item of a system's validation / test loader.

    ``counts(net, splits)`` returns this rank's ``[len(splits), 2]`` float64 (correct, total);
    :meth:`accuracy` sums them over ranks (metered ``control``). Every rank must call it
    (it is collective).
    """

    counts: Callable[[nn.Module, tuple[str, ...]], Tensor]
    comm: Comm

    @torch.no_grad()
    def accuracy(self, net: nn.Module, splits: tuple[str, ...] = ("val", "test")) -> dict:
        """``{split: accuracy}`` of ``net`` over the whole graph."""
        counts = self.comm.all_reduce(self.counts(net, splits), category="control")
        return {s: float(c[0] / c[1].clamp(min=1)) for s, c in zip(splits, counts)}


@runtime_checkable
class SuiteStrategy(Protocol):
    """What :class:`~.base.SystemStrategy` offers the other components (base imports this
    module, so the check is by these methods, which no Lightning strategy has)."""

    def bind(self, config: SystemConfig) -> RankContext: ...

    def module_runtime(self) -> ModuleRuntime: ...


def _suite_strategy(trainer: L.Trainer) -> SuiteStrategy:
    strategy = trainer.strategy
    if not isinstance(strategy, SuiteStrategy):
        from .registry import SYSTEMS

        raise TypeError(
            f"lightning_gnnscale needs one of its own strategies, but the Trainer runs "
            f"{type(strategy).__name__}; pass strategy=<name> with a name from "
            f"{sorted(SYSTEMS)} (Lightning's own 'ddp' is not metered: use 'metered_ddp')"
        )
    return strategy


def rank_context(trainer: L.Trainer) -> RankContext:
    """The running suite strategy's :class:`RankContext` (for callbacks)."""
    return _suite_strategy(trainer).context


def bind_datamodule(trainer: L.Trainer, config: SystemConfig) -> RankContext:
    """Bind a DataModule's system config to the Trainer's strategy and return the context.

    The strategy must be the system's (a GSplit DataModule cannot run under DistDGL's
    strategy); a strategy created by name adopts the DataModule's config, one created with a
    config must have the same one.
    """
    return _suite_strategy(trainer).bind(config)
