"""The default's memory: the layout it chose before, on this machine, for this env and pool.

A layout chosen from a ~50 ms timing follows the timing's noise wherever the env's step cost
lies near the cost at which two layouts are predicted equally fast: HalfCheetah-v5 x8 on 2
cores sits there, and fresh processes took turns between them. Near such a point the
two layouts are within the model's own error of each other, so :func:`~shmvec.planning.plan.choose`
keeps the layout remembered here unless the new timing predicts another at least
:data:`KEEP_MARGIN` faster (hysteresis); a real change (another machine, an env made heavier)
still moves it.

The memory is one small JSON file, ``$XDG_CACHE_HOME/shmvec/plans.json`` (``~/.cache/...``),
or the file ``SHMVEC_PLAN_CACHE`` names; ``SHMVEC_PLAN_CACHE=off`` turns it off. Entries are
keyed by a hash of the machine (host name, CPU model, the usable CPUs), the env
(:func:`env_identity`), the number of envs and the options that restrict the choice.

Many processes may start pools at once (a hyper-parameter sweep): :func:`remember` reads,
updates and replaces the file under an exclusive ``flock`` on ``plans.json.lock`` beside it,
waiting at most :data:`LOCK_WAIT` for it (then the plan is not remembered). The memory is read
without following a symbolic link or waiting on a FIFO, only from a regular file of this user
of at most :data:`MAX_BYTES`, and only entries the plan can use are taken (:func:`_valid_entry`);
anything else is no memory (a warning once per process and cause) and never an error: the plan
is then made afresh. A damaged file of this user is replaced by the next write; something else
at the path is left alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import platform
import re
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shmvec.planning.outside_effects import layers

CACHE_VAR = "SHMVEC_PLAN_CACHE"
OFF = ("", "0", "off", "false", "no")
KEEP_MARGIN = 0.10  # a remembered layout is left only for one predicted at least this much faster
MAX_ENTRIES = 200  # the oldest entries go beyond this many
VERSION = 1  # of the model behind the layouts: a new one forgets the old layouts
MAX_BYTES = 2**20  # 200 entries take ~20 kB: a larger file was not written here
MAX_WORKERS = 4096  # beyond any layout the plan chooses (it starts at most a few hundred workers)
LOCK_WAIT = 2.0  # seconds a pool's start waits for another process's write before it skips remembering
LOCK_POLL = 0.002
MAX_SECONDS = 3600.0  # a remembered step time or scale beyond this is not one the timing gives
MAX_IDENTITY = 8192  # characters of an env's identity kept in a remembered timing
_KEY = re.compile(r"[0-9a-f]{24}\Z")  # plan_key's form
_warned: set[str] = set()  # the causes already logged in this process

logger = logging.getLogger("shmvec")


def cache_file() -> Path | None:
    """Where the memory lives, or None if it is turned off."""
    value = os.environ.get(CACHE_VAR)
    if value is not None:
        return None if value.strip().lower() in OFF else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):  # no home folder: never a "~" folder where the script runs
        return None
    return Path(base) / "shmvec" / "plans.json"


def timings_file() -> Path | None:
    """Where remembered timings live: beside the layouts (``plans.timings.json``), in a file of their
    own, which a release that knows no timings leaves alone."""
    path = cache_file()
    return None if path is None else path.with_name(f"{path.stem}.timings{path.suffix or '.json'}")


def env_identity(env: Any) -> str:
    """What makes an env cost what it costs, as far as can be told from the built env: its
    registered id and arguments, its class, its wrappers, its spaces."""
    spec = getattr(env, "spec", None)
    kwargs = getattr(spec, "kwargs", None) or {}
    simple = {
        k: v if isinstance(v, (str, int, float, bool, type(None))) else type(v).__name__ for k, v in kwargs.items()
    }
    chain = [f"{type(layer).__module__}.{type(layer).__qualname__}" for layer in layers(env)]
    parts = [getattr(spec, "id", None), getattr(spec, "max_episode_steps", None), sorted(simple.items()), chain]
    parts += [repr(getattr(env, "observation_space", None)), repr(getattr(env, "action_space", None))]
    return json.dumps(parts, default=repr)


def plan_key(identity: str, num_envs: int, cpus: str, restrictions: Any) -> str | None:
    """The memory's key for a pool of ``num_envs`` envs of ``identity`` on this machine (None: no key)."""
    if not identity:
        return None
    machine = [platform.node(), cpu_model(), cpus, sys.version_info[:2], VERSION]
    blob = json.dumps([machine, identity, num_envs, restrictions], default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def recall(key: str | None) -> tuple[int, bool] | None:
    """The layout ``(n_workers, main_shard)`` remembered for ``key``, if any."""
    entry = recall_entry(key)
    return None if entry is None or "n_workers" not in entry else (entry["n_workers"], entry["main_shard"])


def remember(key: str | None, n_workers: int, main_shard: bool) -> None:
    """Remember the layout chosen for ``key`` (under the lock, written atomically; a failure is only logged)."""
    remember_entry(key, {"n_workers": n_workers, "main_shard": main_shard, "when": time.time()})


def recall_entry(key: str | None, path: Path | None = None) -> dict | None:
    """The valid entry remembered for ``key`` (a layout or a timing) in ``path`` (the memory's file
    if None), if any."""
    path = path or cache_file()
    if key is None or path is None:
        return None
    return (_read(path) or {}).get(key)


def remember_entry(key: str | None, entry: dict, path: Path | None = None) -> None:
    """Remember ``entry`` for ``key`` in ``path`` (the memory's file if None): under the lock, written
    atomically; a failure is only logged."""
    path = path or cache_file()
    entry = _valid_entry(entry)
    if key is None or path is None or entry is None or not _KEY.match(key):
        return
    lock = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _lock(path.with_name(path.name + ".lock"))
        if lock is None:
            return
        entries = _read(path)
        if entries is None:  # something else lies there: not ours to replace
            return
        # The newest others, and this one whatever the others' times (a clock set back, a file from elsewhere).
        others = sorted((item for item in entries.items() if item[0] != key), key=lambda item: item[1]["when"])
        _write(path, {**dict(others[max(len(others) - MAX_ENTRIES + 1, 0) :]), key: entry})
    except (OSError, ValueError) as exc:  # a read-only or missing cache folder: no memory, no error
        logger.debug("shmvec: could not remember the plan in %s: %s", path, exc)
    finally:
        if lock is not None:
            os.close(lock)  # releases the lock


def _lock(path: Path) -> int | None:
    """A descriptor holding the exclusive lock on ``path`` (a file beside the memory, as the memory
    itself is replaced by each write), or None if it is not this user's file or stays held
    :data:`LOCK_WAIT` seconds: the pool then starts without remembering rather than wait."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            _ignore(path, "the lock is not a regular file of this user")
            os.close(fd)
            return None
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() > deadline:
                    _ignore(path, f"the lock stayed held over {LOCK_WAIT:g} s: the plan is not remembered")
                    os.close(fd)
                    return None
                time.sleep(LOCK_POLL)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def _read(path: Path) -> dict[str, dict] | None:
    """The valid entries of the memory at ``path`` (none if there is no file or it is damaged), or None
    if ``path`` holds something other than this user's regular file, which is then neither read nor replaced."""
    try:  # no symbolic link followed, no wait on a FIFO
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        _ignore(path, "a symbolic link" if getattr(exc, "errno", None) == errno.ELOOP else "unreadable", exc)
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            _ignore(path, "not a regular file")
            return None
        if info.st_uid != os.geteuid():
            _ignore(path, "owned by another user")
            return None
        data = _read_at_most(fd, MAX_BYTES + 1) if info.st_size <= MAX_BYTES else b""
    except OSError as exc:
        _ignore(path, "unreadable", exc)
        return None
    finally:
        os.close(fd)
    if info.st_size > MAX_BYTES or len(data) > MAX_BYTES:
        _ignore(path, f"larger than {MAX_BYTES} bytes")
        return {}
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        _ignore(path, "not JSON")
        return {}
    if not isinstance(raw, dict):
        _ignore(path, "not a JSON object")
        return {}
    entries = {key: entry for key, value in raw.items() if _KEY.match(key) and (entry := _valid_entry(value))}
    if len(entries) < len(raw):
        _ignore(path, "entries of the wrong form (left out)")
    return entries


def _valid_entry(value: Any) -> dict | None:
    """``value`` as an entry if it is one the plan can use, else None: a layout (``n_workers`` an int
    in [0, MAX_WORKERS], ``main_shard`` a bool, at least one lane) or a timing (:func:`_valid_timing`),
    with ``when`` a finite number."""
    if not isinstance(value, dict):
        return None
    when = value.get("when")
    if not ((type(when) is float and math.isfinite(when)) or (type(when) is int and abs(when) < 2**63)):
        return None
    if "timing" in value:
        timing = _valid_timing(value["timing"])
        return None if timing is None else {"timing": timing, "when": float(when)}
    n_workers, main_shard = value.get("n_workers"), value.get("main_shard")
    if type(n_workers) is not int or not 0 <= n_workers <= MAX_WORKERS or type(main_shard) is not bool:
        return None
    if n_workers == 0 and not main_shard:  # no lane at all
        return None
    return {"n_workers": n_workers, "main_shard": main_shard, "when": float(when)}


def _valid_timing(value: Any) -> list | None:
    """An EnvTiming's fields the plan can use: positive finite seconds and scale, a CPU share in (0, 1],
    a small count of per-step calls, a bool, an identity string."""
    if not isinstance(value, list) or len(value) != 6:
        return None
    t_env, scale, cpu_share, calls, trains, identity = value
    numbers = (t_env, scale, cpu_share)
    if not all(type(x) in (int, float) and 0 < x <= MAX_SECONDS for x in numbers) or cpu_share > 1:
        return None
    if type(calls) is not int or not 0 <= calls <= 64 or type(trains) is not bool:
        return None
    if type(identity) is not str or len(identity) > MAX_IDENTITY:
        return None
    return [float(t_env), float(scale), float(cpu_share), calls, trains, identity]


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _write(path: Path, entries: dict) -> None:
    fd, temporary = tempfile.mkstemp(prefix=".plans-", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "w") as file:
            json.dump(entries, file, allow_nan=False)
        os.replace(temporary, path)  # readers see the old file or the new one, never half of one
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _ignore(path: Path, cause: str, error: BaseException | None = None) -> None:
    """Log, once per process and cause, that the memory at ``path`` is ignored."""
    if cause in _warned:
        return
    _warned.add(cause)
    detail = f" ({error})" if error is not None else ""
    logger.warning("shmvec: the plan memory %s is ignored: %s%s; the plan is made afresh", path, cause, detail)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()
