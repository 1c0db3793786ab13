"""Stable-Baselines3's own tests of ``SubprocVecEnv``, run against ``ShmPoolVecEnv``.

Usage, in the environment where SB3 is installed (it needs the package index, nothing else)::

    python tests/upstream/sb3_vec_envs.py [--sdist PATH] [--run NAME] [pytest arguments]

The runner downloads the source distribution of the SB3 release installed here
(``pip download --no-binary :all:``), extracts its ``tests/`` and ``pyproject.toml`` (SB3's
pytest settings) into a temporary folder and runs pytest there, once per entry of ``RUNS``, with
this module as a plugin (``-p``). The plugin replaces ``stable_baselines3.common.vec_env.SubprocVecEnv``
with ``ShmPoolVecEnv`` before pytest imports the test modules, which take the name from there
(``test_vec_envs.py`` puts it in a list at import time). SB3's library itself keeps its own
``SubprocVecEnv``: its code sees a ``ShmPoolVecEnv`` as it sees one a user passes.

Which tests: the SB3 test files that name ``SubprocVecEnv``; of those, a test parametrized over
the vec-env class (a parameter named ``vec_env_class`` or ``vec_env_cls``) for its
``SubprocVecEnv`` value only, any other test if its code names ``SubprocVecEnv``. The rest build
only ``DummyVecEnv`` or no vec env, so they test nothing of shmvec and are left out. ``DESELECTED``
lists the tests that are not run, each with its reason. A run fails if it leaves a shared-memory
entry behind (SB3's tests do not always close their envs: then interpreter exit must clean up).
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.metadata
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RUN_VARIABLE = "SHMVEC_SB3_RUN"

# name: ShmPoolVecEnv's arguments in that run. "default": the plan of n_workers=None, which keeps
# light envs (all of SB3's test envs) in the main process; "n_workers=2": every env in a worker
# process (2 of them, or 1 for a single env), as SubprocVecEnv runs them. "subproc" (None): SB3's
# own SubprocVecEnv on the same tests, a reference to compare with (only when asked, --run subproc).
RUNS: dict[str, dict | None] = {"default": {}, "n_workers=2": {"n_workers": 2}, "subproc": None}
DEFAULT_RUNS = ["default", "n_workers=2"]

# Tests not run, each with its reason: node id (all its parameter sets), or "node id[params]".
DESELECTED: dict[str, str] = {}

_state: dict = {}
_layouts: collections.Counter = collections.Counter()  # how the ShmPoolVecEnvs built ran their envs


# -- the plugin ----------------------------------------------------------------------------


def replacement(options: dict) -> type:
    """The class that stands for SubprocVecEnv: ShmPoolVecEnv, or a subclass that passes ``options``."""
    from shmvec import ShmPoolVecEnv

    if not options:
        return ShmPoolVecEnv

    class ShmPoolVecEnvInWorkers(ShmPoolVecEnv):
        """ShmPoolVecEnv with SubprocVecEnv's signature, its envs in ``n_workers`` worker processes."""

        def __init__(self, env_fns, start_method=None):
            n_workers = min(options["n_workers"], len(env_fns))  # at most one worker per env
            super().__init__(env_fns, start_method=start_method, n_workers=n_workers)

    return ShmPoolVecEnvInWorkers


def record_layouts() -> None:
    """Count the layouts (workers, main shard) of the ShmPoolVecEnvs built, for the summary."""
    from shmvec import ShmPoolVecEnv

    build = ShmPoolVecEnv.__init__

    @functools.wraps(build)
    def __init__(self, *args, **kwargs):
        build(self, *args, **kwargs)
        found = re.search(r"n_workers=\d+, use_main_process=\w+", repr(self))
        _layouts[found.group(0) if found else repr(self)] += 1

    ShmPoolVecEnv.__init__ = __init__


def pytest_configure(config: pytest.Config) -> None:
    run = os.environ.get(RUN_VARIABLE)
    if run not in RUNS:
        raise pytest.UsageError(f"{RUN_VARIABLE} must name one of {sorted(RUNS)}, got {run!r}")
    import stable_baselines3.common.vec_env as vec_env

    if RUNS[run] is None:
        _state.update(run=run, cls=vec_env.SubprocVecEnv)
        return
    _state.update(run=run, cls=replacement(RUNS[run]))
    vec_env.SubprocVecEnv = _state["cls"]
    record_layouts()


def pytest_report_header(config: pytest.Config) -> str:
    import stable_baselines3

    options = RUNS[_state["run"]]
    if options is None:
        return f"shmvec: SB3 {stable_baselines3.__version__}'s own SubprocVecEnv (the reference run)"
    args = ", ".join(f"{key}={value!r}" for key, value in options.items()) or "defaults"
    return f"shmvec: SB3 {stable_baselines3.__version__}'s SubprocVecEnv is ShmPoolVecEnv ({args})"


def _is_replacement(value: object) -> bool:
    if isinstance(value, functools.partial):
        value = value.func
    return value is _state["cls"]


