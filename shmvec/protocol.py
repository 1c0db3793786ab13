"""What the main process and a worker say to each other.

The per-step path uses only two int64 cells of the control block (``layout.CTRL_*``)
and two semaphores; everything below the enums is a rare message pickled through the
worker's pipe: start-up, reset, attribute/method calls, non-empty infos and errors.
Spaces with leaves of no fixed size (``layout.Leaf.pickled``) add per-step messages:
:class:`PickledActions` after each STEP command when the action space has such leaves,
and a :class:`StepInfo` for every env, carrying ``pickled_obs``, in each step reply when
the observation space has them.
"""

from __future__ import annotations

import enum
import pickle
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from shmvec.errors import EnvError


class Command(enum.IntEnum):
    """Written by the main process in the worker's control row (with its seq) before posting to it."""

    STEP = 1  # step the shard with the actions in shared memory
    MESSAGE = 2  # a request object follows on the pipe
    CLOSE = 3  # close the envs and exit
    SEND = 4  # async batches: step the envs newly put in the worker's inbox, one by one


class NextWait(enum.IntEnum):
    """Written by the main process with each step: how the worker waits for the step after it.

    The main process knows what the worker cannot: whether its caller comes back at once
    (a bare stepping loop: spinning through the wait saves a ~80 µs wake-up) or computes
    between steps (a policy: a spinner would take a core from it).
    """

    OWN = 0  # adaptively, within the worker's max_spin (also after every command but STEP)
    BLOCK = 1  # the caller computes between steps: block at once
    SPIN = 2  # the caller steps in a tight loop and every busy process has a core: spin up to sync.MAX_SPIN


class Status(enum.IntEnum):
    """Written by the worker before it posts ``done``."""

    OK = 0  # nothing follows
    REPLY = 1  # one reply object follows on the pipe
    ERROR = 2  # an ErrorReport follows on the pipe


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
    ready_name: str  # the signal posted for every env an async send finishes
    # The worker replaces one that died: it resets its envs and replies their reset infos.
    restart: bool = False


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
            message=str(exc),
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
