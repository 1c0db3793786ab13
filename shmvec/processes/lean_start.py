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

:mod:`~shmvec.processes.starters` leaves the main module out of what multiprocessing
sends to processes named ``shmvec-worker-*``; the workers of a pool made with
``import_main=True`` (:data:`SCRIPT_WORKER_PREFIX`) import the script as ``SubprocVecEnv``'s
do. Under fork (asked for) a worker inherits the parent's memory, main module included.
"""

from __future__ import annotations

from typing import Any

import cloudpickle

WORKER_NAME_PREFIX = "shmvec-worker-"
SCRIPT_WORKER_PREFIX = "shmvec-script-worker-"  # import_main=True: a worker that imports the main script


def env_fns_blob(env_fns: list, env_wrapper: Any) -> bytes:
    """What a worker unpickles after its set-up (:mod:`~shmvec.processes.script_setup`): its env_fns and the wrapper."""
    return cloudpickle.dumps((env_fns, env_wrapper))
