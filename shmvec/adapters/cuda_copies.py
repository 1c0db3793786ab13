"""Copies of shared rows to a CUDA device: ``non_blocking`` on a side stream, fenced by one event per hand-off.

The pool's arena is page-locked (:mod:`shmvec.ipc.pinning`), so a copy from it is one DMA
that the CPU does not wait for::

    hand-off (step_wait, reset_wait, recv)             side stream, in order
    the side stream made current (in C where torch can)
    one fresh device buffer per span ─ copy ────────────▶ DMA from the page-locked arena
    one event recorded after the copies; the caller's    (the caller's kernels queue behind it)
    stream waits on it; tensors are views of the buffers
    before a command that lets the workers rewrite
    rows R (step_async, reset_async, send) ─────────── wait for the last copy that read R

Observations, rewards and flags lie next to each other in the arena
(:class:`~shmvec.ipc.layout.ArenaLayout`), so a whole step is one copy of their span: per
hand-off, one copy, one event, five stream calls (which stream the caller uses, the switch
to the side stream and back, the caller's wait, and telling the allocator that the caller
uses the buffer), one allocation and one view per array (plus one per dtype). The rows of an
async batch are copied straight from the arena when they are one contiguous run (arrays
whose rows lie close together share a copy); scattered rows are gathered on the CPU into
one pinned buffer first (one DMA, not one per row or array). While a batch's copy runs, the
workers step the envs of other batches: a fence holds back only the rows the batch returns.

The CUDA calls are the small methods of :class:`CudaCalls`, one call each (entering and
leaving the side stream: two); :mod:`shmvec.tools.cuda_stand_ins` stands in CPU ones that
count them, to check and count the rest without a GPU.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from typing import Any, NamedTuple

import numpy as np

SPAN_SLACK = 1.25, 256 << 10  # one copy of a span of at most 1.25x the bytes needed + 256 KiB beats several
PAD = 64  # spans are widened to whole cache lines where the memory has them: any dtype can view the buffer
_PLANS_KEPT = 256  # plans of row runs kept (a whole step's, and the async batches' most recent)


class CudaCalls:
    """The CUDA calls of the copies, each a small method that makes one call (torch's, or its allocator's)."""

    def __init__(self, torch: Any):
        self.torch = torch

    def available(self) -> bool:
        return self.torch.cuda.is_available()

    def start(self, device: Any) -> Any:
        """``device`` with its index (the current device if it has none); makes the copies' side stream."""
        cuda = self.torch.cuda
        if device.index is None:
            device = self.torch.device("cuda", cuda.current_device())
        self.device, self.side = device, cuda.Stream(device)
        # `with stream:` switches the stream (and the device, and back) in C on torch >= 2.6;
        # torch.cuda.stream() does it in Python, several calls that look up the device each time
        self._side_context = self.side if hasattr(self.side, "__enter__") else None
        return device

    def caller(self) -> Any:
        """The stream the caller's work on the device queues on."""
        return self.torch.cuda.current_stream(self.device)

    def on_side(self) -> Any:
        """A context in which the side stream is current: allocations and copies queue there."""
        return self._side_context if self._side_context is not None else self.torch.cuda.stream(self.side)

    def to_device(self, source: Any) -> Any:
        """A fresh device buffer, and one copy of ``source`` (host memory) into it, not waited for."""
        return source.to(self.device, non_blocking=True)

    def staging(self, nbytes: int) -> Any:
        """Pinned host memory from torch's caching allocator (which keeps it until a copy from it is done)."""
        return self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True)

    def record(self, event: Any = None) -> Any:
        """``event`` (a new one if None) recorded on the side stream, after the copies queued there."""
        event = event or self.torch.cuda.Event()
        event.record(self.side)
        return event

    def wait(self, stream: Any, event: Any) -> None:
        """``stream`` waits for ``event`` (on the GPU: the CPU does not block)."""
        stream.wait_event(event)

    def keep(self, buffer: Any, stream: Any) -> None:
        """``buffer`` is used on ``stream``: its memory is not reused before the work queued there is done."""
        buffer.record_stream(stream)


cuda_calls = CudaCalls  # how copies make their CUDA calls, given torch


