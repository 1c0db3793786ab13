"""The exceptions shmvec raises.

::

    ShmVecError
    ├── UnsupportedSpaceError      a space cannot live in shared memory      (also TypeError)
    ├── SpaceMismatchError         envs built by env_fns disagree on spaces  (also ValueError)
    ├── InvalidActionError         actions of the wrong count/shape/dtype    (also ValueError)
    ├── ClosedEnvError             the vector env was used after close()
    ├── StepStateError             step_wait without step_async, or twice step_async
    │   └── ResetNeededError       DISABLED autoreset: stepping an env whose episode ended (also AssertionError)
    ├── SharedMemoryCapacityError  /dev/shm cannot hold the buffers          (also MemoryError)
    ├── EnvError                   an env raised and its exception could not be sent back as itself
    ├── WorkerDiedError            a worker process exited or was killed
    └── StepTimeoutError           envs did not answer within the timeout    (also TimeoutError)

    RemoteTraceback                the worker-side traceback, set as ``__cause__`` of env errors

When an env raises inside a worker, the main process re-raises the *original*
exception (so ``except ValueError`` keeps working), with a note naming the env index
and worker and the remote traceback attached as ``__cause__``. Only when the
exception cannot be pickled is it replaced by :class:`EnvError`.
"""

from __future__ import annotations


class ShmVecError(Exception):
    """Base class of every error shmvec raises itself."""


class UnsupportedSpaceError(ShmVecError, TypeError):
    """A space type that shmvec cannot lay out in shared memory."""


class SpaceMismatchError(ShmVecError, ValueError):
    """The environments built by ``env_fns`` do not share the same spaces."""


class InvalidActionError(ShmVecError, ValueError):
    """Actions of the wrong number, shape or dtype were passed to ``step``."""


class ClosedEnvError(ShmVecError):
    """The vector env was used after ``close()``."""


class StepStateError(ShmVecError):
    """``step_wait`` called with no pending step, or ``step_async`` called twice."""


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


class StepTimeoutError(ShmVecError, TimeoutError):
    """Some envs did not answer within the configured timeout."""


class RemoteTraceback(Exception):
    """Carries the formatted traceback of an exception raised in a worker."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'
