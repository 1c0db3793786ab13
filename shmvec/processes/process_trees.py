"""Process trees, from ``/proc``: end all the processes below one (an env's simulator, a daemon it
double-forked) however they were started. Used by the timing process and by workers whose main
process died."""

from __future__ import annotations

import os
import signal
import time

KILL_ROUNDS_TIMEOUT = 2.0  # seconds kill_tree keeps killing what keeps appearing (forks racing the kill)


def end_descendants(grace: float) -> None:
    """End all this process's descendants: SIGTERM, up to ``grace`` seconds to exit, then SIGKILL.
    As a child subreaper it has every orphan below it as a child, so none is missed."""
    if not _has_children():
        return  # the usual case, without a look through /proc
    for pid in _descendants(os.getpid()):
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _reap_children() and _descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.02)
    kill_tree(os.getpid())
    _reap_children()


def kill_tree(root: int, root_too: bool = False) -> None:
    """SIGKILL every live descendant of ``root``, in rounds until none is left (one may fork
    while the others die), then ``root`` itself if ``root_too``. ``root`` is stopped (SIGSTOP)
    first: a subreaper that cannot run still adopts, but starts nothing and reaps nothing."""
    if root_too:
        _signal(root, signal.SIGSTOP)
    deadline = time.monotonic() + KILL_ROUNDS_TIMEOUT
    while True:
        pids = _descendants(root)
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        if root == os.getpid():
            _reap_children()
        time.sleep(0.005)  # SIGKILL lands on the next scheduling of each: a second look sees them dead
    if root_too:
        _signal(root, signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    """The live (not zombie) descendants of ``root``, parents before children, from ``/proc``."""
    children: dict[int, list[int]] = {}
    live = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            found = status(int(name))
            if found is not None:
                state, ppid = found
                children.setdefault(ppid, []).append(int(name))
                if state not in "ZX":
                    live.add(int(name))
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(), ()):
            found.append(child)
            queue.append(child)
    return [pid for pid in found if pid in live]


def status(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of process ``pid`` from ``/proc/<pid>/stat``; None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold anything
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[1])


def _has_children() -> bool:
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _reap_children() -> bool:
    """Reap this process's exited children; whether it still has any."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
