"""The system contract: what a strategy hands the other components of a run, once.

A system is a :class:`~.kit.strategies.SystemStrategy` subclass, a
:class:`~.kit.datamodule.GNNDataModule` subclass and a :class:`~.config_types.SystemConfig` subclass
that both receive. The pieces meet through three typed objects (docs/architecture.md, "The
system contract"):

- :class:`RankContext`: this rank's metered ``comm`` (rank, world size, topology, meter) and
  device. The strategy makes it once the process group exists; the DataModule receives it when
  it binds to the strategy (:func:`bind_datamodule`), callbacks read it with
  :func:`rank_context`.
- :class:`ModuleRuntime`: what the LightningModule needs from the strategy (the context and,
  for systems that move rows between layers, the :data:`LayerHook`), handed once in the
  strategy's ``setup`` through :meth:`RuntimeAware.configure_runtime`.
- :class:`Evaluation`: the one item of the validation and test loaders; it runs this rank's
  share of full-graph evaluation and sums the task's statistics over ranks.
- :class:`Prediction`: the one item of the predict loader; it computes this rank's share of
  the requested nodes' logits or embeddings.

A leaf of the suite: it imports no system, no registry and no model (the models, the
callbacks and every system import it; ``tests/test_startup.py::test_no_import_circle``).

Loader items are plain objects, not dataclasses: Lightning's collection utilities
(``apply_to_collection`` in its precision plugins) pass them through whole.

Per-step inputs of an algorithm travel in typed fields of the system's ``Batch`` subclass;
``Batch.stats`` holds timings and counts for reports only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    import lightning as L

    from .comm import Comm, CommMeter, Topology
    from .config_types import DataConfig, RunFacts, SystemConfig
    from .graph.batch import Batch
    from .tasks.base import NodeTask

LayerHook = Callable[[int, Tensor], Tensor]
"""``hook(i, h) -> h``: called on the rows ``h`` entering layer ``i`` (GSplit's shuffle,
GraNNDIS's halo exchange); see :class:`ModuleRuntime`."""

SUITE_STRATEGY_NAMES: list[str] = []
"""The suite's strategy names as Lightning knows them (``data_parallel``...), for the error of
:func:`rank_context` when a Trainer runs another strategy; the registry fills it when it
registers them with Lightning (this module imports no registry)."""


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

    def __post_init__(self) -> None:
        make = self.layer_hook
        if make is None:
            return
        calls = [0]

        def layer_hook(batch: Batch) -> LayerHook:
            calls[0] += 1
            return make(batch)

        object.__setattr__(self, "layer_hook", layer_hook)
        object.__setattr__(self, "_calls", calls)

    @property
    def layer_hook_unused(self) -> bool:
        """Whether this runtime has a layer hook that the module has never asked for."""
        return self.layer_hook is not None and self._calls[0] == 0


@runtime_checkable
class RuntimeAware(Protocol):
    """A LightningModule (or net) that accepts the strategy's :class:`ModuleRuntime`."""

    def configure_runtime(self, runtime: ModuleRuntime) -> None: ...


class Evaluation:
    """The single item of a system's validation / test loader.

    ``statistics(net, splits)`` returns this rank's ``[len(splits), k]`` float64 summable
    statistics of the task (:func:`~.tasks.base.split_statistics`); :meth:`metrics` sums them
    over ranks (metered ``control``) and has the task turn the sums into metrics. Every rank
    must call it (it is collective).
    """

    def __init__(
        self, statistics: Callable[[nn.Module, tuple[str, ...]], Tensor], comm: Comm, task: NodeTask
    ):
        self.statistics, self.comm, self.task = statistics, comm, task

    @torch.no_grad()
    def metrics(self, net: nn.Module, splits: tuple[str, ...] = ("val", "test")) -> dict:
        """``{split: {metric: value}}`` of ``net`` over the whole graph (e.g.
        ``{"val": {"acc": 0.8}}``)."""
        sums = self.comm.all_reduce(self.statistics(net, splits), category="control")
        return {s: self.task.metric_values(row) for s, row in zip(splits, sums)}


PREDICT_OUTPUTS = ("logits", "embeddings")


class Prediction:
    """The single item of a system's predict loader (``trainer.predict``).

    :meth:`rows` returns ``{"node_ids": [n], output: [n, d]}`` for this rank's share of the
    requested nodes (the shares of all ranks partition them, as in evaluation); ``output`` is
    ``logits`` (the last layer) or ``embeddings`` (the input of the last layer: the hidden
    representation after the previous layers). Every rank must call it (it is collective).
    """

    def __init__(
        self,
        rows: Callable[[nn.Module, Tensor | None, str], tuple[Tensor, Tensor]],
        node_ids: Tensor | None,
        output: str,
    ):
        if output not in PREDICT_OUTPUTS:
            raise ValueError(f"output={output!r} is unknown; valid: {list(PREDICT_OUTPUTS)}")
        self._rows, self.node_ids, self.output = rows, node_ids, output

    @torch.no_grad()
    def rows(self, net: nn.Module) -> dict[str, Tensor]:
        ids, rows = self._rows(net, self.node_ids, self.output)
        return {"node_ids": ids, self.output: rows}


@runtime_checkable
class SuiteStrategy(Protocol):
    """What :class:`~.kit.strategies.SystemStrategy` offers the other components (this module
    imports no system, so the check is by these methods, which no Lightning strategy has)."""

    def bind(
        self,
        config: SystemConfig,
        data: DataConfig | None = None,
        complete_checkpoint: Callable[[dict], None] | None = None,
    ) -> RankContext: ...

    def checked_already(self, config: SystemConfig, facts: RunFacts) -> bool: ...

    def module_runtime(self) -> ModuleRuntime: ...


def _suite_strategy(trainer: L.Trainer) -> SuiteStrategy:
    strategy = trainer.strategy
    if not isinstance(strategy, SuiteStrategy):
        raise TypeError(
            f"lightning_gnnscale needs one of its own strategies, but the Trainer runs "
            f"{type(strategy).__name__}; pass strategy=<name> with a name from "
            f"{sorted(SUITE_STRATEGY_NAMES)} (Lightning's own 'ddp' is "
            "not metered: use 'data_parallel'), or the Strategy of lightning_gnnscale.system(name)"
        )
    return strategy


def rank_context(trainer: L.Trainer) -> RankContext:
    """The running suite strategy's :class:`RankContext` (for callbacks)."""
    return _suite_strategy(trainer).context


def bind_datamodule(
    trainer: L.Trainer,
    config: SystemConfig,
    data: DataConfig | None = None,
    complete_checkpoint: Callable[[dict], None] | None = None,
) -> RankContext:
    """Bind a DataModule's system config to the Trainer's strategy and return the context.

    The strategy must be the system's (a GSplit DataModule cannot run under DistDGL's
    strategy); a strategy created by name adopts the DataModule's config, one created with a
    config must have the same one. The config's rules that involve the model, the data or the
    world size (:func:`~lightning_gnnscale.config_types.check_run`) are checked here, where the
    strategy, the DataModule, the LightningModule and the Trainer meet, before any step: a
    plain Lightning script is held to the rules ``train.py`` checks. A strategy built from a
    typed run (``from_run``) does not check them again for that run. The strategy calls
    ``complete_checkpoint`` on each checkpoint it loads (Lightning restores one after the
    DataModule's ``setup``), so it never reaches for the Trainer's DataModule.
    """
    return _suite_strategy(trainer).bind(config, data, complete_checkpoint)
