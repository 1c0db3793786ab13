"""The entry point of shmvec's forkserver (:class:`~shmvec.processes.starters.PrivateForkServer`):
imports what the processes it forks need, then serves as multiprocessing's forkserver does.

Its command line (:func:`command`) ignores Ctrl-C and takes the caller's ``sys.path`` before
it imports anything of shmvec's (a copy of shmvec found through the caller's ``sys.path``).
A preload that leaves threads behind (a module that starts one at import, an OpenMP team
woken by a parallel region) would be copied into every fork in a state they cannot use: the
server then starts over (``exec``) with the worker's module alone.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import select
import sys
import threading

WORKER_MODULE = "shmvec.engine.worker"  # what every process shmvec starts runs: numpy, gymnasium, shmvec


def command(listener_fd: int, alive_r: int, preload: dict[str, str | None], sys_path: list[str]) -> str:
    """The ``python -c`` program of a server serving on ``listener_fd`` until ``alive_r`` closes."""
    return (
        f"import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); sys.path[:] = {sys_path!r}; "
        f"from shmvec.processes.forkserver_main import main; main({listener_fd}, {alive_r}, {preload!r}, {sys_path!r})"
    )


def main(listener_fd: int, alive_r: int, preload: dict[str, str | None], sys_path: list[str]) -> None:
    """Serve forks on ``listener_fd`` until ``alive_r`` closes, after importing ``preload``
    ({module: the file the caller imported its top-level package from}) with ``sys_path``."""
    with _exit_if_orphaned(alive_r):  # a preload that hangs must not outlive the caller
        _import_quietly(WORKER_MODULE, None)
        threads = _thread_count() - 1  # less this block's own; numpy's BLAS may have some: they fork as always
        for name, origin in preload.items():
            _import_quietly(name, origin)
    if _thread_count() > threads:  # a module left a thread: forks would copy it (and the locks it holds)
        lean = {WORKER_MODULE: preload.get(WORKER_MODULE)}
        program = command(listener_fd, alive_r, lean, sys_path)
        os.execv(sys.executable, [*sys.orig_argv[: sys.orig_argv.index("-c") + 1], program])
    from multiprocessing import forkserver

    forkserver.main(listener_fd, alive_r, [])  # nothing more to preload


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _import_quietly(name: str, origin: str | None) -> None:
    """Import ``name`` if its top-level package is where the caller found it; a module that fails
    to import is left to the process that needs it (it raises there, where it can be reported)."""
    top = name.partition(".")[0]
    try:
        if top not in sys.modules and origin is not None:
            spec = importlib.util.find_spec(top)
            if spec is None or spec.origin != origin:
                return  # another file than the caller's: the processes import the caller's themselves
        importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - SystemExit and KeyboardInterrupt of a module's top too
        return


class _exit_if_orphaned:
    """While in the block, a thread exits the process once ``alive_r`` reads end-of-file (the caller
    is gone); it is joined at the block's end, before the server forks anything."""

    def __init__(self, alive_r: int):
        self.alive_r = alive_r
        self.stop_r, self.stop_w = os.pipe()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        ready, _, _ = select.select([self.alive_r, self.stop_r], [], [])
        if self.alive_r in ready:
            os._exit(0)

    def __enter__(self) -> None:
        self.thread.start()

    def __exit__(self, *exc) -> None:
        os.write(self.stop_w, b"x")
        self.thread.join()
        os.close(self.stop_r)
        os.close(self.stop_w)
