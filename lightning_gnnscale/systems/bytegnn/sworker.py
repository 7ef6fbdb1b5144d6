"""The S-Worker: one mini-batch = one DAG of small sampling tasks, launched by the coarse
controller and run by a thread pool in fine-grained order (spec §3.2; docs/systems/bytegnn.md).

DAG of a supervised mini-batch with ``K`` hops, ``c`` NSC and ``f`` FF tasks per hop::

    seed ─┬─► target                                 (target rows of the seeds)
          ├─► ff[0, 0..f)                            (feature rows of the seeds)
          └─► nsc[1, 0..c) ─► merge[1] ─┬─► ff[1, 0..f)   (rows of hop 1's new vertices)
                                        └─► nsc[2, 0..c) ─► merge[2] ─► ... ─► merge[K] ─► ff[K, ..]
    every target / ff / merge task ─► end            (assembles the Batch, hands it over)

An NSC task samples one chunk of the hop's frontier through the vertices' owners; ``merge``
joins the chunks into the hop's block (sources deduplicated across chunks, as the reference
sampler's ``BlockBuilder`` does); each FF task fetches the rows of one chunk of the hop's new
vertices as soon as that hop is merged, while the next hop samples. Sampling is keyed by
(seed, epoch, step, hop, vertex), so the blocks equal ``NeighborSampler``'s for any chunking,
thread count or timing. On a typed graph (``relation_fanouts``) every NSC task samples each
relation with its own fanout through the owners, and the blocks carry each edge's relation, as
``NeighborSampler``'s typed blocks.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ...graph.batch import Batch
from ...graph.block import Block
from ...graph.sampler import BlockBuilder, SampleKey, build_block_carried
from ...graph.seed_split import SeedSplit
from .config import DagConfig, SchedulerConfig
from .dag import Dag, Executor, Task, TaskError
from .link import LinkDag, LinkSeeds
from .scheduler import CoarseController, CpuMeter, run_coarse_loop
from .store import GraphStore


class SamplingError(RuntimeError):
    """The S-Worker cannot deliver a batch (a task failed, a peer died, or it stalled)."""


def chunk_bounds(n: int, parts: int, i: int) -> tuple[int, int]:
    """``[start, stop)`` of chunk ``i`` of ``n`` items cut into ``parts`` (``tensor_split``)."""
    base, extra = divmod(n, parts)
    start = i * base + min(i, extra)
    return start, start + base + (i < extra)


def _frontier(result) -> Tensor:
    """The vertices the next hop expands: the seeds, or a merged block's sources."""
    if isinstance(result, Block):
        return result.src_ids
    return result.ids if isinstance(result, LinkSeeds) else result


def _frontier_degree(store: GraphStore, result, a: int = 0, b: int | None = None) -> Tensor:
    """Full-graph in-degrees of :func:`_frontier` ``[a:b]``: a merged block carries its
    sources'; the seeds' come from the store."""
    if isinstance(result, Block):
        return result.src_deg[a:b]
    if isinstance(result, LinkSeeds):
        return result.deg[a:b]
    return store.degree_of(result[a:b])


@dataclass
class ByteGNNBatch(Batch):
    """A ByteGNN step's batch; ``dag_id`` is the DAG that built it (launch order)."""

    dag_id: int = -1


def batch_nbytes(batch: Batch) -> int:
    """Memory of a batch's tensors (features, target rows, blocks, their relations)."""
    tensors = [batch.x, batch.y]
    for block in batch.blocks:
        tensors += [block.src_ids, block.edge_index, block.src_deg]
        if block.edge_type is not None:
            tensors.append(block.edge_type)
    return sum(t.numel() * t.element_size() for t in tensors)


