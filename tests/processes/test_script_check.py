"""Which lines of a main script workers would miss (scripts that must warn and that must not); worker_init's checks."""

from __future__ import annotations

import logging
import os
import textwrap
from pathlib import Path

import pytest

from shmvec.options import PoolOptions
from shmvec.processes import script_check
from shmvec.processes.script_check import missed_lines, setup_is_shared


def missed(source: str) -> list[int]:
    return [number for number, _ in missed_lines(textwrap.dedent(source))]


QUIET_SCRIPTS = {
    "imports, definitions and constants": """
        import gymnasium as gym
        from stable_baselines3 import PPO
        N_ENVS = 8
        def make():
            return gym.make("CartPole-v1")
        class Net:
            pass
    """,
    "what is carried": """
        import logging, os, random, sys, warnings
        import numpy as np
        import gymnasium as gym
        from gymnasium.envs.registration import register
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("mylib").setLevel(logging.DEBUG)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        np.random.seed(0)
        random.seed(0)
        os.environ["MUJOCO_GL"] = "egl"
        os.environ.update({"A": "1"})
        sys.path.insert(0, "envs")
        gym.register("MyEnv-v0", entry_point="envs:MyEnv")
        register(id="Other-v0", entry_point="envs:Other")
        gym.logger.set_level(40)
    """,
    "the script's own objects": """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--seed", type=int)
        args = parser.parse_args()
        config = {}
        config["lr"] = 3e-4
        print(args)
    """,
    "I/O on the process's own streams": """
        import sys, pprint, builtins
        from sys import stdout
        print("starting")
        sys.stdout.write("x\\n")
        sys.stdout.flush()
        sys.stderr.write("y\\n")
        sys.stderr.flush()
        stdout.flush()
        sys.stdout.reconfigure(line_buffering=True)
        pprint.pprint({"a": 1})
        builtins.print("z")
    """,
    "the main block": """
        import torch
        if __name__ == "__main__":
            torch.set_default_dtype(torch.float64)
            torch.manual_seed(0)
    """,
    "the main block, either way round": """
        import torch
        if "__main__" == __name__:
            torch.manual_seed(0)
    """,
}


@pytest.mark.parametrize("name", QUIET_SCRIPTS)
def test_scripts_that_must_not_warn(name):
    assert missed(QUIET_SCRIPTS[name]) == []


def test_scripts_that_must_warn_name_their_lines():
    source = """
        import torch
        import mylib
        from gymnasium.envs.classic_control import CartPoleEnv
        import numpy as np
        torch.set_default_dtype(torch.float64)
        mylib.CONFIG["x"] = 5
        CartPoleEnv.reset = lambda self, **kw: None
        mylib.settings.level += 1
        np.set_printoptions(precision=3)
        if True:
            torch.manual_seed(0)
        try:
            mylib.configure()
        except ImportError:
            pass
        del mylib.CONFIG["y"]
        if __name__ == "__main__":
            mylib.configure()
    """
    assert missed(source) == [6, 7, 8, 9, 10, 12, 14, 17]


def test_what_workers_need_of_sys_still_warns():
    source = """
        import sys
        sys.stdout.flush()
        sys.setrecursionlimit(10_000)
        sys.stdout = open("train.log", "w")
        sys.set_int_max_str_digits(0)
    """
    assert missed(source) == [4, 5, 6]


def test_a_script_that_does_not_parse_is_not_reported():
    assert missed("def broken(:\n") == []


def test_the_warning_is_logged_once_with_the_lines_and_the_ways_out(tmp_path, caplog):
    script = tmp_path / "train.py"
    script.write_text("import torch\ntorch.set_default_dtype(torch.float64)\n")
    script_check.warn_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="shmvec.script"):
        script_check.warn_once(script)
        script_check.warn_once(script)
    messages = [record.getMessage() for record in caplog.records if record.name == "shmvec.script"]
    assert len(messages) == 1
    assert "line 2: torch.set_default_dtype(torch.float64)" in messages[0]
    assert "worker_init=" in messages[0] and "import_main=True" in messages[0]


def test_only_a_users_script_file_is_read(monkeypatch, tmp_path):
    main = type("Main", (), {})()
    monkeypatch.setitem(__import__("sys").modules, "__main__", main)
    assert script_check.main_script() is None  # python -c, a piped script, a notebook: no file
    script = tmp_path / "train.py"
    script.write_text("")
    main.__file__ = str(script)
    assert script_check.main_script() == script.resolve()
    main.__file__ = str(Path(pytest.__file__))  # an installed package (python -m pytest): not the user's
    assert script_check.main_script() is None


def test_the_set_up_is_shared_where_workers_get_it_all(monkeypatch, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\ntorch.set_default_dtype(torch.float64)\n")
    monkeypatch.setattr(script_check, "main_script", lambda: script)
    assert not setup_is_shared(PoolOptions(start_method="forkserver"))
    assert setup_is_shared(PoolOptions(start_method="fork"))
    assert setup_is_shared(PoolOptions(worker_init=print))
    assert setup_is_shared(PoolOptions(import_main=True))
    monkeypatch.setattr(script_check, "main_script", lambda: None)
    assert setup_is_shared(PoolOptions())


def test_a_worker_init_that_cannot_be_pickled_is_refused_before_any_worker_starts():
    import threading

    from shmvec.processes.script_setup import worker_start

    lock = threading.Lock()
    with pytest.raises(TypeError, match="worker_init=.* cannot be pickled"):
        worker_start(PoolOptions(worker_init=lock.acquire))


def test_the_log_relay_leaves_nothing_in_dev_shm_and_takes_every_record(caplog):
    """A multiprocessing.Queue would hold three named semaphores (sem.mp-*), left behind for good when a
    process group is killed; the relay's datagrams need none, and a record too long for one is cut."""
    from shmvec.processes.log_relay import MAX_RECORD_BYTES, LogRelay

    before = {name for name in os.listdir("/dev/shm") if name.startswith("sem.")}
    relay = LogRelay()
    try:
        assert {name for name in os.listdir("/dev/shm") if name.startswith("sem.")} <= before
        with caplog.at_level(logging.INFO, logger="relayed"):
            for message in ("short", "x" * (2 * MAX_RECORD_BYTES)):
                record = logging.LogRecord("relayed", logging.INFO, __file__, 1, message, None, None)
                relay.queue.put_nowait(record)
            relay.close()
    finally:
        relay.close()
    messages = [record.getMessage() for record in caplog.records if record.name == "relayed"]
    assert messages[0] == "short" and "[... shmvec's log relay cut " in messages[1], messages
