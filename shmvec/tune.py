"""``python -m shmvec.tune``: the tuner (:mod:`shmvec.tools.tune`)."""

import sys

from shmvec.errors import GymnasiumVersionError
from shmvec.tools.tune import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except GymnasiumVersionError as exc:  # its message, no traceback (main() raises it for scripts)
        sys.exit(f"error: {exc}")
