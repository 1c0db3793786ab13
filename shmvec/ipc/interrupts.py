"""Ctrl-C during a call into a pool: held until the pool's bookkeeping agrees, then handed to the caller's
SIGINT handler (:func:`holding`); handed to it at once in env code the main process runs (:func:`env_code`).

A pool's bookkeeping spans several Python statements: a command word, its seq and its post;
a ``done`` taken from a semaphore and the count of what the worker still owes; a message
read from a pipe and the call it answers; an env's state in an async batch. A
KeyboardInterrupt (or any exception of a SIGINT handler) between two of them leaves a post no
seq matches, an answer taken and never counted (the next wait hangs), or a late answer read
as the next command's.

``pthread_sigmask`` cannot prevent that: it blocks SIGINT in the calling thread only. With
any other thread alive (torch's OpenMP team, a Jupyter kernel's) the kernel delivers SIGINT
there, and CPython still raises KeyboardInterrupt in the main thread at its next check,
inside the "masked" region; and the call that sets the mask can itself raise once the mask
is applied, leaving SIGINT blocked for good (and in every process started afterwards).

What holds in any process: CPython runs Python-level signal handlers only in the main
thread, between bytecodes, whichever thread the kernel delivered the signal to; and
``signal.signal`` runs the handlers of signals already pending before it swaps (so none is
lost across a swap). While a decorated call runs in the main thread, SIGINT's handler, if it
is a Python function (Python's default ``signal.default_int_handler``, which raises
KeyboardInterrupt, or the caller's own: "a first Ctrl-C sets a flag, the second raises",
``asyncio.run``'s), is swapped for :func:`_hold`, which only counts the signal. The caller's
handler comes back when the call ends and then runs once per Ctrl-C held, as if they came
right after the call returned; the first exception it raises ends that (the default raises at
the first). A wait that may last (a worker's answer, an async batch) runs the held ones after
each slice that ends without an answer, where nothing was taken but not counted
(:meth:`~shmvec.engine.worker_waits.WorkerWaits.collect`): Ctrl-C still ends a wait on a hung
env, within one slice, and a handler that returns lets the wait go on. So no exception of a
SIGINT handler can fall between a take and its count, a word and its post, or a pipe read and
its bookkeeping; the release/acquire pairs that publish the data (:mod:`shmvec.ipc.protocol`)
are unchanged. ``SIG_IGN`` and ``SIG_DFL`` need no holding (no Python code runs): they stay.

A handler run during a call that installs another (it replaces itself: a second Ctrl-C that
goes to a handler that raises, or to ``SIG_DFL``) is the caller's handler from then on: held
in turn if it is a Python function, left in place otherwise, and the one found when the call
ends. The handler found is the one put back, exactly (what ``signal.signal`` returns as it
swaps, so one that replaced itself at that instant is not lost).

Env code the main process runs inside a held call (the main shard's steps, resets and
calls) goes through :func:`env_code`: there a SIGINT runs the caller's handler at once, as
it would in ``SyncVectorEnv`` (the default's KeyboardInterrupt stops a sleep or a busy loop,
a hung env can be stopped), and a Ctrl-C held earlier in the call is delivered as the env
code starts. Its caller has its bookkeeping agree before (the workers' posts counted as owed)
and handles a KeyboardInterrupt from it; any other exception a handler raises there is one
of the env code (the env's error). A call into a pool from that env code is held as any other.

Another handler may raise at any instant (a SIGALRM timeout, a SIGTERM handler), also right
after the swap or inside the restore, as CPython checks for signals after every C call:
the swap is inside the ``try`` whose ``finally`` restores the caller's handler, the restore is
tried again where such a handler raised first (its exception is raised once the handler is
back), and should three handlers raise in a row, :func:`_hold` acts as the caller's handler
outside a call and the next call puts that one back. The handler is never left holding.

Why the bookkeeping is not reconciled from shared memory instead: a worker's count of its
answers, written before its ``done`` post, reads the same whether the main process took that
post and was interrupted before counting it, or the worker is between the store and the
post; the rows of the second case are not yet published (aarch64), so reading them on the
strength of the count would break the hand-off invariant. Pipe messages would need a seq
each as well. Holding the interrupt keeps every take and its count in one uninterrupted call.

Why a swap per call, not one handler installed while a pool is open: code that looks at
SIGINT's handler (``asyncio.run`` installs its own only over the default) would find ours,
and a handler the caller installs between calls would go unheld.

A call from another thread needs no holding, as no handler runs there. Nested calls keep the
outer call's hold. Cost: ~1 µs a call, most of it two ``sigaction`` system calls (made
through ``_signal``: ``signal.signal`` converts to and from enums, ~4 µs a call); ~0.2 µs a
nested call; ~0.3 µs a main shard's step (env_code).
"""

