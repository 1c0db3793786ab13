"""The plan's memory (:mod:`shmvec.planning.plan_memory`) under many writers at once and with odd
contents at its path: no update is lost, nothing there raises, blocks or reaches the planner
unless it is an entry the plan can use, and the next write leaves a valid file."""

from __future__ import annotations

import json
import logging
import math
import multiprocessing as mp
import os
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmvec.planning import plan_memory

KEY = "0123456789abcdef01234567"  # plan_key's form
OTHER = "fedcba9876543210fedcba98"
GUARD = 10.0  # seconds before a call counts as hung (a guard against a hang, not a speed check)


def key(number: int) -> str:
    return f"{number:024x}"


def entry(n_workers=1, main_shard=True, when=1.0) -> dict:
    return {"n_workers": n_workers, "main_shard": main_shard, "when": when}


@pytest.fixture
def memory(tmp_path, monkeypatch):
    path = tmp_path / "cache" / "plans.json"
    path.parent.mkdir()
    monkeypatch.setenv(plan_memory.CACHE_VAR, str(path))
    monkeypatch.setattr(plan_memory, "_warned", set())
    return path


def strict_entries(path) -> dict:
    """The file's entries, checked as the planner needs them (no NaN or Infinity in the JSON either)."""

    def refuse(constant):
        raise ValueError(f"{constant} in the memory")

    entries = json.loads(path.read_text(), parse_constant=refuse)
    assert isinstance(entries, dict) and len(entries) <= plan_memory.MAX_ENTRIES
    for name, value in entries.items():
        assert plan_memory._KEY.match(name)
        assert set(value) == {"n_workers", "main_shard", "when"}
        assert type(value["n_workers"]) is int and 0 <= value["n_workers"] <= plan_memory.MAX_WORKERS
        assert type(value["main_shard"]) is bool and value["n_workers"] + value["main_shard"] >= 1
        assert isinstance(value["when"], (int, float)) and math.isfinite(value["when"])
    return entries


def finished(call, *args):
    """``call(*args)`` in a thread, joined within GUARD seconds: the test fails rather than hangs."""
    result = []
    thread = threading.Thread(target=lambda: result.append(call(*args)), daemon=True)
    thread.start()
    thread.join(GUARD)
    assert not thread.is_alive(), f"{call.__name__} blocked"
    return result[0]


# ==== many processes at once ======================================================================


def remember_three(first: int, barrier) -> None:
    barrier.wait()
    for number in range(first, first + 3):
        plan_memory.remember(key(number), 1, True)


def test_sixteen_processes_at_once_lose_no_update(memory):
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(16)
    processes = [ctx.Process(target=remember_three, args=(3 * i, barrier)) for i in range(16)]
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.join(30)
        assert [process.exitcode for process in processes] == [0] * 16
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    assert sorted(strict_entries(memory)) == [key(number) for number in range(48)]


def test_a_lock_held_elsewhere_skips_remembering_rather_than_wait(memory, monkeypatch):
    import fcntl

    monkeypatch.setattr(plan_memory, "LOCK_WAIT", 0.05)
    plan_memory.remember(KEY, 1, True)
    with open(memory.with_name("plans.json.lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another open file: conflicts with this process's own flock
        finished(plan_memory.remember, OTHER, 2, False)
    assert list(strict_entries(memory)) == [KEY]
    plan_memory.remember(OTHER, 2, False)  # released: remembered again
    assert plan_memory.recall(OTHER) == (2, False)


# ==== odd contents ================================================================================

NESTED = 100_000


def keyed(value_text: str) -> str:
    """A memory with one entry, ``value_text`` (JSON, or what passes for it), under KEY."""
    return '{"' + KEY + '": ' + value_text + "}"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[" * NESTED + "]" * NESTED, id="nested list"),
        pytest.param(keyed("[" * NESTED + "]" * NESTED), id="nested entry"),
        pytest.param(keyed('{"n_workers": Infinity, "main_shard": true, "when": 1}'), id="Infinity"),
        pytest.param(keyed('{"n_workers": NaN, "main_shard": true, "when": 1}'), id="NaN"),
        pytest.param(json.dumps({KEY: entry(n_workers="2")}), id="n_workers a string"),
        pytest.param(json.dumps({KEY: entry(n_workers=2.7)}), id="n_workers a float"),
        pytest.param(json.dumps({KEY: entry(n_workers=-5)}), id="n_workers negative"),
        pytest.param(json.dumps({KEY: entry(n_workers=10**9)}), id="n_workers huge"),
        pytest.param(json.dumps({KEY: entry(n_workers=True)}), id="n_workers a bool"),
        pytest.param(json.dumps({KEY: entry(main_shard="false")}), id="main_shard a string"),
        pytest.param(json.dumps({KEY: entry(n_workers=0, main_shard=False)}), id="no lane"),
        pytest.param(keyed('{"n_workers": 1, "main_shard": true, "when": 1' + "0" * 400 + "}"), id="huge when"),
        pytest.param(json.dumps({KEY: [1, True]}), id="entry a list"),
        pytest.param(b"\xff\xfe\x00garbage", id="not UTF-8"),
    ],
)
def test_odd_contents_are_no_memory_and_the_next_write_repairs_them(memory, text):
    (memory.write_bytes if isinstance(text, bytes) else memory.write_text)(text)
    assert plan_memory.recall(KEY) is None
    plan_memory.remember(OTHER, 2, False)
    kept = strict_entries(memory)
    assert list(kept) == [OTHER] and plan_memory.recall(OTHER) == (2, False)


