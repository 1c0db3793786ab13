"""Per-step infos in shared memory: a row of bytes per env instead of a pickle through the pipe.

Most envs that return infos return the same keys with the same types at every step
(MuJoCo: a handful of floats and small arrays; Atari: three ints). A worker learns each
such *schema* the first time it sees it (:func:`schema_of`), writes its values into the
env's row of ``INFO_ROWS`` (a numpy structured dtype laid over the bytes) and the schema's
code into ``INFO_CODE[i]``; 0 means "nothing in the row" (an empty info, or one that went
through the pipe). A worker's schemas live, pickled, in its block of ``INFO_SCHEMAS``,
written before the ``done`` post that publishes the rows, so the main process reads that
block only when a code it has not seen appears, and no message can be lost on the way.

Values come back exactly as the env returned them: Python ``float``/``int``/``bool`` as
Python scalars, numpy scalars as the same numpy type, ndarrays with their dtype and shape.
Anything else (nested dicts, strings, object arrays, ints beyond int64, a schema whose row
would not fit) goes through the pipe as before.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any, NamedTuple

import numpy as np

INFO_ROWS, INFO_CODE, INFO_SCHEMAS = "info_rows", "info_code", "info_schemas"
INFO_ROW_BYTES = 512  # per env: 64 float64 values
SCHEMA_BLOCK_BYTES = 4096  # per worker: its schemas, pickled, after a 4-byte length
MAX_SCHEMAS = 8  # per worker; codes are 1..MAX_SCHEMAS
MAX_SIGNATURES = 64  # key/type combinations a worker remembers (schemas and refusals)
MAX_SHAPES = 2  # schemas per key/type combination with arrays of other shapes
_LENGTH = np.dtype("<u4")

PYTHON_SCALARS = {float: np.dtype(np.float64), int: np.dtype(np.int64), bool: np.dtype(np.bool_)}
PYTHON, SCALAR, ARRAY = 0, 1, 2  # how a field's values come back


class InfoSchema(NamedTuple):
    """The keys of an info dict, in order, and how each value is stored and restored."""

    keys: tuple[str, ...]
    kinds: tuple[int, ...]  # PYTHON, SCALAR or ARRAY per key
    dtype: np.dtype  # structured: one field per key

    def row_view(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` (``[n_envs, INFO_ROW_BYTES]`` bytes) seen as one record of this schema per env."""
        return rows[:, : self.dtype.itemsize].view(self.dtype)[:, 0]


def schema_of(info: dict) -> InfoSchema | None:
    """The schema of ``info`` if its values can travel in a row, else ``None``."""
    keys, kinds, fields = [], [], []
    for key, value in info.items():
        kind = type(value)
        if type(key) is not str:
            return None
        if kind in PYTHON_SCALARS:
            kinds.append(PYTHON)
            fields.append((key, PYTHON_SCALARS[kind]))
        elif isinstance(value, np.generic) and value.dtype.kind in "biufc":
            kinds.append(SCALAR)
            fields.append((key, value.dtype))
        elif kind is np.ndarray and value.dtype.kind in "biufc" and value.ndim > 0 and value.size > 0:
            kinds.append(ARRAY)
            fields.append((key, value.dtype, value.shape))
        else:
            return None
        keys.append(key)
    if not keys:
        return None
    try:
        dtype = np.dtype(fields)  # packed: byte rows need no alignment
    except (ValueError, TypeError):  # e.g. a key numpy refuses as a field name
        return None
    if dtype.names != tuple(keys) or dtype.itemsize > INFO_ROW_BYTES:  # numpy renames a "" key
        return None
    return InfoSchema(tuple(keys), tuple(kinds), dtype)


def _signature(info: dict) -> tuple:
    return tuple(info), tuple(map(type, info.values()))


