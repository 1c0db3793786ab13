"""Unit tests of the pure parts: layout, signals, failure reports, validation, pool options.

Fast and without worker processes: every expected value and message is spelled out, so a
change of behaviour fails here before it surfaces in an end-to-end test.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from envs import Token, TokenSpace
from gymnasium import spaces
from helpers import assert_same

from shmvec.ipc import layout as lay
from shmvec.ipc import signals as sync
from shmvec.errors import (
    EnvError,
    InvalidActionError,
    MainModuleError,
    RemoteTraceback,
    SpaceMismatchError,
    UnsupportedSpaceError,
)
from shmvec.engine.failures import UNGUARDED_MAIN_EXIT, describe_exit, ranges, remote_error, unguarded_main_error
from shmvec.options import DEFAULT_SPIN, PoolOptions, default_start_method
from shmvec.ipc.protocol import ErrorReport
from shmvec.engine.validation import check_env_fns, check_same_spaces, checked_column, split_actions

# ==== layout ============================================================================

BOX = spaces.Box(0.0, 1.0, (2, 3), np.float32)


def nested_space() -> spaces.Dict:
    """Every leaf kind, nested two levels deep; gymnasium's Dict sorts the keys: a, b, s, u."""
    return spaces.Dict(
        {
            "u": TokenSpace(),
            "b": spaces.Tuple(
                (
                    spaces.Discrete(3),
                    spaces.MultiDiscrete([2, 3]),
                    spaces.Dict({"t": spaces.Text(5), "c": spaces.MultiBinary(4)}),
                )
            ),
            "a": BOX,
            "s": spaces.Sequence(spaces.Discrete(2)),
        },
        seed=0,
    )


NESTED_LEAVES = [
    (("a",), (2, 3), np.dtype(np.float32)),
    (("b", 0), (), np.dtype(np.int64)),
    (("b", 1), (2,), np.dtype(np.int64)),
    (("b", 2, "c"), (4,), np.dtype(np.int8)),
    (("b", 2, "t"), None, None),
    (("s",), None, None),
    (("u",), None, None),
]
CONTROL_FIELDS = ["ctrl", "reward", "terminated", "truncated", "inbox", "outbox", "ready_ns", "env_status"]


class BoxSubclass(spaces.Box):
    """A user's Box subclass: still a Box, so it keeps its shared-memory buffer."""


def test_flatten_nested_space_in_key_and_index_order():
    leaves = lay.flatten_space(nested_space())
    assert [(leaf.path, leaf.shape, leaf.dtype) for leaf in leaves] == NESTED_LEAVES
    assert [leaf.pickled for leaf in leaves] == [False, False, False, False, True, True, True]


@pytest.mark.parametrize(
    "space, shape, dtype",
    [
        (BOX, (2, 3), np.float32),
        (spaces.Discrete(5), (), np.int64),
        (spaces.MultiDiscrete([[2, 3], [4, 5]]), (2, 2), np.int64),
        (spaces.MultiBinary([2, 3]), (2, 3), np.int8),
        (BoxSubclass(-1, 1, (4,), np.float64), (4,), np.float64),
    ],
    ids=["Box", "Discrete", "MultiDiscrete", "MultiBinary", "BoxSubclass"],
)
def test_flatten_flat_array_space_is_one_root_leaf(space, shape, dtype):
    assert lay.flatten_space(space) == [lay.Leaf((), shape, np.dtype(dtype))]


@pytest.mark.parametrize(
    "space",
    [spaces.Text(4), spaces.Sequence(spaces.Box(0, 1, (2,))), spaces.Graph(spaces.Box(0, 1, (2,)), None), TokenSpace()],
    ids=["Text", "Sequence", "Graph", "custom"],
)
def test_flatten_space_with_no_fixed_size_is_one_pickled_leaf(space):
    (leaf,) = lay.flatten_space(space)
    assert (leaf.path, leaf.shape, leaf.dtype, leaf.pickled) == ((), None, None, True)


def test_flatten_refuses_what_is_not_a_space():
    with pytest.raises(UnsupportedSpaceError) as excinfo:
        lay.flatten_space((3, 4))
    assert str(excinfo.value) == (
        "expected a gymnasium.spaces.Space, got a tuple ((3, 4)) at the root; "
        "envs must declare their observation_space and action_space as gymnasium spaces"
    )
    assert isinstance(excinfo.value, TypeError)


def test_unflatten_rebuilds_the_nested_value():
    space = nested_space()
    value = space.sample()
    leaf_values = {leaf.path: lay.get_path(value, leaf.path) for leaf in lay.flatten_space(space)}
    rebuilt = lay.unflatten(space, leaf_values)
    assert list(rebuilt) == ["a", "b", "s", "u"]
    assert type(rebuilt["b"]) is tuple and type(rebuilt["b"][2]) is dict
    assert_same(rebuilt, value)
    assert rebuilt["b"][2]["t"] is value["b"][2]["t"]  # leaves are placed, not copied


