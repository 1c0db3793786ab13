"""Calls on every env of a :class:`~shmvec.ShmVectorEnv`, and the one pending call AsyncVectorEnv tracks.

As in ``AsyncVectorEnv``, ``step``, ``reset`` and ``call`` are each an ``*_async``/``*_wait``
pair and one of them may be pending at a time (:attr:`EnvCalls._state`); misuse raises
Gymnasium's errors with its messages. ``call``, ``get_attr``, ``set_attr`` and ``render``
run on every env, in env order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector.async_vector_env import AsyncState

from shmvec.adapters.public_calls import other_call
from shmvec.engine import ops
from shmvec.engine.interface import Engine
from shmvec.engine.validation import seconds
from shmvec.errors import (
    AlreadyPendingError,
    ClosedEnvError,
    NoPendingCallError,
    StepStateError,
    StepTimeoutError,
)
from shmvec.ipc.protocol import RunOps

# Names `call` refuses, as AsyncVectorEnv does: they would bypass the shared buffers
# (the last two are AsyncVectorEnv's own worker commands, refused to the letter).
_RESERVED_CALLS = ("reset", "step", "close", "_setattr", "_check_spaces")


class EnvCalls:
    """``call``/``get_attr``/``set_attr``/``render`` and the pending-call checks (mixed into ShmVectorEnv)."""

    _pool: Engine
    _state: AsyncState = AsyncState.DEFAULT
    num_envs: int
    batch_size: int | None
    closed: bool

    @other_call
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``env.get_wrapper_attr(name)(*args, **kwargs)`` in every env, or return the attribute if not callable.

        Example:
            >>> import gymnasium as gym
            >>> from shmvec import ShmVectorEnv
            >>> envs = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2)
            >>> envs.call("render_mode")  # an attribute: returned as is
            (None, None, None, None)
            >>> envs.call("get_wrapper_attr", "gravity")  # a method: called with the arguments
            (9.8, 9.8, 9.8, 9.8)
            >>> envs.close()
        """
        self.call_async(name, *args, **kwargs)
        return self.call_wait()

    @other_call
    def call_async(self, name: str, /, *args: Any, **kwargs: Any) -> None:
        """Start :meth:`call` in every env; :meth:`call_wait` returns the results.

        Raises:
            AlreadyPendingError: another call is pending.
            ValueError: ``name`` is ``"reset"``, ``"step"`` or ``"close"`` (use those methods).
                ``AsyncVectorEnv`` raises it from ``call_wait``; this raises it at once.
        """
        self._check_open()
        self._check_idle("call_async")
        if name in _RESERVED_CALLS:
            raise ValueError(f"Trying to call function `{name}` with `call`, use `{name}` directly instead.")
        self._pool.call_async(RunOps(dict.fromkeys(range(self.num_envs), ops.CallOrGet(name, args, kwargs))))
        self._state = AsyncState.WAITING_CALL

    @other_call
    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the call started by :meth:`call_async`; return one result per env, in env order.

        Args:
            timeout: seconds to wait (any real number); ``None`` uses the constructor's ``timeout``.

        Raises:
            NoPendingCallError: no call is pending.
            StepTimeoutError: the envs did not answer within ``timeout`` (the env is then unusable).

        Example:
            >>> import gymnasium as gym
            >>> from shmvec import ShmVectorEnv
            >>> envs = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2)
            >>> envs.reset_async(seed=0)
            >>> obs, infos = envs.reset_wait(timeout=30)
            >>> envs.call_async("gravity")
            >>> envs.call_wait()
            (9.8, 9.8, 9.8, 9.8)
            >>> envs.close(terminate=True)
        """
        self._check_open()
        self._check_pending(AsyncState.WAITING_CALL, "call_wait", "call_async")
        results = self._finish("call_wait", self._pool.call_wait, timeout)
        return tuple(results[i] for i in range(self.num_envs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Return ``env.get_wrapper_attr(name)`` of every env (called if callable, as Gymnasium does)."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """``env.set_wrapper_attr(name, value)`` in every env.

        Args:
            name: the attribute.
            values: a list or tuple with one value per env, or any other object to set in all envs.

        Example:
            >>> import gymnasium as gym
            >>> from shmvec import ShmVectorEnv
            >>> envs = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2)
            >>> envs.set_attr("gravity", [9.8, 9.8, 1.6, 1.6])  # one value per env
            >>> envs.get_attr("gravity")
            (9.8, 9.8, 1.6, 1.6)
            >>> envs.close()
        """
        self._check_open()
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        self._check_idle("set_attr")
        self._pool.run({i: ops.SetWrapperAttr(name, value) for i, value in enumerate(values)})

    def render(self) -> tuple[Any, ...]:
        """Return ``env.render()`` of every env, in env order (``call("render")``, as ``AsyncVectorEnv``)."""
        return self.call("render")

    @other_call
    def call_one(self, index: int, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """:meth:`call` in env ``index`` only; its result (SuperSuit's vector env renders its first copy)."""
        self._check_open()
        if not 0 <= index < self.num_envs:
            raise IndexError(f"env index {index} out of range for {self.num_envs} envs")
        if name in _RESERVED_CALLS:
            raise ValueError(f"Trying to call function `{name}` with `call`, use `{name}` directly instead.")
        self._check_idle("call_one")
        return self._pool.run({index: ops.CallOrGet(name, args, kwargs)})[index]

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """The ``np_random_seed`` of every env."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Copies of every env's ``np_random`` generator."""
        return self.get_attr("np_random")

    # -- the pending call ----------------------------------------------------------

    def _check_open(self) -> None:
        """Raise AsyncVectorEnv's ``ClosedEnvironmentError`` after ``close()``."""
        if self.closed or self._pool.closed:
            raise ClosedEnvError(f"Trying to operate on `{type(self).__name__}`, after a call to `close()`.")

    def _check_idle(self, caller: str) -> None:
        """Raise AsyncVectorEnv's ``AlreadyPendingCallError`` if a call is pending."""
        if self._state != AsyncState.DEFAULT:
            end = "" if caller == "reset_async" else "."  # AsyncVectorEnv's reset_async message has no period
            raise AlreadyPendingError(
                f"Calling `{caller}` while waiting for a pending call to `{self._state.value}` to complete{end}",
                str(self._state.value),
            )

    def _check_full_batches(self, call: str) -> None:
        """reset()/step() act on every env: with smaller async batches, say what to use instead."""
        if self.batch_size != self.num_envs:
            raise StepStateError(
                f"{call}() is for batch_size == num_envs; this env has batch_size={self.batch_size} of "
                f"num_envs={self.num_envs}: use async_reset(), send() and recv()"
            )

    def _check_pending(self, state: AsyncState, caller: str, starter: str) -> None:
        """Raise AsyncVectorEnv's ``NoAsyncCallError`` unless ``state`` is what is pending."""
        if self._state != state:
            raise NoPendingCallError(f"Calling `{caller}` without any prior call to `{starter}`.", state.value)

    def _finish(self, caller: str, wait: Callable[[float | None], Any], timeout: Any) -> Any:
        """Run the pool's ``wait`` for the pending call; the call is no longer pending afterwards, whatever happens."""
        limit = seconds(timeout)  # before the state changes: a bad timeout leaves the call pending
        try:
            return wait(limit)
        except StepTimeoutError as exc:
            shown = self._pool.timeout if timeout is None else timeout
            raise StepTimeoutError(f"The call to `{caller}` has timed out after {shown} second(s): {exc}") from None
        finally:
            self._state = AsyncState.DEFAULT
