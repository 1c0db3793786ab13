"""What the suite leaves out where an optional dependency is not installed.

SB3 needs torch, and torch's small CPU build is installed only for the Python CI runs
first: on other Pythons (3.12, 3.13) the suite runs without SB3, torch and Ray. Then

- a module (test or doctest) that imports one of them or ``ShmPoolVecEnv`` at its top
  (a library module: anywhere, for its docstring examples) is not collected, nor one that
  imports such a module; the run's header names them;
- a test whose code names SB3 or its vec envs is skipped, saying why.

Modules that need torch or Ray only for some tests skip those themselves (``pytest.importorskip``).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).parent
MISSING = {name for name in ("stable_baselines3", "torch", "ray") if importlib.util.find_spec(name) is None}
SB3_MISSING, TORCH_MISSING = "stable_baselines3" in MISSING, "torch" in MISSING
SB3_NAMES = ("stable_baselines3", "ShmPoolVecEnv", "DummyVecEnv", "SubprocVecEnv")


def _top_imports(tree: ast.AST) -> set[str]:
    """Modules (and ``module.name`` for ``from module import name``) imported when the module is:
    those outside functions and ``if TYPE_CHECKING:`` blocks."""
    names: set[str] = set()
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        names |= _top_imports(node)
    return names


def _needs(names: set[str]) -> bool:
    return any(name.split(".")[0] in MISSING for name in names) or (SB3_MISSING and "shmvec.ShmPoolVecEnv" in names)


def _left_out() -> list[str]:
    """The modules that need what is missing, and those that import one of them (to a fixed point)."""
    if not MISSING:
        return []
    sources = {path: path.read_text() for folder in ("tests", "shmvec") for path in (ROOT / folder).rglob("*.py")}
    imports = {path: _top_imports(ast.parse(text)) for path, text in sources.items()}
    found = {path for path, names in imports.items() if _needs(names)}
    while True:
        names = {".".join(path.relative_to(ROOT).with_suffix("").parts) for path in found}
        new = {path for path, imported in imports.items() if path not in found and imported & names}
        if not new:
            break
        found |= new
    # a docstring example may need torch where its module imports it inside a function (not its importers)
    found |= {p for p in sources if TORCH_MISSING and ROOT / "shmvec" in p.parents and "import torch" in sources[p]}
    return sorted(str(path.relative_to(ROOT)) for path in found)


collect_ignore = _left_out()


def pytest_report_header(config) -> list[str]:
    if not collect_ignore:
        return []
    missing = ", ".join(sorted(MISSING))
    return [f"not installed: {missing}; {len(collect_ignore)} modules left out: " + ", ".join(collect_ignore)]


def pytest_collection_modifyitems(config, items) -> None:
    # Ray's tests run last: they start Ray in this process, and after them a worker forked from it
    # (the default start method) died of SIGSEGV in one test on this project's CI box.
    items.sort(key=lambda item: "backends/test_ray.py" in item.nodeid)
    if not MISSING:
        return
    skip = pytest.mark.skip(reason="needs stable-baselines3, not installed for this Python")
    for item in items:
        function = getattr(item, "function", None)
        try:
            source = inspect.getsource(function) if function is not None else ""
        except (OSError, TypeError):
            source = ""
        params = str(item.callspec.params) if hasattr(item, "callspec") else ""
        if SB3_MISSING and any(name in source or name in params for name in SB3_NAMES):
            item.add_marker(skip)
        else:  # a script run by the test, e.g. a README example
            for module in sorted(MISSING):
                if f"import {module}" in params:
                    item.add_marker(pytest.mark.skip(reason=f"needs {module}, not installed for this Python"))