def test_unflatten_of_a_flat_space_is_its_root_value():
    row = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert lay.unflatten(BOX, {(): row}) is row


def test_unflatten_of_a_custom_space_hands_its_value_back():
    token = Token("up", 3)
    assert lay.unflatten(TokenSpace(), {(): token}) is token


def test_get_path_follows_keys_and_indices():
    value = {"a": (1, {"b": [10, 20]})}
    assert lay.get_path(value, ("a", 1, "b", 1)) == 20
    assert lay.get_path(value, ()) is value
    with pytest.raises(KeyError):
        lay.get_path(value, ("missing",))


def test_require_fixed_size_names_the_pickled_leaf():
    with pytest.raises(UnsupportedSpaceError, match=r"got Text\(1, 5, .*\) at \('b', 2, 't'\) in Dict") as excinfo:
        lay.require_fixed_size(nested_space(), "observation", "ShmPoolVecEnv")
    assert str(excinfo.value).startswith("ShmPoolVecEnv takes only fixed-size observation spaces")
    lay.require_fixed_size(spaces.Dict({"x": BOX}), "observation", "ShmPoolVecEnv")  # no error


@pytest.mark.parametrize(
    "n_envs, n_workers, bounds",
    [
        (10, 3, [(0, 4), (4, 7), (7, 10)]),
        (7, 4, [(0, 2), (2, 4), (4, 6), (6, 7)]),
        (6, 3, [(0, 2), (2, 4), (4, 6)]),
        (5, 5, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]),
        (7, 1, [(0, 7)]),
        (1, 1, [(0, 1)]),
    ],
)
def test_shard_bounds(n_envs, n_workers, bounds):
    assert lay.shard_bounds(n_envs, n_workers) == bounds


def test_shard_bounds_are_contiguous_and_even_within_one():
    for n_envs in range(1, 40):
        for n_workers in range(1, n_envs + 1):
            bounds = lay.shard_bounds(n_envs, n_workers)
            starts, stops = [b[0] for b in bounds], [b[1] for b in bounds]
            assert starts == [0, *stops[:-1]] and stops[-1] == n_envs
            sizes = [stop - start for start, stop in bounds]
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)  # the larger shards come first


@pytest.mark.parametrize("n_envs, n_workers", [(4, 0), (4, 5), (4, -1), (0, 1)])
def test_shard_bounds_refuses_impossible_splits(n_envs, n_workers):
    with pytest.raises(ValueError) as excinfo:
        lay.shard_bounds(n_envs, n_workers)
    assert str(excinfo.value) == f"n_workers must be between 1 and the number of envs ({n_envs}), got {n_workers}"


def assert_well_placed(layout: lay.ArenaLayout) -> None:
    """Every field starts on a cache line, none overlaps the next, and the arena covers them all."""
    placed = sorted(layout.fields.values(), key=lambda spec: spec.offset)
    for spec in placed:
        assert spec.offset % lay.ALIGNMENT == 0, spec
    for spec, following in zip(placed, placed[1:]):
        assert spec.offset + max(spec.nbytes, 1) <= following.offset, (spec, following)
    assert layout.nbytes >= placed[-1].offset + placed[-1].nbytes
    assert layout.nbytes % lay.ALIGNMENT == 0


def test_plan_places_nested_spaces_without_pickled_leaves():
    action_space = spaces.Tuple((spaces.Discrete(2), spaces.Box(-1, 1, (3,), np.float64)))
    layout = lay.ArenaLayout.plan(nested_space(), action_space, n_envs=5, n_workers=2, final_obs=True)
    obs_fields = ["obs('a',)", "obs('b', 0)", "obs('b', 1)", "obs('b', 2, 'c')"]
    action_fields = ["action(0,)", "action(1,)", lay.ACTION_CODE]
    assert list(layout.fields) == CONTROL_FIELDS + obs_fields + action_fields  # no final_obs: not flat
    shapes = {name: (spec.shape, spec.dtype) for name, spec in layout.fields.items()}
    assert shapes["ctrl"] == ((2, lay.CTRL_WIDTH), np.dtype(np.int64))
    assert shapes["reward"] == ((5,), np.dtype(np.float64))
    assert shapes["terminated"] == shapes["truncated"] == ((5,), np.dtype(np.bool_))
    assert shapes["env_status"] == ((5,), np.dtype(np.int8))
    assert shapes["obs('a',)"] == ((5, 2, 3), np.dtype(np.float32))
    assert shapes["obs('b', 2, 'c')"] == ((5, 4), np.dtype(np.int8))
    # an action row holds 3 values of any dtype a caller gives: the codes say which
    assert shapes["action(1,)"] == ((5, 3 * lay.ACTION_ITEMSIZE), np.dtype(np.uint8))
    assert shapes[lay.ACTION_CODE] == ((2, 6), np.dtype(np.int8))  # and the code of all rows at once
    assert [leaf.path for leaf in layout.obs_leaves] == [("a",), ("b", 0), ("b", 1), ("b", 2, "c")]
    assert [leaf.path for leaf in layout.pickled_obs_leaves] == [("b", 2, "t"), ("s",), ("u",)]
    assert layout.pickled_action_leaves == ()
    assert_well_placed(layout)


