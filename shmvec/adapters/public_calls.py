"""What the adapters' public calls do around their work: a Ctrl-C is held until the pool's
bookkeeping agrees (:func:`~shmvec.ipc.interrupts.holding`), and their time is counted
apart from the caller's (:mod:`~shmvec.clocks.call_clock`; the adapter has ``_clock``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from shmvec.clocks.call_clock import timed_call, timed_step, timed_step_start
from shmvec.ipc.interrupts import holding

F = TypeVar("F", bound=Callable[..., Any])


def step_end(method: F) -> F:
    """A call that ends a step or returns an async batch (``step``, ``step_wait``, ``recv``)."""
    return holding(timed_step(method))


def step_start(method: F) -> F:
    """A call that starts one (``step_async``, ``send``)."""
    return holding(timed_step_start(method))


def other_call(method: F) -> F:
    """Any other call that reaches the envs: resets, ``call``, attributes."""
    return holding(timed_call(method))
