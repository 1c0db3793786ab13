"""What the main process and a worker say to each other, and how each hand-off is published.

The per-step path uses the control block (``layout.CTRL_*``) and the worker's semaphores;
everything below the enums is a rare message pickled through the worker's pipe: start-up,
reset, attribute/method calls, the infos that do not fit a shared row (``ipc/info_rows.py``)
and errors. Spaces with leaves of no fixed
size (``layout.Leaf.pickled``) add per-step messages: :class:`PickledActions` after each
STEP command when the action space has such leaves, and a :class:`StepInfo` for every env,
carrying ``pickled_obs``, in each step reply when the observation space has them.

The invariant: every datum that crosses processes is read only after acquiring the
semaphore post that published it. A ``sem_post`` publishes every store its poster made
before it; a wait or ``acquire(0)`` that takes that post, or a later one of the same
semaphore, sees them. Plain numpy stores and loads are not ordered (aarch64 may show a
later store before an earlier one), so a cell read without that acquire, a count or a
flag, vouches for nothing else. A pipe message publishes what its sender wrote before
sending it in the same way (the kernel's pipe lock orders memory like a semaphore).

Each hand-off, as writer: what -> the post that publishes it -> reader, after taking it:

- main, every command: the ``CTRL_POST`` word (seq, sent, command) -> the ``seq``-th post
  on ``cmd[k]`` -> worker k, once it has taken ``seq`` posts (see :func:`post_word`).
- main, STEP: the action rows, ``CTRL_NEXT_WAIT``, ``CTRL_OBS_BUFFER`` -> the STEP's post
  -> worker k, with the word. Pickled action leaves follow on the pipe.
- main, MESSAGE: the request -> the pipe (``CTRL_OBS_BUFFER`` of a full reset: the post)
  -> worker k, after the word (written before the post when it fits the socket's buffer).
- main, SEND: inbox slots up to ``sent`` and their action rows -> the SEND's post (or a
  later one) -> worker k, which steps exactly the ids up to the ``sent`` of the word it
  acts on, never a count read again.
- worker k, a command's answer: ``CTRL_STATUS`` and its rows (observations, rewards,
  flags, final observations, info rows and codes, its block of info schemas) ->
  ``done[k]``, one post per command -> main (``WorkerLink.wait``), then the reply on the
  pipe.
- worker k, env i of a send: its rows, ``ENV_STATUS[i]``, ``READY_NS[i]``, its outbox slot
  -> ``finished[k]``, one post per env -> main (``AsyncSchedule._scan``), one outbox slot
  per post taken; ``ready``, shared by the workers, only wakes it. Env i's record or
  error follows on the pipe. ``CTRL_PUBLISHED`` (the worker's count of outbox slots) is
  only a hint of which workers to take posts from: a count not visible yet is visible
  once the ``ready`` post made after it is taken, and that post wakes the main process.
- main, a step of more than 8 workers: every worker's word -> the roots' posts ->
  each worker, which posts its children's ``cmd`` before stepping (``engine.step_tree``):
  acquire/release pairs chain, so a child sees every store made before the root's post.
- main, start-up and restart: the worker's control row (zeroed, ``CTRL_OBS_BUFFER``) ->
  the pipe (Attach) -> worker k, once it has received Attach.
- worker k, restarted: its envs' reset rows -> the pipe (their reset infos) -> main, once
  it has received them.

How the messages are pickled for the pipe: :mod:`shmvec.ipc.wire`.

The Ray backend adds no shared cells: the driver and a node's actor talk through Ray
calls, and the node's own pool follows the list above.
"""

from __future__ import annotations

import enum
import pickle
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import gymnasium as gym

from shmvec.errors import EnvError
from shmvec.gymnasium_1_1 import AutoresetMode


class Command(enum.IntEnum):
    """Written by the main process in the worker's control row (a :func:`post_word`) before posting to it."""

    STEP = 1  # step the shard with the actions in shared memory
    MESSAGE = 2  # a request object comes on the pipe (before the post if it fits the buffer, else after)
    CLOSE = 3  # close the envs and exit
    SEND = 4  # async batches: step the envs put in the worker's inbox up to the word's ``sent``, one by one


class NextWait(enum.IntEnum):
    """Written by the main process with each step: how the worker waits for the step after it.

    The main process knows what the worker cannot: whether its caller comes back soon (a
    bare stepping loop, or a light policy's forward pass: spinning through the wait saves
    a ~80 µs wake-up) or computes for long between steps (a CNN: a spinner would hold a
    core for nothing).
    """

    OWN = 0  # adaptively, within the worker's max_spin (also after every command but STEP)
    BLOCK = 1  # the caller computes for long between steps: block at once
    SPIN = 2  # the caller comes back soon and every busy process has a core: spin up to signals.MAX_SPIN


class Status(enum.IntEnum):
    """Written by the worker before it posts ``done``."""

    OK = 0  # nothing follows
    REPLY = 1  # one reply object follows on the pipe
    ERROR = 2  # an ErrorReport follows on the pipe


# The CTRL_POST word: seq | sent | command, in one int64.
POST_SPAN = 16  # > every Command
SENT_SPAN = 1 << 24  # > the envs of any worker, so that the ids in flight (sent minus taken) fit
SEQ_SPAN = 1 << 35  # the rest of the word: seqs wrap, and a worker counts its posts mod SEQ_SPAN
SENT_SHIFT = POST_SPAN.bit_length() - 1
SEQ_SHIFT = SENT_SHIFT + SENT_SPAN.bit_length() - 1