from __future__ import annotations

import _signal  # signal's C functions: signal.getsignal/signal wrap them in enum conversions (~2 µs each)
import functools
import signal
import sys
from collections.abc import Callable
from threading import get_ident, main_thread
from typing import Any, TypeVar

from shmvec.errors import ClosedEnvError

_SIGINT = int(signal.SIGINT)
_SIG_DFL = int(signal.SIG_DFL)
_getsignal, _setsignal = _signal.getsignal, _signal.signal
_held = 0  # the SIGINTs that arrived during the current call, not yet handed to the caller's handler
_holder: int | None = None  # the thread of the call that holds SIGINT (the main thread), while it runs
_through = False  # the holder runs env code (env_code): a SIGINT goes to the caller's handler at once
_caller: Any = signal.default_int_handler  # the caller's handler, while _hold stands in for it
_closed_hooks: list[Callable[[], None]] = []  # see on_closed

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")


def _hold(signum: int, frame: Any) -> None:
    global _held
    if _through or _holder is None:  # env code; or no call runs (see the module doc): as the caller's handler
        _deliver(frame)
    else:
        _held += 1


def _deliver(frame: Any) -> None:
    """One SIGINT to the caller's handler (the one installed, or the one _hold stands in for). Inside a
    held call, a handler it installs in its place becomes the caller's, held in turn (see the module doc)."""
    global _caller
    installed = _getsignal(_SIGINT)
    handler = _caller if installed is _hold else installed
    if not callable(handler):
        if handler == _SIG_DFL:  # a handler run before set it: this Ctrl-C ends the process, as it would have
            signal.raise_signal(_SIGINT)
        return  # ignored
    try:
        handler(_SIGINT, frame)
    finally:
        if installed is _hold and _holder is not None and _getsignal(_SIGINT) is not _hold:  # it replaced itself
            _caller = _getsignal(_SIGINT)
            if callable(_caller):
                _caller = _setsignal(_SIGINT, _hold)  # what it replaces: the newest, should one run meanwhile


def _deliver_held(frame: Any) -> None:
    """Hand the Ctrl-Cs held so far to the caller's handler, one call each, until one raises: the rest
    are dropped then (the default raises at the first; Ctrl-Cs that come as a handler unwinds count anew)."""
    global _held
    try:
        while _held:
            _held -= 1
            _deliver(frame)
    except BaseException:
        _held = 0
        raise


