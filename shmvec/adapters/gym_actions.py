"""A Gymnasium batch of actions, checked and split into the leaves a pool's rows take.

``SyncVectorEnv``/``AsyncVectorEnv`` take an element of the batched action space: for a
Dict or Tuple space, a dict or tuple of batches, one per leaf. :class:`GymActions` checks
such a batch (a single action where a batch is expected is ``AsyncVectorEnv``'s
``TypeError``; a wrong count, shape or structure its ``ValueError``) and yields each
fixed-size leaf's actions as given, with their checked array, for
:meth:`~shmvec.ipc.action_rows.ActionRows.write`; leaves with no fixed size come as a
tuple of one action per env, as ``iterate`` yields them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import Space

from shmvec.engine.validation import checked_column
from shmvec.errors import InvalidActionError, UnbatchedActionError
from shmvec.ipc import layout as lay

Column = tuple[tuple, Any, np.ndarray]  # (leaf path, its actions as given, those as a checked array)


class GymActions:
    """Checks batches of actions for ``num_envs`` envs of ``single_action_space``."""

    def __init__(
        self,
        single_action_space: Space,
        action_space: Space,
        num_envs: int,
        action_leaves: Mapping[tuple, np.ndarray],
        pickled_paths: tuple[tuple, ...],
    ):
        self.action_space = action_space
        self.leaves = list(action_leaves.items())  # (path, rows in the space's dtype)
        self.pickled_paths = pickled_paths
        self.num_envs = num_envs
        self._leaf_spaces = {path: lay.get_path(single_action_space, path) for path in action_leaves}

    def columns(self, actions: Any) -> list[Column]:
        """Every fixed-size leaf's column of a full batch."""
        self._check_batch(actions)
        return [self._column(actions, path, view) for path, view in self.leaves]

    def pickled(self, actions: Any) -> dict[tuple, tuple]:
        """Every leaf with no fixed size: a tuple of one action per env."""
        return {path: self._pickled_column(actions, path) for path in self.pickled_paths}

    def batch_columns(self, actions: Any, env_ids: np.ndarray) -> list[Column]:
        """Every fixed-size leaf's column of a batch for the envs ``env_ids`` (``send``)."""
        return [self._batch_column(actions, path, view, env_ids) for path, view in self.leaves]

    def _check_batch(self, actions: Any) -> None:
        """A ``TypeError`` for a single action where a batch is expected, as ``AsyncVectorEnv`` raises.

        Wrong counts, shapes and structures are left to the checks of each leaf, whose
        :class:`~shmvec.errors.InvalidActionError` is the ``ValueError`` AsyncVectorEnv raises there.
        """
        paths = [path for path, _ in self.leaves] + list(self.pickled_paths)
        for path in [()] + [path for path in paths if path]:
            try:
                part = lay.get_path(actions, path)
            except (KeyError, IndexError, TypeError):
                continue  # not the action space's structure: the leaf checks say so
            if _is_single_value(part):
                where = f" at {path}" if path else ""
                raise UnbatchedActionError(
                    f"expected a batch of {self.num_envs} actions{where} (an element of {self.action_space}), "
                    f"got the single value {part!r}; pass one action per env"
                )

    def _part(self, actions: Any, path: tuple) -> Any:
        try:
            return lay.get_path(actions, path)
        except (KeyError, IndexError, TypeError) as exc:
            raise InvalidActionError(
                f"actions do not match the action space {self.action_space}: cannot find the part at {path}"
            ) from exc

    def _column(self, actions: Any, path: tuple, view: np.ndarray) -> Column:
        part = self._part(actions, path)
        where = f" at {path}" if path else ""
        return path, part, checked_column(part, view, self._leaf_spaces[path], f"actions{where}")

    def _pickled_column(self, actions: Any, path: tuple) -> tuple:
        part = self._part(actions, path)
        where = f" at {path}" if path else ""
        wanted = f"expected actions{where} as a sequence of {self.num_envs} actions (one per env)"
        try:
            column = tuple(part)
        except TypeError as exc:
            raise InvalidActionError(f"{wanted}, got a {type(part).__name__}") from exc
        if len(column) != self.num_envs:
            raise InvalidActionError(f"{wanted}, got {len(column)}")
        return column

    def _batch_column(self, actions: Any, path: tuple, view: np.ndarray, env_ids: np.ndarray) -> Column:
        try:
            part = lay.get_path(actions, path)
            shape = np.shape(part)
        except (KeyError, IndexError, TypeError) as exc:
            raise InvalidActionError(f"actions do not match the action space: cannot find the part at {path}") from exc
        except ValueError:  # ragged: checked_column says so
            shape = (len(part),)
        where = f" at {path}" if path else ""
        if not shape or shape[0] != len(env_ids):
            raise InvalidActionError(
                f"send() needs one action per env in env_ids ({len(env_ids)}), got actions{where} of shape {shape}"
            )
        return path, part, checked_column(part, view[: len(env_ids)], self._leaf_spaces[path], f"actions{where}")


def _is_single_value(value: Any) -> bool:
    """Whether ``value`` is one action (0-d) rather than a batch or a dict/tuple of batches."""
    return not isinstance(value, (Mapping, tuple, list)) and np.ndim(value) == 0
