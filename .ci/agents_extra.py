"""CI: the ``[sb3,agents]`` extras alone install what docs/agents.md and examples/agents/ import.

Run by ``.ci/run`` with the python of a fresh venv that holds torch's CPU build and
``pip install ".[sb3,agents]"`` (not editable, nothing else). Imports shmvec from that install
(not the checkout), every example of ``examples/agents/`` as a module (its ``__main__`` guard
keeps it from running), and builds and steps once each PettingZoo env the extra promises
(butterfly, sisl, MPE2); then runs the KAZ tutorial short, in a temporary directory (it saves
its model in the working directory).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "agents"
# Every env docs/agents.md, examples/agents/, tests/adapters/test_agents_*.py and bench/agents.py use.
ENVS = [
    ("pettingzoo.butterfly", "knights_archers_zombies_v11", {"obs_method": "vector"}),
    ("pettingzoo.butterfly", "pistonball_v6", {}),
    ("pettingzoo.sisl", "pursuit_v5", {}),
    ("pettingzoo.sisl", "multiwalker_v9", {}),
    ("mpe2", "simple_spread_v3", {}),
]
KAZ = ["--timesteps", "256", "--n-steps", "8", "--eval-games", "1"]


def main() -> None:
    import shmvec

    where = Path(shmvec.__file__).resolve()
    # CI's venv may sit inside the checkout: what counts is that shmvec comes from this venv's
    # site-packages (the installed wheel), not from the checkout's shmvec/ folder.
    site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert site_packages in where.parents, f"shmvec imported from {where}, not from the install in {site_packages}"
    providers = importlib.metadata.packages_distributions().get("pygame", [])
    assert len(set(providers)) == 1, f"the module pygame comes from several distributions: {providers}"
    print(f"shmvec from {where.parent}; pygame from {providers[0]}")

    for path in sorted(EXAMPLES.glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        print(f"imported examples/agents/{path.name}")

    for package, name, kwargs in ENVS:
        module = getattr(importlib.import_module(package), name)
        env = module.parallel_env(**kwargs)
        env.reset(seed=0)
        env.step({agent: env.action_space(agent).sample() for agent in env.agents})
        env.close()
        print(f"stepped {package}.{name}")

    with tempfile.TemporaryDirectory() as cwd:
        command = [sys.executable, str(EXAMPLES / "sb3_kaz_vector.py"), *KAZ]
        print("$", " ".join(["python", "examples/agents/sb3_kaz_vector.py", *KAZ]), flush=True)
        start = time.perf_counter()
        run = subprocess.run(command, cwd=cwd, timeout=600, capture_output=True, text=True)
        if run.returncode:
            sys.exit(f"{run.stdout}{run.stderr}the KAZ tutorial exited {run.returncode}")
        saved = list(Path(cwd).glob("knights_archers_zombies_v11_*.zip"))
        assert len(saved) == 1, f"the KAZ tutorial saved {saved}"
        print(f"the KAZ tutorial trained, saved and evaluated in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
