"""How shmvec starts its processes (workers, the timing run): never as a fork of your process.

A fork copies all of a process's state: locks held by threads that do not exist in the copy
(``threading`` does not count a C extension's), GNU OpenMP's thread pool, logging handlers
freed there (a gzip trailer written into your file), C stdio buffers written twice. So,
unless you ask for ``start_method="fork"``, every process shmvec starts comes from:

- **its own forkserver** (the default): a fresh interpreter, started once per process at the
  first pool that needs a process, that imports the worker's modules and those the env factories'
  pickles name (:func:`modules_named_by`: a ``make_vec_env`` factory names SB3's modules, hence
  torch), then forks each process on request. A process forked from it starts with those
  imports done (~10 ms instead of ~1 s for torch), and nothing of your process is in it but what
  is sent (the pickled env factories, ``sys.path``, the working directory). It is multiprocessing's
  own forkserver, with a private instance: ``multiprocessing.set_forkserver_preload`` and the
  forkserver of your own processes are left alone. The server ignores Ctrl-C (your process
  handles it), skips a module that fails to import (the process that needs it imports it and
  reports the error) or that it would find elsewhere than your process did, and exits with
  your process. Its preload is fixed at its start: a later pool whose factories need other
  modules imports them in each of its processes;
- **spawn** where asked (``start_method="spawn"``): a fresh interpreter per process.

Either way a worker (``shmvec-worker-*``) skips the main script: multiprocessing's preparation
data lose the keys that would import it (:data:`MAIN_KEYS`). The contexts here carry their own
``Popen`` classes for that; nothing of ``multiprocessing`` is replaced.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickletools
import signal
import socket
import sys
import threading
from multiprocessing import connection, forkserver, popen_forkserver, popen_spawn_posix, process, spawn, util
from multiprocessing.context import BaseContext, reduction, set_spawning_popen
from typing import Any

from shmvec.processes.forkserver_main import WORKER_MODULE, command
from shmvec.processes.lean_start import WORKER_NAME_PREFIX

MAIN_KEYS = ("init_main_from_name", "init_main_from_path")  # preparation data that import the parent's __main__
NEVER_PRELOADED = frozenset({"__main__", "__mp_main__", "builtins", "copyreg", "_codecs"})


def preparation_data(name: str) -> dict[str, Any]:
    """multiprocessing's preparation data for a process called ``name``, without the main script for a worker."""
    data = spawn.get_preparation_data(name)
    if name.startswith(WORKER_NAME_PREFIX):
        for key in MAIN_KEYS:
            data.pop(key, None)
    return data


def _dump(popen: Any, process_obj: Any) -> io.BytesIO:
    """The preparation data and the process object, pickled as the stock Popen classes do."""
    buf = io.BytesIO()
    set_spawning_popen(popen)
    try:
        reduction.dump(preparation_data(process_obj._name), buf)
        reduction.dump(process_obj, buf)
    finally:
        set_spawning_popen(None)
    return buf


# ==== shmvec's forkserver ====================================================================


class PrivateForkServer(forkserver.ForkServer):
    """A forkserver of shmvec's own: multiprocessing's server (``forkserver.main``), started by
    :mod:`shmvec.processes.forkserver_main` with ``preload`` imported, and this process's
    ``sys.path`` (see the module's docstring)."""

    def __init__(self, preload: list[str]):
        super().__init__()
        self._preload_modules = list(preload)
        self._owner = os.getpid()

    def ensure_running(self) -> None:
        with self._lock:
            resource_tracker_running()
            if self._forkserver_pid is not None:
                try:
                    pid, _ = os.waitpid(self._forkserver_pid, os.WNOHANG)
                except ChildProcessError:
                    pid = self._forkserver_pid  # reaped by someone else's waitpid(-1): gone
                if not pid:
                    return  # still serving
                self._forget()  # it died (killed from outside): start another
            self._launch()

    def _forget(self) -> None:
        os.close(self._forkserver_alive_fd)
        if not util.is_abstract_socket_namespace(self._forkserver_address):
            with contextlib.suppress(OSError):
                os.unlink(self._forkserver_address)
        self._forkserver_address = self._forkserver_alive_fd = self._forkserver_pid = None

    def _launch(self) -> None:
        expected = {name: _origin_of(name) for name in self._preload_modules}
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()  # the server exits when this process (the only writer) is gone
            try:
                program = command(listener.fileno(), alive_r, expected, list(sys.path))
                exe = spawn.get_executable()
                args = [exe, *util._args_from_interpreter_flags(), "-c", program]
                pid = util.spawnv_passfds(exe, args, [listener.fileno(), alive_r])
            except BaseException:
                os.close(alive_w)
                raise
            finally:
                os.close(alive_r)
        self._forkserver_address, self._forkserver_alive_fd, self._forkserver_pid = address, alive_w, pid

    @property
    def preload(self) -> list[str]:
        return list(self._preload_modules)

    def kill(self) -> None:
        """End the server now (the processes it forked live on): a hung preload, or a test's clean-up."""
        with self._lock:
            pid = self._forkserver_pid
            if pid is None or self._owner != os.getpid():
                return
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            self._forget()


def resource_tracker_running() -> None:
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


def _origin_of(name: str) -> str | None:
    """The file this process imported top-level package ``name``'s from (None for a namespace or a built-in)."""
    module = sys.modules.get(name.partition(".")[0])
    return getattr(module, "__file__", None)


SERVER_START_TIMEOUT = 60.0  # seconds the first process waits for the server's preload before the server is replaced

