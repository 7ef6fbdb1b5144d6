"""DAG instances of sampling tasks and the thread pool that runs them (spec §3.2.2).

A :class:`Task` runs ``fn(*parent_results)`` once all its parents have finished; its cost
(``cost_fn(*parent_results)``, known only then) orders it in the :class:`Executor`'s ready heap
behind every ready task of an older DAG. A DAG is finished when its ``end`` task has run. A
task's result is dropped once every child has run (the tasks and their DAG form reference
cycles, which would keep every intermediate tensor until Python's cyclic collector ran).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .scheduler import ReadyHeap


@dataclass(eq=False)
class Task:
    """One node of a DAG instance.

    Attributes:
        kind: operator name (``seed``, ``nsc``, ``merge``, ``ff``, ``target``, ``end``...).
        fn: ``fn(*parent results) -> result``.
        parents: tasks whose results ``fn`` takes, in that order.
        cost_fn: ``cost_fn(*parent results) -> float`` for the ready heap (default 0).
        hop, chunk: where the task sits in the DAG (for names and reports).
    """

    kind: str
    fn: Callable[..., Any]
    parents: Sequence[Task] = ()
    cost_fn: Callable[..., float] | None = None
    hop: int = 0
    chunk: int = 0
    children: list[Task] = field(default_factory=list)
    pending: int = 0
    unread: int = 0
    result: Any = None
    started: float | None = None
    finished: float | None = None
    runs: int = 0
    dag: Dag | None = None

    @property
    def name(self) -> str:
        return f"{self.kind}[hop {self.hop}, chunk {self.chunk}]"

    def __repr__(self) -> str:  # the dataclass repr would recurse through the whole DAG
        return f"Task({self.name}, dag {self.dag.dag_id if self.dag else None}, runs {self.runs})"


@dataclass(eq=False)
class Dag:
    """One mini-batch's sampling DAG. ``tasks`` must list parents before children and end
    with the sink ``end`` (every other task is its ancestor).

    Attributes:
        dag_id: launch order (older DAGs have smaller ids and run first).
        tasks: every task, parents before children; ``tasks[-1]`` is the sink.
        name: what the DAG is for (e.g. ``epoch 3, step 7``), for error messages.
        launched: ``time.perf_counter()`` at submission.
    """

    dag_id: int
    tasks: list[Task]
    name: str = ""
    launched: float = 0.0

    def __post_init__(self) -> None:
        known: set[int] = set()
        for task in self.tasks:
            for parent in task.parents:
                if id(parent) not in known:
                    raise ValueError(f"{task.name}: parent {parent.name} is not listed before it")
                parent.children.append(task)
            task.pending = len(task.parents)
            task.dag = self
            known.add(id(task))
        for task in self.tasks:
            task.unread = len(task.children)

    @property
    def sink(self) -> Task:
        return self.tasks[-1]

    def __repr__(self) -> str:
        return f"Dag({self.dag_id}, {self.name!r}, {len(self.tasks)} tasks)"


class TaskError(RuntimeError):
    """A sampling task raised; the message names the task and its DAG."""


class Executor:
    """A pool of threads that pop ready tasks from one :class:`ReadyHeap`.

    Args:
        num_threads: worker threads.
        on_finished: called (from a worker thread) with each DAG whose sink has run; the
            sink's result is dropped from the DAG when it returns.
        on_error: called once with the first :class:`TaskError`; the pool then stops taking
            tasks.
        before_task: called with every task just before it runs (tests inject delays or
            failures here); ``None``: nothing.
    """

    def __init__(
        self,
        num_threads: int,
        on_finished: Callable[[Dag], None],
        on_error: Callable[[TaskError], None],
        before_task: Callable[[Task], None] | None = None,
    ) -> None:
        if num_threads < 1:
            raise ValueError(f"num_threads={num_threads} must be >= 1")
        self.num_threads = num_threads
        self.on_finished, self.on_error, self.before_task = on_finished, on_error, before_task
        self.heap = ReadyHeap()
        self._cond = threading.Condition()
        self._stopped = False
        self.error: TaskError | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.num_threads):
            thread = threading.Thread(target=self._work, name=f"bytegnn-sampler-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, dag: Dag) -> None:
        """Queue the DAG's root tasks (those without parents)."""
        dag.launched = time.perf_counter()
        with self._cond:
            for task in dag.tasks:
                if not task.parents:
                    self._push(task)
            self._cond.notify_all()

    def _push(self, task: Task) -> None:
        args = [p.result for p in task.parents]
        cost = float(task.cost_fn(*args)) if task.cost_fn is not None else 0.0
        self.heap.push(task.dag.dag_id, cost, task)

    def _next(self) -> Task | None:
        with self._cond:
            while not self._stopped and not len(self.heap):
                self._cond.wait()
            return None if self._stopped else self.heap.pop()

    def _work(self) -> None:
        while (task := self._next()) is not None:
            try:
                if self.before_task is not None:
                    self.before_task(task)
                task.started = time.perf_counter()
                task.result = task.fn(*[p.result for p in task.parents])
                task.finished = time.perf_counter()
                task.runs += 1
            except Exception as exc:  # reported to the consumer, which raises it
                self._fail(task, exc)
                return
            with self._cond:
                for parent in task.parents:  # a result every child has read is not needed
                    parent.unread -= 1
                    if parent.unread == 0:
                        parent.result = None
                for child in task.children:
                    child.pending -= 1
                    if child.pending == 0:
                        try:
                            self._push(child)
                        except Exception as exc:
                            self._fail(child, exc)
                            return
                self._cond.notify_all()
            if task is task.dag.sink:
                self.on_finished(task.dag)
                task.result = None  # handed over: the consumer's reference is the only one

    def _fail(self, task: Task, exc: Exception) -> None:
        error = TaskError(
            f"ByteGNN sampling task {task.name} of DAG {task.dag.dag_id} ({task.dag.name}) "
            f"failed: {type(exc).__name__}: {exc}"
        )
        error.__cause__ = exc
        with self._cond:
            first = self.error is None
            if first:
                self.error = error
            self._stopped = True
            self._cond.notify_all()
        if first:
            self.on_error(error)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop taking tasks and join the threads (a task that is running finishes first)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout_s)
        alive = [t.name for t in self._threads if t.is_alive()]
        self._threads = []
        if alive:
            raise RuntimeError(
                f"ByteGNN sampling threads did not stop within {timeout_s} s: {alive}"
            )
