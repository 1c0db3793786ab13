"""Copies of shared rows to a CUDA device: ``non_blocking`` on a side stream, each fenced by an event.

The pool's arena is page-locked (:mod:`shmvec.ipc.pinning`), so a copy from it is one DMA
that the CPU does not wait for::

    hand-off (step_wait, reset_wait, recv)             side stream, in order
    a fresh device buffer ─ copy_(rows, non_blocking) ─▶ DMA from the page-locked arena
    an event recorded after it; the caller's stream    (the caller's kernels queue behind it)
    waits on the event; the tensors are returned
    before a command that lets the workers rewrite
    rows R (step_async, reset_async, send) ─────────── wait for the last copy that read R

A whole step (every env) takes one copy: observations, rewards and flags lie close together
in the arena, so one DMA of their span gives them all, as views of one device buffer. The
rows of an async batch are copied straight from the arena when they are one contiguous run;
scattered rows are gathered on the CPU into pinned memory first (one DMA, not one per
row), and their rewards and flags are packed there too. While a batch's copy runs, the
workers step the envs of other batches: a fence holds back only the rows it reads.

The CUDA calls are the small methods of :class:`CudaCalls`; tests stand in CPU ones
(:data:`cuda_calls`) to check the rest without a GPU.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

SPAN_SLACK = 1.25, 256 << 10  # one copy of a span of at most 1.25x the bytes needed + 256 KiB beats several


class CudaCalls:
    """The CUDA calls of the copies, each a small method."""

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
        return device

    def copying(self) -> Any:
        """A context in which the side stream is current: copies (and allocations) queue there."""
        return self.torch.cuda.stream(self.side)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.torch.empty(shape, dtype=dtype, device=self.device)

    def staging(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """Pinned host memory from torch's caching allocator (which keeps it until a copy from it is done)."""
        return self.torch.empty(shape, dtype=dtype, pin_memory=True)

    def fence(self, event: Any = None) -> Any:
        """``event`` (a new one if None) recorded on the side stream, after the copies queued there."""
        event = event or self.torch.cuda.Event()
        event.record(self.side)
        return event

    def hand_over(self, tensors: list, event: Any) -> None:
        """The caller's stream waits for ``event`` (without blocking the CPU) and may use ``tensors``."""
        current = self.torch.cuda.current_stream(self.device)
        current.wait_event(event)
        for tensor in tensors:
            tensor.record_stream(current)  # used there: its memory is not reused before the caller is done with it


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
        needed = int(self._last_read.max() if rows is None else self._last_read[rows].max(initial=0))
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


class _Span:
    """Arrays that lie close together in one shared buffer: one copy of their span, a view per array."""

    def __init__(self, arrays: list[np.ndarray], source: Any, parts: list[tuple[int, int, Any, tuple]]):
        self.arrays, self.source, self.parts = arrays, source, parts

    @classmethod
    def of(cls, arrays: list[np.ndarray], torch: Any) -> _Span | None:
        """The span of ``arrays`` (views of one buffer, as the pool's are), or None if they are not close."""
        roots = {id(_root(array)) for array in arrays}
        if len(roots) != 1 or not all(array.flags.c_contiguous for array in arrays):
            return None
        whole = np.frombuffer(_root(arrays[0]), dtype=np.uint8)
        base = whole.__array_interface__["data"][0]
        starts = [array.__array_interface__["data"][0] - base for array in arrays]
        first, last = min(starts), max(start + array.nbytes for start, array in zip(starts, arrays))
        if last - first > SPAN_SLACK[0] * sum(array.nbytes for array in arrays) + SPAN_SLACK[1]:
            return None
        parts = []  # (start, stop, dtype or None for uint8, shape or None for one dimension): no view for nothing
        for start, array in zip(starts, arrays):
            dtype = torch.from_numpy(array[:0]).dtype
            shape = array.shape if array.ndim != 1 else None
            parts.append((start - first, start - first + array.nbytes, None if dtype == torch.uint8 else dtype, shape))
        return cls(list(arrays), torch.from_numpy(whole[first:last]), parts)