_server: PrivateForkServer | None = None
_server_lock = threading.Lock()
_wanted: list[str] = []  # what the server to start next preloads (the first pool's wish)


def _forget_in_a_fork() -> None:
    """In a fork of this process (the caller's own ``os.fork``): a server and locks of its own, as
    another thread may have held these at the fork."""
    global _server, _server_lock
    _server, _server_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_a_fork)


def preload_what_it_names(pickle_bytes: bytes) -> None:
    """Have the server, if not started yet, preload the modules ``pickle_bytes`` names (:func:`modules_named_by`)."""
    with _server_lock:
        if _server is None:
            _wanted.extend(m for m in modules_named_by(pickle_bytes) if m not in _wanted)


def _server_for_start() -> PrivateForkServer:
    """This process's server: started at the first process with the worker module and the wished modules."""
    global _server
    with _server_lock:
        if _server is None:
            _server = PrivateForkServer([WORKER_MODULE, *(m for m in _wanted if m != WORKER_MODULE)])
        return _server


def _fall_back_to_base_server() -> PrivateForkServer:
    """Replace a server whose preload killed or hung it by one that preloads the worker module only."""
    global _server
    with _server_lock:
        failed, _server = _server, PrivateForkServer([WORKER_MODULE])
    if failed is not None:
        failed.kill()
    return _server


class _ForkServerPopen(popen_forkserver.Popen):
    def _launch(self, process_obj: Any) -> None:
        buf = _dump(self, process_obj)
        try:
            self._connect(_server_for_start())
        except ServerFailed:
            self._connect(_fall_back_to_base_server())
        with open(self._data_w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())  # after the pid: the child reads it, however large

    def _connect(self, server: PrivateForkServer) -> None:
        """Have ``server`` fork the child; its pid read within :data:`SERVER_START_TIMEOUT`."""
        try:
            self.sentinel, w = server.connect_to_new_process(self._fds)
        except OSError as exc:
            raise ServerFailed(server) from exc
        parent_w = os.dup(w)  # the child sees this process end through it, as with the stock Popen
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
        self._data_w = w
        try:
            if not connection.wait([self.sentinel], SERVER_START_TIMEOUT):
                raise ServerFailed(server)
            self.pid = forkserver.read_signed(self.sentinel)
        except (OSError, EOFError) as exc:
            raise ServerFailed(server) from exc
        finally:
            if getattr(self, "pid", None) is None:
                os.close(w)
                self.finalizer()


class ServerFailed(Exception):
    """The forkserver died or hung before it forked (a module of its preload crashed or hung it)."""

    def __init__(self, server: PrivateForkServer):
        super().__init__(f"shmvec's forkserver (preload {server.preload}) did not start a process")
        self.server = server


class _SpawnPopen(popen_spawn_posix.Popen):
    def _launch(self, process_obj: Any) -> None:
        from multiprocessing import resource_tracker

        tracker_fd = resource_tracker.getfd()
        self._fds.append(tracker_fd)
        fp = _dump(self, process_obj)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            self.pid = util.spawnv_passfds(spawn.get_executable(), cmd, self._fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            self.finalizer = util.Finalize(self, util.close_fds, [fd for fd in (parent_r, parent_w) if fd is not None])
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)


class ForkServerProcess(process.BaseProcess):
    """A process forked by this process's private forkserver."""

    _start_method = "forkserver"

    @staticmethod
    def _Popen(process_obj):
        return _ForkServerPopen(process_obj)


class SpawnProcess(process.BaseProcess):
    """A spawned process; a worker skips the main script."""

    _start_method = "spawn"

    @staticmethod
    def _Popen(process_obj):
        return _SpawnPopen(process_obj)


class ForkServerContext(BaseContext):
    _name = "forkserver"
    Process = ForkServerProcess


class SpawnContext(BaseContext):
    _name = "spawn"
    Process = SpawnProcess


def start_context(start_method: str) -> Any:
    """The multiprocessing context shmvec starts processes by: ``"fork"`` as asked (multiprocessing's),
    ``"spawn"`` lean, ``"forkserver"`` from this process's private server (see :func:`preload_what_it_names`)."""
    if start_method == "fork":
        from multiprocessing import get_context

        return get_context("fork")
    if start_method == "spawn":
        return SpawnContext()
    if start_method == "forkserver":
        return ForkServerContext()
    raise ValueError(f"cannot find context for {start_method!r}")


MAX_INNER_PICKLE = 2**20  # bytes: a larger pickle inside one (an env that carries data) is not read: too slow


def modules_named_by(pickle_bytes: bytes, _depth: int = 0) -> list[str]:
    """The modules of this process that a pickle names (its globals' modules, cloudpickle's
    ``subimport`` of modules), in order: what unpickling it imports. Not ``__main__``. A pickle
    held inside as bytes (agent slots carry their env's) is read too, up to :data:`MAX_INNER_PICKLE`:
    unpickled in the worker, it imports as much."""
    found: dict[str, None] = {}
    if not pickle_bytes:
        return []
    try:
        for _, arg, _ in pickletools.genops(pickle_bytes):
            if isinstance(arg, str):
                name = arg.partition(" ")[0]  # GLOBAL's "module qualname"
                if name in sys.modules and name not in NEVER_PRELOADED and _origin_of(name):
                    found[name] = None
            elif isinstance(arg, bytes) and arg[:1] == b"\x80" and len(arg) <= MAX_INNER_PICKLE and _depth < 2:
                found.update(dict.fromkeys(modules_named_by(arg, _depth + 1)))  # PROTO: a pickle's first opcode
    except Exception:
        pass  # an odd pickle: what was found so far
    return list(found)
