"""ByteGNN's two-level scheduler (spec §3.2.3; docs/systems/bytegnn.md#scheduling).

- Coarse: :class:`CoarseController` decides, every poll, whether to launch the next mini-batch's
  DAG from the launch score ``T_gap_ms * f(C_util) * balance`` against ``sigma``, within a
  memory bound on the prefetched batches; :func:`run_coarse_loop` is the loop around it, with
  the clock, the CPU meter and the sleep injected so that a fake clock drives it
  deterministically in tests. The memory bound counts the queued batches at their bytes and
  reserves each DAG in flight at the largest batch seen (before any: an a-priori bound).
  :class:`CpuMeter` measures ``C_util`` over a window the kernel's CPU accounting resolves.
- Fine: :class:`ReadyHeap`, the ready tasks ordered by ``(dag_id, cost, seq)``: older DAG
  first, then cheaper task first, then FIFO.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

C_SCALE = 100.0 / math.log(101.0)  # c in f(C) = 101 - exp(C / c); f(0) = 100, f(100) = 0


def cpu_factor(c_util: float) -> float:
    """``f(C) = clamp(101 - exp(C / c), 0, 100)`` with ``c = 100 / ln 101``; ``C`` in percent."""
    return min(100.0, max(0.0, 101.0 - math.exp(c_util / C_SCALE)))


def default_sigma(
    gap_ref_ms: float = 5.0, cpu_ref: float = 80.0, balance_ref: float = 1.0
) -> float:
    """``sigma = T_gap_ref * f(C_ref) * balance_ref`` (spec decision B1: 5 ms, 80 %, 1 -> 304.4)."""
    return gap_ref_ms * cpu_factor(cpu_ref) * balance_ref


def launch_score(
    gap_ms: float,
    c_util: float,
    t_sample_ms: float | None,
    t_train_ms: float | None,
    queue_len: int,
    q_floor: float = 0.5,
    inflight: int = 0,
) -> float:
    """The launch score ``T_gap * f(C) * T_sample / (T_train * max(Q + inflight, q_floor))``.

    The supply is the finished batches ``Q`` plus the DAGs in flight (each will be a batch
    the trainer has to consume): counting only ``Q`` launched the whole run's DAGs at once.
    ``t_sample_ms`` / ``t_train_ms`` are ``None`` until one DAG has finished and one step has
    trained (cold start): their ratio is then taken as 1, so the balance is 1 with nothing
    supplied (spec decision B2) and ``1 / supply`` beyond.
    """
    if t_sample_ms is None or t_train_ms is None:
        balance = 1.0 / max(queue_len + inflight, 1)
    else:
        supply = max(queue_len + inflight, q_floor)
        balance = t_sample_ms / (max(t_train_ms, 1e-9) * supply)
    return gap_ms * cpu_factor(c_util) * balance


class CpuMeter:
    """``C_util``: this process's CPU time (all its threads: trainer, sampling, service) over
    the last window, in percent of ``cores`` cores' time, clamped to [0, 100].

    A poll inside the window returns the last complete window's value: a 5 ms poll of
    tick-based counters reads only 0 or 100. The process's own time (not the machine's) is
    used because a rank stands for one ByteGNN machine, whose ``cores`` are its share of this
    host; other tenants of a shared host do not enter.

    Args:
        cores: the cores this rank stands for.
        window_s: the shortest window.
        cpu_time, clock: seconds of CPU time and of wall time (injectable for tests).
    """

    def __init__(
        self,
        cores: float,
        window_s: float = 0.1,
        cpu_time: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if cores <= 0 or window_s <= 0:
            raise ValueError(f"cores={cores} and window_s={window_s} must be > 0")
        self.cores, self.window_s, self._cpu_time, self._clock = cores, window_s, cpu_time, clock
        self._t0, self._c0 = clock(), cpu_time()
        self.value = 0.0

    def __call__(self) -> float:
        now = self._clock()
        elapsed = now - self._t0
        if elapsed >= self.window_s:
            used = self._cpu_time()
            share = (used - self._c0) / (elapsed * self.cores)
            self.value = min(100.0, max(0.0, 100.0 * share))
            self._t0, self._c0 = now, used
        return self.value


def ema(old: float | None, sample: float, alpha: float) -> float:
    """Exponential moving average; the first sample starts it."""
    return sample if old is None else (1 - alpha) * old + alpha * sample


@dataclass
class Decision:
    """One poll of the coarse loop (kept for the trajectory report and the tests)."""

    now_ms: float
    score: float
    c_util: float
    queue_len: int
    inflight: int
    launched: bool
    prefetch_bytes: float = 0.0  # the queued batches' bytes + the in-flight DAGs' reservations


@dataclass
class CoarseController:
    """The launch decision of Algorithm 1 plus the two EMAs it reads.

    Args:
        sigma: launch threshold.
        q_floor: lower bound of the supply ``Q + inflight`` in the balance (finite at 0).
        ema_alpha: weight of a new sample in ``T_avg_sample`` / ``T_avg_train`` and the
            batch size.
        max_inflight: never launch while this many DAGs run (``None``: no limit).
        max_prefetch_bytes: never launch a DAG whose reservation would take the prefetched
            batches past this (``None``: no bound): the queued ones at their exact bytes, each
            DAG in flight at :attr:`reserve_bytes`.
        batch_bound: the most bytes one batch can take, known before any has finished
            (``None``: not known, e.g. a full-neighbourhood hop); the reservation until then.
        keep_trace: how many recent decisions to keep (the trajectory).
        batch_bytes: the largest finished batch so far.
    """

    sigma: float
    q_floor: float = 0.5
    ema_alpha: float = 0.1
    max_inflight: int | None = None
    max_prefetch_bytes: float | None = None
    batch_bound: float | None = None
    keep_trace: int = 100_000
    t_sample_ms: float | None = None
    t_train_ms: float | None = None
    batch_bytes: float | None = None
    last_launch_ms: float = 0.0
    trace: list[Decision] = field(default_factory=list)

    def observe_sample(self, work_ms: float, batch_bytes: float | None = None) -> None:
        """A DAG finished: its tasks ran ``work_ms`` in all (not its latency, which grows with
        the DAGs queued beside it) and its batch takes ``batch_bytes``."""
        self.t_sample_ms = ema(self.t_sample_ms, work_ms, self.ema_alpha)
        if batch_bytes is not None:
            self.batch_bytes = max(self.batch_bytes or 0.0, batch_bytes)

    def observe_train(self, step_ms: float) -> None:
        """The T-Worker spent ``step_ms`` on one step."""
        self.t_train_ms = ema(self.t_train_ms, step_ms, self.ema_alpha)

    @property
    def reserve_bytes(self) -> float | None:
        """What a DAG in flight is counted at: the largest finished batch, else the a-priori
        bound (``None``: neither is known)."""
        return self.batch_bytes if self.batch_bytes is not None else self.batch_bound

    def prefetch_bytes(self, queued_bytes: float, inflight: int) -> float:
        """The prefetched batches' bytes: the queued ones' plus the reservations in flight."""
        return queued_bytes + inflight * (self.reserve_bytes or 0.0)

    def memory_room(self, queued_bytes: float, inflight: int) -> bool:
        """One more DAG's reservation stays within ``max_prefetch_bytes``; never while no size
        is known (only the idle launch then)."""
        if self.max_prefetch_bytes is None:
            return True
        reserve = self.reserve_bytes
        if reserve is None:
            return False
        return self.prefetch_bytes(queued_bytes, inflight + 1) <= self.max_prefetch_bytes

    def decide(
        self, now_ms: float, c_util: float, queue_len: int, inflight: int, queued_bytes: float
    ) -> bool:
        """Launch now? ``score >= sigma``, ``inflight < max_inflight`` and memory room; or
        nothing runs and nothing waits (``min_inflight = 1``: the system cannot stall).
        ``queued_bytes``: the exact bytes of the ``queue_len`` finished batches."""
        score = launch_score(
            now_ms - self.last_launch_ms,
            c_util,
            self.t_sample_ms,
            self.t_train_ms,
            queue_len,
            self.q_floor,
            inflight,
        )
        idle = inflight == 0 and queue_len == 0
        room = (self.max_inflight is None or inflight < self.max_inflight) and self.memory_room(
            queued_bytes, inflight
        )
        launch = idle or (room and score >= self.sigma)
        if len(self.trace) >= self.keep_trace:
            del self.trace[: self.keep_trace // 2]
        held = self.prefetch_bytes(queued_bytes, inflight + launch)
        self.trace.append(Decision(now_ms, score, c_util, queue_len, inflight, launch, held))
        if launch:
            self.last_launch_ms = now_ms
        return launch


class CoarseEnv(Protocol):
    """What the coarse loop reads and drives (the S-Worker, or a simulation in tests)."""

    def now_ms(self) -> float: ...
    def cpu_percent(self) -> float: ...
    def queue_len(self) -> int: ...
    def queued_bytes(self) -> float: ...
    def inflight(self) -> int: ...
    def has_next(self) -> bool: ...
    def launch_next(self) -> None: ...
    def sleep_ms(self, ms: float) -> None: ...
    def running(self) -> bool: ...


def run_coarse_loop(controller: CoarseController, env: CoarseEnv, sleep_ms: float = 5.0) -> None:
    """Algorithm 1: while ``env.running()``, poll; launch the next DAG when the controller says
    so, otherwise sleep ``sleep_ms``. The CPU meter is read on every poll."""
    while env.running():
        c_util = env.cpu_percent()
        if env.has_next() and controller.decide(
            env.now_ms(), c_util, env.queue_len(), env.inflight(), env.queued_bytes()
        ):
            env.launch_next()
        else:
            env.sleep_ms(sleep_ms)


class ReadyHeap:
    """Ready tasks, popped in ``(dag_id, cost, seq)`` order (``seq``: push order). Not locked:
    the executor holds its lock around it."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Any]] = []
        self._seq = 0

    def push(self, dag_id: int, cost: float, item: Any) -> None:
        heapq.heappush(self._heap, (dag_id, cost, self._seq, item))
        self._seq += 1

    def pop(self) -> Any:
        return heapq.heappop(self._heap)[3]

    def __len__(self) -> int:
        return len(self._heap)
