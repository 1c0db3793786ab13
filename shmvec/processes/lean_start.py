"""Worker processes that start without the user's main script.

Under forkserver and spawn, multiprocessing has every child import the parent's
``__main__`` (as ``__mp_main__``) before it runs anything. For a training script that
imports torch and SB3 at its top, that costs each worker ~150 MB of its own memory and
~0.6 s; a script without the ``if __name__ == "__main__":`` guard would build its vector
env again in every worker, and a script piped through stdin cannot be imported at all.

A worker needs none of it. Its env_fns come by cloudpickle, which carries the functions
and classes defined in ``__main__`` by value, and it imports their modules by name. What
it does need of the parent's state travels explicitly:

- ``sys.path`` and the working directory (multiprocessing sends them with every child),
  so an env module beside the script imports as it does in the parent;
- what the script set up at its top and can be carried without running it (logging,
  warnings filters, environment variables, the global random states, the Gymnasium
  registry): :mod:`~shmvec.processes.script_setup`.

:func:`start_without_main` makes multiprocessing leave the main module out of what it
sends to processes named ``shmvec-worker-*`` (``multiprocessing.spawn.get_preparation_data``,
which both the spawn and the forkserver starters call); every other process is started
as before, and so are the workers of a pool made with ``import_main=True``
(:data:`SCRIPT_WORKER_PREFIX`: they import the script as ``SubprocVecEnv``'s do). Under
fork a worker inherits the parent's memory, main module included.
"""

from __future__ import annotations

import functools
from multiprocessing import spawn
from typing import Any

import cloudpickle

WORKER_NAME_PREFIX = "shmvec-worker-"
SCRIPT_WORKER_PREFIX = "shmvec-script-worker-"  # import_main=True: a worker that imports the main script
_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")  # what has a child import the parent's __main__


def start_without_main() -> None:
    """From now on, ``shmvec-worker-*`` processes started by spawn or forkserver skip the main module. Idempotent."""
    original = spawn.get_preparation_data
    if getattr(original, "_shmvec_lean", False):
        return

    @functools.wraps(original)
    def get_preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        if name.startswith(WORKER_NAME_PREFIX):
            for key in _MAIN_KEYS:
                data.pop(key, None)
        return data

    get_preparation_data._shmvec_lean = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = get_preparation_data


def env_fns_blob(env_fns: list, env_wrapper: Any) -> bytes:
    """What a worker unpickles after its set-up (:mod:`~shmvec.processes.script_setup`): its env_fns and the wrapper."""
    return cloudpickle.dumps((env_fns, env_wrapper))