def test_valid_entries_beside_invalid_ones_are_kept(memory):
    memory.write_text(json.dumps({KEY: entry(2, False), OTHER: entry(n_workers="x"), "not a key": entry()}))
    assert plan_memory.recall(KEY) == (2, False) and plan_memory.recall(OTHER) is None
    plan_memory.remember(key(7), 1, True)
    assert sorted(strict_entries(memory)) == sorted([KEY, key(7)])


@pytest.mark.parametrize("when", ["yesterday", float("nan"), None, [1]])
def test_an_odd_when_among_more_than_the_entries_kept(memory, when):
    entries = {key(number): entry(when=float(number)) for number in range(plan_memory.MAX_ENTRIES + 5)}
    entries[KEY] = entry(when=when)
    memory.write_text(json.dumps(entries))
    plan_memory.remember(OTHER, 1, True)
    kept = strict_entries(memory)
    assert len(kept) == plan_memory.MAX_ENTRIES and OTHER in kept and KEY not in kept
    assert key(plan_memory.MAX_ENTRIES + 4) in kept and key(0) not in kept  # the oldest went


@pytest.mark.parametrize("count", [1, 150, plan_memory.MAX_ENTRIES - 1])
def test_a_memory_below_its_cap_keeps_every_entry(memory, count):
    memory.write_text(json.dumps({key(number): entry(when=float(number)) for number in range(count)}))
    plan_memory.remember(OTHER, 1, True)
    kept = strict_entries(memory)
    assert len(kept) == count + 1 and OTHER in kept  # 150 kept 49 when the cut's start went negative


def test_a_new_entry_is_kept_beside_more_entries_from_the_future(memory):
    entries = {key(number): entry(when=1e18 + number) for number in range(plan_memory.MAX_ENTRIES + 5)}
    memory.write_text(json.dumps(entries))
    plan_memory.remember(OTHER, 2, False)
    kept = strict_entries(memory)
    assert len(kept) == plan_memory.MAX_ENTRIES and plan_memory.recall(OTHER) == (2, False)
    assert key(plan_memory.MAX_ENTRIES + 4) in kept and key(5) not in kept


def test_a_file_over_the_size_cap_is_no_memory_and_is_replaced(memory):
    memory.write_text(json.dumps({KEY: entry()}) + " " * (plan_memory.MAX_BYTES + 1))
    assert plan_memory.recall(KEY) is None
    plan_memory.remember(OTHER, 1, True)
    assert list(strict_entries(memory)) == [OTHER] and memory.stat().st_size < 1000