def post_word(seq: int, sent: int, command: int) -> int:
    """The ``layout.CTRL_POST`` word of the ``seq``-th post on a worker's ``cmd``, made once the
    main process has put ``sent`` env ids in the worker's inbox.

    Each post overwrites the word. A worker acts on it only once it has taken ``seq`` posts,
    when that post has published the word and every store before it; reading it ahead of
    them, it takes posts until they match. Acting on the newest word loses nothing: ``sent``
    counts every send, and after a STEP or MESSAGE the main process posts nothing until the
    worker's ``done``, but a CLOSE, which supersedes it.
    """
    return (seq % SEQ_SPAN) << SEQ_SHIFT | (sent % SENT_SPAN) << SENT_SHIFT | command


def read_word(word: int) -> tuple[int, int, int]:
    """``(seq, sent, command)`` of a :func:`post_word` word (seq mod SEQ_SPAN, sent mod SENT_SPAN)."""
    return word >> SEQ_SHIFT, (word >> SENT_SHIFT) % SENT_SPAN, word % POST_SPAN


# ---- start-up -----------------------------------------------------------------------


@dataclass
class Hello:
    """First message of a worker: what its envs look like."""

    worker: int
    spaces: list[tuple[gym.Space, gym.Space]]  # (observation_space, action_space) per env
    metadata: dict[str, Any]
    render_mode: str | None
    spec: Any  # gym.envs.registration.EnvSpec | None


@dataclass
class Attach:
    """Main -> worker once: where the shared buffers are and how to auto-reset."""

    arena_name: str
    layout: Any  # layout.ArenaLayout
    autoreset_mode: AutoresetMode
    ready_name: str  # the signal posted for every env an async send finishes (a wake-up: see the module doc)
    # The worker replaces one that died: it resets its envs and replies their reset infos.
    restart: bool = False
    # The cmd signals of the workers this one posts when it takes a STEP (engine.step_tree).
    step_children: tuple[str, ...] = ()


# ---- requests (main -> worker) and replies ------------------------------------------


@dataclass
class Reset:
    """Reset the envs named in ``kwargs`` with exactly those keyword arguments."""

    kwargs: dict[int, dict[str, Any]]  # global env index -> env.reset(**kwargs)


@dataclass
class RunOps:
    """Apply ``ops[i](env_i)`` to each named env and reply ``{i: result}``."""

    ops: dict[int, Callable[[gym.Env], Any]]


class SendReply(NamedTuple):
    """Async batches, worker -> main: the record ([StepInfo]) or ErrorReport of env ``env_index``'s step.

    Typed apart from the replies to commands: it may reach the pipe ahead of a rare call's reply.
    """

    env_index: int
    payload: Any


class StepInfo(NamedTuple):
    """Sent for an env whose step produced a non-empty info or ended an episode."""

    env_index: int
    info: dict[str, Any]  # what the env returned last (its reset info if it auto-reset)
    final_obs: Any = None  # SAME_STEP mode, episode ended: the last observation ...
    final_info: dict[str, Any] | None = None  # ... and the step info that came with it
    restarted: bool = False  # the env's worker died and was re-created (restart mode); info: its reset info
    # Observation spaces with pickled leaves: {leaf path: value} of the env's (new) observation.
    pickled_obs: dict[tuple, Any] | None = None


class ResetResult(NamedTuple):
    """An env's reset as a worker replies it when the observation space has pickled leaves."""

    info: dict[str, Any]
    pickled_obs: dict[tuple, Any]  # {leaf path: value} of the reset observation


@dataclass
class PickledActions:
    """Main -> worker on the pipe right after a STEP command, when the action space has pickled leaves."""

    columns: dict[tuple, Sequence[Any]]  # leaf path -> the actions of the worker's envs, in env order


@dataclass
class ErrorReport:
    """An exception raised in a worker, ready to be re-raised in the main process."""

    worker: int
    env_index: int | None
    exc_type: str
    message: str
    traceback: str
    # The pickled exception when it survives the trip; kept as bytes so that a class the
    # main process cannot import degrades to EnvError instead of breaking the report.
    exception: bytes | None = field(default=None)

    @classmethod
    def capture(cls, worker: int, env_index: int | None, exc: BaseException) -> ErrorReport:
        try:
            shipped: bytes | None = pickle.dumps(exc)
            pickle.loads(shipped)  # e.g. a custom __init__ signature fails only here
        except Exception:
            shipped = None
        return cls(
            worker=worker,
            env_index=env_index,
            exc_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
            message=_text(exc),
            traceback="".join(traceback.format_exception(exc)),
            exception=shipped,
        )

    def rebuild(self) -> BaseException:
        """The original exception if it unpickles here, else an :class:`EnvError` carrying its text."""
        if self.exception is not None:
            try:
                exc = pickle.loads(self.exception)
                if isinstance(exc, BaseException):
                    return exc
            except Exception:
                pass
        return EnvError(f"{self.exc_type}: {self.message}")


def _text(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder where the exception's ``__str__`` raises: the env's error is
    still reported as itself (the traceback module prints such a one the same way)."""
    try:
        return str(exc)
    except Exception as failure:
        return f"<str() of the {type(exc).__qualname__} raised {type(failure).__qualname__}>"
