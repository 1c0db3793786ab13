"""``ShmVectorEnv(device=...)``: observations, rewards and flags handed over as torch tensors on a device.

torch is imported here only, and only when a device is asked for. Every tensor returned is
the caller's: later steps never change it (on ``"cpu"`` with ``copy=False``, observations
are views of the shared rows instead, as numpy's are).

On CUDA the pool's arena is page-locked once (:meth:`~shmvec.engine.interface.Engine.page_lock`),
and each hand-off copies straight from it, ``non_blocking``, on a side stream::

    step_wait / reset_wait / recv                     side stream (in order)
    fresh device tensors ─ copy_(rows, non_blocking) ▶ DMA from the page-locked arena
    rewards and flags packed in pinned memory ───────▶ one small DMA
    event recorded; the caller's stream waits on it,  (the caller's kernels queue behind it)
    the tensors are returned at once
    step_async / reset_async / send (rows R) ───────── wait for the last copy that read R:
                                                       only then may the workers rewrite R

Rows of an async batch that are not one contiguous run are gathered on the CPU into
pinned memory first (one DMA instead of one per row). While a batch's copy runs, the
workers step the envs of other batches: the fence only holds back the rows it reads.
"""

from __future__ import annotations

import copy as copy_module
from collections import deque
from typing import Any

import numpy as np

from shmvec.engine.interface import Engine
from shmvec.ipc import layout as lay


class CudaCalls:
    """The CUDA calls of a hand-off, each a small method (tests stand in CPU ones to check the rest without a GPU)."""

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

    def fence(self) -> Any:
        """An event recorded on the side stream after the copies queued there."""
        event = self.torch.cuda.Event()
        event.record(self.side)
        return event

    def hand_over(self, tensors: list, event: Any) -> None:
        """The caller's stream waits for ``event`` (without blocking the CPU) and may use ``tensors``."""
        current = self.torch.cuda.current_stream(self.device)
        current.wait_event(event)
        for tensor in tensors:
            tensor.record_stream(current)  # used there: its memory is not reused before the caller is done with it


cuda_calls = CudaCalls  # how a hand-off makes its CUDA calls, given torch


class CopyFences:
    """Which in-flight copies still read which shared rows, so that no worker rewrites them too soon.

    Copies run in order on one stream, so a finished copy means every earlier one finished:
    it is enough to remember, per env row, the number of the last copy that read it.
    """

    def __init__(self, num_envs: int):
        self._last_read = np.zeros(num_envs, dtype=np.int64)  # per row: the copy that read it last (0: none)
        self._events: deque[tuple[int, Any]] = deque()  # (copy number, its event), oldest first
        self._issued = self._done = 0

    def add(self, event: Any, rows: np.ndarray | slice | None) -> None:
        """A copy was issued and ``event`` recorded after it; it reads ``rows`` (None: none of the shared rows)."""
        self._issued += 1
        if rows is not None:
            self._last_read[rows] = self._issued
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
        self._done = needed

    def wait_all(self) -> None:
        """Block until every copy finished (before the arena is unregistered)."""
        if self._events:
            self._events[-1][1].synchronize()
        self._events.clear()
        self._done = self._issued