def test_plan_adds_final_obs_fields_only_for_flat_observations_when_asked():
    flat = lay.ArenaLayout.plan(BOX, spaces.Discrete(2), n_envs=3, n_workers=1, final_obs=True)
    assert (flat.fields[lay.FINAL_OBS].shape, flat.fields[lay.FINAL_OBS].dtype) == ((3, 2, 3), np.dtype(np.float32))
    assert (flat.fields[lay.FINAL_FLAG].shape, flat.fields[lay.FINAL_FLAG].dtype) == ((3,), np.dtype(np.bool_))
    assert_well_placed(flat)
    not_asked = lay.ArenaLayout.plan(BOX, spaces.Discrete(2), n_envs=3, n_workers=1)
    assert lay.FINAL_OBS not in not_asked.fields and lay.FINAL_FLAG not in not_asked.fields
    in_a_dict = lay.ArenaLayout.plan(spaces.Dict({"x": BOX}), spaces.Discrete(2), n_envs=3, n_workers=1, final_obs=True)
    assert lay.FINAL_OBS not in in_a_dict.fields and lay.FINAL_FLAG not in in_a_dict.fields


def test_plan_gives_empty_and_one_byte_fields_a_cache_line_each():
    layout = lay.ArenaLayout.plan(spaces.Box(0, 1, (0,)), spaces.MultiBinary(1), n_envs=1, n_workers=1)
    assert layout.fields["obs()"].nbytes == 0 and layout.fields[lay.ENV_STATUS].nbytes == 1
    assert_well_placed(layout)
    assert layout.nbytes == lay.ALIGNMENT * len(layout.fields)


def test_plan_is_picklable():
    layout = lay.ArenaLayout.plan(nested_space(), spaces.Discrete(2), n_envs=4, n_workers=2)
    assert pickle.loads(pickle.dumps(layout)) == layout


def test_views_over_a_bytearray_are_separate_windows_of_it():
    layout = lay.ArenaLayout.plan(nested_space(), spaces.MultiDiscrete([3, 3]), n_envs=5, n_workers=2)
    buffer = bytearray(layout.nbytes)
    views = layout.views(buffer)
    assert list(views) == list(layout.fields)
    for name, view in views.items():
        assert (view.shape, view.dtype) == (layout.fields[name].shape, layout.fields[name].dtype)
    for n, view in enumerate(views.values(), start=1):  # each field its own value: no overlap
        view.view(np.uint8)[...] = n
    for n, (name, view) in enumerate(views.items(), start=1):
        spec = layout.fields[name]
        assert bytes(buffer[spec.offset : spec.offset + spec.nbytes]) == bytes([n]) * spec.nbytes, name
    views["reward"][2] = 1.5  # writes go straight to the buffer
    offset = layout.fields["reward"].offset + 2 * 8
    assert np.frombuffer(buffer, np.float64, 1, offset)[0] == 1.5


def test_views_need_a_buffer_of_nbytes():
    layout = lay.ArenaLayout.plan(BOX, spaces.Discrete(2), n_envs=2, n_workers=1)
    with pytest.raises(TypeError, match="buffer is too small"):
        layout.views(bytearray(layout.nbytes - lay.ALIGNMENT))


# ==== sync.Signal =======================================================================


@pytest.fixture
def signals():
    """``signals(max_spin)``: a new owned Signal, closed at teardown."""
    made = []

    def create(max_spin: float = 0.0) -> sync.Signal:
        made.append(sync.Signal.create(max_spin))
        return made[-1]

    yield create
    for signal in made:
        signal.close()


def sem_file(signal: sync.Signal) -> str:
    return os.path.join("/dev/shm", "sem." + signal.name.lstrip("/"))


def test_signal_post_then_wait(signals):
    signal = signals()
    assert signal.name.startswith(f"/shmvec_{os.getpid()}_sem_")
    signal.post()
    assert signal.wait(1.0) is True
    assert signal.wait(0.05) is False  # the one post was taken


@pytest.mark.parametrize("max_spin", [0.0, 0.01])
def test_signal_wait_times_out_with_false(signals, max_spin):
    assert signals(max_spin).wait(0.05) is False


