"""Shared Strategy and DataModule machinery for every system.

- :class:`MeteredSingleDeviceStrategy` and :class:`MeteredDDPStrategy` own the run's
  :class:`CommMeter` and a :class:`Comm`; the DDP one registers the metered gradient hook on CPU
  too (Lightning only does so on CUDA) and routes Lightning's own barrier / broadcast / reduce
  through ``comm`` so that every byte between processes is counted.
- :class:`SampledDataModule` turns a graph into per-rank mini-batches: a shared seeded
  permutation of the training nodes per epoch, cut into global steps, each split across ranks,
  sampled with the hash-keyed sampler. Evaluation is full-graph layer-wise inference.
"""

from __future__ import annotations

import io
import pickle
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, Dataset, Sampler

from ..comm import (
    REDUCE_OPS,
    Comm,
    CommMeter,
    GradientHookState,
    Topology,
    register_metered_ddp_hook,
)
from ..graph.batch import Batch
from ..graph.cache import tensor_digest
from ..graph.csc import Graph
from ..graph.order import EpochOrder
from ..graph.sampler import NeighborSampler
from ..models.gnn import BlockGNN, SubgraphModel, layerwise_inference


class MeteredSingleDeviceStrategy(SingleDeviceStrategy):
    """One process; its ``comm`` is local (every collective a no-op that counts nothing)."""

    def __init__(self, device: str = "cpu", **kwargs):
        super().__init__(device=torch.device(device), **kwargs)
        self.meter = CommMeter()
        self.comm = Comm.local(self.meter)
        self.topology = Topology.single()


def ddp_strategy_kwargs(cfg) -> dict:
    """The :class:`MeteredDDPStrategy` arguments every DDP-family system takes from its config."""
    return {
        "servers": cfg.topology.servers,
        "timeout_s": cfg.launcher.collective_timeout_s,
        "process_group_backend": cfg.strategy.process_group_backend,
    }


class MeteredDDPStrategy(DDPStrategy):
    """DDP whose gradient all-reduce and bookkeeping collectives go through the metered ``comm``.

    Gradients are summed, not averaged: the loss is already divided by the global seed count.

    Args:
        servers: simulated servers (``topology.servers``); ``None`` = Lightning's ``num_nodes``.
        timeout_s: a collective that waits longer than this fails instead of hanging.
    """

    def __init__(
        self,
        servers: int | None = None,
        timeout_s: float = 300.0,
        process_group_backend: str | None = None,
        **kwargs,
    ):
        kwargs.setdefault("find_unused_parameters", False)
        # DDP's own start-up sync (a shape all-gather and a state broadcast) would bypass the
        # meter; ``configure_ddp`` broadcasts the weights through ``comm`` instead.
        kwargs.setdefault("init_sync", False)
        super().__init__(
            process_group_backend=process_group_backend,
            timeout=timedelta(seconds=timeout_s),
            **kwargs,
        )
        self.servers = servers
        self.timeout_s = timeout_s
        self.meter = CommMeter()
        self.comm = Comm.local(self.meter)
        self.topology = Topology.single()
        self.grad_hook_state: GradientHookState | None = None

    def setup_distributed(self) -> None:
        super().setup_distributed()
        self.topology = Topology.from_launch(self.world_size, self.num_nodes, self.servers)
        # On GPU the world group is NCCL, but ids, counts and flags stay on the CPU: give the
        # exchange group both backends so every tensor finds its own.
        backend = "cpu:gloo,cuda:nccl" if self.root_device.type == "cuda" else None
        self.comm = Comm.create(
            self.meter, self.topology, backend=backend, timeout_s=self.timeout_s
        )

    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        # Lightning (2.6) broadcasts a SIGTERM flag on the world group before every training
        # step, outside the strategy; send the same flag through the metered comm instead.
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = self._broadcast_sigterm_flag

    def _broadcast_sigterm_flag(self) -> None:
        flag = torch.tensor(
            [int(getattr(self.lightning_module.trainer, "received_sigterm", False))]
        )
        if int(self.comm.broadcast(flag, 0, category="control")) == 1:
            self.comm.barrier()
            raise SIGTERMException()

    def broadcast_initial_weights(self) -> None:
        """Rank 0's initial parameters and buffers to every rank (``parameter`` bytes)."""
        for tensor in [*self.model.parameters(), *self.model.buffers()]:
            self.comm.broadcast(tensor.data, 0, category="parameter")

    def configure_ddp(self) -> None:
        self.broadcast_initial_weights()
        super().configure_ddp()
        state = GradientHookState(self.comm.with_group(self.model.process_group), scale=1.0)
        self.grad_hook_state = register_metered_ddp_hook(self.model, state)

    # Lightning's own cross-rank bookkeeping, metered as `control`.
    def barrier(self, name: str | None = None) -> None:
        self.comm.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not self.comm.is_distributed:
            return obj
        payload = pickle.dumps(obj) if self.global_rank == src else b""
        size = self.comm.broadcast(torch.tensor([len(payload)]), src, category="control")
        data = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            if payload
            else (torch.empty(int(size), dtype=torch.uint8))
        )
        data = self.comm.broadcast(data, src, category="control")
        return pickle.load(io.BytesIO(data.numpy().tobytes()))

    def reduce(self, tensor, group: Any = None, reduce_op: Any = "mean") -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor):
            return tensor
        name = str(getattr(reduce_op, "name", reduce_op)).lower().split(".")[-1]
        average = name in ("mean", "avg")
        op = "sum" if average else name
        if op not in REDUCE_OPS:
            raise ValueError(
                f"reduce_op={reduce_op!r} is not supported; valid: mean, {', '.join(REDUCE_OPS)}"
            )
        out = self.comm.all_reduce(
            tensor.detach().clone().to(torch.float64), op, category="control"
        )
        return (out / self.world_size if average else out).to(tensor.dtype)


