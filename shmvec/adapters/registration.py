"""``gym.make_vec`` support: a ``shmvec/`` twin of any registered env id.

Gymnasium's ``gym.make_vec`` knows three vectorization modes, ``"sync"``, ``"async"`` and
``"vector_entry_point"``; the last one builds whatever the env spec's
``vector_entry_point`` returns. :func:`register` registers a twin of an env id, e.g.
``"shmvec/CartPole-v1"`` for ``"CartPole-v1"``, that is the same env (``gym.make`` of it
builds the original) with a vector entry point building a :class:`~shmvec.ShmVectorEnv`.
As the twin has a vector entry point, ``gym.make_vec`` uses it by default.

In ``"vector_entry_point"`` mode Gymnasium passes every option as a keyword argument
(``vector_kwargs`` and ``wrappers`` are refused), as for its own vector envs: keywords
named like :class:`~shmvec.ShmVectorEnv`'s parameters (:data:`VECTOR_OPTIONS`:
``n_workers``, ``autoreset_mode``, ``start_method``, ...) configure the vector env,
``env_wrappers`` takes the wrappers to apply to each env, and every other keyword goes
to ``gym.make`` of each env.
"""

from __future__ import annotations

import copy as copy_module
import dataclasses
import inspect
import sys
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from shmvec.adapters.vector import ShmVectorEnv
from shmvec.gymnasium_1_1 import require_vector_api
from shmvec.options import PoolOptions

__all__ = ["NAMESPACE", "VECTOR_OPTIONS", "ShmVectorEntryPoint", "make_vec", "register", "twin_id"]

NAMESPACE = "shmvec"

# ShmVectorEnv's own parameters (one source of truth: its signature, env_fns excepted), the pool options and
# main_shard (use_main_process's former name: PoolOptions.from_kwargs takes it with a DeprecationWarning).
VECTOR_OPTIONS = (
    tuple(
        name
        for name, param in inspect.signature(ShmVectorEnv.__init__).parameters.items()
        if name not in ("self", "env_fns") and param.kind != param.VAR_KEYWORD
    )
    + tuple(field.name for field in dataclasses.fields(PoolOptions) if field.name != "n_workers")
    + ("main_shard",)
)


@dataclasses.dataclass(frozen=True)
class ShmVectorEntryPoint:
    """The ``vector_entry_point`` of a ``shmvec/`` twin: ``gym.make_vec`` calls it.

    Attributes:
        env_id: the original env id; each env is ``gym.make(env_id, **env_kwargs)``.
    """

    env_id: str

    def __call__(
        self,
        num_envs: int = 1,
        *,
        env_wrappers: Sequence[Callable[[gym.Env], gym.Wrapper]] | None = None,
        **kwargs: Any,
    ) -> ShmVectorEnv:
        """Build the vector env with :func:`shmvec.make_vec`.

        Args:
            num_envs: number of envs.
            env_wrappers: wrapper functions applied in order to each env.
            **kwargs: :data:`VECTOR_OPTIONS` for :class:`~shmvec.ShmVectorEnv`; the rest
                goes to ``gym.make`` of each env.
        """
        vector_kwargs = {name: kwargs.pop(name) for name in VECTOR_OPTIONS if name in kwargs}
        n_workers = vector_kwargs.pop("n_workers", None)
        return make_vec(self.env_id, num_envs, n_workers, vector_kwargs=vector_kwargs, wrappers=env_wrappers, **kwargs)


def twin_id(env_id: str) -> str:
    """The id :func:`register` gives the twin of ``env_id``.

    Example:
        >>> twin_id("CartPole-v1"), twin_id("ALE/Pong-v5")
        ('shmvec/CartPole-v1', 'shmvec/ALE-Pong-v5')
    """
    namespace, name, version = gym.envs.registration.parse_env_id(env_id)
    if namespace is not None:  # an id has at most one namespace
        name = f"{namespace}-{name}"
    return gym.envs.registration.get_env_id(NAMESPACE, name, version)


