"""Scripts as users write and run them, under every start method: workers never import them.

A worker gets its env_fns by cloudpickle and imports only what they need (numpy,
gymnasium, shmvec, the envs' own modules), never the user's main script. So a script
without the ``if __name__ == "__main__":`` guard, a script piped through stdin and a
script that imports torch at its top all just work, and the workers stay small. Each
test runs a real script in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.vector_api  # ShmVectorEnv: Gymnasium 1.1 on (tests/conftest.py)

TIMEOUT = 90  # seconds; a hang fails the test
START_METHODS = [None, "forkserver", "spawn", "fork"]
IDS = ["default", "forkserver", "spawn", "fork"]

UNGUARDED_SCRIPT = """\
import gymnasium as gym
import numpy as np

import shmvec

envs = shmvec.ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2{start_method})
envs.reset(seed=0)
envs.step(np.zeros(4, dtype=np.int64))
envs.close()
print("stepped")
"""


def run_script(text: str, tmp_path, stdin: bool = False, **format_args) -> subprocess.CompletedProcess:
    text = text.format(**format_args)
    if stdin:
        args, script_input = [sys.executable, "-"], text
    else:
        (tmp_path / "train.py").write_text(text)
        args, script_input = [sys.executable, str(tmp_path / "train.py")], None
    result = subprocess.run(args, input=script_input, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, f"exit code {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result


def option(start_method: str | None) -> str:
    return "" if start_method is None else f", start_method={start_method!r}"


@pytest.mark.parametrize("start_method", START_METHODS, ids=IDS)
def test_a_script_without_the_main_guard_works(start_method, tmp_path):
    result = run_script(UNGUARDED_SCRIPT, tmp_path, start_method=option(start_method))
    assert result.stdout.count("stepped") == 1  # the workers did not run the script again


@pytest.mark.parametrize("start_method", START_METHODS, ids=IDS)
def test_a_script_piped_through_stdin_works(start_method, tmp_path):
    result = run_script(UNGUARDED_SCRIPT, tmp_path, stdin=True, start_method=option(start_method))
    assert result.stdout.count("stepped") == 1


TORCH_SCRIPT = """\
import json
import sys

import torch  # a training script imports torch (and SB3) at its top
import gymnasium as gym

import shmvec

def probe(env):
    main = sys.modules["__main__"]
    return {{"torch": "torch" in sys.modules, "main_file": getattr(main, "__file__", None)}}

if __name__ == "__main__":
    envs = shmvec.ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 2, n_workers=2{start_method})
    print(json.dumps(envs._pool.run({{0: probe, 1: probe}})))
    envs.close()
"""


@pytest.mark.parametrize("start_method", [None, "spawn"], ids=["default", "spawn"])
def test_workers_do_not_import_the_script_nor_torch(start_method, tmp_path):
    pytest.importorskip("torch")
    result = run_script(TORCH_SCRIPT, tmp_path, start_method=option(start_method))
    found = json.loads(result.stdout.strip().splitlines()[-1])
    for worker in found.values():
        assert worker["torch"] is False, found
        assert worker["main_file"] != str(tmp_path / "train.py"), found


REGISTERED_SCRIPT = """\
import gymnasium as gym
import numpy as np
from gymnasium.vector import SyncVectorEnv

import shmvec

class Counter(gym.Env):
    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, start=0):
        self.start = start

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = self.start + int(self.np_random.integers(5))
        return np.array([self.t], np.float32), {{}}

    def step(self, action):
        self.t += int(action)
        return np.array([self.t], np.float32), 1.0, self.t > 20, False, {{}}