def assert_same_on_all_ranks(comm: Comm, values: torch.Tensor, what: str) -> None:
    """Fail loudly if ``values`` (e.g. a partition every rank computed or loaded) differs
    between ranks: mismatched split functions would silently corrupt results or hang."""
    digest = torch.tensor([int(tensor_digest(values)[:15], 16)], dtype=torch.int64)
    digests = comm.all_gather_tensor(digest, category="control")
    if bool((digests != digests[0]).any()):
        raise RuntimeError(
            f"{what} differs between ranks (digests {digests.tolist()}); "
            "every rank must use the same dataset, config and code version"
        )


# ------------------------------------------------------------------------------- data


class EpochSteps(Sampler):
    """Yields ``(epoch, step)`` for the epoch about to run (iterated in the main process).

    The epoch is the fit loop's count of processed epochs: ``trainer.current_epoch`` still
    names the checkpoint's epoch when Lightning builds the first iterator of a resumed run, and
    a counter of ``iter`` calls breaks when Lightning probes the loader (it does so with
    DataLoader workers). Covered by the resume and worker tests.
    """

    def __init__(self, dm: GNNDataModule):
        self.dm = dm

    def __len__(self) -> int:
        return self.dm.steps_per_epoch

    def __iter__(self):
        trainer = self.dm.trainer
        epoch = trainer.fit_loop.epoch_progress.current.processed if trainer else 0
        return iter([(epoch, step) for step in range(self.dm.steps_per_epoch)])


