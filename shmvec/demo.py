"""``python -m shmvec.demo``: the demo (:mod:`shmvec.tools.demo`)."""

import sys

from shmvec.tools.demo import main

if __name__ == "__main__":
    sys.exit(main())
