"""The CUDA-only steps of the device hand-off, checked without a GPU through their small injectable calls.

- Page-locking (``shmvec.ipc.pinning.cuda_host``, replaced by a recorder): once, in the main
  process, after every worker attached the arena (a worker slowed down before attaching must
  not change that), undone before the arena closes: at ``close()``, after a worker died, and
  by the finalizer of an env never closed; a failure warns once and copies go on pageable.
- Copies (``shmvec.adapters.cuda_copies.cuda_calls``, replaced by the CPU stand-ins of
  ``shmvec.tools.cuda_stand_ins``, whose events complete in stream order): the results equal
  ``SyncVectorEnv``'s on every path (whole steps, contiguous and scattered async batches), no
  command lets the workers rewrite a row before the copy that reads it is done, and the events
  of gathered batches do not pile up.
"""

from __future__ import annotations

import gc
import os
import signal
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shmvec import ShmPoolVecEnv, ShmVectorEnv, WorkerDiedError  # noqa: E402
from shmvec.adapters import cuda_copies, torch_device  # noqa: E402
from shmvec.engine import worker  # noqa: E402
from shmvec.gymnasium_1_1 import AutoresetMode  # noqa: E402
from shmvec.ipc import arena as arena_module  # noqa: E402
from shmvec.ipc import pinning  # noqa: E402
from shmvec.tools.cuda_stand_ins import StandInCalls, StandInEvent, StandInStream  # noqa: E402
from tests.adapters.test_vector import ENV_FACTORIES, run_equivalence  # noqa: E402
from tests.adapters.test_vector_device import make_pair  # noqa: E402
from tests.helpers import SHM_DIR, assert_same, descendant_pids  # noqa: E402
from tests.torch_results import AsNumpy, async_batches  # noqa: E402

CARTPOLE = ENV_FACTORIES["CartPole"]
MIXED = ENV_FACTORIES["MixedDict"]


# ---- stand-ins ----------------------------------------------------------------------------


class RecordingHost(pinning.CudaHost):
    """Records every CUDA call pinning makes, with what was true when it was made."""

    def __init__(self, log: list, arenas: list, initialized: bool = True, code: int = 0):
        self.log, self.arenas, self.initialized, self.code = log, arenas, initialized, code
        self.looks = 0  # calls of cuda_initialized (not in the log: they make no CUDA call)

    def cuda_initialized(self) -> bool:
        self.looks += 1
        return self.initialized

    def register(self, address: int, nbytes: int, device: int | None) -> int:
        name = self.arenas[-1].name if self.arenas else "no arena"
        workers = sorted(descendant_pids())
        attached = [pid for pid in workers if name in _maps(pid)]
        self.log.append(("register", os.getpid(), address, nbytes, workers, attached))
        return self.code

    def unregister(self, address: int, device: int | None) -> int:
        exists = bool(self.arenas) and os.path.exists(os.path.join(SHM_DIR, self.arenas[-1].name))
        self.log.append(("unregister", os.getpid(), address, exists))
        return 0

    def clear_error(self) -> None:
        self.log.append(("clear_error",))

    def error_name(self, code: int) -> str:
        return f"fake error {code}"


def _maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as maps:
        return maps.read()


@pytest.fixture
def cuda_log(monkeypatch):
    """Replace the CUDA host calls by a recorder; the log also gets each arena's close."""
    log: list = []
    arenas: list = []
    original_init, original_close = arena_module.OwnedArena.__init__, arena_module.OwnedArena.close

    def init(self, nbytes):
        original_init(self, nbytes)
        arenas.append(self)

    def close(self):
        if self in arenas and not any(entry[0] == "arena closed" for entry in log):
            log.append(("arena closed", self.name))
        original_close(self)

    monkeypatch.setattr(arena_module.OwnedArena, "__init__", init)
    monkeypatch.setattr(arena_module.OwnedArena, "close", close)
    host = RecordingHost(log, arenas)
    monkeypatch.setattr(pinning, "cuda_host", host)
    host.arenas_made = arenas
    return host