def builds_subproc(item: pytest.Item) -> bool:
    """Whether the test builds a SubprocVecEnv (see the module's docstring)."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    for name in ("vec_env_class", "vec_env_cls"):
        if name in params:
            return _is_replacement(params[name])
    function = getattr(item, "function", None)
    return function is not None and "SubprocVecEnv" in inspect.getsource(function)


def deselection(nodeid: str) -> str | None:
    for key in DESELECTED:
        if nodeid == key or ("[" not in key and nodeid.startswith(key + "[")):
            return key
    return None


@pytest.hookimpl(tryfirst=True)  # before -k and -m: DESELECTED is checked against every test
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, other, deselected, used = [], [], [], set()
    for item in items:
        name = getattr(getattr(item, "module", None), "SubprocVecEnv", None)
        if name is not None and name is not _state["cls"]:  # the test would run SB3's own SubprocVecEnv
            raise pytest.UsageError(f"{item.module.__name__}.SubprocVecEnv is not replaced: {name!r}")
        key = deselection(item.nodeid)
        if key is not None:
            used.add(key)
            deselected.append(item)
        elif builds_subproc(item):
            kept.append(item)
        else:
            other.append(item)
    # keep the list exact: a test renamed or gone upstream is taken off it (a key whose parameters
    # name the class of another run, e.g. "[ShmPoolVecEnvInWorkers]", is not for this run)
    mine = {_state["cls"].__name__}
    stale = sorted(k for k in set(DESELECTED) - used if set(re.findall(r"\bShmPoolVecEnv\w*", k)) <= mine)
    if stale:
        raise pytest.UsageError(f"DESELECTED names tests this SB3 release does not have: {stale}")
    _state.update(kept=len(kept), other=len(other), deselected=len(deselected))
    items[:] = kept
    if other or deselected:
        config.hook.pytest_deselected(items=other + deselected)


def pytest_terminal_summary(terminalreporter) -> None:
    if "kept" not in _state:
        return
    write = terminalreporter.write_line
    write(
        f"shmvec run {_state['run']!r}: {_state['kept']} tests build SubprocVecEnv; "
        f"{_state['other']} others left out (DummyVecEnv only); {_state['deselected']} deselected:"
    )
    for key, reason in DESELECTED.items():
        write(f"  {key}: {reason}")
    if RUNS[_state["run"]] is not None:
        layouts = "; ".join(f"{count} with {layout}" for layout, count in _layouts.most_common())
        write(f"ShmPoolVecEnvs built: {sum(_layouts.values())} ({layouts or 'none'})")


# -- the runner ----------------------------------------------------------------------------


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def download_sdist(version: str, folder: Path) -> Path:
    pip("download", "--quiet", "--no-deps", "--no-binary", ":all:", f"stable-baselines3=={version}", "-d", str(folder))
    (sdist,) = folder.glob("stable_baselines3-*.tar.gz")
    return sdist


def extract_tests(sdist: Path, folder: Path) -> Path:
    """Extract ``tests/``, ``pyproject.toml`` (pytest settings) and ``setup.py`` (extras) of the sdist
    into ``folder``, not the package (the installed one is tested); return the sdist's top folder."""
    with tarfile.open(sdist) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        files = (f"{top}/pyproject.toml", f"{top}/setup.py")
        wanted = [m for m in tar.getmembers() if m.name.startswith(f"{top}/tests/") or m.name in files]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4
        tar.extractall(folder, members=wanted, **safe)
    return folder / top


def fetch_test_requirements(root: Path, folder: Path) -> list[str]:
    """SB3's tests/test_utils.py imports ale_py (SB3's ``extra``), which shmvec's dev extra lacks:
    installed into ``folder`` (returned for PYTHONPATH) where missing, at SB3's bound."""
    if importlib.util.find_spec("ale_py") is not None:
        return []
    setup = root / "setup.py"
    found = re.search(r'"(ale-py[^"]*)"', setup.read_text()) if setup.exists() else None
    pip("install", "--quiet", "--no-deps", "--target", str(folder), found.group(1) if found else "ale-py")
    return [str(folder)]


def shm_entries_of(pid: int) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if re.match(rf"(sem\.)?shmvec_{pid}_", n))


def run_pytest(run: str, root: Path, files: list[str], paths: list[str], pytest_args: list[str]) -> bool:
    """One run, in a process of its own; whether it passed."""
    print(f"== run {run!r}", flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), **{RUN_VARIABLE: run})
    command = [sys.executable, "-m", "pytest", "-p", "sb3_vec_envs", "-c", "pyproject.toml", "--rootdir", "."]
    command += ["-p", "no:cacheprovider", "-q", *files, *pytest_args]
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=root, env=env)
    code = process.wait()
    print(f"== run {run!r}: exit status {code}, {time.monotonic() - start:.1f} s", flush=True)
    leaked = shm_entries_of(process.pid)  # an env a test leaves open must be cleaned up at exit
    if leaked:
        print(f"== run {run!r} left shared memory behind: {leaked}", flush=True)
    return code == 0 and not leaked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, help="use this SB3 sdist instead of downloading it")
    parser.add_argument("--run", choices=list(RUNS), action="append", help=f"repeatable; default: {DEFAULT_RUNS}")
    args, pytest_args = parser.parse_known_args(argv)
    if importlib.util.find_spec("pytest_timeout") is not None:  # a hang fails the test instead of the job
        pytest_args = ["--timeout", "120", *pytest_args]
    begin = time.monotonic()
    version = importlib.metadata.version("stable-baselines3")
    runs = args.run or DEFAULT_RUNS
    with tempfile.TemporaryDirectory(prefix="shmvec-sb3-") as tmp:
        tmp_path = Path(tmp)
        sdist = args.sdist.resolve() if args.sdist else download_sdist(version, tmp_path / "sdist")
        root = extract_tests(sdist, tmp_path / "src")
        paths = [str(HERE), *fetch_test_requirements(root, tmp_path / "site")]
        paths += [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
        files = [f"tests/{p.name}" for p in sorted(root.glob("tests/test_*.py")) if "SubprocVecEnv" in p.read_text()]
        print(f"== SB3 {version}'s tests of SubprocVecEnv against ShmPoolVecEnv, runs {runs}: {files}", flush=True)
        failed = [run for run in runs if not run_pytest(run, root, files, paths, pytest_args)]
    summary = f"== {time.monotonic() - begin:.1f} s in all"
    print(summary + (f"; failed runs: {failed}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
