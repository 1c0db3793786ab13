"""A gate job's process: ``python -m bench.gate_child ROW IMPL SCALE TREE`` (see :mod:`bench.gate_jobs`).

Nothing but imports at its top, as in a user's training script: a main script whose top-level
lines workers would miss makes the default plan keep the envs all in workers or all in the
main process, which would measure another layout than users get.
"""

import sys

from bench.gate_jobs import child_main

if __name__ == "__main__":
    row, impl, scale, tree = sys.argv[1:5]
    sys.exit(child_main(row, impl, float(scale), tree))