@pytest.fixture
def fake_cuda(monkeypatch, cuda_log):
    """CUDA's copy calls replaced by counted CPU stand-ins (``.stream``, ``.counts``: the last env's)."""
    monkeypatch.setattr(cuda_copies, "cuda_calls", StandInCalls)
    return StandInCalls


def slow_attach(monkeypatch, seconds: float = 0.3):
    """Workers (forked: they inherit this patch) wait before they attach the arena."""
    original = worker.attach

    def attach(name, nbytes):
        time.sleep(seconds)
        return original(name, nbytes)

    monkeypatch.setattr(worker, "attach", attach)


def cuda_vector_env(n_envs=4, n_workers=2, **kwargs):
    return ShmVectorEnv([CARTPOLE] * n_envs, n_workers, device="cuda", start_method="fork", **kwargs)


def pinned_sb3_env(n_envs=4, n_workers=2, **kwargs):
    return ShmPoolVecEnv([CARTPOLE] * n_envs, n_workers, start_method="fork", **kwargs)


# ---- page-locking -------------------------------------------------------------------------


@pytest.mark.parametrize("adapter", ["ShmVectorEnv", "ShmPoolVecEnv"])
def test_registered_once_in_the_main_process_after_the_workers_attached(adapter, cuda_log, fake_cuda, monkeypatch):
    slow_attach(monkeypatch)
    env = cuda_vector_env() if adapter == "ShmVectorEnv" else pinned_sb3_env(pin_memory=True)
    try:
        env.reset()
        for _ in range(5):
            env.step(np.zeros(4, dtype=np.int64))
        arena = cuda_log.arenas_made[-1]
        address = np.frombuffer(arena.buf, np.uint8).__array_interface__["data"][0]
        assert [entry[0] for entry in cuda_log.log] == ["register"]
        _, pid, registered, nbytes, workers, attached = cuda_log.log[0]
        assert pid == os.getpid()
        assert (registered, nbytes) == (address, arena.nbytes)  # the whole arena
        assert len(workers) == 2 and attached == workers  # every worker had mapped it
    finally:
        env.close()
    assert [entry[0] for entry in cuda_log.log] == ["register", "unregister", "arena closed"]
    _, pid, unregistered, arena_still_there = cuda_log.log[1]
    assert pid == os.getpid() and unregistered == registered and arena_still_there


def test_no_registration_on_cpu_or_without_the_option(cuda_log, closing):
    closing(ShmVectorEnv([CARTPOLE] * 2, 1, device="cpu")).reset()
    closing(ShmVectorEnv([CARTPOLE] * 2, 1)).reset()
    closing(pinned_sb3_env(pin_memory=False, copy=False)).reset()
    closing(pinned_sb3_env()).reset()  # auto, copy=True: the observations are copied out of the arena anyway
    cuda_log.initialized = False
    closing(pinned_sb3_env(copy=False)).reset()  # auto: CUDA not started
    assert cuda_log.log == []
    cuda_log.initialized = True
    closing(pinned_sb3_env(copy=False)).reset()  # auto: CUDA already started
    assert [entry[0] for entry in cuda_log.log] == ["register"]


