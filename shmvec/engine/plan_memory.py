"""The default's memory: the layout it chose before, on this machine, for this env and pool.

A layout chosen from a ~50 ms timing follows the timing's noise wherever the env's step cost
lies near the cost at which two layouts are predicted equally fast: HalfCheetah-v5 x8 on 2
cores sits there, and fresh processes took turns between them. Near such a point the
two layouts are within the model's own error of each other, so :func:`~shmvec.engine.plan.choose`
keeps the layout remembered here unless the new timing predicts another at least
:data:`KEEP_MARGIN` faster (hysteresis); a real change (another machine, an env made heavier)
still moves it.

The memory is one small JSON file, ``$XDG_CACHE_HOME/shmvec/plans.json`` (``~/.cache/...``),
or the file ``SHMVEC_PLAN_CACHE`` names; ``SHMVEC_PLAN_CACHE=off`` turns it off. Entries are
keyed by a hash of the machine (host name, CPU model, the usable CPUs), the env
(:func:`env_identity`), the number of envs and the options that restrict the choice. A file
that cannot be read or written is ignored: the plan is then made afresh.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shmvec.engine.outside_effects import layers

CACHE_VAR = "SHMVEC_PLAN_CACHE"
OFF = ("", "0", "off", "false", "no")
KEEP_MARGIN = 0.10  # a remembered layout is left only for one predicted at least this much faster
MAX_ENTRIES = 200  # the oldest entries go beyond this many
VERSION = 1  # of the model behind the layouts: a new one forgets the old layouts

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
    machine = [platform.node(), _cpu_model(), cpus, sys.version_info[:2], VERSION]
    blob = json.dumps([machine, identity, num_envs, restrictions], default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def recall(key: str | None) -> tuple[int, bool] | None:
    """The layout ``(n_workers, main_shard)`` remembered for ``key``, if any."""
    path = cache_file()
    if key is None or path is None:
        return None
    entry = _read(path).get(key)
    try:
        return int(entry["n_workers"]), bool(entry["main_shard"])
    except (TypeError, KeyError, ValueError):
        return None


def remember(key: str | None, n_workers: int, main_shard: bool) -> None:
    """Remember the layout chosen for ``key`` (written atomically; a failure is only logged)."""
    path = cache_file()
    if key is None or path is None:
        return
    entries = _read(path)
    entries[key] = {"n_workers": n_workers, "main_shard": main_shard, "when": time.time()}
    if len(entries) > MAX_ENTRIES:
        newest = sorted(entries.items(), key=lambda item: item[1].get("when", 0) if isinstance(item[1], dict) else 0)
        entries = dict(newest[-MAX_ENTRIES:])
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".plans-", dir=path.parent)
        with os.fdopen(fd, "w") as file:
            json.dump(entries, file)
        os.replace(temporary, path)  # readers see the old file or the new one, never half of one
    except (OSError, TypeError, ValueError) as exc:
        logger.debug("shmvec: could not remember the plan in %s: %s", path, exc)
        if temporary is not None and os.path.exists(temporary):
            os.unlink(temporary)


def _read(path: Path) -> dict:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()