def test_signal_drain_counts_pending_posts(signals):
    signal = signals()
    assert signal.drain() == 0
    for _ in range(3):
        signal.post()
    assert signal.drain() == 3
    assert signal.wait(0.0) is False


def test_signal_close_unlinks_once_and_is_idempotent():
    signal = sync.Signal.create()
    assert os.path.exists(sem_file(signal))
    signal.close()
    assert not os.path.exists(sem_file(signal))
    signal.close()  # idempotent


def test_signal_open_by_name_shares_the_semaphore(signals):
    owner = signals()
    other = sync.Signal.open(owner.name)
    try:
        owner.post()
        assert other.wait(1.0) is True
        other.post()
        assert owner.wait(1.0) is True
    finally:
        other.close()
    assert os.path.exists(sem_file(owner))  # only the owner unlinks
    other.close()  # idempotent too


class FakeTime:
    """Stands in for sync's clock and sched_yield, so that spin learning is deterministic:
    each yield advances the clock by ``step`` seconds and then, unless ``late``, posts
    ``signal``, as a peer answering after ``step`` would (a spinning wait takes that post
    right after the yield). With ``late`` the peer answers only once the wait blocks."""

    def __init__(self, monkeypatch, signal: sync.Signal, step: float, late: bool = False):
        self.now, self.step, self.signal, self.yields, self.late = 100.0, step, signal, 0, late
        monkeypatch.setattr(sync, "_perf_counter", lambda: self.now)
        monkeypatch.setattr(sync, "_sched_yield", self.sched_yield)
        if late:
            monkeypatch.setattr(signal, "_sem", AnswerWhenBlocked(signal._sem))

    def sched_yield(self) -> None:
        self.yields += 1
        self.now += self.step
        if not self.late:
            self.signal.post()


class AnswerWhenBlocked:
    """A semaphore whose peer posts just as a waiter blocks on it (a wait longer than any spin)."""

    def __init__(self, sem):
        self.sem = sem

    def __getattr__(self, name: str):  # value, unlink, close, ...
        return getattr(self.sem, name)

    def acquire(self, timeout: float | None = None) -> None:
        if timeout != 0:
            self.sem.release()
        self.sem.acquire(timeout)


def test_signal_spins_while_waits_end_within_its_bound(monkeypatch, signals):
    signal = signals(max_spin=1e-3)
    clock = FakeTime(monkeypatch, signal, step=10e-6)  # the peer answers within 10 µs
    for _ in range(60):
        assert signal.wait(1.0) is True
    assert clock.yields == 60  # every wait spun (and was answered while spinning)
    assert (signal._hits, signal._spin) == (1.0, 1e-3)


def test_signal_stops_spinning_after_a_run_of_long_waits_not_after_one(monkeypatch, signals):
    signal = signals(max_spin=1e-3)
    clock = FakeTime(monkeypatch, signal, step=10e-3, late=True)  # the peer takes 10 ms: beyond max_spin
    assert signal.wait(1.0) is True
    assert signal._spin == 1e-3  # one long wait (a hiccup): still spinning
    assert signal.wait(1.0) is True
    assert signal.wait(1.0) is True
    assert signal._spin == 0.0  # three in a row: blocking
    clock.step, clock.late = 10e-6, False
    for _ in range(sync.PROBE_EVERY * 3):  # short waits again: probes see it and turn spinning back on
        assert signal.wait(1.0) is True
    assert signal._spin == 1e-3


def test_signal_takes_a_pending_post_at_once_and_learns_nothing(monkeypatch, signals):
    signal = signals(max_spin=1e-3)
    clock = FakeTime(monkeypatch, signal, step=10e-6)
    signal.post()
    assert signal.wait(1.0) is True
    assert clock.yields == 0
    assert (signal._hits, signal._spin) == (1.0, 1e-3)


def test_signal_spins_as_told_for_one_wait_and_learns_nothing(monkeypatch, signals):
    signal = signals(max_spin=0.0)  # would never spin on its own
    clock = FakeTime(monkeypatch, signal, step=10e-6)
    assert signal.wait(1.0, spin=1e-3) is True
    assert clock.yields == 1
    spinning = signals(max_spin=1e-3)
    clock = FakeTime(monkeypatch, spinning, step=10e-6, late=True)
    assert spinning.wait(1.0, spin=0.0) is True  # told to block: no spin
    assert clock.yields == 0 and (spinning._hits, spinning._spin) == (1.0, 1e-3)


def test_signal_with_no_spin_never_spins(monkeypatch, signals):
    signal = signals(max_spin=0.0)
    clock = FakeTime(monkeypatch, signal, step=1e-6)
    assert signal.wait(0.02) is False
    assert clock.yields == 0


# ==== failures ==========================================================================


