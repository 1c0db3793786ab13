"""``TimingsCallback``: ``envs.timings`` in SB3's logger, next to ``time/fps``.

Example::

    from stable_baselines3 import PPO
    from shmvec import ShmPoolVecEnv
    from shmvec.tools.sb3_callback import TimingsCallback

    model = PPO("MlpPolicy", ShmPoolVecEnv([make_env] * 8), tensorboard_log="runs")
    model.learn(100_000, callback=TimingsCallback())  # timings/caller_share, timings/envs_share, ...
"""

from __future__ import annotations

import logging

from stable_baselines3.common.callbacks import BaseCallback

from shmvec.tools.timeline import plot_timeline, shmvec_env_of

_log = logging.getLogger("shmvec")


class TimingsCallback(BaseCallback):
    """Records ``envs.timings.scalars()`` as ``timings/<name>`` in the model's logger at the end of
    each rollout (TensorBoard, W&B, CSV: wherever ``time/fps`` goes), then resets the timings.

    Each rollout's numbers are therefore its own: the wall time since the previous rollout's end,
    which is this rollout **and the update before it** (the training step runs between two rollouts,
    and counts as the caller's time); the first covers the time since ``learn`` started.
    ``timings/caller_share`` + ``envs_share`` + ``stragglers_share`` + ``library_share`` +
    ``calls_share`` is 1; also ``steps_per_second`` (vector steps), ``env_cpu_share`` and
    ``worker_busy_share`` (see :meth:`shmvec.clocks.timings.Timings.scalars`).

    The vec env may be wrapped (``VecNormalize``, ``VecMonitor``, ...); if it is not a shmvec one,
    the callback warns once (logger ``"shmvec"``) and does nothing.

    Args:
        verbose: 1 prints the timings table and its verdicts (``str(envs.timings)``) at each record.
        every: record every this many rollouts (the timings then cover them all): off-policy
            algorithms with ``train_freq=1`` end a rollout every step.
        timeline: a path for :func:`~shmvec.tools.timeline.plot_timeline`'s PNG of the rollout's
            last vector steps, written at each record (``{rollout}`` in it: the rollout's number);
            needs matplotlib.
    """

    def __init__(self, verbose: int = 0, every: int = 1, timeline: str | None = None):
        super().__init__(verbose)
        if every < 1:
            raise ValueError(f"every must be at least 1, got {every}")
        self.every, self.timeline = every, timeline
        self.rollouts = 0
        self._envs = None
        self._warned = False

    def _on_training_start(self) -> None:
        self._envs = shmvec_env_of(self.training_env)
        if self._envs is None:
            if not self._warned:
                _log.warning(
                    "TimingsCallback: the vec env %r is not a shmvec one (ShmPoolVecEnv); it records nothing",
                    type(self.training_env).__name__,
                )
                self._warned = True
            return
        self._envs.timings.reset()  # from learn()'s start: not the model's construction

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if self._envs is None:
            return
        self.rollouts += 1
        if self.rollouts % self.every:
            return
        timings = self._envs.timings
        for name, value in timings.scalars().items():
            self.logger.record(f"timings/{name}", value)
        if self.verbose >= 1:
            print(timings)
        if self.timeline is not None and timings.steps:
            plot_timeline(self._envs, self.timeline.format(rollout=self.rollouts))
        timings.reset()
