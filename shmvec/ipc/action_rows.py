"""Action rows: each env gets its action in shared memory as the caller gave it.

``SyncVectorEnv``, ``AsyncVectorEnv`` and ``DummyVecEnv`` hand each env its part of the
caller's batch untouched: a row of the caller's array (a numpy scalar or array of the
caller's dtype, whatever the space's dtype), or the caller's own Python number or list.
An env may depend on that (``time.sleep`` takes a ``numpy.float64`` but refuses a
``numpy.float32``; MuJoCo integrates float64 controls differently from their float32
roundings). So an action leaf's row holds any real dtype: it is
:data:`~shmvec.ipc.layout.ACTION_ITEMSIZE` bytes per element, and a code per leaf and env
(the ``ACTION_CODE`` field) says which dtype the row holds and whether the env gets it as
numpy values or, through ``tolist()``, as Python ones. One more code per leaf, after the
envs', is the code of every row when one write gave all rows the same (:data:`MIXED`
otherwise), so that a shard reads one code, not one per env, in the common case. The
main process writes the codes with the rows, before the command that publishes both; a
worker reads them after it.

Python values come back as one Python number type per env: a list mixing ints and
floats arrives as floats, a tuple as a list (numpy keeps neither apart).

Example:
    >>> from gymnasium import spaces
    >>> from shmvec.ipc import layout as lay
    >>> layout = lay.ArenaLayout.plan(spaces.Discrete(2), spaces.Box(0, 1, (), np.float32), 3, 1)
    >>> rows = ActionRows(layout, layout.views(bytearray(layout.nbytes)))
    >>> actions = [0.5, np.float64(0.25), np.float32(1.0)]
    >>> rows.write((), actions, np.asarray(actions))
    >>> [(type(a).__name__, float(a)) for a in rows.column(0, 0, 3)]
    [('float', 0.5), ('float64', 0.25), ('float32', 1.0)]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from shmvec.ipc import layout as lay

# Every real dtype a caller may give, by dtype.char: int64 and longlong are both here
# since numpy keeps their scalar types apart.
DTYPES = tuple(np.dtype(char) for char in "?bhilqBHILQefdg")
PYTHON = len(DTYPES)  # code + PYTHON: the env gets the row's values as Python numbers/lists
_CODES = {dtype.char: code for code, dtype in enumerate(DTYPES)}
_PYTHON_SCALARS = frozenset((bool, int, float))
assert max(dtype.itemsize for dtype in DTYPES) <= lay.ACTION_ITEMSIZE

MIXED = -1  # the all-rows code when the rows hold different codes
_ALL = slice(None)
TakenRows = tuple[np.ndarray, list[np.ndarray]]  # (codes [leaf, env], raw rows per leaf): ActionRows.take


def dtype_code(dtype: np.dtype) -> int:
    """The code of ``dtype`` (its native-order twin for another byte order)."""
    code = _CODES.get(dtype.char)
    return _CODES[np.dtype(f"{dtype.kind}{dtype.itemsize}").char] if code is None else code


def value_code(value: Any) -> int:
    """The code of one env's action as given: a numpy scalar or array keeps its dtype, a
    Python number, list or tuple comes back as Python values, anything else (a tensor) as
    the numpy array it converts to."""
    if isinstance(value, (np.ndarray, np.generic)):
        return dtype_code(value.dtype)
    python = isinstance(value, (bool, int, float, list, tuple))
    return dtype_code(np.asarray(value).dtype) + (PYTHON if python else 0)


def handed_over(values: Any, column: np.ndarray) -> Any:
    """What each env reads back after :meth:`ActionRows.write` of ``values`` to every row, without
    the round trip (every env in one process: nothing needs the rows), indexed by env: the items
    of the caller's array ``column`` (numpy scalars: copies) or the rows of a copy (an env may keep
    its action), in its dtype. None where only the round trip gives what the env gets: Python
    values (a list or tuple), an array-like, a dtype numpy keeps in another form (another byte order)."""
    if type(values) is not np.ndarray or column.dtype not in _HANDED:
        return None
    if column.ndim > 1:
        return column.copy()
    return column if len(column) <= INDEXED_UP_TO else list(column)  # list(): ~0.37 µs, then 18 ns an item


_HANDED = frozenset(DTYPES)  # native byte order: a '>i8' array is no int64 array
INDEXED_UP_TO = 16  # an array's items: indexed one by one (47 ns each) up to this many, else listed


class ActionRows:
    """The fixed-size action leaves of a pool over its arena views, in the callers' dtypes.

    The main process :meth:`write`\\s a batch; a shard reads its envs' actions with
    :meth:`column` (a step) or :meth:`value` (one env). :attr:`leaves` has a view per leaf
    in the space's dtype, the shape and dtype callers' batches are checked against.
    """

    def __init__(self, layout: lay.ArenaLayout, views: dict[str, np.ndarray]):
        leaves = layout.action_leaves
        self.paths = tuple(leaf.path for leaf in leaves)
        self.flat = self.paths == ((),)  # one leaf, the whole action
        self._index = {path: k for k, path in enumerate(self.paths)}
        self._raw = [views[lay.action_field(leaf.path)] for leaf in leaves]  # uint8 [N, row bytes]
        self._shapes = [leaf.shape for leaf in leaves]
        self.codes = views[lay.ACTION_CODE]  # int8 [leaf, env + the all-rows code]
        self._n_envs = n = self.codes.shape[1] - 1
        # per leaf, made once (a view costs 0.15 µs a step): all its codes, and the envs' alone
        self._code_rows = list(self.codes)
        self._env_codes = [codes[:n] for codes in self._code_rows]
        # per leaf, the code this object last gave all rows, MIXED since it gave some rows
        # others: only the main process's object writes codes, so an unchanged code needs no write
        self._all_rows = [MIXED] * len(leaves)
        # views[k][code]: leaf k's rows [N, *leaf_shape] seen in the dtype of code
        self.views = [[self._view(k, DTYPES[code % PYTHON]) for code in range(2 * PYTHON)] for k in range(len(leaves))]
        self.leaves = {leaf.path: self.views[k][dtype_code(leaf.dtype)] for k, leaf in enumerate(leaves)}

    def _view(self, k: int, dtype: np.dtype) -> np.ndarray:
        raw, shape = self._raw[k], self._shapes[k]
        inner = [dtype.itemsize * math.prod(shape[d + 1 :]) for d in range(len(shape))]
        return np.ndarray((len(raw), *shape), dtype, buffer=raw, strides=(raw.strides[0], *inner))

    def write(self, path: tuple[Any, ...], values: Any, column: np.ndarray, rows: Any = _ALL) -> None:
        """Write one leaf's actions for the envs ``rows`` (all by default).

        Args:
            path: the leaf's path.
            values: the leaf's actions as the caller gave them, one per env of ``rows``.
            column: ``np.asarray(values)``, checked (:func:`~shmvec.engine.validation.checked_column`).
            rows: a slice or an array of env indices.
        """
        k = self._index[path]
        if isinstance(values, (list, tuple)):  # one action per env, each as given
            kinds = set(map(type, values))
            kind = kinds.pop() if len(kinds) == 1 else None
            if kind not in _PYTHON_SCALARS:  # per env: numpy values, lists, a mix
                self._write_each(k, values, rows)
                return
            code = dtype_code(column.dtype) + PYTHON  # int: int64, or uint64 past its range
        else:  # an array, the common case (a tensor's rows come as numpy rows)
            code = _CODES.get(column.dtype.char)
            if code is None:
                code = dtype_code(column.dtype)
        self.views[k][code][rows] = column
        if rows is _ALL:
            if code != self._all_rows[k]:
                self._code_rows[k].fill(code)  # the all-rows code too; 0.2 µs, a Python int into a slice 1.2
                self._all_rows[k] = code
        else:
            self._env_codes[k][rows] = code
            self._code_rows[k][self._n_envs] = self._all_rows[k] = MIXED

    def _write_each(self, k: int, values: Any, rows: Any) -> None:
        envs = range(self._n_envs)[rows] if isinstance(rows, slice) else rows.tolist()
        codes = [value_code(value) for value in values]
        views = self.views[k]
        for i, code, value in zip(envs, codes, values):
            views[code][i] = value
        self._env_codes[k][rows] = codes
        self._code_rows[k][self._n_envs] = self._all_rows[k] = MIXED

    def column(self, k: int, start: int, stop: int) -> list[Any]:
        """Leaf ``k``'s actions of envs ``[start, stop)``, copied out (an env may keep them)."""
        code = int(self._code_rows[k][self._n_envs])
        if code == MIXED:
            codes = self._env_codes[k][start:stop].tobytes()
            if codes.count(codes[:1]) != len(codes):  # envs given different dtypes
                return [self.value(k, i) for i in range(start, stop)]
            code = codes[0]
        rows = self.views[k][code][start:stop].copy()
        return rows.tolist() if code >= PYTHON else list(rows)

    def value(self, k: int, i: int) -> Any:
        """Leaf ``k``'s action of env ``i``, copied out."""
        code = int(self.codes[k, i])
        row = self.views[k][code][i]
        return row.tolist() if code >= PYTHON else row.copy()

    def take(self, rows: Any) -> TakenRows:
        """A copy of the rows and codes of envs ``rows``, for :meth:`put` into another pool's."""
        return self.codes[:, : self._n_envs][:, rows].copy(), [raw[rows].copy() for raw in self._raw]

    def put(self, part: TakenRows, rows: Any = _ALL) -> None:
        """Write what :meth:`take` took into the rows ``rows``."""
        codes, raws = part
        envs = self.codes[:, : self._n_envs]
        envs[:, rows] = codes
        for raw, taken in zip(self._raw, raws):
            raw[rows] = taken
        uniform = (envs == envs[:, :1]).all(axis=1)
        self.codes[:, self._n_envs] = np.where(uniform, envs[:, 0], MIXED)
        self._all_rows = [MIXED] * len(self._raw)