def _root(array: np.ndarray) -> Any:
    """The object whose memory ``array`` views (the arena's memoryview for the pool's views)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base


class CudaCopies:
    """The copies of one hand-off to one CUDA device, and their fences."""

    def __init__(self, torch: Any, cuda: CudaCalls, num_envs: int):
        self.torch, self.cuda = torch, cuda
        self.fences = CopyFences(num_envs)
        self._spans: dict[tuple[int, ...], _Span | None] = {}  # by the ids of the arrays copied together (kept)
        self._host: dict[int, tuple[np.ndarray, Any]] = {}  # id(shared view) -> (view, CPU tensor over it)

    def copy(self, arrays: list[np.ndarray], env_ids: np.ndarray | None, scalars: int) -> list:
        """Device tensors of ``arrays``' rows ``env_ids`` (None: all); the last ``scalars`` arrays are
        per-env values (rewards, flags), the others observation leaves."""
        if env_ids is None:
            span = self._span(arrays)
            if span is not None:
                return self._copy_span(span)
            rows: Any = slice(None)
        elif len(env_ids) == 1 or (np.diff(env_ids) == 1).all():  # one run: straight from the arena
            rows = slice(int(env_ids[0]), int(env_ids[-1]) + 1)
        else:
            rows = env_ids
        obs, per_env = arrays[: len(arrays) - scalars], arrays[len(arrays) - scalars :]
        cuda = self.cuda
        with cuda.copying():
            out = [self._copy_rows(array, rows) for array in obs]
            if per_env:
                out += self._packed(per_env, env_ids)
            event = cuda.fence(self.fences.spare())
        self.fences.add(event, rows if isinstance(rows, slice) and obs else None)
        cuda.hand_over(out, event)
        return out

    def _span(self, arrays: list[np.ndarray]) -> _Span | None:
        key = tuple(map(id, arrays))
        span = self._spans.get(key, False)
        if span is False or (span is not None and any(a is not b for a, b in zip(span.arrays, arrays))):
            span = self._spans[key] = _Span.of(arrays, self.torch)
        return span

    def _copy_span(self, span: _Span) -> list:
        cuda = self.cuda
        with cuda.copying():
            buffer = cuda.empty(tuple(span.source.shape), self.torch.uint8).copy_(span.source, non_blocking=True)
            event = cuda.fence(self.fences.spare())
        self.fences.add(event, slice(None))
        cuda.hand_over([buffer], event)
        out = []
        for start, stop, dtype, shape in span.parts:
            view = buffer[start:stop]
            if dtype is not None:
                view = view.view(dtype)
            out.append(view if shape is None else view.view(shape))
        return out

    def _copy_rows(self, array: np.ndarray, rows: Any) -> Any:
        source = self._host_tensor(array)
        if isinstance(rows, slice):
            source = source[rows]
        else:  # scattered rows: gathered into pinned memory, then one DMA instead of one per row
            staged = self.cuda.staging((len(rows), *array.shape[1:]), source.dtype)
            np.take(array, rows, axis=0, out=staged.numpy())
            source = staged
        return self.cuda.empty(tuple(source.shape), source.dtype).copy_(source, non_blocking=True)

    def _packed(self, arrays: list[np.ndarray], env_ids: np.ndarray | None) -> list:
        """Small per-env arrays (rewards, flags) packed in pinned memory: one DMA, then views on the device."""
        n = len(arrays[0]) if env_ids is None else len(env_ids)
        offsets, end = [], 0
        for array in arrays:
            end = -(-end // array.itemsize) * array.itemsize  # each view aligned to its item size
            offsets.append(end)
            end += n * array.itemsize
        staged = self.cuda.staging((end,), self.torch.uint8)
        host = staged.numpy()
        for array, start in zip(arrays, offsets):
            part = host[start : start + n * array.itemsize].view(array.dtype)
            if env_ids is None:
                part[:] = array
            else:
                np.take(array, env_ids, out=part)
        packed = self.cuda.empty((end,), self.torch.uint8).copy_(staged, non_blocking=True)
        return [
            packed[start : start + n * array.itemsize].view(self._host_tensor(array).dtype)
            for array, start in zip(arrays, offsets)
        ]

    def _host_tensor(self, view: np.ndarray) -> Any:
        """A CPU tensor over a shared view (made once per view: the pool keeps its views for its life)."""
        known = self._host.get(id(view))
        if known is None or known[0] is not view:
            known = self._host[id(view)] = (view, self.torch.from_numpy(view))
        return known[1]