def register(env_id: str) -> str:
    """Register ``"shmvec/<env_id>"``, whose ``gym.make_vec`` builds a :class:`~shmvec.ShmVectorEnv`.

    The twin copies the original's spec (``gym.make`` of it makes the same single env) and
    adds a ``vector_entry_point`` that calls :func:`shmvec.make_vec` on the original id.
    Registering twice is harmless.

    Args:
        env_id: a registered env id, e.g. ``"CartPole-v1"`` or ``"ALE/Pong-v5"``.

    Returns:
        The twin's id: ``"shmvec/CartPole-v1"``, ``"shmvec/ALE-Pong-v5"``.

    Raises:
        gymnasium.error.Error: ``env_id`` is not registered, or has no single-env entry point.
        ValueError: the twin id is taken by an env that shmvec did not register.

    Example:
        >>> import gymnasium as gym
        >>> import shmvec
        >>> shmvec.register("CartPole-v1")
        'shmvec/CartPole-v1'
        >>> envs = gym.make_vec("shmvec/CartPole-v1", num_envs=4, n_workers=2,
        ...                     autoreset_mode="SameStep", max_episode_steps=200)
        >>> type(envs).__name__, envs.num_envs, envs.n_workers
        ('ShmVectorEnv', 4, 2)
        >>> envs.close()
    """
    require_vector_api("shmvec.register")
    original = gym.spec(env_id)
    if original.entry_point is None:
        raise gym.error.Error(f"{env_id} has no entry_point: shmvec needs one to build each env in its workers")
    entry_point = ShmVectorEntryPoint(original.id)
    new_id = twin_id(original.id)
    existing = gym.registry.get(new_id)
    if existing is not None:
        if existing.vector_entry_point == entry_point:
            return new_id
        raise ValueError(
            f"{new_id} is already registered to another env ({existing.entry_point}); shmvec did not register it"
        )
    gym.register(
        id=new_id,
        entry_point=original.entry_point,
        reward_threshold=original.reward_threshold,
        nondeterministic=original.nondeterministic,
        max_episode_steps=original.max_episode_steps,
        order_enforce=original.order_enforce,
        disable_env_checker=original.disable_env_checker,
        kwargs=dict(original.kwargs),
        # gym.make_vec refuses a vector entry point next to additional wrappers; the vector
        # env still applies them, as it builds the original id.
        additional_wrappers=(),
        vector_entry_point=entry_point,
    )
    return new_id


def make_vec(
    env_id: str | gym.envs.registration.EnvSpec,
    num_envs: int = 1,
    n_workers: int | None = None,
    *,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Wrapper]] | None = None,
    **kwargs: Any,
) -> ShmVectorEnv:
    """Like ``gym.make_vec(env_id, num_envs, ...)``, vectorized with :class:`ShmVectorEnv`.

    Args:
        env_id: a registered env id (or an ``EnvSpec``), as for ``gym.make``.
        num_envs: number of envs.
        n_workers: worker processes; ``None`` (default) chooses them, and whether the main
            process steps envs too, from the cores and the envs' step cost (see :class:`ShmVectorEnv`).
        vector_kwargs: keyword arguments of :class:`ShmVectorEnv` (``autoreset_mode``,
            ``copy``, ``start_method``, ``timeout``, ...).
        wrappers: wrapper functions applied in order to each single env.
        **kwargs: passed to ``gym.make`` for each env (e.g. ``max_episode_steps``, ``g``).

    Returns:
        The vector env, its ``spec`` set as ``gym.make_vec`` sets it.

    Example:
        >>> import shmvec
        >>> envs = shmvec.make_vec("CartPole-v1", num_envs=8, n_workers=2,
        ...                        vector_kwargs={"autoreset_mode": "SameStep"})
        >>> envs.close()
    """
    require_vector_api("shmvec.make_vec")
    vector_kwargs = dict(vector_kwargs or {})
    wrappers = list(wrappers or [])
    if isinstance(env_id, gym.envs.registration.EnvSpec):
        env_spec = copy_module.deepcopy(env_id)
    else:
        env_spec = copy_module.deepcopy(gym.spec(env_id))
    env_kwargs = {**env_spec.kwargs, **kwargs}
    env_spec.kwargs = {}
    build_spec = _with_main_entry_point(env_spec)

    def make_one() -> gym.Env:
        env = gym.make(build_spec, **env_kwargs)
        for wrapper in wrappers:
            env = wrapper(env)
        return env

    envs = ShmVectorEnv([make_one] * num_envs, n_workers, **vector_kwargs)
    vector_spec = copy_module.deepcopy(env_spec)
    vector_spec.kwargs = dict(env_kwargs)
    if num_envs != 1:
        vector_spec.kwargs["num_envs"] = num_envs
    if wrappers:
        vector_spec.kwargs["wrappers"] = wrappers
    envs.spec = vector_spec
    return envs


def _with_main_entry_point(spec: gym.envs.registration.EnvSpec) -> gym.envs.registration.EnvSpec:
    """``spec``, an entry point ``"__main__:Name"`` replaced by the object it names here.

    Workers do not run the main script, so their ``__main__`` has no ``Name``; the object itself
    travels with the env_fns, by value, as cloudpickle carries the script's classes and functions.
    """
    entry = spec.entry_point
    if not (isinstance(entry, str) and entry.startswith("__main__:")):
        return spec
    obj: Any = sys.modules["__main__"]
    try:
        for part in entry.split(":", 1)[1].split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return spec  # gym.make says what is missing, as it would here
    return dataclasses.replace(spec, entry_point=obj)