@dataclass
class StepBatcher(Dataset):
    """Builds one rank's batch of a step; self-contained so DataLoader workers (spawned inside
    spawned ranks) can pickle it without the Trainer. Indexed by ``(epoch, step)``."""

    graph: Graph
    sampler: NeighborSampler
    train_ids: torch.Tensor
    batch_size: int
    seed: int
    rank: int
    world_size: int
    salt_by_rank: bool

    def __len__(self) -> int:
        return -(-self.train_ids.numel() // self.batch_size)

    def __post_init__(self) -> None:
        self.order = EpochOrder(self.train_ids, self.seed)

    def step_seeds(self, epoch: int, step: int) -> torch.Tensor:
        """All ranks' seeds of one global step."""
        return self.order.step(epoch, step, self.batch_size)

    def __getitem__(self, key: tuple[int, int]) -> Batch:
        """This rank's share of step ``step``: sample, then gather input rows and labels."""
        epoch, step = key
        global_seeds = self.step_seeds(epoch, step)
        seeds = torch.tensor_split(global_seeds, self.world_size)[self.rank]
        start = time.perf_counter()
        salt = self.rank if self.salt_by_rank else 0
        blocks = self.sampler.sample(seeds, epoch=epoch, step=step, salt=salt)
        sampled = time.perf_counter()
        x = self.graph.x.index_select(0, blocks[0].src_ids)
        y = self.graph.y.index_select(0, seeds)
        stats = {
            "sample_s": sampled - start,
            "load_s": time.perf_counter() - sampled,
            "input_nodes": blocks[0].num_src,
        }
        return Batch(blocks, x, y, global_seeds.numel(), epoch, step, stats)


def _no_collate(batch):
    return batch


class _CollectiveSteps(Dataset):
    """Steps of a DataModule whose ``make_batch(epoch, step)`` runs collectives."""

    def __init__(self, dm: GNNDataModule):
        self.dm = dm

    def __len__(self) -> int:
        return self.dm.steps_per_epoch

    def __getitem__(self, key: tuple[int, int]) -> Batch:
        return self.dm.make_batch(*key)


def collective_train_loader(dm: GNNDataModule) -> DataLoader:
    """Train loader for batches built with collectives: main process, strict step order."""
    return DataLoader(
        _CollectiveSteps(dm),
        sampler=EpochSteps(dm),
        batch_size=None,
        collate_fn=_no_collate,
        num_workers=0,
    )


class GNNDataModule(L.LightningDataModule):
    """What every system's DataModule shares: one evaluation pass per rank through
    ``eval_counts`` (called by ``GNNModule``), ``steps_per_epoch`` for :class:`EpochSteps`,
    and moving :class:`Batch` es to the device. Subclasses set ``input_dim`` (width of
    ``Batch.x``) and ``num_classes``."""

    input_dim: int
    num_classes: int

    @property
    def steps_per_epoch(self) -> int:
        raise NotImplementedError

    def eval_counts(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        """``[len(splits), 2]`` float64 (correct, total) of this rank; the caller sums ranks."""
        raise NotImplementedError

    def _eval_loader(self) -> DataLoader:
        return DataLoader([0], batch_size=None)  # one evaluation pass per rank

    val_dataloader = _eval_loader
    test_dataloader = _eval_loader

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch.to(device) if isinstance(batch, Batch) else batch


class SampledDataModule(GNNDataModule):
    """Per-rank sampled mini-batches over a graph that every rank holds whole.

    Args:
        graph: the dataset (features already in the run's dtype).
        fanouts: by hop from the seeds; ``-1`` = all neighbours.
        batch_size: global seeds per step (split across ranks); ``-1`` = all training nodes.
        seed: base of the epoch permutation and of the sampling keys.
        salt_by_rank: rank-salted sampling keys (independent micro-batches, as data-parallel
            systems sample); ``False`` makes ranks sample exactly what one process would.
        num_workers: DataLoader processes that sample ahead.
        eval_chunk_size: destination nodes per chunk in layer-wise inference.
    """

    def __init__(
        self,
        graph: Graph,
        fanouts: list[int],
        batch_size: int,
        seed: int = 0,
        salt_by_rank: bool = False,
        num_workers: int = 0,
        eval_chunk_size: int = 65536,
    ):
        super().__init__()
        self.graph = graph
        self.input_dim, self.num_classes = graph.num_features, graph.num_classes
        self.fanouts = list(fanouts)
        self.seed = seed
        self.salt_by_rank = salt_by_rank
        self.num_workers = num_workers
        self.eval_chunk_size = eval_chunk_size
        self.train_ids = graph.split_ids("train")
        if self.train_ids.numel() == 0:
            raise ValueError(f"dataset {graph.name!r} has no training nodes")
        self.batch_size = self.train_ids.numel() if batch_size == -1 else batch_size
        self.sampler = NeighborSampler(graph.indptr, graph.indices, self.fanouts, seed)
        self.rank, self.world_size = 0, 1

    def setup(self, stage: str) -> None:
        if self.trainer is not None:
            self.rank, self.world_size = self.trainer.global_rank, self.trainer.world_size

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.train_ids.numel() // self.batch_size)

    def batcher(self) -> StepBatcher:
        """The batch maker for this rank (rank and world size as set up)."""
        return StepBatcher(
            self.graph,
            self.sampler,
            self.train_ids,
            self.batch_size,
            self.seed,
            self.rank,
            self.world_size,
            self.salt_by_rank,
        )

    def make_batch(self, epoch: int, step: int) -> Batch:
        """This rank's share of step ``step``."""
        return self.batcher()[epoch, step]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.batcher(),
            sampler=EpochSteps(self),
            batch_size=None,
            collate_fn=_no_collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def eval_counts(self, net: torch.nn.Module, splits: tuple[str, ...]) -> torch.Tensor:
        return replicated_eval_counts(
            self.graph, net, splits, self.rank, self.world_size, self.eval_chunk_size
        )


@torch.no_grad()
def full_logits(graph: Graph, net: torch.nn.Module, chunk_size: int) -> torch.Tensor:
    """Full-neighbourhood logits of every node ``[N, C]``."""
    device = next(net.parameters()).device
    if isinstance(net, SubgraphModel):
        return net.model(graph.x.to(device), graph.edge_index().to(device))
    assert isinstance(net, BlockGNN)
    return layerwise_inference(net, graph.indptr, graph.indices, graph.x.to(device), chunk_size)


def replicated_eval_counts(
    graph: Graph,
    net: torch.nn.Module,
    splits: tuple[str, ...],
    rank: int,
    world_size: int,
    chunk_size: int,
) -> torch.Tensor:
    """``[len(splits), 2]`` float64 (correct, total) over this rank's share of each split.

    For systems whose ranks hold the whole graph: each rank runs full-graph layer-wise inference
    and counts every ``world_size``-th node; the caller sums the counts over ranks.
    """
    pred = full_logits(graph, net, chunk_size).argmax(1).cpu()
    counts = torch.zeros(len(splits), 2, dtype=torch.float64)
    for i, split in enumerate(splits):
        ids = graph.split_ids(split)[rank::world_size]
        counts[i, 0] = (pred[ids] == graph.y[ids]).sum()
        counts[i, 1] = ids.numel()
    return counts
