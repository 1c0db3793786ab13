"""shmvec: fast, dependable vectorized RL environments over shared memory.

- :class:`ShmPoolVecEnv` - a Stable-Baselines3 ``VecEnv`` (needs the ``[sb3]`` extra).
- :class:`ShmVectorEnv` / :func:`make_vec` - a Gymnasium ``VectorEnv``; :func:`register`
  gives any env id a ``shmvec/`` twin that ``gym.make_vec`` builds as one.
- :func:`concat_vec_envs_v1` - SuperSuit's, over shmvec: the agents of PettingZoo parallel envs as
  vector slots, with SuperSuit's base classes (``"gymnasium"``: :class:`ShmAgentConcatVecEnv`;
  ``"stable_baselines3"``: :class:`ShmAgentVecEnv`, an SB3 ``VecEnv``, needs the ``[sb3]`` extra);
  :class:`ShmAgentVectorEnv` - the same slots as a Gymnasium ``VectorEnv`` of Gymnasium's conventions.
- :class:`ShmPool` - the engine both adapters share.
- :class:`TimingsCallback` - ``envs.timings`` in SB3's logger at each rollout's end (needs the ``[sb3]`` extra).
"""

import sys

# Checked before anything else is imported: elsewhere the first pool would fail deep inside
# (no /dev/shm, no futex semaphores), or the first syntax Python 3.10 lacks.
if not sys.platform.startswith("linux") or sys.version_info < (3, 11):
    raise ImportError(
        "shmvec supports Linux only (shared memory in /dev/shm, futex-backed POSIX semaphores, /proc), "
        f"with Python 3.11 or later; this is {sys.platform!r} with Python {sys.version_info[0]}.{sys.version_info[1]}"
    )

from shmvec.adapters.agents_concat import ShmAgentConcatVecEnv, concat_vec_envs_v1
from shmvec.adapters.agents_gym import ShmAgentVectorEnv
from shmvec.adapters.registration import make_vec, register
from shmvec.adapters.vector import ShmVectorEnv
from shmvec.engine.pool import ShmPool
from shmvec.errors import (
    AlreadyPendingError,
    ClosedEnvError,
    EnvError,
    GymnasiumVersionError,
    InvalidActionError,
    NoPendingCallError,
    RemoteTraceback,
    ResetNeededError,
    SharedMemoryCapacityError,
    ShmVecError,
    SpaceMismatchError,
    StepStateError,
    StepTimeoutError,
    UnbatchedActionError,
    UnsupportedSpaceError,
    WorkerDiedError,
)

__version__ = "0.1.0"

__all__ = [
    "ShmAgentConcatVecEnv",
    "ShmAgentVecEnv",
    "ShmAgentVectorEnv",
    "ShmPool",
    "ShmPoolVecEnv",
    "ShmVectorEnv",
    "TimingsCallback",
    "concat_vec_envs_v1",
    "make_vec",
    "register",
    "AlreadyPendingError",
    "ClosedEnvError",
    "EnvError",
    "GymnasiumVersionError",
    "InvalidActionError",
    "NoPendingCallError",
    "RemoteTraceback",
    "ResetNeededError",
    "SharedMemoryCapacityError",
    "ShmVecError",
    "SpaceMismatchError",
    "StepStateError",
    "StepTimeoutError",
    "UnbatchedActionError",
    "UnsupportedSpaceError",
    "WorkerDiedError",
]


def __getattr__(name: str):
    # Adapters import their framework lazily: `import shmvec` needs neither SB3 nor torch.
    if name == "ShmPoolVecEnv":
        from shmvec.adapters.sb3 import ShmPoolVecEnv

        return ShmPoolVecEnv
    if name == "ShmAgentVecEnv":
        from shmvec.adapters.agents_sb3 import ShmAgentVecEnv

        return ShmAgentVecEnv
    if name == "TimingsCallback":
        from shmvec.tools.sb3_callback import TimingsCallback

        return TimingsCallback
    raise AttributeError(f"module 'shmvec' has no attribute {name!r}")
