"""Ctrl-C during a call into a pool: held until the pool's bookkeeping agrees, then raised (:func:`holding`);
raised at once in env code the main process runs (:func:`env_code`).

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

Env code the main process runs inside a held call (the main shard's steps, resets and
calls) goes through :func:`env_code`: there a SIGINT raises KeyboardInterrupt at once, as it
would in ``SyncVectorEnv`` (a sleep or a busy loop is interrupted, a hung env can be
stopped), and a Ctrl-C held earlier in the call is raised as the env code starts. Its
caller has its bookkeeping agree before (the workers' posts counted as owed) and handles a
KeyboardInterrupt from it. A call into a pool from that env code is held as any other.

Another handler may raise at any instant (a SIGALRM timeout, a SIGTERM handler), also right
after the swap or inside the restore, as CPython checks for signals after every C call:
the swap is inside the ``try`` whose ``finally`` restores the default, the restore is tried
again where such a handler raised first (its exception is raised once the default is back),
and should three handlers raise in a row, :func:`_hold` acts as the default handler outside
a call and the next call puts the default back. The handler is never left holding.

Why the bookkeeping is not reconciled from shared memory instead: a worker's count of its
answers, written before its ``done`` post, reads the same whether the main process took that
post and was interrupted before counting it, or the worker is between the store and the
post; the rows of the second case are not yet published (aarch64), so reading them on the
strength of the count would break the hand-off invariant. Pipe messages would need a seq
each as well. Holding the interrupt keeps every take and its count in one uninterrupted call.

Why a swap per call, not one handler installed while a pool is open: code that looks at
SIGINT's handler (``asyncio.run`` installs its own only over the default) would find ours.

Nothing else is changed: another handler (the caller's own, asyncio's) is left in place and
runs as it would, without this protection; a call from another thread needs none, as no
handler runs there. Nested calls keep the outer call's handler. Cost: ~1 µs a call, most
of it two ``sigaction`` system calls (made through ``_signal``: ``signal.signal`` converts to
and from enums, ~4 µs a call); ~0.2 µs a nested call; ~0.3 µs a main shard's step (env_code).
"""

from __future__ import annotations

import _signal  # signal's C functions: signal.getsignal/signal wrap them in enum conversions (~2 µs each)
import functools
import signal
from collections.abc import Callable
from threading import get_ident, main_thread
from typing import Any, TypeVar

from shmvec.errors import ClosedEnvError

_SIGINT = int(signal.SIGINT)
_DEFAULT = signal.default_int_handler
_getsignal, _setsignal = _signal.getsignal, _signal.signal
_held = False  # a SIGINT arrived during the current call
_holder: int | None = None  # the thread of the call that holds SIGINT (the main thread), while it runs
_through = False  # the holder runs env code (env_code): a SIGINT raises there at once
_closed_hooks: list[Callable[[], None]] = []  # see on_closed

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")


def _hold(signum: int, frame: Any) -> None:
    global _held
    if _through or _holder is None:  # env code; or no call runs (see the module doc): as the default
        raise KeyboardInterrupt
    _held = True


def holding(method: F) -> F:
    """``method``, with SIGINT held while it runs (see the module doc)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        global _held, _holder, _through
        handler = _getsignal(_SIGINT)
        try:  # (zero-cost until raised)
            if handler is not _DEFAULT and (handler is not _hold or _holder is not None):
                if _through and _holder == get_ident():  # a pool call from env code that a held call runs
                    return _from_env_code(method, args, kwargs)
                return method(*args, **kwargs)  # nested (ours is in), another handler, or none
            thread = get_ident()
            if thread != main_thread().ident:  # no handler runs in this thread
                return method(*args, **kwargs)
        except ClosedEnvError:
            _closed_here()
            raise
        _held, _holder, _through = False, thread, False  # before the swap: a signal right after it is held
        try:
            try:
                _setsignal(_SIGINT, _hold)  # raises a KeyboardInterrupt already pending first, before any change
            except ValueError:  # not the main interpreter
                _holder = None
                return method(*args, **kwargs)
            return method(*args, **kwargs)
        except ClosedEnvError:
            _closed_here()
            raise
        finally:
            _through = False
            _holder = None  # from here _hold raises, as the default would (a SIGINT pending at the swap too)
            raised = None
            try:
                if _getsignal(_SIGINT) is _hold:  # unless the call set a handler of its own meanwhile
                    _setsignal(_SIGINT, _DEFAULT)  # runs pending handlers first, then swaps
            except BaseException as exc:  # a handler raised first (another's, or a pending SIGINT's)
                raised = exc
                _swap_back()
            if _held:
                _held = False
                interrupt = KeyboardInterrupt()
                interrupt.__context__ = raised
                raise interrupt
            if raised is not None:
                raise raised

    return call  # type: ignore[return-value]


def on_closed(hook: Callable[[], None]) -> None:
    """Have ``hook()`` run in a thread whose call raises :class:`~shmvec.errors.ClosedEnvError` (an env
    that another thread closed: :mod:`~shmvec.engine.caller_threads` gives the thread back what it
    set there). Every public call of the adapters, and every call into a pool, is a held call."""
    _closed_hooks.append(hook)


def _closed_here() -> None:
    for hook in _closed_hooks:
        hook()


def _swap_back() -> None:
    """The default handler back after a handler raised at the first try; two tries more (see the module doc)."""
    try:
        if _getsignal(_SIGINT) is _hold:
            _setsignal(_SIGINT, _DEFAULT)
    except BaseException:
        try:
            if _getsignal(_SIGINT) is _hold:
                _setsignal(_SIGINT, _DEFAULT)
        except BaseException:
            pass  # _hold stays until the next call; it raises as the default does meanwhile


def _from_env_code(method: Callable[..., R], args: tuple, kwargs: dict) -> R:
    """A call into a pool from env code that a held call runs (an env stepping a pool of its own):
    held as any other, then back to the env code, where a Ctrl-C held meanwhile is raised."""
    global _held, _through
    _through = False
    try:
        return method(*args, **kwargs)
    finally:
        _through = True
        if _held:
            _held = False
            raise KeyboardInterrupt


def env_code(fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)``: env code that the main process runs inside a held call (the main shard's).

    A SIGINT during it raises KeyboardInterrupt there at once, as it would without the pool;
    one held earlier in the call is raised first. The caller's bookkeeping must agree when it
    calls this, and stay right if it raises.
    """
    global _held, _through
    if _holder != get_ident():  # not inside a held call of this thread: a SIGINT raises anyway
        return fn(*args)
    if _held:
        _held = False
        raise KeyboardInterrupt
    try:
        _through = True
        return fn(*args)
    finally:
        _through = False


def let_through(fn: Callable[..., R], *args: Any) -> R:
    """:func:`env_code`, but a Ctrl-C held earlier in the call stays held (raised as the call ends): for a
    caller whose bookkeeping agrees only if ``fn`` runs or raises (an async send's env of the main shard)."""
    global _through
    if _holder != get_ident():
        return fn(*args)
    try:
        _through = True
        return fn(*args)
    finally:
        _through = False


def held() -> bool:
    """Whether a Ctrl-C came during the current call, in its thread (only a call of the main thread holds one)."""
    return _held and _holder == get_ident()


def raise_held() -> None:
    """Raise the KeyboardInterrupt held during the current call, if any: where the caller's bookkeeping agrees."""
    global _held
    if held():
        _held = False
        raise KeyboardInterrupt