def test_a_failed_registration_warns_once_and_copies_go_on(cuda_log, fake_cuda, closing):
    cuda_log.code = 712  # e.g. cudaErrorHostMemoryAlreadyRegistered
    with pytest.warns(RuntimeWarning, match="could not page-lock.*fake error 712") as caught:
        shm = closing(ShmVectorEnv([MIXED] * 4, 2, device="cuda", start_method="fork"))
    ours = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(ours) == 1 and ours[0].filename == __file__  # the warning points at the caller's line
    assert shm._device.pinned is False
    from gymnasium.vector import SyncVectorEnv

    ref = closing(SyncVectorEnv([MIXED] * 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning while stepping
        run_equivalence(AsNumpy(shm, device=torch.device("cpu")), ref, 60, seed=2)
    shm.close()
    assert [entry[0] for entry in cuda_log.log] == ["register", "clear_error", "arena closed"]  # nothing to undo


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_pin_memory_without_cuda_warns_once_and_works(closing):
    with pytest.warns(RuntimeWarning, match="could not page-lock"):
        env = closing(pinned_sb3_env(pin_memory=True))
    env.reset()
    env.step(np.zeros(4, dtype=np.int64))


@pytest.mark.vector_api
def test_a_dead_worker_still_unregisters_before_the_arena_closes(cuda_log, fake_cuda):
    env = cuda_vector_env()
    try:
        env.reset()
        os.kill(env._pool.links[0].process.pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError):
            for _ in range(50):
                env.step(torch.zeros(4, dtype=torch.int64))
    finally:
        env.close()
    assert [entry[0] for entry in cuda_log.log] == ["register", "unregister", "arena closed"]
    assert cuda_log.log[1][3]  # the arena was still there


def test_an_env_never_closed_unregisters_when_collected(cuda_log):
    env = pinned_sb3_env(pin_memory=True)
    env.reset()
    with pytest.warns(ResourceWarning):
        del env
        gc.collect()
    assert [entry[0] for entry in cuda_log.log] == ["register", "unregister", "arena closed"]


@pytest.mark.vector_api
def test_a_constructor_that_fails_after_registration_unregisters(cuda_log, fake_cuda, monkeypatch):
    def fail(self, pool):
        pool.page_lock()
        raise RuntimeError("after registration")

    monkeypatch.setattr(torch_device.DeviceHandoff, "start", fail)
    with pytest.raises(RuntimeError, match="after registration"):
        cuda_vector_env()
    assert [entry[0] for entry in cuda_log.log] == ["register", "unregister", "arena closed"]


def test_release_in_a_forked_child_leaves_the_registration_alone(cuda_log):
    memory = bytearray(4096)
    pinned = pinning.pin(memory, "a test buffer")
    pid = os.fork()
    if pid == 0:  # the child: its copy of the handle must not unregister the parent's memory
        pinned.release()
        os._exit(0 if len(cuda_log.log) == 1 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    pinned.release()
    pinned.release()  # idempotent
    assert [entry[0] for entry in cuda_log.log] == ["register", "unregister"]


def test_loaded_libcudart_lists_only_cuda_runtimes():
    assert all(os.path.basename(path).startswith("libcudart") for path in pinning._loaded_libcudart())


# ---- copies and their fences --------------------------------------------------------------


class WriteChecker:
    """Before each command that lets the workers write rows, every copy reading one of them must be done."""

    def __init__(self, env, monkeypatch):
        self.reads: list[tuple[StandInStream, int, np.ndarray]] = []  # stream, event number, rows: events are reused
        self.posts = 0
        original_add = cuda_copies.CopyFences.add
        checker = self

        def add(fences, event, rows):
            if rows is not None:
                checker.reads.append((event.stream, event.number, np.arange(env.num_envs)[rows]))
            original_add(fences, event, rows)

        monkeypatch.setattr(cuda_copies.CopyFences, "add", add)
        pool = env._pool
        for name, rows_of in (
            ("step_async", lambda *a: None),
            ("call_async", lambda request, *a: list(request.kwargs)),
            ("send", lambda env_ids: env_ids),
            ("send_reset", lambda kwargs: list(kwargs)),
        ):
            monkeypatch.setattr(pool, name, self.checked(getattr(pool, name), rows_of, env.num_envs))

    def checked(self, post, rows_of, num_envs):
        def wrapper(*args, **kwargs):
            rows = rows_of(*args, **kwargs)
            written = np.arange(num_envs) if rows is None else np.asarray(rows)
            for stream, number, read in self.reads:
                if np.isin(read, written).any():
                    running = f"rows {written.tolist()} posted while a copy of rows {read.tolist()} runs"
                    assert number <= stream.completed, running
            self.posts += 1
            return post(*args, **kwargs)

        return wrapper


@pytest.mark.parametrize("one_copy", [True, False], ids=["one-span-copy", "a-copy-per-array"])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED], ids=lambda m: m.name)
@pytest.mark.vector_api
def test_whole_steps_match_and_wait_for_their_copies(mode, one_copy, fake_cuda, closing, monkeypatch):
    if not one_copy:  # as for memory that is not one arena (Ray's driver): each array on its own
        monkeypatch.setattr(cuda_copies, "SPAN_SLACK", (1.0, 0))
    shm, ref = make_pair(MIXED, closing, mode=mode, device="cuda")
    checker = WriteChecker(shm, monkeypatch)
    counts = run_equivalence(AsNumpy(shm, device=torch.device("cpu")), ref, 120, seed=4)
    assert counts["terminated"] + counts["truncated"] > 0
    assert len(checker.reads) > 100 and checker.posts > 100
    assert fake_cuda.stream.completed > 0
    calls = fake_cuda.counts  # a hand-off records one event
    assert (calls["copies"] == calls["events"]) == one_copy  # observations, rewards and flags in one copy, or not
    assert calls["staging"] == 0  # straight from the arena


@pytest.mark.parametrize("n_workers", [1, 2])
def test_async_batches_match_numpy_and_never_rewrite_rows_in_flight(n_workers, fake_cuda, closing, monkeypatch):
    """1 worker: batches run in env order (contiguous runs, and a wrap-around gathered); 2: interleaved."""
    runs = []
    for device in (None, "cuda"):
        env = closing(ShmVectorEnv([MIXED] * 6, n_workers, batch_size=4, start_method="fork", device=device))
        checker = WriteChecker(env, monkeypatch) if device else None
        runs.append(async_batches(env, device=torch.device("cpu")))  # the stand-ins copy to the CPU
    if n_workers == 1:  # only then are the batches the same in both runs
        for t, (got, want) in enumerate(zip(runs[1], runs[0])):
            assert_same(got, want, f"batch {t}")
        assert checker.reads  # contiguous batches were copied straight from the arena...
    assert checker.posts == 61  # the reset and every send


def recorded(stream: StandInStream) -> StandInEvent:
    event = StandInEvent(stream)
    event.record()
    return event


def test_copy_fences_wait_only_for_copies_of_the_rows_written():
    fences, stream = cuda_copies.CopyFences(6), StandInStream()
    first, second = recorded(stream), recorded(stream)
    fences.add(first, slice(0, 3))
    fences.add(second, slice(3, 6))
    fences.before_write(np.array([3]))  # rows of the second copy: waits for it (and so for the first)
    assert second.done and first.done
    stream.completed = 0  # pretend nothing ran yet
    third, fourth = recorded(stream), recorded(stream)
    fences.add(third, slice(0, 2))
    fences.add(fourth, None)  # a gathered batch: it reads staging memory, no shared row
    fences.before_write(np.array([4, 5]))  # read last by the second copy, known done
    assert not third.done
    fences.before_write(np.array([2]))  # read by the first copy only, done
    assert not third.done
    fences.before_write(None)  # a whole step: the last copy of any row
    assert third.done and not fourth.done
    fences.wait_all()
    assert fourth.done


def test_copies_that_read_no_row_keep_no_event():
    """A gathered batch's copy reads pinned staging memory, no shared row: once a later copy is issued nothing
    waits for its event, so at most the last one is kept, however many batches go by (one each, for good, before)."""
    fences, stream = cuda_copies.CopyFences(6), StandInStream()
    rows = np.array([0, 2, 5])
    for _ in range(100_000):
        fences.add(recorded(stream), None)  # recv: a gathered batch
        fences.before_write(rows)  # send to its envs
    assert len(fences._events) == 1
    fences.add(recorded(stream), slice(0, 3))  # a contiguous run, read from the arena: kept until written
    fences.add(last := recorded(stream), None)
    assert [number for number, _ in fences._events] == [100_001, 100_002]
    fences.before_write(np.array([1]))
    fences.wait_all()
    assert last.done and not fences._events


def test_async_batches_do_not_pile_up_events(fake_cuda, closing):
    env = closing(ShmVectorEnv([CARTPOLE] * 6, 2, batch_size=4, start_method="fork", device="cuda"))
    env.async_reset(seed=0)
    gathered = 0
    for _ in range(400):
        *_, infos = env.recv()
        ids = infos["env_id"]
        gathered += bool((np.diff(ids) != 1).any())
        env.send(np.zeros(len(ids), dtype=np.int64), ids)
    assert gathered > 100  # most batches mix the workers' envs: their rows are gathered
    assert len(env._device._copies.fences._events) <= 2
