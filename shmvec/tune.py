"""``python -m shmvec.tune``: the tuner (:mod:`shmvec.tools.tune`)."""

import sys

from shmvec.tools.tune import main

if __name__ == "__main__":
    sys.exit(main())