class CopyFences:
    """Which in-flight copies still read which shared rows, so that no worker rewrites them too soon.

    Copies run in order on one stream, so a finished copy means every earlier one finished:
    it is enough to remember, per env row, the number of the last copy that read it.
    """

    def __init__(self, num_envs: int):
        self._last_read = np.zeros(num_envs, dtype=np.int64)  # per row: the copy that read it last (0: none)
        self._last_read_max = 0  # the last copy that read any row
        self._events: deque[tuple[int, Any]] = deque()  # (copy number, its event), oldest first
        self._spare: list[Any] = []  # events known complete, to record again
        self._issued = self._done = 0

    def spare(self) -> Any:
        """An event no copy waits on any more, or None."""
        return self._spare.pop() if self._spare else None

    def add(self, event: Any, rows: np.ndarray | slice | None) -> None:
        """A copy was issued and ``event`` recorded after it; it reads ``rows`` (None: none of the shared rows).

        The events kept are those of copies that read rows, which :meth:`before_write` waits
        for and then reuses, and the last one (:meth:`wait_all`). A copy that reads no row (a
        gathered batch: nearly every batch of an async pool) is never waited for once a later
        copy is issued, so its event is dropped then (not reused: it may not be complete).
        """
        self._issued += 1
        if self._events and self._events[-1][0] > self._last_read_max:
            self._events.pop()  # the previous copy read no row (see above)
        if rows is not None:
            self._last_read[rows] = self._issued
            self._last_read_max = self._issued
        self._events.append((self._issued, event))

    def before_write(self, rows: np.ndarray | None = None) -> None:
        """Block until no copy still reads ``rows`` (None: any row)."""
        needed = self._last_read_max if rows is None else int(self._last_read[rows].max(initial=0))
        if needed <= self._done:
            return
        while self._events and self._events[0][0] <= needed:
            number, event = self._events.popleft()
            if number == needed:
                event.synchronize()
            self._spare.append(event)
        self._done = needed

    def wait_all(self) -> None:
        """Block until every copy finished (before the arena is unregistered)."""
        if self._events:
            self._events[-1][1].synchronize()
        self._spare += [event for _, event in self._events]
        self._events.clear()
        self._done = self._issued


class _Place(NamedTuple):
    """Where a shared array's rows lie: in ``root`` (a CPU uint8 tensor over its whole buffer), from ``offset``."""

    root: Any
    offset: int
    row_bytes: int
    dtype: Any  # torch's; None: uint8
    itemsize: int
    row_shape: tuple[int, ...]


class _Part(NamedTuple):
    """One returned tensor: a view of copy ``group``'s device buffer."""

    group: int
    start: int  # bytes into the buffer
    dtype: Any  # torch's; None: uint8
    itemsize: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in items


class _Plan(NamedTuple):
    arrays: list[np.ndarray]  # the arrays it was made for (their ids are the key: checked to be the same)
    sources: list[Any]  # per copy: the CPU tensor over its span of host memory (None: gathered into staging)
    sizes: list[int]  # per copy: its bytes
    parts: list[_Part]


