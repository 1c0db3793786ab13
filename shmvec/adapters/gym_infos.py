"""Gymnasium's infos, a dict of arrays and ``_key`` masks, built as ``SyncVectorEnv`` builds them.

``VectorEnv._add_info`` adds one env's info at a time, key by key: ~1 µs per key and env,
which caps the main process near 100k steps a second for MuJoCo-like infos whatever the
cores. Most infos arrive in shared info rows, grouped by schema (a worker's shard at a
time: :class:`~shmvec.ipc.info_rows.InfoGroup`), so :func:`add_step_infos` adds a group a
key at a time: one array assignment per key and group. The result is what the per-env
additions give, dtype, masks and key order included: each key's array is created with the
type of the first env (in env order) that has it, and later envs' values are cast into
it. Where a group cannot be added as columns without changing that (a key already holding
an array of another shape or of objects, a nested dict, numpy bools, which Gymnasium
keeps as objects), its envs are added one by one as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from shmvec.ipc.info_rows import SCALAR, InfoGroup
from shmvec.ipc.protocol import StepInfo

AddInfo = Callable[[dict[str, Any], dict[str, Any], int], dict[str, Any]]  # VectorEnv._add_info


def add_record_infos(infos: dict[str, Any], add_info: AddInfo, rows: Iterable[tuple[int, StepInfo]]) -> dict[str, Any]:
    """Add each ``(row, record)``'s infos as the references do (rows in increasing order)."""
    for row, record in rows:
        if record.final_info is not None:
            infos = add_info(infos, {"final_obs": record.final_obs, "final_info": record.final_info}, row)
        elif record.restarted:  # its worker died: no final_obs, the last observation is lost
            infos = add_info(infos, {"shmvec_restarted": True}, row)
        infos = add_info(infos, record.info, row)
    return infos


def add_step_infos(
    infos: dict[str, Any], add_info: AddInfo, num_envs: int, records: list[StepInfo], groups: list[InfoGroup]
) -> dict[str, Any]:
    """Add a step's ``records`` (sorted by env) and info row ``groups`` in env order."""
    if not groups and not records:  # most steps
        return infos
    if not groups:
        return add_record_infos(infos, add_info, ((record.env_index, record) for record in records))
    pending = iter(records)
    record = next(pending, None)
    for group in groups:
        while record is not None and record.env_index < group.first:
            infos = add_record_infos(infos, add_info, [(record.env_index, record)])
            record = next(pending, None)
        if not _add_columns(infos, num_envs, group):
            for i, info in group.infos():  # one by one, as the references
                infos = add_info(infos, info, i)
    while record is not None:
        infos = add_record_infos(infos, add_info, [(record.env_index, record)])
        record = next(pending, None)
    return infos


def _add_columns(infos: dict[str, Any], num_envs: int, group: InfoGroup) -> bool:
    """Add ``group``'s infos a key at a time, as the per-env additions would; False (and nothing
    added) where they would not come out the same."""
    schema, records = group.schema, group.records
    for key, kind in zip(schema.keys, schema.kinds):
        array = infos.get(key)
        column = records[key]
        if key == "final_obs":  # Gymnasium keeps final observations as objects
            return False
        if array is None:
            if kind == SCALAR and column.dtype.kind == "b":  # np.bool_ is no np.number: an object array
                return False
        elif type(array) is not np.ndarray or array.dtype == object or array.shape[1:] != column.shape[1:]:
            return False
    envs = group.envs
    for key in schema.keys:
        array = infos.get(key)
        column = records[key]
        if array is None:  # created with the type of the first env that has the key: this group's
            array = np.zeros((num_envs, *column.shape[1:]), dtype=column.dtype)
        array[envs] = column
        mask = infos.get(f"_{key}")
        if mask is None:
            mask = np.zeros(num_envs, dtype=np.bool_)
        mask[envs] = True
        infos[key], infos[f"_{key}"] = array, mask
    return True