class DeviceHandoff:
    """The tensors a :class:`~shmvec.ShmVectorEnv` returns with ``device=``, and its actions back as numpy.

    Create it before the pool (it checks ``device``), then :meth:`start` it with the pool.
    """

    def __init__(self, device: Any, copy: bool):
        import torch

        self.torch = torch
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f'device must be a torch device ("cpu", "cuda", "cuda:1", ...), got {device!r}') from exc
        self._cuda = cuda_calls(torch) if self.device.type == "cuda" else None
        if self._cuda is not None and not self._cuda.available():
            raise ValueError(f"device={device!r}, but torch sees no CUDA device (torch.cuda.is_available() is False)")
        self.copy = copy
        self.pinned = False  # whether copies come from a page-locked arena
        self._fences = CopyFences(0)
        self._host: dict[int, tuple[np.ndarray, Any]] = {}  # id(shared view) -> (view, tensor over it)

    def start(self, pool: Engine) -> None:
        """Page-lock the pool's arena (CUDA) and make the copy stream, once the pool runs."""
        self._fences = CopyFences(pool.num_envs)
        if self._cuda is not None:
            self.device = self._cuda.start(self.device)
            self.pinned = pool.page_lock(self.device.index)

    # -- actions -------------------------------------------------------------------

    def host_actions(self, actions: Any) -> Any:
        """``actions`` with every tensor (nested in dicts, tuples and lists too) as a numpy array."""
        if isinstance(actions, self.torch.Tensor):
            actions = actions.detach().cpu()
            try:
                return actions.numpy()
            except TypeError:  # a dtype numpy lacks (bfloat16, ...)
                return actions.float().numpy()
        if isinstance(actions, dict):
            return type(actions)((key, self.host_actions(value)) for key, value in actions.items())
        if isinstance(actions, (tuple, list)) and type(actions) in (tuple, list):
            return type(actions)(self.host_actions(value) for value in actions)
        return actions

    # -- results -------------------------------------------------------------------

    def before_write(self, env_ids: Any = None) -> None:
        """Call before a command lets the workers write rows ``env_ids`` (None: all) of the arena."""
        if self._cuda is not None:
            self._fences.before_write(None if env_ids is None else np.asarray(env_ids, dtype=np.int64))

    def results(
        self,
        space: Any,
        leaves: dict[tuple, np.ndarray],
        pickled: dict[tuple, list[Any]],
        scalars: tuple[np.ndarray, ...] = (),
        env_ids: np.ndarray | None = None,
    ) -> tuple[Any, ...]:
        """``(observations, *scalars)`` as tensors on the device: rows ``env_ids`` (None: every env).

        ``leaves``: the shared views of the fixed-size observation leaves; ``pickled``: the
        leaves with no fixed size, which stay Python objects (a tuple, one per env, as numpy's).
        """
        paths = list(leaves)
        arrays = [leaves[path] for path in paths]
        if self._cuda is not None:
            tensors = self._to_cuda(arrays, scalars, env_ids)
        else:
            tensors = self._to_host(arrays, scalars, env_ids)
            if self.device.type != "cpu":  # another accelerator: plain copies
                tensors = [tensor.to(self.device) for tensor in tensors]
        obs = dict(zip(paths, tensors))
        for path, column in pickled.items():
            values = tuple(column) if env_ids is None else tuple(column[i] for i in env_ids.tolist())
            obs[path] = copy_module.deepcopy(values) if self.copy or env_ids is not None else values
        return (lay.unflatten(space, obs), *tensors[len(arrays) :])

    def _to_host(self, arrays: list[np.ndarray], scalars: tuple[np.ndarray, ...], env_ids: np.ndarray | None) -> list:
        from_numpy = self.torch.from_numpy
        if env_ids is not None:
            return [from_numpy(array[env_ids]) for array in (*arrays, *scalars)]  # indexing copies
        obs = [from_numpy(array.copy() if self.copy else array) for array in arrays]
        return obs + [from_numpy(array.copy()) for array in scalars]

    def _to_cuda(self, arrays: list[np.ndarray], scalars: tuple[np.ndarray, ...], env_ids: np.ndarray | None) -> list:
        cuda = self._cuda
        rows: Any = env_ids  # what the copies read of the shared rows
        if env_ids is None:
            rows = slice(None)
        elif len(env_ids) == 1 or (np.diff(env_ids) == 1).all():  # one run: straight from the arena
            rows = slice(int(env_ids[0]), int(env_ids[-1]) + 1)
        with cuda.copying():
            out = []
            for array in arrays:
                source = self._host_tensor(array)
                if isinstance(rows, slice):
                    source = source[rows]
                else:  # scattered rows: gathered into pinned memory, then one DMA instead of one per row
                    staged = cuda.staging((len(rows), *array.shape[1:]), source.dtype)
                    np.take(array, rows, axis=0, out=staged.numpy())
                    source = staged
                out.append(cuda.empty(tuple(source.shape), source.dtype).copy_(source, non_blocking=True))
            if scalars:
                out += self._packed_scalars(scalars, env_ids)
            event = cuda.fence()
        self._fences.add(event, rows if isinstance(rows, slice) and arrays else None)
        cuda.hand_over(out, event)
        return out

    def _packed_scalars(self, scalars: tuple[np.ndarray, ...], env_ids: np.ndarray | None) -> list:
        """Small per-env arrays (rewards, flags) packed in pinned memory: one DMA, then views on the device."""
        torch, cuda = self.torch, self._cuda
        n = len(scalars[0]) if env_ids is None else len(env_ids)
        offsets, end = [], 0
        for array in scalars:
            end = -(-end // array.itemsize) * array.itemsize  # each view aligned to its item size
            offsets.append(end)
            end += n * array.itemsize
        staged = cuda.staging((end,), torch.uint8)
        host = staged.numpy()
        for array, start in zip(scalars, offsets):
            part = host[start : start + n * array.itemsize].view(array.dtype)
            if env_ids is None:
                part[:] = array
            else:
                np.take(array, env_ids, out=part)
        packed = cuda.empty((end,), torch.uint8).copy_(staged, non_blocking=True)
        return [
            packed[start : start + n * array.itemsize].view(self._host_tensor(array).dtype)
            for array, start in zip(scalars, offsets)
        ]

    def _host_tensor(self, view: np.ndarray) -> Any:
        """A CPU tensor over a shared view (made once per view: the pool keeps its views for its life)."""
        known = self._host.get(id(view))
        if known is None or known[0] is not view:
            known = self._host[id(view)] = (view, self.torch.from_numpy(view))
        return known[1]

    def close(self) -> None:
        """Wait for every copy still in flight (before the pool unregisters and closes its arena)."""
        if self._cuda is not None:
            self._fences.wait_all()