class InfoWriter:
    """Worker side: writes the infos of its envs into their rows when their schema allows."""

    def __init__(self, views: dict[str, np.ndarray], worker: int):
        self.rows, self.codes = views[INFO_ROWS], views[INFO_CODE]
        self.block = views[INFO_SCHEMAS][worker]
        self.schemas: list[InfoSchema] = []
        # keys and value types -> their schemas as (code, record view, array fields), one per array
        # shapes seen (arrays only: scalars of one type always fit); [] when refused
        self._known: dict[tuple, list[tuple[int, np.ndarray, tuple[int, ...]]]] = {}

    def write(self, i: int, info: dict) -> int:
        """Write env ``i``'s ``info`` into its row; return its code, or 0 if it must be pickled."""
        signature = _signature(info)
        candidates = self._known.get(signature)
        if candidates is None:
            candidates = self._known[signature] = [] if len(self._known) >= MAX_SIGNATURES else self._learn(info)
        values = tuple(info.values())
        for code, view, arrays in candidates:
            if arrays and not self._fits(code, values, arrays):
                continue
            try:
                view[i] = values
            except (OverflowError, ValueError, TypeError):  # e.g. a Python int beyond int64
                return 0
            return code
        if candidates and len(candidates) < MAX_SHAPES:  # the same keys with arrays of other shapes
            learned = self._learn(info)
            if learned:
                candidates += learned
                return self.write(i, info)
        return 0

    def _fits(self, code: int, values: tuple, arrays: tuple[int, ...]) -> bool:
        dtype = self.schemas[code - 1].dtype
        for k in arrays:
            field = dtype[k]
            if values[k].shape != field.shape or values[k].dtype != field.base:
                return False
        return True

    def _learn(self, info: dict) -> list[tuple[int, np.ndarray, tuple[int, ...]]]:
        """``[(code, record view, array fields)]`` of ``info``'s new schema, or ``[]`` if it has none."""
        schema = schema_of(info) if len(self.schemas) < MAX_SCHEMAS else None
        if schema is None or not self._publish([*self.schemas, schema]):
            return []
        self.schemas.append(schema)
        arrays = tuple(k for k, kind in enumerate(schema.kinds) if kind == ARRAY)
        return [(len(self.schemas), schema.row_view(self.rows), arrays)]

    def _publish(self, schemas: list[InfoSchema]) -> bool:
        """Write ``schemas`` into the block (the next ``done`` post publishes it); False if they do not fit."""
        blob = pickle.dumps(schemas, protocol=pickle.HIGHEST_PROTOCOL)
        head = _LENGTH.itemsize
        if head + len(blob) > len(self.block):
            return False
        self.block[head : head + len(blob)] = np.frombuffer(blob, np.uint8)
        self.block[:head] = np.frombuffer(_LENGTH.type(len(blob)).tobytes(), np.uint8)
        return True


class InfoGroup(NamedTuple):
    """Envs whose rows hold infos of one schema this step: the first env, all of them (a slice or
    an index array), the schema and their records (a view of the shared rows: read it before the
    next step)."""

    first: int
    envs: slice | np.ndarray
    schema: InfoSchema
    records: np.ndarray

    def dicts(self, extra: tuple[tuple[str, bool | None], ...] = ()) -> list[dict]:
        """Each env's info, in env order, each value of the type the env returned, then the
        ``extra`` (key, constant) pairs (SB3's ``("TimeLimit.truncated", False)``)."""
        return _rebuild(self.schema, self.records, extra)

    def infos(self) -> list[tuple[int, dict]]:
        """``(env index, info)`` of each env."""
        envs = self.envs
        ids = range(envs.start, envs.stop) if isinstance(envs, slice) else envs.tolist()
        return list(zip(ids, self.dicts()))