@pytest.mark.parametrize(
    "exitcode, words",
    [
        (0, "exit code 0"),
        (3, "exit code 3"),
        (-9, "signal SIGKILL (killed from outside, e.g. by the out-of-memory killer)"),
        (-11, "signal SIGSEGV (a crash in native code)"),
        (-7, "signal SIGBUS (a crash in native code, or shared memory ran out)"),
        (-15, "signal SIGTERM"),
        (-200, "signal 200"),
    ],
)
def test_describe_exit(exitcode, words):
    assert describe_exit(exitcode) == words


@pytest.mark.parametrize(
    "indices, text",
    [
        ([], ""),
        ([4], "4"),
        ([0, 1], "0..1"),
        ([0, 1, 2, 5], "0..2, 5"),
        ([1, 3, 5], "1, 3, 5"),
        ([2, 3, 7, 8, 9, 11], "2..3, 7..9, 11"),
    ],
)
def test_ranges(indices, text):
    assert ranges(indices) == text


class Unpicklable(Exception):
    """Its __init__ takes two arguments but ``args`` keeps one: unpickling it fails."""

    def __init__(self, what, extra):
        super().__init__(what)
        self.extra = extra


def captured(exc: BaseException, worker: int, env_index: int | None) -> ErrorReport:
    try:
        raise exc
    except BaseException as raised:
        return ErrorReport.capture(worker, env_index, raised)


def test_remote_error_is_the_original_exception_with_where_and_traceback():
    exc = remote_error(captured(KeyError("lost"), worker=1, env_index=3))
    assert type(exc) is KeyError and exc.args == ("lost",)
    assert exc.__notes__ == ["shmvec: raised in env 3 (worker 1); the remote traceback is shown above"]
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "KeyError: 'lost'" in exc.__cause__.tb and "in captured" in exc.__cause__.tb
    assert (exc.env_index, exc.worker_index) == (3, 1)


def test_remote_error_of_a_worker_names_the_worker_only():
    exc = remote_error(captured(RuntimeError("boom"), worker=2, env_index=None))
    assert exc.__notes__ == ["shmvec: raised in worker 2; the remote traceback is shown above"]
    assert (exc.env_index, exc.worker_index) == (None, 2)


def test_remote_error_of_an_unpicklable_exception_is_an_env_error():
    report = captured(Unpicklable("odd", 1), worker=0, env_index=1)
    assert report.exception is None
    exc = remote_error(report)
    assert type(exc) is EnvError
    assert str(exc) == f"{Unpicklable.__module__}.Unpicklable: odd"
    assert "Unpicklable: odd" in exc.__cause__.tb
    assert (exc.env_index, exc.worker_index) == (1, 0)


def test_unguarded_main_error_only_for_its_exit_code():
    exc = unguarded_main_error(UNGUARDED_MAIN_EXIT, "spawn")
    assert type(exc) is MainModuleError
    message = str(exc)
    assert message.startswith("the worker processes could not start: with start_method='spawn' every worker")
    assert 'if __name__ == "__main__":' in message and 'start_method="fork"' in message
    assert unguarded_main_error(1, "spawn") is None
    assert unguarded_main_error(None, "forkserver") is None
    assert unguarded_main_error(-9, "forkserver") is None


# ==== validation ========================================================================


def test_checked_column_passes_a_matching_column_through():
    view = np.zeros(4, np.int64)
    actions = np.array([0, 1, 1, 0], np.int32)  # same kind: the env gets int32
    assert checked_column(actions, view, spaces.Discrete(2), "actions") is actions
    assert checked_column([0, 1, 1, 0], view, spaces.Discrete(2), "actions").tolist() == [0, 1, 1, 0]


def test_checked_column_refuses_a_wrong_shape():
    with pytest.raises(InvalidActionError) as excinfo:
        checked_column([0, 1, 1], np.zeros(4, np.int64), spaces.Discrete(2), "actions")
    assert str(excinfo.value) == "expected actions of shape (4,) (num_envs=4, action space Discrete(2)), got shape (3,)"


def test_checked_column_refuses_ragged_values():
    view = np.zeros((2, 2), np.int64)
    with pytest.raises(InvalidActionError, match=r"got values that do not form one array: ") as excinfo:
        checked_column([[0], [0, 1]], view, spaces.MultiDiscrete([2, 2]), "actions at ('a',)")
    assert str(excinfo.value).startswith("expected actions at ('a',) of shape (2, 2) (num_envs=2, action space MultiDiscrete([2 2]))")


def test_checked_column_refuses_float_to_int():
    with pytest.raises(InvalidActionError) as excinfo:
        checked_column(np.zeros(4), np.zeros(4, np.int64), spaces.Discrete(2), "actions")
    assert str(excinfo.value) == (
        "actions of dtype float64 are not of the kind of the action space's dtype int64; pass int64 actions"
    )


