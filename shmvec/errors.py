"""The exceptions shmvec raises.

::

    ShmVecError
    ├── UnsupportedSpaceError      a space cannot live in shared memory      (also TypeError)
    ├── SpaceMismatchError         envs built by env_fns disagree on spaces  (also ValueError, RuntimeError)
    ├── InvalidActionError         actions of the wrong count/shape/dtype    (also ValueError)
    │   └── UnbatchedActionError   one action where a batch is expected      (also TypeError)
    ├── ClosedEnvError             the vector env was used after close()     (also gymnasium's ClosedEnvironmentError)
    ├── StepStateError             a wait or a call out of order
    │   ├── NoPendingCallError     a wait with nothing started to wait for   (also gymnasium's NoAsyncCallError)
    │   ├── AlreadyPendingError    a call while another one is pending       (also gymnasium's AlreadyPendingCallError)
    │   └── ResetNeededError       DISABLED autoreset: stepping an env whose episode ended (also AssertionError)
    ├── SharedMemoryCapacityError  /dev/shm cannot hold the buffers          (also MemoryError)
    ├── EnvError                   an env raised and its exception could not be sent back as itself
    ├── WorkerDiedError            a worker process exited or was killed
    ├── GymnasiumVersionError      the Gymnasium side on a Gymnasium before 1.1 (also ImportError)
    ├── MainModuleError            no longer raised (workers do not import the main script); kept for old code
    └── StepTimeoutError           envs did not answer within the timeout
                                   (also TimeoutError, multiprocessing.TimeoutError)

    RemoteTraceback                the worker-side traceback, set as ``__cause__`` of env errors

When an env raises inside a worker, the main process re-raises the *original*
exception (so ``except ValueError`` keeps working), with a note naming the env index
and worker and the remote traceback attached as ``__cause__``. Only when the
exception cannot be pickled is it replaced by :class:`EnvError`.

Where Gymnasium's ``AsyncVectorEnv`` raises its own class, the matching shmvec error
subclasses it too, so code written for either catches both::

    >>> import gymnasium
    >>> from shmvec.errors import ClosedEnvError
    >>> issubclass(ClosedEnvError, gymnasium.error.ClosedEnvironmentError)
    True
"""

from __future__ import annotations

import multiprocessing

from gymnasium import error as gym_error


class ShmVecError(Exception):
    """Base class of every error shmvec raises itself."""


class UnsupportedSpaceError(ShmVecError, TypeError):
    """A space type that shmvec cannot lay out in shared memory."""


class SpaceMismatchError(ShmVecError, ValueError, RuntimeError):
    """The environments built by ``env_fns`` do not share the same spaces.

    A ``RuntimeError`` too, as Gymnasium's vector envs raise one there. When the pool's
    start-up check raised it, ``space`` says which space differs (``"observation"`` or
    ``"action"``) and ``spaces`` holds that space of every env, in env order.
    """

    space: str | None = None
    spaces: list | None = None


class InvalidActionError(ShmVecError, ValueError):
    """Actions of the wrong number, shape or dtype were passed to ``step``."""


class UnbatchedActionError(InvalidActionError, TypeError):
    """A single action (a scalar) was passed where a batch of ``num_envs`` actions is expected.

    A ``TypeError`` too, as ``AsyncVectorEnv`` raises one there.
    """


class ClosedEnvError(ShmVecError, gym_error.ClosedEnvironmentError):
    """The vector env was used after ``close()``."""


class StepStateError(ShmVecError):
    """A wait or a call out of order: see the subclasses."""


class NoPendingCallError(StepStateError, gym_error.NoAsyncCallError):
    """A ``*_wait`` call with no matching ``*_async`` call pending (e.g. ``step_wait`` without ``step_async``).

    ``name`` is what was expected to be pending (``"step"``, ``"reset"``, ``"call"``), as in Gymnasium.
    """

    def __init__(self, message: str, name: str | None = None):
        super().__init__(message, name)


class AlreadyPendingError(StepStateError, gym_error.AlreadyPendingCallError):
    """A call while another one is pending (e.g. ``step_async`` twice, ``reset`` before ``step_wait``).

    ``name`` is what is pending (``"step"``, ``"reset"``, ``"call"``), as in Gymnasium.
    """

    def __init__(self, message: str, name: str | None = None):
        super().__init__(message, name)


class ResetNeededError(StepStateError, AssertionError):
    """With autoreset disabled, ``step`` was called on envs whose episode ended and were not reset.

    ``SyncVectorEnv`` fails here with an ``AssertionError``, hence the second base.
    """


class SharedMemoryCapacityError(ShmVecError, MemoryError):
    """The shared-memory filesystem cannot hold the buffers the pool needs."""


class EnvError(ShmVecError):
    """An env raised an exception that could not be transported back as itself."""


class WorkerDiedError(ShmVecError):
    """A worker process exited or was killed while the pool needed it."""


class StepTimeoutError(ShmVecError, TimeoutError, multiprocessing.TimeoutError):
    """Some envs did not answer within the timeout.

    Both timeout classes: the builtin one and ``multiprocessing.TimeoutError``, which
    ``AsyncVectorEnv`` raises.
    """


class GymnasiumVersionError(ShmVecError, ImportError):
    """The installed Gymnasium is older than the part of shmvec that was asked for needs.

    ``ShmVectorEnv``, ``ShmAgentVectorEnv``, ``make_vec`` and ``register`` follow the ``VectorEnv``
    API of Gymnasium 1.1 and later; on older releases (which SB3 accepts) only the SB3 side works
    (:mod:`shmvec.gymnasium_1_1`). An ``ImportError`` too, as for any dependency too old to use.
    """


class RemoteTraceback(Exception):
    """Carries the formatted traceback of an exception raised in a worker."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


class MainModuleError(ShmVecError, RuntimeError):
    """No longer raised: workers do not import the main script any more. Kept so that code catching it still runs."""
