"""Audit of ``torch.distributed`` calls: is every byte on the wire accounted for by the meter?

``CollectiveRecorder`` patches the Python collectives of ``torch.distributed`` (and of
``torch.distributed.distributed_c10d``, so calls made inside c10d, such as the tensor
collectives behind ``all_gather_object``, are seen too) and records each call. The metered
``Comm`` methods wrap their ``torch.distributed`` call in ``metered_call(category,
counted_bytes)`` and the meter reductions in ``bookkeeping_call()``; a recorded call carries
that mark, so a test can demand that every call came from a metered path and that the bytes
the meter counted equal the bytes the marked calls claimed.

Known framework calls: Lightning (2.6) broadcasts a one-element SIGTERM flag on the world group
before every training step, from its training loop, outside any strategy hook. The suite does
not patch Lightning to meter it; the recorder marks such calls (``KNOWN_FRAMEWORK_CALLS``) with
their origin, the audit reports their count and bytes apart, and the meter does not count them.

Blind spots: code that bound a collective before the recorder started (``from
torch.distributed import all_reduce``) and DDP's C++ reducer (its bucket all-reduce is seen only
through a Python comm hook such as ``metered_allreduce_hook``). DDP's parameter and buffer
broadcasts go through ``torch.distributed._broadcast_coalesced``, which is recorded.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from lightning_gnnscale.comm.meter import CATEGORIES


class _Mark(threading.local):
    """The mark of the collective this thread is issuing, and the recorder's nesting depth."""

    category: str | None = None
    counted_bytes: int = 0
    bookkeeping: bool = False
    collective: str | None = None
    depth: int = 0


_mark = _Mark()


class _MarkedCall:
    """Context manager that marks the ``torch.distributed`` calls issued inside it."""

    __slots__ = ("_category", "_counted_bytes", "_bookkeeping", "_collective")

    def __init__(
        self,
        category: str | None,
        counted_bytes: int,
        bookkeeping: bool,
        collective: str | None = None,
    ) -> None:
        self._category = category
        self._counted_bytes = counted_bytes
        self._bookkeeping = bookkeeping
        self._collective = collective

    def __enter__(self) -> None:
        _mark.category = self._category
        _mark.counted_bytes = self._counted_bytes
        _mark.bookkeeping = self._bookkeeping
        _mark.collective = self._collective

    def __exit__(self, *exc: object) -> None:
        _mark.category = None
        _mark.counted_bytes = 0
        _mark.bookkeeping = False
        _mark.collective = None


def metered_call(category: str, counted_bytes: int, collective: str | None = None) -> _MarkedCall:
    """Mark the enclosed collective as metered: the meter counted ``counted_bytes`` for it.
    ``collective``: the ``Comm`` primitive it implements when that is another operation (an
    all-reduce done by an all-gather)."""
    return _MarkedCall(category, counted_bytes, bookkeeping=False, collective=collective)


def bookkeeping_call() -> _MarkedCall:
    """Mark the enclosed collective as known bookkeeping (reducing the meter itself)."""
    return _MarkedCall(None, 0, bookkeeping=True)


@dataclass(frozen=True)
class CollectiveCall:
    """One recorded ``torch.distributed`` call (plain values, picklable).

    ``numel``/``nbytes`` are those of the local payload argument (the input of a gather,
    all-to-all or reduce, the tensor of a broadcast or point-to-point op); ``category`` and
    ``counted_bytes`` are the metered mark, ``bookkeeping`` the meter-reduction mark,
    ``collective`` the ``Comm`` primitive when the call implements another one.
    """

    op: str
    numel: int
    dtype: str | None
    nbytes: int
    group: str
    category: str | None
    counted_bytes: int
    bookkeeping: bool
    framework: str | None = None  # a known unmetered framework call (its origin module)
    collective: str | None = None

    @property
    def logical_op(self) -> str:
        """The operation this call performs for its caller: ``collective``, else ``op``."""
        return self.collective or self.op

    @property
    def accounted(self) -> bool:
        return self.category is not None or self.bookkeeping or self.framework is not None


# op name -> name of the argument holding the local payload (None: no payload).
AUDITED_OPS: dict[str, str | None] = {
    "all_reduce": "tensor",
    "all_reduce_coalesced": "tensors",
    "reduce": "tensor",
    "broadcast": "tensor",
    "all_gather": "tensor",
    "all_gather_coalesced": "input_tensor_list",
    "all_gather_into_tensor": "input_tensor",
    "all_gather_single": "input_tensor",
    "_all_gather_base": "input_tensor",
    "all_to_all": "input_tensor_list",
    "all_to_all_single": "input",
    "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input",
    "reduce_scatter_single": "input",
    "_reduce_scatter_base": "input",
    "gather": "tensor",
    "scatter": "scatter_list",
    "send": "tensor",
    "recv": "tensor",
    "isend": "tensor",
    "irecv": "tensor",
    "batch_isend_irecv": "p2p_op_list",
    "barrier": None,
    "monitored_barrier": None,
}
_PATCHED_MODULES = (dist, c10d)
# (module that issues the call, op): framework collectives the meter cannot see, reported apart.
KNOWN_FRAMEWORK_CALLS = {("lightning.pytorch.loops.training_epoch_loop", "broadcast")}