def test_checked_column_takes_multibinary_floats_of_0_and_1_only():
    space, view = spaces.MultiBinary(3), np.zeros((2, 3), np.int8)
    floats = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]], np.float32)  # as SB3's PPO samples them
    assert checked_column(floats, view, space, "actions") is floats
    with pytest.raises(InvalidActionError, match="dtype float32 are not of the kind of the action space's dtype int8"):
        checked_column(floats * 0.5, view, space, "actions")


def make_env():
    raise AssertionError("never called by the checks")


def test_check_env_fns_returns_a_list():
    assert check_env_fns((make_env, make_env)) == [make_env, make_env]


@pytest.mark.parametrize(
    "env_fns, error, message",
    [
        ("CartPole-v1", TypeError, "env_fns must be a list of callables that each build an env, got str"),
        (make_env, TypeError, "env_fns must be a list of callables that each build an env, got function"),
        ((f for f in [make_env]), TypeError, "env_fns must be a list of callables that each build an env, got generator"),
        ([], ValueError, "env_fns is empty: pass at least one callable that builds an env"),
        (
            [make_env, "CartPole-v1"],
            TypeError,
            "env_fns[1] is a str, not a callable; pass functions that build envs, e.g. [lambda: gym.make('CartPole-v1')] * 8",
        ),
    ],
    ids=["str", "one callable", "generator", "empty", "non-callable"],
)
def test_check_env_fns_refuses(env_fns, error, message):
    with pytest.raises(error) as excinfo:
        check_env_fns(env_fns)
    assert type(excinfo.value) is error and str(excinfo.value) == message


def test_check_same_spaces_accepts_equal_spaces():
    check_same_spaces([(spaces.Box(0, 1, (2,)), spaces.Discrete(2))] * 3)


@pytest.mark.parametrize("which", ["observation", "action"])
def test_check_same_spaces_names_the_first_env_that_differs(which):
    same, other = (spaces.Box(0, 1, (2,)), spaces.Discrete(2)), (spaces.Box(0, 1, (3,)), spaces.Discrete(3))
    odd = (other[0], same[1]) if which == "observation" else (same[0], other[1])
    envs = [same, same, odd, odd]
    with pytest.raises(SpaceMismatchError) as excinfo:
        check_same_spaces(envs)
    exc = excinfo.value
    differing, first = (odd[0], same[0]) if which == "observation" else (odd[1], same[1])
    assert str(exc) == f"env 2 has {which} space {differing}, but env 0 has {first}; all envs must match"
    assert exc.space == which
    assert exc.spaces == [pair[0 if which == "observation" else 1] for pair in envs]
    assert isinstance(exc, ValueError) and isinstance(exc, RuntimeError)


def test_check_same_spaces_with_obs_space_match():
    def same_shape(first, space):
        return first.shape == space.shape

    low, high = spaces.Box(0, 1, (2,)), spaces.Box(5, 9, (2,))
    check_same_spaces([(low, spaces.Discrete(2)), (high, spaces.Discrete(2))], obs_space_match=same_shape)
    with pytest.raises(SpaceMismatchError, match=r"^env 1 has observation space Box\(0.0, 1.0, \(3,\)"):
        check_same_spaces([(low, spaces.Discrete(2)), (spaces.Box(0, 1, (3,)), spaces.Discrete(2))], same_shape)
    with pytest.raises(SpaceMismatchError, match=r"^env 1 has action space Discrete\(3\), but env 0 has Discrete\(2\)"):
        check_same_spaces([(low, spaces.Discrete(2)), (high, spaces.Discrete(3))], obs_space_match=same_shape)


ACTION_SPACE = spaces.Dict({"move": spaces.Discrete(3), "aim": spaces.Tuple((spaces.Discrete(2), spaces.Discrete(4)))})


def test_split_actions_into_leaf_columns():
    actions = [{"move": 1, "aim": (0, 3)}, {"aim": [1, 2], "move": 2}, {"move": 0, "aim": np.array([1, 1])}]
    columns = split_actions(actions, ACTION_SPACE, 3)
    assert list(columns) == [("aim", 0), ("aim", 1), ("move",)]
    assert columns[("move",)] == [1, 2, 0]
    assert [int(v) for v in columns[("aim", 0)]] == [0, 1, 1]
    assert [int(v) for v in columns[("aim", 1)]] == [3, 2, 1]


def test_split_actions_of_a_flat_space_is_one_column():
    assert split_actions(np.array([1, 0]), spaces.Discrete(2), 2) == {(): [1, 0]}


