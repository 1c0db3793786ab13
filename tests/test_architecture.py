"""The layout's rules (docs/architecture.md), checked on the source: imports only go down,
no import cycles (``TYPE_CHECKING`` and function-level imports included), modules under
400 lines, and both backends meet the engine interface the adapters see."""

from __future__ import annotations

import ast
import inspect
import pathlib

import gymnasium as gym
import pytest

import shmvec
from shmvec.engine.interface import Engine

PACKAGE = pathlib.Path(shmvec.__file__).parent
# Layers, lowest first: a module may import from its own layer and the ones below it.
LAYERS = {
    "errors": 0,
    "gymnasium_1_1": 0,  # Gymnasium 1.1's names on older releases (shmvec/gymnasium_1_1.py)
    "options": 0,
    "ipc": 1,
    "processes": 2,
    "clocks": 3,
    "planning": 4,
    "engine": 5,
    "backends": 6,
    "adapters": 7,
    "tools": 8,
}
TOP = 9  # shmvec/__init__.py and the `python -m` entry points
MAX_LINES = 400


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], TOP) if len(parts) > 1 else TOP


def imports_of(module: str) -> set[str]:
    """The shmvec modules ``module`` imports, wherever in the file the import is."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "shmvec":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "shmvec"}
    return {name for name in found if name in MODULES and name != module}


GRAPH = {module: imports_of(module) for module in MODULES}


def test_the_layout_has_the_layers():
    assert {name.split(".")[1] for name in MODULES if name.count(".") >= 1} >= set(LAYERS)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_go_down(module):
    upward = sorted(dep for dep in GRAPH[module] if layer(dep) > layer(module))
    assert not upward, f"{module} (layer {layer(module)}) imports from layers above it: {upward}"


def test_the_base_modules_import_nothing_of_shmvec():
    assert not GRAPH["shmvec.errors"] and not GRAPH["shmvec.options"]


def test_no_import_cycles():
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(GRAPH[module]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def private_names_of(module: str) -> set[str]:
    """The underscore names ``module`` defines: functions, classes, class-body names, attributes it assigns."""
    names = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


PRIVATE = {module: private_names_of(module) for module in MODULES}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_leave_other_modules_private_state_alone(module):
    """No ``obj._name`` where ``obj`` is not ``self``/``cls`` and ``_name`` belongs to another shmvec module."""
    others = set().union(*(names for other, names in PRIVATE.items() if other != module)) - PRIVATE[module]
    touched = sorted(
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(MODULES[module].read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr in others
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    )
    assert not touched, f"{module} touches other modules' private state: {touched}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_under_400_lines(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines < MAX_LINES, f"{module} has {lines} lines: split it by job"


ENGINE_MEMBERS = sorted(
    {name for name in Engine.__annotations__} | {name for name in vars(Engine) if not name.startswith("_")}
)


def test_the_local_pool_meets_the_engine_interface():
    from shmvec.engine.pool import ShmPool

    with ShmPool([lambda: gym.make("CartPole-v1")] * 2) as pool:
        missing = [name for name in ENGINE_MEMBERS if not hasattr(pool, name)]
    assert not missing, f"ShmPool lacks {missing}"


def test_the_ray_pool_has_the_engine_methods():
    pytest.importorskip("ray")
    from shmvec.backends.ray import RayPool

    methods = [name for name in ENGINE_MEMBERS if inspect.isfunction(getattr(Engine, name, None))]
    properties = [name for name in ENGINE_MEMBERS if isinstance(getattr(Engine, name, None), property)]
    assert methods and properties
    missing = [name for name in methods + properties if not hasattr(RayPool, name)]
    assert not missing, f"RayPool lacks {missing}"