def _framework_origin(op: str) -> str | None:
    """The module of the first caller outside torch and this file, if it issues a known
    framework call of ``op``."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not (module.startswith("torch") or module == __name__):
            return module if (module, op) in KNOWN_FRAMEWORK_CALLS else None
        frame = frame.f_back
    return None


def _payload_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _payload_tensors(getattr(item, "tensor", item))]
    return []


def _group_name(group: Any) -> str:
    group = group if group is not None else dist.group.WORLD
    return str(getattr(group, "group_name", group))


_ACTIVE: list[CollectiveRecorder] = []  # recorders inside their ``with`` block


def declare_transport_bytes(category: str, nbytes: int) -> None:
    """Declare ``nbytes`` of ``category`` that a transport outside ``torch.distributed``
    (comm/transport.py's sockets) has just added to the meter, so the active recorders'
    declared totals still match the meter; the call itself cannot be intercepted."""
    for recorder in list(_ACTIVE):
        recorder.calls.append(
            CollectiveCall("socket", 0, None, nbytes, "socket", category, nbytes, False)
        )


class CollectiveRecorder:
    """Context manager recording every ``torch.distributed`` collective issued inside it.

    Usage::

        with CollectiveRecorder() as recorder:
            ...  # training steps
        recorder.assert_accounted(meter.delta(before))
    """

    def __init__(self) -> None:
        self.calls: list[CollectiveCall] = []
        self._originals: list[tuple[Any, str, Callable]] = []

    def __enter__(self) -> CollectiveRecorder:
        wrappers: dict[str, Callable] = {}
        for op, payload_arg in AUDITED_OPS.items():
            original = getattr(c10d, op, None) or getattr(dist, op, None)
            if original is not None:
                wrappers[op] = self._wrap(op, original, payload_arg)
        # DDP syncs parameters and buffers through this C++ binding; its signature is fixed.
        wrappers["_broadcast_coalesced"] = self._wrap_broadcast_coalesced(dist._broadcast_coalesced)
        for module in _PATCHED_MODULES:
            for op, wrapper in wrappers.items():
                if hasattr(module, op):
                    self._originals.append((module, op, getattr(module, op)))
                    setattr(module, op, wrapper)
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        for module, op, original in reversed(self._originals):
            setattr(module, op, original)
        self._originals.clear()

    def _record(self, op: str, payload: Any, group: Any) -> None:
        tensors = _payload_tensors(payload)
        unmarked = _mark.category is None and not _mark.bookkeeping
        self.calls.append(
            CollectiveCall(
                op=op,
                numel=sum(t.numel() for t in tensors),
                dtype=str(tensors[0].dtype) if tensors else None,
                nbytes=sum(t.numel() * t.element_size() for t in tensors),
                group=_group_name(group),
                category=_mark.category,
                counted_bytes=_mark.counted_bytes,
                bookkeeping=_mark.bookkeeping,
                framework=_framework_origin(op) if unmarked else None,
                collective=_mark.collective,
            )
        )

    def _call_outermost(self, function: Callable, record: Callable[[], None], args, kwargs):
        """Record only the outermost audited call (c10d wrappers call each other)."""
        if _mark.depth == 0:
            record()
        _mark.depth += 1
        try:
            return function(*args, **kwargs)
        finally:
            _mark.depth -= 1

    def _wrap(self, op: str, original: Callable, payload_arg: str | None) -> Callable:
        signature = inspect.signature(original)

        def wrapper(*args, **kwargs):
            def record() -> None:
                bound = signature.bind_partial(*args, **kwargs).arguments
                group = bound.get("group")
                if op == "batch_isend_irecv" and bound.get("p2p_op_list"):
                    group = bound["p2p_op_list"][0].group
                payload = bound.get(payload_arg) if payload_arg else None
                self._record(op, payload, group)

            return self._call_outermost(original, record, args, kwargs)

        return wrapper

    def _wrap_broadcast_coalesced(self, original: Callable) -> Callable:
        def wrapper(process_group, tensors, *args, **kwargs):
            return self._call_outermost(
                original,
                lambda: self._record("_broadcast_coalesced", tensors, process_group),
                (process_group, tensors, *args),
                kwargs,
            )

        return wrapper

    def unaccounted(self) -> list[CollectiveCall]:
        """Calls that came neither from a metered path nor from known bookkeeping."""
        return [call for call in self.calls if not call.accounted]

    def framework_calls(self) -> list[CollectiveCall]:
        """Known framework calls the meter cannot see (see ``KNOWN_FRAMEWORK_CALLS``)."""
        return [call for call in self.calls if call.framework is not None]

    def counted_bytes(self) -> dict[str, int]:
        """Bytes the metered calls declared to the meter, by category."""
        totals = dict.fromkeys(CATEGORIES, 0)
        for call in self.calls:
            if call.category is not None:
                totals[call.category] += call.counted_bytes
        return totals

    def problems(self, meter_delta: dict[str, Any]) -> list[str]:
        """Why the recorded calls and this rank's meter delta over the same span disagree."""
        found = [f"unmetered call: {call}" for call in self.unaccounted()]
        declared = self.counted_bytes()
        for category in CATEGORIES:
            if declared[category] != meter_delta["bytes"][category]:
                found.append(
                    f"{category}: metered calls declared {declared[category]} bytes, "
                    f"meter counted {meter_delta['bytes'][category]}"
                )
        return found

    def assert_accounted(self, meter_delta: dict[str, Any]) -> None:
        """Raise AssertionError listing every problem found by ``problems``."""
        found = self.problems(meter_delta)
        if found:
            raise AssertionError("communication audit failed:\n" + "\n".join(found))