@pytest.mark.parametrize(
    "actions, message",
    [
        (
            {"move": [1, 2]},
            f"expected a list of 2 actions, one per env, each an element of {ACTION_SPACE} (as DummyVecEnv takes them), "
            "got a dict with keys ['move']",
        ),
        (5, f"expected a list of 2 actions, one per env, each an element of {ACTION_SPACE}, got a int"),
        ([{"move": 1, "aim": (0, 0)}], f"expected 2 actions (one per env, each an element of {ACTION_SPACE}), got 1"),
        (
            [{"move": 1, "aim": (0, 0)}, {"move": 1}],
            f"actions[1] misses key(s) ['aim']; expected exactly the keys ['aim', 'move'] ({ACTION_SPACE})",
        ),
        (
            [{"move": 1, "aim": (0, 0), "fire": 1}, {"move": 1, "aim": (0, 0)}],
            f"actions[0] has unknown key(s) ['fire']; expected exactly the keys ['aim', 'move'] ({ACTION_SPACE})",
        ),
        (
            [{"aim": (0, 0), "fire": 1}, {"move": 1, "aim": (0, 0)}],
            f"actions[0] misses key(s) ['move'] and has unknown key(s) ['fire']; expected exactly the keys "
            f"['aim', 'move'] ({ACTION_SPACE})",
        ),
        (
            [{"move": 1, "aim": (0, 0)}, (1, (0, 0))],
            f"actions[1] is a tuple, expected a dict with keys ['aim', 'move'] ({ACTION_SPACE})",
        ),
        (
            [{"move": 1, "aim": (0, 0)}, {"move": 1, "aim": (0,)}],
            f"actions[1]['aim'] has 1 elements, expected 2 ({ACTION_SPACE['aim']})",
        ),
        (
            [{"move": 1, "aim": 0}, {"move": 1, "aim": (0, 0)}],
            f"actions[0]['aim'] is a int, expected a tuple of 2 actions ({ACTION_SPACE['aim']})",
        ),
    ],
    ids=["mapping", "no len", "count", "missing key", "extra key", "missing and extra", "not a dict", "tuple length", "not a tuple"],
)
def test_split_actions_refuses(actions, message):
    with pytest.raises(InvalidActionError) as excinfo:
        split_actions(actions, ACTION_SPACE, 2)
    assert str(excinfo.value) == message


# ==== options ===========================================================================


def test_pool_options_defaults():
    options = PoolOptions()
    assert options == PoolOptions(
        n_workers=None,
        start_method="forkserver",
        timeout=None,
        worker_threads=1,
        max_spin=200e-6,
        main_shard=None,  # chosen with n_workers=None, False with an explicit n_workers
        on_worker_failure="raise",
        max_restarts=3,
    )
    assert options.max_spin == DEFAULT_SPIN
    assert default_start_method() == "forkserver"  # Linux: forkserver is available


def test_pool_options_normalises_main_shard_to_bool():
    assert PoolOptions(main_shard=1).main_shard is True
    assert PoolOptions(main_shard=0).main_shard is False
    assert PoolOptions().main_shard is None


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("timeout", 0, "timeout must be positive seconds or None, got 0"),
        ("timeout", -1.5, "timeout must be positive seconds or None, got -1.5"),
        ("timeout", "1", "timeout must be positive seconds or None, got '1'"),
        ("worker_threads", 0, "worker_threads must be an int >= 1 or None, got 0"),
        ("worker_threads", 2.0, "worker_threads must be an int >= 1 or None, got 2.0"),
        ("worker_threads", True, "worker_threads must be an int >= 1 or None, got True"),
        ("max_spin", -1e-6, "max_spin must be seconds >= 0, got -1e-06"),
        ("max_spin", None, "max_spin must be seconds >= 0, got None"),
        ("on_worker_failure", "ignore", "on_worker_failure must be \"raise\" or \"restart\", got 'ignore'"),
        ("max_restarts", -1, "max_restarts must be an int >= 0, got -1"),
        ("max_restarts", 1.0, "max_restarts must be an int >= 0, got 1.0"),
        ("max_restarts", False, "max_restarts must be an int >= 0, got False"),
        ("start_method", "illegal_method", "cannot find context for 'illegal_method'"),
        ("start_method", "", "cannot find context for ''"),
    ],
)
def test_pool_options_refuse_invalid_values(option, value, message):
    with pytest.raises(ValueError) as excinfo:
        PoolOptions(**{option: value})
    assert str(excinfo.value) == message


@pytest.mark.parametrize(
    "options, num_envs, workers",
    [
        (PoolOptions(), 1, 1),
        (PoolOptions(), 64, min(64, len(os.sched_getaffinity(0)))),
        (PoolOptions(main_shard=True), 64, min(64, len(os.sched_getaffinity(0))) - 1),
        (PoolOptions(main_shard=True), 1, 0),  # the main process steps the only env
        (PoolOptions(n_workers=3), 7, 3),
        (PoolOptions(n_workers=7), 7, 7),
        (PoolOptions(n_workers=0, main_shard=True), 2, 0),
        (PoolOptions(n_workers=1, main_shard=True), 2, 1),
    ],
)
def test_workers_for(options, num_envs, workers):
    assert options.workers_for(num_envs) == workers


