"""``ShmVectorEnv(device=...)``: observations, rewards and flags handed over as torch tensors on a device.

torch is imported here only, and only when a device is asked for. Every tensor returned is
the caller's: later steps never change it (on ``"cpu"`` with ``copy=False``, observations
are views of the shared rows instead, as numpy's are).

On CUDA the pool's arena is page-locked once the workers attached it
(:meth:`~shmvec.engine.interface.Engine.page_lock`), and each hand-off copies straight from
it without blocking (:mod:`shmvec.adapters.cuda_copies`); before a command lets the workers
rewrite rows, :meth:`DeviceHandoff.before_write` waits for the copies that still read them.
"""

from __future__ import annotations

import copy as copy_module
from typing import Any

import numpy as np

from shmvec.adapters import cuda_copies
from shmvec.engine.interface import Engine
from shmvec.ipc import layout as lay


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
        self._cuda = cuda_copies.cuda_calls(torch) if self.device.type == "cuda" else None
        if self._cuda is not None and not self._cuda.available():
            raise ValueError(f"device={device!r}, but torch sees no CUDA device (torch.cuda.is_available() is False)")
        self.copy = copy
        self.pinned = False  # whether copies come from a page-locked arena
        self._copies: cuda_copies.CudaCopies | None = None  # CUDA, once started

    def start(self, pool: Engine) -> None:
        """Page-lock the pool's arena (CUDA) and make the copy stream, once the pool runs."""
        if self._cuda is not None:
            self.device = self._cuda.start(self.device)
            self._copies = cuda_copies.CudaCopies(self.torch, self._cuda, pool.num_envs)
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
        if self._copies is not None:
            self._copies.fences.before_write(None if env_ids is None else np.asarray(env_ids, dtype=np.int64))

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
        if self._copies is not None:
            tensors = self._copies.copy([*arrays, *scalars], env_ids)
        else:
            tensors = self._to_host(arrays, scalars, env_ids)
            if self.device.type != "cpu":  # another accelerator: plain copies
                tensors = [tensor.to(self.device) for tensor in tensors]
        if paths == [()] and not pickled:  # a flat space (Box, Discrete, ...): the tensor itself
            return (tensors[0], *tensors[1:])
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

    def close(self) -> None:
        """Wait for every copy still in flight (before the pool unregisters and closes its arena)."""
        if self._copies is not None:
            self._copies.fences.wait_all()
