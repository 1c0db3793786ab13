"""Entries left in /dev/shm by a process group SIGKILLed as a whole go at the next pool start.

The end-to-end tests kill a real stepping script's whole process group (main process,
resource tracker, workers, forkserver) under each start method, see its entries stay,
and start a pool. The unit tests run :func:`~shmvec.ipc.leftovers.reclaim` on a scratch
directory: which entries it removes and which it must keep.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap

import gymnasium as gym
import psutil
import pytest

from shmvec import ShmPoolVecEnv
from shmvec.ipc import leftovers
from shmvec.ipc.leftovers import Maker, is_leftover, own_maker, parse_name, reclaim, start_time, unique_name
from shmvec.ipc.signals import Signal
from tests.helpers import REPO, gone, poll_until, shm_of

QUICK = 5.0  # seconds: generous bound for "at once" on a loaded 2-core box
CI_PID = re.compile(r"^(sem\.)?shmvec_([0-9]+)_")  # how .ci/run reads the maker's pid

STEPPING_SCRIPT = """
    import sys
    import gymnasium as gym
    import numpy as np
    from shmvec import ShmPoolVecEnv

    if __name__ == "__main__":
        env = ShmPoolVecEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2, start_method=sys.argv[1])
        env.reset()
        actions = np.zeros(4, dtype=np.int64)
        for _ in range(10):
            env.step(actions)
        print("READY", flush=True)
        while True:
            env.step(actions)
"""


# -- a whole process group SIGKILLed ---------------------------------------------------------


def group_of(pgid: int) -> list[int]:
    """The processes of process group ``pgid``."""
    pids = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                pids.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return pids


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the script's process group (it leads it) and reap the script."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=QUICK)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_killed_group_leftovers_go_at_next_pool_start(tmp_path, caplog, closing, start_method):
    script = tmp_path / "stepping.py"
    script.write_text(textwrap.dedent(STEPPING_SCRIPT))
    proc = subprocess.Popen(
        [sys.executable, str(script), start_method],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},  # this checkout's shmvec, not an installed one
        start_new_session=True,  # its own process group, as a job scheduler or `timeout` starts it
    )
    try:
        line = proc.stdout.readline()
        assert line == "READY\n", (
            f"script failed to start: {line!r}\n{proc.stderr.read() if proc.poll() is not None else ''}"
        )
        group = group_of(proc.pid)
        assert len(group) >= 4, f"main, resource tracker and 2 workers expected in the group: {group}"
        kill_group(proc)
        assert poll_until(lambda: all(gone(pid) for pid in group), QUICK), "the group outlived SIGKILL"
        left = shm_of(proc.pid)
        kinds = sorted({name.split("_")[2] for name in left})
        assert kinds == ["arena", "sem"], (
            f"a killed tracker cannot unlink: arena and semaphores should stay, got {left}"
        )

        with caplog.at_level(logging.INFO, logger="shmvec"):
            closing(ShmPoolVecEnv([lambda: gym.make("CartPole-v1")] * 2, n_workers=1, start_method=start_method))
        assert shm_of(proc.pid) == [], "the next pool start should have removed the killed group's entries"
        logged = "\n".join(record.getMessage() for record in caplog.records if record.name == "shmvec")
        assert all(name in logged for name in left), f"not every removed entry was logged:\n{logged}"
    finally:
        kill_group(proc)
        for name in shm_of(proc.pid):  # a failed test must not leave its leftovers for good
            os.unlink(os.path.join(leftovers.SHM_DIR, name))


# -- names -----------------------------------------------------------------------------------


def test_names_record_this_process_and_keep_the_pid_where_tools_read_it():
    me = own_maker()
    assert me.pid == os.getpid() and me.start == start_time(os.getpid()) and me.pidns > 0
    name = unique_name("arena")
    assert parse_name(name) == me
    assert int(CI_PID.match(name).group(2)) == os.getpid()
    sem = Signal.create()
    try:
        entry = "sem." + sem.name.lstrip("/")
        assert entry in os.listdir(leftovers.SHM_DIR)
        assert parse_name(entry) == me
        assert int(CI_PID.match(entry).group(2)) == os.getpid()
    finally:
        sem.close()


def test_a_forked_child_names_itself():
    own_maker()  # cached in the parent before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its maker and leave at once
        try:
            os.write(write, repr(tuple(own_maker())).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        child = eval(os.read(read, 200).decode())
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert child[0] == pid != os.getpid()
    assert child[2] == own_maker().pidns
    assert child[1] >= own_maker().start


def test_start_time_reads_past_odd_command_names(tmp_path):
    odd = tmp_path / "a) b (c"  # the command name field may hold spaces and parentheses
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "30"])
    try:
        assert psutil.Process(proc.pid).name() == "a) b (c"
        ticks = os.sysconf("SC_CLK_TCK")
        created = psutil.boot_time() + start_time(proc.pid) / ticks
        assert abs(created - psutil.Process(proc.pid).create_time()) < 2 / ticks
    finally:
        proc.kill()
        proc.wait()
    assert start_time(proc.pid) is None


# -- which entries reclaim() removes ---------------------------------------------------------


@pytest.fixture
def sleeper():
    """A live process other than this one."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def make_entry(directory, maker: Maker, kind: str = "arena", sem: bool = False) -> str:
    name = ("sem." if sem else "") + f"shmvec_{maker.pid}_{kind}_{maker.start}-{maker.pidns}_{os.urandom(4).hex()}"
    (directory / name).write_bytes(b"x")
    return name