def holding(method: F) -> F:
    """``method``, with SIGINT held while it runs (see the module doc)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        global _held, _holder, _through, _caller
        handler = _getsignal(_SIGINT)
        try:  # (zero-cost until raised)
            if handler is _hold and _holder is not None or not callable(handler):
                if _through and _holder == get_ident():  # a pool call from env code that a held call runs
                    return _from_env_code(method, args, kwargs)
                return method(*args, **kwargs)  # nested (ours is in), or nothing to hold (SIG_IGN, SIG_DFL)
            thread = get_ident()
            if thread != main_thread().ident:  # no handler runs in this thread
                return method(*args, **kwargs)
        except ClosedEnvError:
            _closed_here()
            raise
        if handler is not _hold:  # else left by a restore that failed (see the module doc): _caller is still right
            _caller = handler
        try:
            _held, _holder, _through = 0, thread, False  # before the swap: a signal right after it is held
            try:
                replaced = _setsignal(_SIGINT, _hold)  # runs a handler already pending first, before any change
            except ValueError:  # not the main interpreter
                _holder = None
                return method(*args, **kwargs)
            if replaced is not _hold:  # the one installed at the swap: it may have replaced itself just before
                _caller = replaced
            return method(*args, **kwargs)
        except ClosedEnvError:
            _closed_here()
            raise
        finally:
            _through = False
            raised = None
            try:  # still holding: a SIGINT pending at the swap is counted, and no handler of the caller runs inside it
                if _getsignal(_SIGINT) is _hold:  # unless a handler run during the call installed another
                    _setsignal(_SIGINT, _caller)
            except BaseException as exc:  # another signal's handler raised first
                raised = exc
                _swap_back()
            _holder = None  # from here _hold hands a SIGINT on, should it still be in (see the module doc)
            count, _held = _held, 0  # (a pool call from the handler starts a count of its own)
            if count:
                try:
                    for _ in range(count):  # in the caller's frame: as if they came right after the call
                        _deliver(sys._getframe(1))
                except BaseException as exc:
                    if raised is not None and exc.__context__ is None:
                        exc.__context__ = raised
                    raise
            if raised is not None:
                raise raised

    return call  # type: ignore[return-value]


def on_closed(hook: Callable[[], None]) -> None:
    """Have ``hook()`` run in a thread whose call raises :class:`~shmvec.errors.ClosedEnvError` (an env
    that another thread closed: :mod:`~shmvec.processes.caller_threads` gives the thread back what it
    set there). Every public call of the adapters, and every call into a pool, is a held call."""
    _closed_hooks.append(hook)


def _closed_here() -> None:
    for hook in _closed_hooks:
        hook()


def _swap_back() -> None:
    """The caller's handler back after a handler raised at the first try; two tries more (see the module doc)."""
    try:
        if _getsignal(_SIGINT) is _hold:
            _setsignal(_SIGINT, _caller)
    except BaseException:
        try:
            if _getsignal(_SIGINT) is _hold:
                _setsignal(_SIGINT, _caller)
        except BaseException:
            pass  # _hold stays until the next call; it hands a SIGINT to _caller meanwhile


def _from_env_code(method: Callable[..., R], args: tuple, kwargs: dict) -> R:
    """A call into a pool from env code that a held call runs (an env stepping a pool of its own):
    held as any other, then back to the env code, where a Ctrl-C held meanwhile is delivered."""
    global _through
    _through = False
    try:
        return method(*args, **kwargs)
    finally:
        _through = True
        _deliver_held(sys._getframe(1))


def env_code(fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)``: env code that the main process runs inside a held call (the main shard's).

    A SIGINT during it goes to the caller's handler there at once, as it would without the
    pool; one held earlier in the call goes to it first. The caller's bookkeeping must agree
    when it calls this, and stay right if it raises.
    """
    global _through
    if _holder != get_ident():  # not inside a held call of this thread: a SIGINT reaches the handler anyway
        return fn(*args)
    if _held:
        _deliver_held(sys._getframe(1))
    try:
        _through = True
        return fn(*args)
    finally:
        _through = False


def let_through(fn: Callable[..., R], *args: Any) -> R:
    """:func:`env_code`, but a Ctrl-C held earlier in the call stays held (delivered as the call ends): for a
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
    return _held > 0 and _holder == get_ident()


def raise_held() -> None:
    """Hand the Ctrl-Cs held during the current call to the caller's handler, where the caller's bookkeeping
    agrees: the default raises KeyboardInterrupt; a handler that returns lets the call go on."""
    if held():
        _deliver_held(sys._getframe(1))