@pytest.mark.parametrize(
    "options, num_envs, message",
    [
        (PoolOptions(n_workers=3), 2, "n_workers must be an int between 1 and 2 for 2 envs, got 3"),
        (PoolOptions(n_workers=0), 2, "n_workers must be an int between 1 and 2 for 2 envs, got 0"),
        (PoolOptions(n_workers=1.0), 2, "n_workers must be an int between 1 and 2 for 2 envs, got 1.0"),
        (PoolOptions(n_workers=True), 2, "n_workers must be an int between 1 and 2 for 2 envs, got True"),
        (
            PoolOptions(n_workers=2, main_shard=True),
            2,
            "n_workers must be an int between 0 and 1 for 2 envs with main_shard=True, got 2",
        ),
        (
            PoolOptions(n_workers=-1, main_shard=True),
            2,
            "n_workers must be an int between 0 and 1 for 2 envs with main_shard=True, got -1",
        ),
    ],
)
def test_workers_for_refuses_out_of_bounds(options, num_envs, message):
    with pytest.raises(ValueError) as excinfo:
        options.workers_for(num_envs)
    assert str(excinfo.value) == message


def test_from_kwargs_builds_the_options():
    assert PoolOptions.from_kwargs("ShmVectorEnv", n_workers=2, start_method="fork", main_shard=True) == PoolOptions(
        n_workers=2, start_method="fork", main_shard=True
    )
    assert PoolOptions.from_kwargs("ShmVectorEnv") == PoolOptions()


def test_from_kwargs_refuses_an_unknown_keyword_naming_the_owner_and_the_options():
    with pytest.raises(TypeError) as excinfo:
        PoolOptions.from_kwargs("ShmPoolVecEnv", n_worker=2)
    assert str(excinfo.value) == (
        "ShmPoolVecEnv() got an unexpected keyword argument 'n_worker'; pool options are ['n_workers', "
        "'start_method', 'timeout', 'worker_threads', 'max_spin', 'main_shard', 'on_worker_failure', 'max_restarts', 'backend', "
        "'n_nodes', 'omp_spin']"
    )


# ==== helpers.assert_same (the comparison every equivalence test relies on) ==============


@pytest.mark.parametrize(
    "got, want",
    [
        (np.array([np.nan, 1.0]), np.array([np.nan, 1.0])),
        (np.float32("nan"), np.float32("nan")),
        (float("nan"), float("nan")),
        ({"a": 1, "b": (2, [3.0])}, {"a": 1, "b": (2, [3.0])}),
        (np.array([{"x": np.zeros(2)}, None], dtype=object), np.array([{"x": np.zeros(2)}, None], dtype=object)),
        (spaces.GraphInstance(np.zeros(2), None, None), spaces.GraphInstance(np.zeros(2), None, None)),
    ],
    ids=["nan array", "nan numpy scalar", "nan float", "nested", "object array", "named tuple"],
)
def test_assert_same_accepts_identical_values(got, want):
    assert_same(got, want)


@pytest.mark.parametrize(
    "got, want, message",
    [
        ({"b": 1, "a": 2}, {"a": 2, "b": 1}, "value: keys ['b', 'a'] != ['a', 'b']"),
        ([1, 2], (1, 2), "value: type list != tuple"),
        (np.int64(1), 1, "value: type int64 != int"),
        (np.zeros(2, np.float32), np.zeros(2, np.float64), "value: float32(2,) != float64(2,)"),
        (np.zeros((1, 2)), np.zeros(2), "value: float64(1, 2) != float64(2,)"),
        (np.array([-0.0]), np.array([0.0]), "value: values differ"),
        (-0.0, 0.0, "value: -0.0 != 0.0"),
        (np.array([np.nan, 1.0]), np.array([1.0, np.nan]), "value: values differ"),
        (np.array([1, None], dtype=object), np.array([1, 2], dtype=object), "value.flat[1]: type NoneType != int"),
        (
            spaces.GraphInstance(np.zeros(2), None, None),
            (np.zeros(2), None, None),
            "value: type GraphInstance != tuple",
        ),
        ({"a": [1, {"b": 2.5}]}, {"a": [1, {"b": 2.0}]}, "value['a'][1]['b']: 2.5 != 2.0"),
    ],
    ids=[
        "key order",
        "list vs tuple",
        "numpy vs python scalar",
        "dtype",
        "shape",
        "negative zero in array",
        "negative zero",
        "nan position",
        "object array",
        "named tuple class",
        "nested path",
    ],
)
def test_assert_same_refuses_any_difference(got, want, message):
    with pytest.raises(AssertionError) as excinfo:
        assert_same(got, want)
    assert str(excinfo.value).startswith(message)