def test_entries_of_live_makers_are_kept(tmp_path, sleeper):
    me = own_maker()
    other = Maker(sleeper.pid, start_time(sleeper.pid), me.pidns)
    kept = {make_entry(tmp_path, me), make_entry(tmp_path, me, "sem", sem=True), make_entry(tmp_path, other)}
    assert reclaim(str(tmp_path)) == []
    assert set(os.listdir(tmp_path)) == kept


def test_entries_of_dead_makers_are_removed_and_logged(tmp_path, caplog):
    me = own_maker()
    dead = Maker(dead_pid(), me.start, me.pidns)
    gone_names = {make_entry(tmp_path, dead), make_entry(tmp_path, dead, "sem", sem=True)}
    kept = make_entry(tmp_path, me)
    with caplog.at_level(logging.INFO, logger="shmvec"):
        removed = reclaim(str(tmp_path))
    assert set(removed) == gone_names
    assert os.listdir(tmp_path) == [kept]
    assert all(name in caplog.text for name in gone_names)


def test_a_reused_pid_does_not_keep_a_leftover(tmp_path, sleeper):
    """The pid is alive, but the process that has it started at another time than the maker."""
    me = own_maker()
    live_start = start_time(sleeper.pid)
    earlier = {
        make_entry(tmp_path, Maker(sleeper.pid, live_start - 1, me.pidns)),
        make_entry(tmp_path, Maker(me.pid, me.start - 1, me.pidns)),
    }
    kept = make_entry(tmp_path, Maker(sleeper.pid, live_start, me.pidns))
    assert set(reclaim(str(tmp_path))) == earlier
    assert os.listdir(tmp_path) == [kept]


def test_entries_of_another_pid_namespace_are_kept(tmp_path):
    me = own_maker()
    name = make_entry(tmp_path, Maker(dead_pid(), me.start, me.pidns + 1))
    assert reclaim(str(tmp_path)) == []
    assert os.listdir(tmp_path) == [name]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_entries_of_another_user_are_kept(tmp_path):
    me = own_maker()
    name = make_entry(tmp_path, Maker(dead_pid(), me.start, me.pidns))
    os.chown(tmp_path / name, 65534, 65534)
    assert reclaim(str(tmp_path)) == []
    assert os.listdir(tmp_path) == [name]


def test_decision_keeps_other_users_and_namespaces_without_asking_for_the_pid():
    me = Maker(100, 5000, 4026531836)
    dead = Maker(200, 4000, me.pidns)

    def never(pid):
        raise AssertionError("the maker's pid was looked up for an entry that is not ours to judge")

    assert not is_leftover(dead, owner_uid=1001, me=me, uid=1000, start_of=never)
    assert not is_leftover(dead._replace(pidns=me.pidns + 1), owner_uid=1000, me=me, uid=1000, start_of=never)
    assert not is_leftover(dead, owner_uid=1000, me=me._replace(pidns=0), uid=1000, start_of=never)  # no /proc
    assert is_leftover(dead, owner_uid=1000, me=me, uid=1000, start_of=lambda pid: None)
    assert is_leftover(dead, owner_uid=1000, me=me, uid=1000, start_of=lambda pid: 4001)
    assert not is_leftover(dead, owner_uid=1000, me=me, uid=1000, start_of=lambda pid: 4000)


def test_other_names_and_non_files_are_left_alone(tmp_path):
    pid = dead_pid()
    me = own_maker()
    odd = [
        f"shmvec_{pid}_arena_1a2b3c4d",  # the older form: no start time, no namespace
        f"shmvec_{pid}_arena_{me.start}_1a2b3c4d",
        f"shmvec_x{pid}_arena_{me.start}-{me.pidns}_1a2b3c4d",
        f"shmvec_{pid}_arena_{me.start}-{me.pidns}_1a2b3c4d.tmp",
        f"sem.shmvec_{pid}_ARENA_{me.start}-{me.pidns}_1a2b3c4d",
        f"other_{pid}_arena_{me.start}-{me.pidns}_1a2b3c4d",
        "shmvec_",
    ]
    for name in odd:
        (tmp_path / name).write_bytes(b"x")
        assert parse_name(name) is None
    directory = f"shmvec_{pid}_arena_{me.start}-{me.pidns}_1a2b3c4d"  # a valid name, not a file
    (tmp_path / directory).mkdir()
    assert reclaim(str(tmp_path)) == []
    assert set(os.listdir(tmp_path)) == {*odd, directory}


def test_entries_vanishing_meanwhile_are_skipped(tmp_path, monkeypatch):
    """Another pool starting beside us, or the maker's own tracker, may unlink them first."""
    me = own_maker()
    dead = Maker(dead_pid(), me.start, me.pidns)
    ghost = f"shmvec_{dead.pid}_arena_{dead.start}-{dead.pidns}_00000000"  # listed, gone before lstat
    raced = make_entry(tmp_path, dead)  # gone between lstat and unlink
    removed = make_entry(tmp_path, dead, "sem", sem=True)
    listdir, unlink = os.listdir, os.unlink

    def racing_unlink(path):
        unlink(path)
        if path.endswith(raced):
            raise FileNotFoundError(path)

    monkeypatch.setattr(leftovers.os, "listdir", lambda d: [ghost, *listdir(d)])
    monkeypatch.setattr(leftovers.os, "unlink", racing_unlink)
    assert reclaim(str(tmp_path)) == [removed]
    assert listdir(tmp_path) == []


def test_no_shm_directory_means_nothing_to_reclaim(tmp_path):
    assert reclaim(str(tmp_path / "missing")) == []
