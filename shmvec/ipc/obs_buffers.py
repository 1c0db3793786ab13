"""Observation buffers of a pool (both backends): one, or two written in turn (zero-copy SB3)."""

from __future__ import annotations

from typing import Any

import numpy as np

from shmvec.ipc import layout as lay


class ObsBuffers:
    """Mixin for the pools: :attr:`obs_leaves` names the buffer the last step or full reset wrote.

    With two buffers (``ArenaLayout.plan(obs_buffers=2)``) each step and each reset of
    every env writes the other one, so the caller may read the previous observations in
    place until the call after next starts.
    """

    obs_leaves: dict[tuple[Any, ...], np.ndarray]

    def _init_obs_buffers(self, layout: lay.ArenaLayout, views: dict[str, np.ndarray]) -> None:
        self._obs_buffers = [layout.obs_views(views, b) for b in range(layout.obs_buffers)]
        self.obs_buffer = 0  # the buffer the last (or pending) step or reset writes
        self.obs_leaves = self._obs_buffers[0]

    def _turn_for_reset(self, kwargs: dict[int, Any]) -> None:
        """Before a reset: a full one writes the other buffer; a partial one keeps the others' rows."""
        if len(self._obs_buffers) > 1 and len(kwargs) == self.num_envs:
            self.ensure_can_step()
            self._next_obs_buffer()

    def _next_obs_buffer(self) -> None:
        """Have the call about to start write the other observation buffer."""
        self.obs_buffer ^= 1
        self.obs_leaves = self._obs_buffers[self.obs_buffer]