gym.register("Counter-v0", entry_point=Counter, kwargs={{"start": 3}})  # a class of this script
gym.register("CounterByName-v0", entry_point="__main__:Counter")  # ... named by a string
gym.register("ShortCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=3)

if __name__ == "__main__":
    fns = [lambda: gym.make("Counter-v0"), lambda: gym.make("CounterByName-v0")] * 2
    envs = shmvec.ShmVectorEnv(fns, n_workers=4{start_method})
    ref = SyncVectorEnv(fns)
    assert np.array_equal(envs.reset(seed=1)[0], ref.reset(seed=1)[0])
    for _ in range(30):
        actions = np.array([2, 1, 0, 2])
        assert np.array_equal(envs.step(actions)[0], ref.step(actions)[0])
    envs.close()
    short = shmvec.ShmVectorEnv([lambda: gym.make("ShortCartPole-v0")] * 2, n_workers=2{start_method})
    short.reset(seed=0)
    truncated = [short.step(np.zeros(2, np.int64))[3].all() for _ in range(3)]
    assert truncated == [False, False, True], truncated  # its own max_episode_steps: a new id, not a builtin
    short.close()
    print("same")
"""


@pytest.mark.parametrize("start_method", START_METHODS, ids=IDS)
def test_envs_the_script_registered_are_made_by_id_in_workers(start_method, tmp_path):
    result = run_script(REGISTERED_SCRIPT, tmp_path, start_method=option(start_method))
    assert "same" in result.stdout


MODULE_BESIDE_SCRIPT = """\
import my_envs  # my_envs.py lies beside this script

import shmvec

if __name__ == "__main__":
    envs = shmvec.ShmVectorEnv([my_envs.make] * 2, n_workers=2{start_method})
    print(envs.reset(seed=0)[0].shape)
    envs.close()
"""


@pytest.mark.parametrize("start_method", [None, "spawn"], ids=["default", "spawn"])
def test_an_env_module_beside_the_script_imports_in_workers(start_method, tmp_path):
    (tmp_path / "my_envs.py").write_text("import gymnasium as gym\n\ndef make():\n    return gym.make('CartPole-v1')\n")
    result = run_script(MODULE_BESIDE_SCRIPT, tmp_path, start_method=option(start_method))
    assert "(2, 4)" in result.stdout


MISSING_MODULE_SCRIPT = """\
import sys
import types

import gymnasium as gym

import shmvec

# A module that exists only in this process (made at run time, on no path): the workers cannot import it.
made_here = types.ModuleType("made_here")
exec("import gymnasium as gym\\nclass Env(gym.Wrapper):\\n    pass", made_here.__dict__)
sys.modules["made_here"] = made_here

if __name__ == "__main__":
    try:
        shmvec.ShmVectorEnv([lambda: made_here.Env(gym.make("CartPole-v1"))] * 4, n_workers=2)
    except ModuleNotFoundError as exc:
        print("NOTES", " ".join(exc.__notes__))
"""


def test_an_env_fn_whose_module_is_missing_in_the_workers_names_the_envs_and_the_module(tmp_path):
    result = run_script(MISSING_MODULE_SCRIPT, tmp_path)
    notes = result.stdout.split("NOTES", 1)[1]
    assert "could not load the env_fns of its envs 0..1: module 'made_here' cannot be imported there" in notes
    assert 'start_method="fork"' in notes and "raised in worker 0" in notes


def test_the_workers_forkserver_does_not_import_the_script(tmp_path):
    """The forkserver forks every worker: it must not run the script (nor pay for its imports) either."""
    script = textwrap.dedent(
        """\
        import os
        print("imported in", os.getpid())
        import gymnasium as gym
        import shmvec
        if __name__ == "__main__":
            envs = shmvec.ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 2, n_workers=2, start_method="forkserver")
            envs.close()
        """
    )
    result = run_script(script.replace("{", "{{").replace("}", "}}"), tmp_path)
    assert result.stdout.count("imported in") == 1, result.stdout


def test_import_shmvec_leaves_multiprocessings_forkserver_alone():
    """SB3's SubprocVecEnv, or the script itself, may use multiprocessing's forkserver: ``import shmvec``
    changes nothing of it (shmvec's processes come from a forkserver of its own)."""
    code = "from multiprocessing import forkserver\nimport shmvec\nprint(forkserver._forkserver._preload_modules)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    assert result.stdout.strip() == "['__main__']", result.stderr


UNPICKLABLE_REGISTRATION = """\
import threading

import gymnasium as gym
import numpy as np

import shmvec

gym.register("Locked-v0", entry_point="shmvec.tools.waiting_env:WaitingEnv", kwargs={{"lock": threading.Lock()}})

if __name__ == "__main__":
    envs = shmvec.ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 2, n_workers=2)
    envs.reset(seed=0)
    print("started", envs.step(np.zeros(2, np.int64))[0].shape)
    envs.close()
"""


def test_a_registry_entry_that_cannot_be_pickled_stays_behind_and_the_rest_starts(tmp_path):
    result = run_script(UNPICKLABLE_REGISTRATION, tmp_path)
    assert "started (2, 4)" in result.stdout


PLUGIN_MODULE = """\
import gymnasium as gym

gym.register("Plugin/Thing-v0", entry_point="my_plugin:Thing")  # at import, as ale_py does


class Thing(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}
"""

PLUGIN_SCRIPT = """\
import gymnasium as gym
import numpy as np

import my_plugin  # noqa: F401  (registers its ids)
import shmvec

if __name__ == "__main__":
    envs = shmvec.ShmVectorEnv([lambda: gym.make("Plugin/Thing-v0")] * 2, n_workers=2)
    envs.reset(seed=0)
    envs.step(np.zeros(2, dtype=np.int64))
    envs.close()
    print("stepped")
"""


def test_a_plugin_registering_its_ids_again_in_a_worker_warns_nothing(tmp_path):
    """A worker gets the parent's registry, then an env_fn imports the plugin (the entry point's
    module), which registers its ids again: Gymnasium would warn for each (ale_py: ~700 lines)."""
    (tmp_path / "my_plugin.py").write_text(PLUGIN_MODULE)
    result = run_script(PLUGIN_SCRIPT, tmp_path)
    assert "stepped" in result.stdout
    assert "Overriding environment" not in result.stderr, result.stderr[:2000]


PRELOAD_SCRIPT = """\
import json
from multiprocessing import forkserver

import gymnasium as gym

import shmvec
from shmvec.processes import starters

at_import = list(forkserver._forkserver._preload_modules)
with shmvec.ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 2, n_workers=1, start_method="forkserver"):
    pass
print(json.dumps([at_import, list(forkserver._forkserver._preload_modules), starters._server.preload]))
"""


def test_the_forkserver_never_preloads_the_main_script(tmp_path):
    """Where CPython imports a preloaded ``__main__`` in the forkserver (3.13.1+, 3.14), a guard-less
    script would run its top level there and every worker would inherit it: shmvec's own server
    never preloads it, and multiprocessing's keeps what it had."""
    result = run_script(PRELOAD_SCRIPT, tmp_path)
    at_import, at_pool, shmvecs = json.loads(result.stdout.strip().splitlines()[-1])
    assert at_import == at_pool == ["__main__"]  # others' servers keep their own preload
    assert "__main__" not in shmvecs and shmvecs[0] == "shmvec.engine.worker", shmvecs


@pytest.mark.parametrize(
    "pretend, named",
    [
        ("sys.platform = 'darwin'", "this is 'darwin'"),
        ("sys.platform = 'win32'", "this is 'win32'"),
        ("sys.version_info = (3, 10, 14, 'final', 0)", "with Python 3.10"),
    ],
    ids=["macos", "windows", "python-3.10"],
)
def test_import_elsewhere_than_linux_fails_at_once_saying_what_is_supported(pretend, named):
    """A fresh interpreter that reads as another platform (or an older Python) gets an ImportError
    from ``import shmvec`` itself, before any pool, naming Linux, /dev/shm and Python 3.11."""
    code = f"import sys\n{pretend}\nimport shmvec\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: shmvec supports Linux only (shared memory in /dev/shm"), last
    assert "with Python 3.11 or later" in last and named in last, last


def test_linux_is_the_platform_the_package_declares():
    tomllib = pytest.importorskip("tomllib")
    with open(Path(__file__).parents[1] / "pyproject.toml", "rb") as file:
        project = tomllib.load(file)["project"]
    systems = [c for c in project.get("classifiers", []) if c.startswith("Operating System")]
    assert systems == ["Operating System :: POSIX :: Linux"]