class InfoReader:
    """Main side: rebuilds the infos of the envs whose rows hold one, as the envs returned them."""

    def __init__(self, views: dict[str, np.ndarray], shards: list[tuple[int, int]], n_workers: int):
        self.rows, self.codes, self.blocks = views[INFO_ROWS], views[INFO_CODE], views[INFO_SCHEMAS]
        self._shards = [(k, start, stop) for k, (start, stop) in enumerate(shards[:n_workers])]
        self._schemas: list[list[tuple[InfoSchema, np.ndarray]]] = [[] for _ in range(n_workers)]
        self._shared: dict[InfoSchema, tuple[InfoSchema, np.ndarray]] = {}

    def infos(self) -> list[tuple[int, dict]]:
        """``(env index, info)`` of every env whose row holds its info this step, in env order."""
        out: list[tuple[int, dict]] = []
        groups = self.groups()
        for group in groups:
            out += group.infos()
        if any(type(group.envs) is not slice for group in groups):  # a shard of several schemas
            out.sort(key=_first)
        return out

    def groups(self) -> list[InfoGroup]:
        """The envs whose rows hold infos this step, by schema, in order of their first env.

        Neighbouring shards whose envs all wrote rows of one schema make one group: with many
        workers of a few envs each (envs that wait), a group per shard cost more than its dicts.
        """
        codes = self.codes.tolist()
        out: list[InfoGroup] = []
        run: tuple[int, int, InfoSchema, np.ndarray] | None = None  # (start, stop, schema, view) of whole shards
        for k, start, stop in self._shards:  # in env order
            shard = codes[start:stop]
            code = shard[0]
            if code and shard.count(code) == len(shard):  # the usual step: one schema for the whole shard
                schema, view = self._schema(k, code)
                if run is not None and run[2] is schema and run[1] == start:
                    run = (run[0], stop, schema, view)
                    continue
                if run is not None:
                    out.append(_whole(*run))
                run = (start, stop, schema, view)
                continue
            if run is not None:
                out.append(_whole(*run))
                run = None
            if any(shard):
                out += self._mixed(k, start, shard)
        if run is not None:
            out.append(_whole(*run))
        return out

    def _mixed(self, worker: int, start: int, shard: list[int]) -> list[InfoGroup]:
        """:meth:`groups` of a shard whose envs wrote rows of several schemas, or some none."""
        by_code: dict[int, list[int]] = {}
        for j, code in enumerate(shard):
            if code:
                by_code.setdefault(code, []).append(start + j)
        out = []
        for code, ids in by_code.items():  # in order of first env: codes are met in env order
            schema, view = self._schema(worker, code)
            envs = np.array(ids)
            out.append(InfoGroup(ids[0], envs, schema, view[envs]))
        return out

    def _schema(self, worker: int, code: int) -> tuple[InfoSchema, np.ndarray]:
        known = self._schemas[worker]
        if code > len(known):  # new to us: the worker wrote its block before posting done
            block = self.blocks[worker]
            length = int(block[: _LENGTH.itemsize].view(_LENGTH)[0])
            schemas = pickle.loads(block[_LENGTH.itemsize : _LENGTH.itemsize + length].tobytes())
            # one object per distinct schema, whichever worker learned it: groups() merges by identity
            known[:] = [self._shared.setdefault(schema, (schema, schema.row_view(self.rows))) for schema in schemas]
        return known[code - 1]

    def forget(self, worker: int, start: int, stop: int) -> None:
        """Worker ``worker`` (envs ``[start, stop)``) was replaced: its successor learns schemas anew."""
        self._schemas[worker] = []
        self.codes[start:stop] = 0


def _whole(start: int, stop: int, schema: InfoSchema, view: np.ndarray) -> InfoGroup:
    return InfoGroup(start, slice(start, stop), schema, view[start:stop])


def _first(pair: tuple) -> Any:
    return pair[0]


def _rebuild(schema: InfoSchema, records: np.ndarray, extra: tuple = ()) -> list[dict]:
    """One info dict per record, each value of the type the env returned, then ``extra``."""
    columns = []
    for key, kind in zip(schema.keys, schema.kinds):
        column = records[key]
        if kind == PYTHON:
            columns.append(column.tolist())
        elif kind == SCALAR:
            columns.append(list(column))  # numpy scalars of the field's dtype
        else:
            columns.append([row.copy() for row in column])  # each its own array, as unpickled ones are
    return list(map(dict_maker(schema.keys, extra), *columns))


_DICT_MAKERS: dict[tuple, Any] = {}


def dict_maker(keys: tuple[str, ...], extra: tuple[tuple[str, bool | None], ...] = ()) -> Any:
    """``f(value, ...)`` -> ``{keys[0]: value, ..., **dict(extra)}``, made once per key set.

    A dict display with constant keys (made as ``collections.namedtuple`` makes its
    classes) builds an 11-key info in about half the time of ``dict(zip(keys, values))``;
    this runs for every env of every step. Keys are strings (:func:`schema_of`), written
    with ``repr``; extra values are constants.

    Example:
        >>> dict_maker(("a", "b"), (("TimeLimit.truncated", False),))(1, 2.5)
        {'a': 1, 'b': 2.5, 'TimeLimit.truncated': False}
    """
    maker = _DICT_MAKERS.get((keys, extra))
    if maker is None:
        names = [f"v{i}" for i in range(len(keys))]
        items = [f"{key!r}: {name}" for key, name in zip(keys, names)] + [f"{k!r}: {v!r}" for k, v in extra]
        maker = eval(f"lambda {', '.join(names)}: {{{', '.join(items)}}}", {})  # noqa: S307
        _DICT_MAKERS[(keys, extra)] = maker
    return maker


def fast_copy(info: dict) -> dict:
    """A copy of ``info`` as independent of the env as ``copy.deepcopy``'s, cheaply when every value
    is an immutable scalar or a numeric array (the main shard's infos, every step)."""
    out = {}
    arrays = set()
    for key, value in info.items():
        kind = type(value)
        if kind in PYTHON_SCALARS or (isinstance(value, np.generic) and value.dtype.kind in "biufc"):
            out[key] = value
        elif kind is np.ndarray and value.dtype.kind in "biufc" and id(value) not in arrays:
            arrays.add(id(value))  # an array seen twice must stay one array: deepcopy's job
            out[key] = value.copy()
        else:
            return copy.deepcopy(info)
    return out
