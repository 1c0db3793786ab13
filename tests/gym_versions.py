"""Where the references of older Gymnasium releases differ from the newest, which shmvec follows.

pyproject.toml accepts Gymnasium 1.1 on, and CI runs the suite with 1.1 too (the floors job).
shmvec raises the errors and keeps the behaviour of Gymnasium 1.4 on every release; the tests
that compare it with ``SyncVectorEnv``/``AsyncVectorEnv`` of the installed release use these
flags where that release did otherwise.
"""

from __future__ import annotations

import gymnasium as gym
from packaging.version import Version

GYMNASIUM = Version(gym.__version__)
BEFORE_1_4 = GYMNASIUM < Version("1.4")
# Before 1.4, bare assertions (AssertionError, other words) where 1.4 raises ValueError or TypeError:
# a seed list of the wrong length, an observation_mode tuple of non-spaces, a bad reset_mask.
ASSERTS_SEED_LISTS = ASSERTS_OBSERVATION_MODES = ASSERTS_RESET_MASKS = BEFORE_1_4
# Before 1.4, the vector envs wrote autoreset_mode into the env class's own metadata dict.
WRITES_CLASS_METADATA = BEFORE_1_4
# Before 1.2.1, AsyncVectorEnv's step sent a wrong count of actions as far as they went, then
# waited forever for the rest.
WAITS_ON_WRONG_COUNTS = GYMNASIUM < Version("1.2.1")