def test_a_fifo_at_the_path_neither_blocks_nor_is_replaced(memory):
    os.mkfifo(memory)
    try:
        assert finished(plan_memory.recall, KEY) is None
        finished(plan_memory.remember, KEY, 1, True)
        assert not memory.is_file() and memory.exists()  # still the FIFO: not ours to replace
    finally:  # a reader left blocked in open() (a regression) is let go by a writer's open
        try:
            os.close(os.open(memory, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: no reader
            pass


def test_a_symlink_to_dev_zero_is_not_followed(memory):
    memory.symlink_to("/dev/zero")
    assert plan_memory.recall(KEY) is None
    plan_memory.remember(KEY, 1, True)
    assert memory.is_symlink() and os.readlink(memory) == "/dev/zero"


def test_a_symlink_to_a_valid_memory_elsewhere_is_not_followed(memory, tmp_path):
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text(json.dumps({KEY: entry(3, False)}))
    memory.symlink_to(elsewhere)
    assert plan_memory.recall(KEY) is None


def test_a_directory_at_the_path_is_no_memory(memory):
    memory.mkdir()
    assert plan_memory.recall(KEY) is None
    plan_memory.remember(KEY, 1, True)
    assert memory.is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_file_of_another_user_is_no_memory_and_is_left_alone(memory):
    text = json.dumps({KEY: entry(3, False)})
    memory.write_text(text)
    os.chown(memory, 12345, 12345)
    assert plan_memory.recall(KEY) is None
    plan_memory.remember(OTHER, 1, True)
    assert memory.read_text() == text and memory.stat().st_uid == 12345


@pytest.mark.parametrize("odd", ["symlink", "fifo", "directory"])
def test_an_odd_lock_file_skips_remembering(memory, odd):
    lock = memory.with_name("plans.json.lock")
    {"symlink": lambda: lock.symlink_to("/dev/zero"), "fifo": lambda: os.mkfifo(lock), "directory": lock.mkdir}[odd]()
    finished(plan_memory.remember, KEY, 1, True)
    assert not memory.exists()


@pytest.mark.parametrize("where", ["a file/plans.json", "/proc/shmvec-cannot-be-here/plans.json"])
def test_a_cache_folder_that_cannot_be_made_raises_nothing(tmp_path, monkeypatch, where):
    # root ignores permissions: a read-only folder is played by folders that cannot be made
    (tmp_path / "a file").write_text("")
    monkeypatch.setenv(plan_memory.CACHE_VAR, str(tmp_path / where))
    assert plan_memory.recall(KEY) is None
    plan_memory.remember(KEY, 1, True)
    assert plan_memory.recall(KEY) is None


def test_each_cause_is_logged_once_per_process(memory, caplog):
    caplog.set_level(logging.WARNING, logger="shmvec")
    memory.write_text("{not json")
    for _ in range(3):
        assert plan_memory.recall(KEY) is None
    memory.write_text("[1, 2")
    assert plan_memory.recall(KEY) is None
    memory.write_text(json.dumps({KEY: entry(n_workers=-1)}))
    assert plan_memory.recall(KEY) is None
    messages = [record.getMessage() for record in caplog.records if "plan memory" in record.getMessage()]
    assert len(messages) == 2 and "not JSON" in messages[0] and "wrong form" in messages[1]


# ==== generated garbage ===========================================================================

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_ish = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "n_workers": st.integers(-2, 5000) | scalars,
        "main_shard": st.booleans() | scalars,
        "when": st.floats() | st.integers() | scalars,
        "extra": json_ish,
    },
)
entry_like = st.dictionaries(
    st.sampled_from([KEY, OTHER, key(1)]) | st.text(max_size=30), fields | json_ish, max_size=6
)


def as_bytes(value) -> bytes:
    return json.dumps(value, default=repr).encode()


garbage = (
    st.binary(max_size=300)
    | json_ish.map(as_bytes)
    | entry_like.map(as_bytes)
    | st.tuples(entry_like.map(as_bytes), st.integers(0, 40)).map(lambda pair: pair[0][: -pair[1] or None])
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(content=garbage)
def test_generated_garbage_is_never_more_than_valid_entries(memory, content):
    memory.write_bytes(content)
    for name in (KEY, OTHER, key(1)):
        layout = plan_memory.recall(name)
        assert layout is None or (
            type(layout[0]) is int
            and type(layout[1]) is bool
            and 0 <= layout[0] <= plan_memory.MAX_WORKERS
            and layout[0] + layout[1] >= 1
        )
    plan_memory.remember(key(2), 3, False)
    kept = strict_entries(memory)
    assert plan_memory.recall(key(2)) == (3, False) and kept[key(2)]["n_workers"] == 3
