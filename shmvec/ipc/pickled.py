"""Leaves with no fixed size (Graph, Sequence, Text, OneOf, custom spaces), main side.

They have no shared buffer: a worker sends their observation values with its reply (a
:class:`~shmvec.ipc.protocol.StepInfo` per env for a step, a
:class:`~shmvec.ipc.protocol.ResetResult` per env for a reset), and their actions follow each
STEP command on the pipe as a :class:`~shmvec.ipc.protocol.PickledActions`. A pool whose
spaces have no such leaf pays nothing here: every method returns at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shmvec.errors import InvalidActionError
from shmvec.ipc import layout as lay
from shmvec.ipc.protocol import PickledActions, ResetResult, StepInfo
from shmvec.ipc.wire import to_worker


class PickledLeaves:
    """The pickled leaves of one pool: their latest observation values and how actions travel."""

    def __init__(self, layout: lay.ArenaLayout, shards: list[tuple[int, int]], num_envs: int):
        # leaf path -> one value per env, refreshed by every step and reset
        self.obs: dict[tuple, list[Any]] = {leaf.path: [None] * num_envs for leaf in layout.pickled_obs_leaves}
        self.action_paths = tuple(leaf.path for leaf in layout.pickled_action_leaves)
        self._shards = shards
        self.main_actions: PickledActions | None = None  # the main shard's part of the last step

    def action_blobs(self, columns: dict[tuple, Sequence[Any]] | None) -> list[bytes] | None:
        """Each shard's part of ``columns`` (leaf path -> one action per env), pickled; ``None`` without such leaves."""
        if not self.action_paths:
            return None
        if columns is None or set(columns) != set(self.action_paths):
            raise ValueError(f"step_async needs the actions of the pickled action leaves {list(self.action_paths)}")
        parts = [
            PickledActions({path: tuple(columns[path][s:e]) for path in self.action_paths}) for s, e in self._shards
        ]
        self.main_actions = parts[-1]  # used only with a main shard
        return [_dumps(part) for part in parts]

    @staticmethod
    def send(link: Any, blob: bytes) -> None:
        try:
            link.conn.send_bytes(blob)
        except OSError:
            pass  # the worker died: the wait that follows finds it and raises or restarts it

    def keep_obs(self, records: list[StepInfo]) -> list[StepInfo]:
        """Store the records' observation leaves; return the records that carry more (info, episode end)."""
        if not self.obs:
            return records
        kept = []
        for record in records:
            if record.pickled_obs is None:
                kept.append(record)
                continue
            for path, value in record.pickled_obs.items():
                self.obs[path][record.env_index] = value
            if record.info or record.final_info is not None or record.restarted:
                kept.append(record)
        return kept

    def keep_reset_obs(self, results: dict[int, Any]) -> dict[int, Any]:
        """Store the observation leaves of reset results; return ``{env: info}`` (other results unchanged)."""
        if not self.obs:
            return results
        out = {}
        for i, result in results.items():
            if isinstance(result, ResetResult):
                for path, value in result.pickled_obs.items():
                    self.obs[path][i] = value
                result = result.info
            out[i] = result
        return out


def _dumps(part: PickledActions) -> bytes:
    try:
        return to_worker(part)
    except Exception as exc:
        raise InvalidActionError(
            f"actions at {list(part.columns)} cannot be pickled, so they cannot reach the worker processes; "
            "pass picklable actions"
        ) from exc
