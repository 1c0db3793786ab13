"""Ctrl-C during a call into a pool: held until the pool's bookkeeping agrees, then raised (:func:`holding`).

A pool's bookkeeping spans several Python statements: a command word, its seq and its post;
a ``done`` taken from a semaphore and the count of what the worker still owes; a message
read from a pipe and the call it answers; an env's state in an async batch. A
KeyboardInterrupt between two of them leaves a post no seq matches, an answer taken and
never counted (the next wait hangs), or a late answer read as the next command's.

``pthread_sigmask`` cannot prevent that: it blocks SIGINT in the calling thread only. With
any other thread alive (torch's OpenMP team, a Jupyter kernel's) the kernel delivers SIGINT
there, and CPython still raises KeyboardInterrupt in the main thread at its next check,
inside the "masked" region; and the call that sets the mask can itself raise once the mask
is applied, leaving SIGINT blocked for good (and in every process started afterwards).

What holds in any process: CPython runs Python-level signal handlers only in the main
thread, between bytecodes, whichever thread the kernel delivered the signal to; and
``signal.signal`` runs the handlers of signals already pending before it swaps (so none is
lost across a swap). While a decorated call runs in the main thread, if SIGINT's handler is
Python's default (``signal.default_int_handler``, which raises KeyboardInterrupt), it is
swapped for :func:`_hold`, which only records the signal; the default comes back when the
call ends, and a KeyboardInterrupt held meanwhile is raised then, as if it came right after
the call returned. A wait that may last (a worker's answer, an async batch) asks
:func:`held` after each slice that ends without an answer, where nothing was taken but not
counted, and raises there (:meth:`~shmvec.engine.worker_waits.WorkerWaits.collect`): Ctrl-C
still ends a wait on a hung env, within one slice. So no KeyboardInterrupt can fall between
a take and its count, a word and its post, or a pipe read and its bookkeeping; the
release/acquire pairs that publish the data (:mod:`shmvec.ipc.protocol`) are unchanged.

Why the bookkeeping is not reconciled from shared memory instead: a worker's count of its
answers, written before its ``done`` post, reads the same whether the main process took that
post and was interrupted before counting it, or the worker is between the store and the
post; the rows of the second case are not yet published (aarch64), so reading them on the
strength of the count would break the hand-off invariant. Pipe messages would need a seq
each as well. Holding the interrupt keeps every take and its count in one uninterrupted call.

Nothing else is changed: another handler (the caller's own, asyncio's) is left in place and
runs as it would, without this protection; a call from another thread needs none, as no
handler runs there. Nested calls keep the outer call's handler. Cost: ~1 µs a call, most
of it two ``sigaction`` system calls (made through ``_signal``: ``signal.signal`` converts to
and from enums, ~4 µs a call); ~0.2 µs a nested call.
"""

from __future__ import annotations

import _signal  # signal's C functions: signal.getsignal/signal wrap them in enum conversions (~2 µs each)
import functools
import signal
from collections.abc import Callable
from threading import get_ident, main_thread
from typing import Any, TypeVar

_SIGINT = int(signal.SIGINT)
_DEFAULT = signal.default_int_handler
_getsignal, _setsignal = _signal.getsignal, _signal.signal
_held = False  # a SIGINT arrived during the current call
_holder: int | None = None  # the thread of the call that holds SIGINT (the main thread), while it runs

F = TypeVar("F", bound=Callable[..., Any])


def _hold(signum: int, frame: Any) -> None:
    global _held
    _held = True


def holding(method: F) -> F:
    """``method``, with SIGINT held while it runs (see the module doc)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        global _held, _holder
        if _getsignal(_SIGINT) is not _DEFAULT:  # nested (ours is in), another handler, or none
            return method(*args, **kwargs)
        thread = get_ident()
        if thread != main_thread().ident:  # no handler runs in this thread
            return method(*args, **kwargs)
        _held, _holder = False, thread  # before the swap: a signal right after it is held, not lost
        try:
            _setsignal(_SIGINT, _hold)  # raises a KeyboardInterrupt already pending first, before any change
        except ValueError:  # not the main interpreter
            _holder = None
            return method(*args, **kwargs)
        try:
            return method(*args, **kwargs)
        finally:
            _holder = None
            if _getsignal(_SIGINT) is _hold:  # unless the call set a handler of its own meanwhile
                _setsignal(_SIGINT, _DEFAULT)  # runs _hold for a signal still pending, then swaps
            if _held:
                _held = False
                raise KeyboardInterrupt

    return call  # type: ignore[return-value]


def held() -> bool:
    """Whether a Ctrl-C came during the current call, in its thread (only a call of the main thread holds one)."""
    return _held and _holder == get_ident()


def raise_held() -> None:
    """Raise the KeyboardInterrupt held during the current call, if any: where the caller's bookkeeping agrees."""
    global _held
    if held():
        _held = False
        raise KeyboardInterrupt
