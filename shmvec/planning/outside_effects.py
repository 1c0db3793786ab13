"""What the timing run's env must not do outside its process: record videos, write logs, open a window.

The default plan steps one extra env with random actions (:mod:`~shmvec.engine.timing_run`).
Wrappers that write what an env does somewhere the user looks would leave a trace that a
``SyncVectorEnv`` run does not: CleanRL's ``make_env(..., capture_video=True)`` wraps env 0 in
``RecordVideo``, which would record the timing's random episodes into the run's ``videos/``
folder. :func:`quieten` turns off those it knows how to, before the env's first reset:

- Gymnasium's ``RecordVideo`` starts no recording (its triggers are removed);
- Stable-Baselines3's ``Monitor`` with a file (``make_vec_env(monitor_dir=...)``) writes no episode rows;

and names those it cannot: an env that renders to a window (``render_mode="human"``,
``HumanRendering``) shows it on the user's screen at every step. Effects of building the env
(a licence seat, a simulator, a robot) cannot be known from here: ``n_workers`` skips the
timing run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym


class NotTimed(RuntimeError):
    """The env would show its timing run outside its process (see :func:`quieten`)."""


def quieten(env: Any) -> str | None:
    """Turn off what ``env``'s wrappers would record outside its process; return why it cannot
    be stepped unseen (e.g. ``"it renders to a window (render_mode='human')"``), or None."""
    for layer in layers(env):
        if getattr(layer, "render_mode", None) == "human":
            return f"it renders to a window ({type(layer).__name__} with render_mode='human')"
    for layer in layers(env):
        own = vars(layer)  # its own attributes: Gymnasium 0.29's wrappers forward getattr, warning
        if isinstance(layer, gym.Wrapper) and "episode_trigger" in own and "step_trigger" in own:
            # RecordVideo, and Gymnasium 0.29's RecordVideoV0 (not its subclass): a recording starts only from a trigger
            layer.episode_trigger = layer.step_trigger = never
        writer = own.get("results_writer")
        if callable(getattr(writer, "write_row", None)):  # SB3's Monitor (and its subclasses) with a file
            layer.results_writer = None
            writer.close()
    return None


def never(_: int) -> bool:
    """A ``RecordVideo`` trigger that never fires (Gymnasium 0.29 calls its episode trigger when
    there is no step trigger, even if it is None; 1.x skips a None trigger)."""
    return False


def layers(env: Any) -> Iterator[Any]:
    """``env`` and every env it wraps, outermost first."""
    seen = set()
    while env is not None and id(env) not in seen:
        seen.add(id(env))
        yield env
        env = env.env if isinstance(env, gym.Wrapper) else None