def batch_bytes_bound(
    seeds: int,
    fanouts: list[int],
    num_nodes: int,
    row_bytes: int,
    target_bytes: int,
    typed: bool = False,
) -> int | None:
    """The most :func:`batch_nbytes` of a batch of ``seeds`` seeds (``row_bytes``: one
    feature row's bytes, ``target_bytes``: one target row's): every hop's sources are at
    most ``min(N, dst * (1 + fanout))``, its edges ``dst * fanout`` (int64 ids, degrees and
    edge index, and ``typed``: each edge's relation); ``None`` with a full-neighbourhood hop
    (``-1``: no bound without the degrees). A typed graph's ``fanout`` of a hop is the sum
    of its relations' fanouts."""
    if any(f < 0 for f in fanouts):
        return None
    dst, total = seeds, seeds * target_bytes
    edge_words = 3 if typed else 2
    for fanout in fanouts:
        src = min(num_nodes, dst * (1 + fanout))
        total += 8 * (2 * src + edge_words * dst * fanout)
        dst = src
    return total + dst * row_bytes


def dag_work_s(dag: Dag) -> float:
    """Seconds the DAG's tasks ran, summed (its latency less the time it waited)."""
    return sum(t.finished - t.started for t in dag.tasks if t.finished is not None)


class SWorker:
    """Builds, launches and runs the sampling DAGs of one rank; hands batches to the trainer.

    Args:
        store: the graph store (local partition + remote access).
        split: the seeds of every step.
        fanouts: by hop from the seeds.
        seed: base of the sampling keys.
        dag: DAG shape; scheduler: coarse controller settings.
        num_threads: sampling threads.
        timeout_s: the longest :meth:`take` waits without any DAG finishing.
        cores: the cores this rank stands for (the CPU meter's 100 %).
        cpu_percent: the CPU meter (injectable for tests); default a :class:`CpuMeter` of
            this process over ``scheduler.cpu_window_ms``.
        before_task: passed to :class:`Executor` (tests inject delays or failures).
        link: link prediction's DAG parts (``None``: a node task's DAG). Its seeds are
            local training pairs: a ``negative`` task turns them into the step's seed nodes
            and ``y`` (``task.step_rows``) and a ``resolve`` task maps those nodes to gids
            through the id map before the hops sample them (module docstring).
        relation_fanouts: a typed graph's fanout of every relation per hop (``[(10, 5),
            (10, 5)]``; the store must be typed); ``None``: homogeneous, ``fanouts``.
    """

    def __init__(
        self,
        store: GraphStore,
        split: SeedSplit,
        fanouts: list[int],
        seed: int,
        dag: DagConfig,
        scheduler: SchedulerConfig,
        num_threads: int,
        timeout_s: float,
        cores: float = 1.0,
        cpu_percent: Callable[[], float] | None = None,
        before_task: Callable[[Task], None] | None = None,
        link: LinkDag | None = None,
        relation_fanouts: list[tuple[int, ...]] | None = None,
    ) -> None:
        if (relation_fanouts is not None) != store.typed:
            raise ValueError(
                "relation fanouts and a typed graph store come together (both or neither)"
            )
        if relation_fanouts is not None and (
            len(relation_fanouts) != len(fanouts)
            or any(len(hop) != store.num_relations for hop in relation_fanouts)
        ):
            raise ValueError(
                f"relation fanouts {relation_fanouts} must give {len(fanouts)} hops of "
                f"{store.num_relations} relations"
            )
        self.link = link
        self.relation_fanouts = None
        if relation_fanouts is not None:
            self.relation_fanouts = [tuple(int(f) for f in hop) for hop in relation_fanouts]
        self.store, self.split, self.fanouts, self.seed = store, split, list(fanouts), seed
        self.dag_config, self.scheduler_config = dag, scheduler
        self.timeout_s = timeout_s
        self._cpu = cpu_percent
        self.cores = cores
        x, y = store.local.x, store.local.targets.target
        most_seeds = -(-split.mine.numel() // split.steps)  # the most seeds of a step here
        target_bytes = math.prod(y.shape[1:]) * y.element_size()
        if link is not None:  # seed nodes per pair; y's rows are fewer than the nodes
            # y [pairs, 3] int64 (typed: 4, the relation last)
            most_seeds = most_seeds * link.nodes_per_pair
            target_bytes = 8 * (3 + link.targets.split.is_typed)
        hop_fanouts = self.fanouts  # per destination and hop: a typed graph's relations summed
        if self.relation_fanouts is not None:
            hop_fanouts = [-1 if -1 in hop else sum(hop) for hop in self.relation_fanouts]
        self.controller = CoarseController(
            scheduler.threshold,
            scheduler.q_floor,
            scheduler.ema_alpha,
            scheduler.max_inflight,
            scheduler.prefetch_mb * 2**20,
            batch_bytes_bound(
                most_seeds,
                hop_fanouts,
                store.book.num_nodes,
                x.shape[1] * x.element_size(),
                target_bytes,
                typed=self.relation_fanouts is not None,
            ),
        )
        self.executor = Executor(num_threads, self._finished, self._failed, before_task)
        self._cond = threading.Condition()
        self._builders = threading.local()
        self._done: dict[tuple[int, int], ByteGNNBatch] = {}
        self._done_bytes: dict[tuple[int, int], int] = {}  # batch_nbytes of each queued batch
        self._cursor: tuple[int, int] | None = None  # next (epoch, step) to launch
        self._last_taken: tuple[int, int] | None = None
        self._consuming_epoch = -1
        self.last_epoch: int | None = None  # launch nothing past it (None: no limit)
        self._inflight: set[tuple[int, int]] = set()  # launched, not finished
        self._next_dag_id = 0
        self._error: BaseException | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()
        self._returned_at: float | None = None
        self.launched = 0
        self.finished = 0

    # ------------------------------------------------------------------------ the DAG
    def _builder(self) -> BlockBuilder:
        builder = getattr(self._builders, "builder", None)
        if builder is None:
            builder = BlockBuilder(self.store.degree.numel(), self.store.degree)
            self._builders.builder = builder
        return builder

    def build_dag(self, dag_id: int, epoch: int, step: int) -> Dag:
        """The physical DAG of ``(epoch, step)``."""
        store, split, config = self.store, self.split, self.dag_config
        key = SampleKey(self.seed, epoch, step)
        width = max(1, store.local.x.shape[1])

        seed = Task("seed", lambda: split.seeds(epoch, step), cost_fn=lambda: 1.0)
        tasks = [seed]
        link = self.link
        if link is not None:  # seeds are pairs: negatives, then the seed nodes' gids

            def negative(pairs: Tensor) -> tuple[Tensor, Tensor]:
                positions = link.steps.positions(epoch, step, pairs)
                return link.task.step_rows(link.targets, pairs, positions, epoch=epoch, step=step)

            def resolve(rows: tuple[Tensor, Tensor]) -> LinkSeeds:
                return LinkSeeds(*store.resolve(rows[0]), rows[1])

            k = link.task.config.num_negatives
            neg = Task("negative", negative, [seed], cost_fn=lambda s: s.numel() * k)
            ids = Task("resolve", resolve, [neg], cost_fn=lambda r: r[0].numel())
            target = Task("target", lambda s: s.y, [ids], cost_fn=lambda s: 0.0)
            tasks += [neg, ids]
            seed = ids  # the hops start from the seed nodes
        else:
            target = Task("target", store.targets, [seed], cost_fn=lambda s: s.numel())
        tasks.append(target)
        sinks = [target]

        def fetch(hop: int, prev: Task) -> list[Task]:
            def new_vertices(result) -> Tensor:
                return _frontier(result) if hop == 0 else result.src_ids[result.num_dst :]

            out = []
            for c in range(config.ff_tasks):

                def rows(result, c=c):
                    ids = new_vertices(result)
                    a, b = chunk_bounds(ids.numel(), config.ff_tasks, c)
                    return store.features(ids[a:b])

                def cost(result, c=c):
                    a, b = chunk_bounds(new_vertices(result).numel(), config.ff_tasks, c)
                    return (b - a) * width

                out.append(Task("ff", rows, [prev], cost, hop=hop, chunk=c))
            return out

        ffs = fetch(0, seed)
        tasks += ffs
        prev = seed
        relation_fanouts = self.relation_fanouts
        for hop, fanout in enumerate(self.fanouts):
            hop_key = key.hop_key(hop)
            if relation_fanouts is not None:
                fanout = relation_fanouts[hop]
            nscs = []
            for c in range(config.nsc_tasks):

                def nsc(result, c=c, fanout=fanout, hop_key=hop_key):
                    frontier = _frontier(result)
                    a, b = chunk_bounds(frontier.numel(), config.nsc_tasks, c)
                    if relation_fanouts is not None:  # (src, dst_pos, src_deg, relations)
                        src, dst_pos, src_deg, kinds = store.sample_typed(
                            frontier[a:b], fanout, hop_key
                        )
                        return src, dst_pos + a, src_deg, kinds
                    src, dst_pos, src_deg = store.sample(frontier[a:b], fanout, hop_key)
                    return src, dst_pos + a, src_deg

                def nsc_cost(result, c=c):  # the chunk's degrees, summed (the paper's cost)
                    frontier = _frontier(result)
                    a, b = chunk_bounds(frontier.numel(), config.nsc_tasks, c)
                    return float(_frontier_degree(store, result, a, b).sum())

                nscs.append(Task("nsc", nsc, [prev], nsc_cost, hop=hop + 1, chunk=c))

            def merge(result, *parts):
                kinds = None
                if len(parts) == 1:
                    src, dst_pos, src_deg = parts[0][:3]
                    if len(parts[0]) > 3:
                        kinds = parts[0][3]
                else:
                    src = torch.cat([p[0] for p in parts])
                    dst_pos = torch.cat([p[1] for p in parts])
                    src_deg = None if parts[0][2] is None else torch.cat([p[2] for p in parts])
                    if len(parts[0]) > 3:
                        kinds = torch.cat([p[3] for p in parts])
                frontier = _frontier(result)
                if src_deg is None:  # the [N] degrees: the dense builder
                    return self._builder()(frontier, src, dst_pos, kinds)
                dst_deg = _frontier_degree(store, result)
                return build_block_carried(frontier, dst_deg, src, dst_pos, src_deg, kinds)

            def merge_cost(result, *parts):
                return float(sum(p[0].numel() for p in parts))

            merged = Task("merge", merge, [prev, *nscs], merge_cost, hop=hop + 1)
            hop_ffs = fetch(hop + 1, merged)
            tasks += [*nscs, merged, *hop_ffs]
            ffs += hop_ffs
            sinks.append(merged)
            prev = merged

        num_merges = len(self.fanouts)

        def end(targets, *rest):
            blocks = list(rest[:num_merges])[::-1]
            x = torch.cat(rest[num_merges:])
            stats = {"input_nodes": blocks[0].num_src}
            count = split.global_seed_count(step)
            stats["global_seeds"] = count  # positives under link prediction
            terms = count if link is None else link.task.loss_terms(count)
            return ByteGNNBatch(blocks, x, targets, terms, epoch, step, stats, dag_id=dag_id)

        tasks.append(Task("end", end, [target, *sinks[1:], *ffs]))
        return Dag(dag_id, tasks, name=f"epoch {epoch}, step {step}")

    # ------------------------------------------------------------------------ coarse loop
    def now_ms(self) -> float:
        return (time.perf_counter() - self._t0) * 1e3

    def cpu_percent(self) -> float:
        return self._cpu()

    def queue_len(self) -> int:
        return len(self._done)

    def queued_bytes(self) -> float:
        with self._cond:
            return float(sum(self._done_bytes.values()))

    def inflight(self) -> int:
        return len(self._inflight)

    def has_next(self) -> bool:
        with self._cond:
            if self._cursor is None or self._error is not None:
                return False
            epoch = self._cursor[0]
            if self.last_epoch is not None and epoch > self.last_epoch:
                return False
            return self.scheduler_config.prefetch_next_epoch or epoch <= self._consuming_epoch

    def launch_next(self) -> None:
        with self._cond:
            epoch, step = self._cursor
            self._cursor = (epoch, step + 1) if step + 1 < self.split.steps else (epoch + 1, 0)
            dag_id = self._next_dag_id
            self._next_dag_id += 1
            self._inflight.add((epoch, step))
            self.launched += 1
        self.executor.submit(self.build_dag(dag_id, epoch, step))

    def sleep_ms(self, ms: float) -> None:
        self._stopping.wait(ms / 1e3)

    def running(self) -> bool:
        return not self._stopping.is_set()

    def _finished(self, dag: Dag) -> None:
        batch = dag.sink.result
        batch.stats["dag_s"] = time.perf_counter() - dag.launched
        work_s, nbytes = dag_work_s(dag), batch_nbytes(batch)
        with self._cond:
            self._done[(batch.epoch, batch.step)] = batch
            self._done_bytes[(batch.epoch, batch.step)] = nbytes
            self._inflight.discard((batch.epoch, batch.step))
            self.finished += 1
            self.controller.observe_sample(work_s * 1e3, nbytes)
            self._cond.notify_all()

    def _failed(self, error: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    # ------------------------------------------------------------------------ lifecycle
    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the sampling threads and the coarse controller's thread."""
        if self._thread is not None:
            raise RuntimeError("the S-Worker is already started")
        if self._cpu is None:
            self._cpu = CpuMeter(self.cores, self.scheduler_config.cpu_window_ms / 1e3)
        self.executor.start()
        self._thread = threading.Thread(target=self._coarse, name="bytegnn-coarse", daemon=True)
        self._thread.start()

    def _coarse(self) -> None:
        try:
            run_coarse_loop(self.controller, self, self.scheduler_config.sleep_ms)
        except BaseException as exc:  # the consumer raises it
            self._failed(SamplingError(f"the ByteGNN coarse scheduler failed: {exc!r}"))

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop launching, stop the threads and join them; idempotent."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
        self.executor.stop(timeout_s)
        if thread is not None and thread.is_alive():
            raise RuntimeError(f"the ByteGNN coarse scheduler did not stop within {timeout_s} s")

    # ------------------------------------------------------------------------ consumer
    def take(self, epoch: int, step: int) -> ByteGNNBatch:
        """The batch of ``(epoch, step)``, waiting for its DAG. Steps must be taken in
        increasing order, each once; results of skipped steps are dropped."""
        key = (epoch, step)
        called = time.perf_counter()
        if self._returned_at is not None:
            self.controller.observe_train((called - self._returned_at) * 1e3)
        with self._cond:
            if self._last_taken is not None and key <= self._last_taken:
                raise SamplingError(
                    f"batch {key} requested after {self._last_taken}: each (epoch, step) is "
                    "consumed once, in order"
                )
            if self._thread is None or self._stopping.is_set():
                raise SamplingError("the ByteGNN S-Worker is not running (start it first)")
            if self._cursor is None:
                self._cursor = key
            elif key < self._cursor and key not in self._done and key not in self._inflight:
                raise SamplingError(f"batch {key} was never launched or was dropped")
            self._consuming_epoch = max(self._consuming_epoch, epoch)
            for old in [k for k in self._done if k < key]:
                del self._done[old], self._done_bytes[old]
            progress, last_finished = time.monotonic(), self.finished
            while key not in self._done:
                if self._error is not None:
                    raise SamplingError(str(self._error)) from self._error
                if self.finished != last_finished:
                    progress, last_finished = time.monotonic(), self.finished
                elif time.monotonic() - progress > self.timeout_s:
                    raise SamplingError(
                        f"no sampling DAG finished for {self.timeout_s:g} s while waiting for "
                        f"batch {key} ({len(self._inflight)} in flight)"
                    )
                self._cond.wait(0.05)
            batch = self._done.pop(key)
            del self._done_bytes[key]
            self._last_taken = key
            if step == self.split.steps - 1:
                self._consuming_epoch = epoch + 1
        if batch.epoch != epoch or batch.step != step:
            raise SamplingError(f"batch for {key} carries ({batch.epoch}, {batch.step})")
        self._returned_at = time.perf_counter()
        batch.stats["sample_s"] = self._returned_at - called
        return batch


__all__ = ["ByteGNNBatch", "SWorker", "SamplingError", "TaskError", "chunk_bounds"]
