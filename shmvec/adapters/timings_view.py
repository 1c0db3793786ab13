"""``envs.timings``: where a run's time went, the same on ShmPoolVecEnv and ShmVectorEnv."""

from __future__ import annotations

from shmvec.clocks.timings import Timings
from shmvec.engine.interface import Engine


class TimingsView:
    """Mixed into both adapters."""

    _pool: Engine

    @property
    def timings(self) -> Timings:
        """Where the time went since the envs were made, or since the last ``envs.timings.reset()``:
        the caller's share (between calls), the envs', the stragglers', shmvec's own work and other
        calls, each worker's busy share and CPU share, each env's step times; ``print()`` it for a
        table and what would help. Always on: a few clock reads per step (sampled per env)."""
        return self._pool.timings()