class CudaCopies:
    """The copies of the hand-offs to one CUDA device, and their fences."""

    def __init__(self, torch: Any, cuda: CudaCalls, num_envs: int):
        self.torch, self.cuda = torch, cuda
        self.fences = CopyFences(num_envs)
        self._places: dict[int, tuple[np.ndarray, _Place | None]] = {}  # id(shared view) -> (view, place)
        self._roots: dict[int, tuple[Any, Any]] = {}  # id(buffer) -> (buffer, CPU uint8 tensor over it)
        self._plans: dict[tuple, _Plan | None] = {}  # by (ids of the arrays, first row, end row or -count)

    def copy(self, arrays: list[np.ndarray], env_ids: np.ndarray | None = None) -> list:
        """Device tensors of ``arrays``' rows ``env_ids`` (None: all), each array's as the caller's own."""
        plan = None
        if env_ids is None:
            plan, rows = self._run(arrays, 0, len(arrays[0])), slice(None)
        elif len(env_ids) == 1 or (np.diff(env_ids) == 1).all():  # one run: straight from the arena
            start, stop = int(env_ids[0]), int(env_ids[0]) + len(env_ids)
            plan, rows = self._run(arrays, start, stop), slice(start, stop)
        if plan is None:  # scattered rows (or arrays that are not views of one buffer): gathered, then one copy
            env_ids = np.arange(len(arrays[0])) if env_ids is None else env_ids
            plan, rows = self._gathered(arrays, len(env_ids)), None  # once gathered, the copy reads no shared row
            sources = [self._gather(plan, env_ids)]
        else:
            sources = plan.sources
        cuda = self.cuda
        caller = cuda.caller()
        with cuda.on_side():
            buffers = [cuda.to_device(source) for source in sources]
            event = cuda.record(self.fences.spare())
        self.fences.add(event, rows)
        cuda.wait(caller, event)
        for buffer in buffers:
            cuda.keep(buffer, caller)
        return _views(buffers, plan)

    # -- plans ---------------------------------------------------------------------

    def _run(self, arrays: list[np.ndarray], start: int, stop: int) -> _Plan | None:
        """The copies of rows ``start:stop`` of ``arrays`` straight from their memory (None: they cannot be)."""
        key = (*map(id, arrays), start, stop)
        plan = self._plans.get(key, False)
        if plan is False or (plan is not None and not all(map(operator.is_, plan.arrays, arrays))):
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.clear()
            plan = self._plans[key] = self._plan_run(arrays, start, stop)
        return plan

    def _plan_run(self, arrays: list[np.ndarray], start: int, stop: int) -> _Plan | None:
        places = [self._place(array) for array in arrays]
        if None in places:
            return None
        n = stop - start
        pieces = sorted(  # (root, first byte, end byte, array): by buffer, then address
            (
                (place.root, place.offset + start * place.row_bytes, place.offset + stop * place.row_bytes, i)
                for i, place in enumerate(places)
            ),
            key=lambda piece: (id(piece[0]), piece[1]),
        )
        spans: list[list] = []  # [root, first byte, end byte, bytes needed]
        parts: list[Any] = [None] * len(arrays)
        for root, first, end, i in pieces:
            place, span = places[i], spans[-1] if spans else None
            if (
                span is None
                or span[0] is not root
                or (first - span[1]) % place.itemsize
                or not _close(span, first, end)
            ):
                aligned = first - first % PAD
                span = [root, aligned if first % place.itemsize == 0 else first, end, 0]
                spans.append(span)
            span[2], span[3] = max(span[2], end), span[3] + end - first
            parts[i] = _part(len(spans) - 1, first - span[1], place.dtype, place.itemsize, (n, *place.row_shape))
        sources, sizes = [], []
        for root, first, end, _ in spans:
            end = min(-(-end // PAD) * PAD, len(root))  # whole cache lines where the buffer has them
            sources.append(root[first:end])
            sizes.append(end - first)
        return _Plan(list(arrays), sources, sizes, parts)

    def _gathered(self, arrays: list[np.ndarray], n: int) -> _Plan:
        """The plan of a gathered batch of ``n`` rows: one pinned buffer, each array's rows from a cache line."""
        key = (*map(id, arrays), 0, -n)
        plan = self._plans.get(key)
        if plan is None or not all(map(operator.is_, plan.arrays, arrays)):
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.clear()
            parts, end = [], 0
            for array in arrays:
                parts.append(_part(0, end, self._dtype(array), array.itemsize, (n, *array.shape[1:])))
                end += -(-n * math.prod(array.shape[1:]) * array.itemsize // PAD) * PAD
            plan = self._plans[key] = _Plan(list(arrays), [None], [max(end, PAD)], parts)
        return plan

    def _gather(self, plan: _Plan, env_ids: np.ndarray) -> Any:
        """The rows ``env_ids`` of the plan's arrays, in one pinned buffer laid out as ``plan`` says."""
        staged = self.cuda.staging(plan.sizes[0])
        host = staged.numpy()
        for array, part in zip(plan.arrays, plan.parts):
            out = host[part.start : part.start + math.prod(part.shape) * part.itemsize]
            np.take(array, env_ids, axis=0, out=out.view(array.dtype).reshape(part.shape))
        return staged

    def _place(self, view: np.ndarray) -> _Place | None:
        """Where a shared view lies (found once per view: the pool keeps its views for its life)."""
        known = self._places.get(id(view))
        if known is None or known[0] is not view:
            known = self._places[id(view)] = (view, self._find(view))
        return known[1]

    def _find(self, view: np.ndarray) -> _Place | None:
        buffer = view
        while isinstance(buffer.base, np.ndarray):
            buffer = buffer.base
        buffer = buffer.base  # the arena's memoryview, for the pool's views
        if buffer is None or not view.flags.c_contiguous or view.ndim == 0:
            return None
        root = self._roots.get(id(buffer))
        if root is None or root[0] is not buffer:
            root = self._roots[id(buffer)] = (buffer, self.torch.from_numpy(np.frombuffer(buffer, dtype=np.uint8)))
        offset = view.__array_interface__["data"][0] - root[1].data_ptr()
        row_bytes = math.prod(view.shape[1:]) * view.itemsize
        return _Place(root[1], offset, row_bytes, self._dtype(view), view.itemsize, tuple(view.shape[1:]))

    def _dtype(self, array: np.ndarray) -> Any:
        """torch's dtype of ``array``; None for bytes (uint8), which need no view of another dtype."""
        dtype = self.torch.from_numpy(array[:0]).dtype
        return None if dtype == self.torch.uint8 else dtype


def _close(span: list, first: int, end: int) -> bool:
    """Whether one copy of ``span`` widened to ``first:end`` beats two copies."""
    return max(span[2], end) - span[1] <= SPAN_SLACK[0] * (span[3] + end - first) + SPAN_SLACK[1]


def _part(group: int, start: int, dtype: Any, itemsize: int, shape: tuple[int, ...]) -> _Part:
    strides, size = [], 1
    for extent in reversed(shape):
        strides.append(size)
        size *= max(extent, 1)
    return _Part(group, start, dtype, itemsize, shape, tuple(reversed(strides)))


def _views(buffers: list, plan: _Plan) -> list:
    """The returned tensors: one view each of the device buffers (after one view per buffer and dtype)."""
    typed: dict[tuple[int, Any], Any] = {}
    out = []
    for part in plan.parts:
        buffer, itemsize = buffers[part.group], part.itemsize
        if part.dtype is None:
            out.append(buffer.as_strided(part.shape, part.strides, part.start))
        elif plan.sizes[part.group] % itemsize == 0:
            whole = typed.get((part.group, part.dtype))
            if whole is None:
                whole = typed[(part.group, part.dtype)] = buffer.view(part.dtype)
            out.append(whole.as_strided(part.shape, part.strides, part.start // itemsize))
        else:  # a buffer that ends short of a whole item (memory with no room to widen the span)
            view = buffer[part.start : part.start + math.prod(part.shape) * itemsize].view(part.dtype)
            out.append(view.view(part.shape))
    return out
