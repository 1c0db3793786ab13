"""Whether the main script sets up anything that workers will not see, and one warning that says so.

A worker does not run the main script (:mod:`~shmvec.processes.lean_start`); it takes on what
:mod:`~shmvec.processes.script_setup` carries. What else the script's top level does (a
monkeypatch, ``torch.set_default_dtype``, ``mylib.CONFIG["x"] = 5``) stays in the main
process. :func:`missed_lines` finds such statements in the script's source (one
``ast.parse``, ~1 ms): at the top level, outside the ``if __name__ == "__main__":`` block,

- a call whose callee comes from an import (``torch.set_default_dtype(...)``,
  ``patch_envs()`` imported from a module), other than the calls whose effects are carried
  (:data:`CARRIED`) and those that only do I/O on the process's own streams
  (:data:`OWN_STREAMS`: ``sys.stdout.flush()``, ``pprint.pprint(...)``; ``print`` is no import);
- an assignment, augmented assignment or ``del`` of an attribute or item of an imported
  name (``CartPoleEnv.reset = patched``, ``mylib.CONFIG["x"] = 5``), other than to
  ``os.environ``.

Imports, definitions, assignments to the script's own names (``N_ENVS = 8``,
``args = parser.parse_args()``) and calls on them (``parser.add_argument(...)``) are not
reported: they change nothing outside the script. Statements inside a top-level ``if``,
``for``, ``while``, ``with`` or ``try`` count as top level.

:func:`warn_once` logs the lines on logger ``shmvec.script`` (a warning, once per process
and script), with the two ways out: ``worker_init=`` or ``import_main=True``.
"""

from __future__ import annotations

import ast
import logging
import sys
import sysconfig
from functools import cache
from pathlib import Path

from shmvec.options import PoolOptions

logger = logging.getLogger("shmvec.script")

# Callees (resolved through the script's imports) whose effects workers get anyway: carried
# by script_setup, sent by multiprocessing (sys.path, the working directory), or with no
# effect on envs.
CARRIED = (
    "logging",
    "warnings",
    "random.seed",
    "numpy.random.seed",
    "os.environ",
    "os.putenv",
    "os.unsetenv",
    "os.chdir",
    "sys.path",
    "sys.exit",
    "dotenv.load_dotenv",
    "gymnasium.register",
    "gymnasium.register_envs",
    "gymnasium.envs.registration.register",
    "gymnasium.logger",
    "shmvec",
)
ENVIRON = "os.environ"  # the one imported object whose items a script may set: carried
# Callees that only read or write the process's own streams: a worker needs none of what they do.
OWN_STREAMS = (
    "sys.stdout",
    "sys.stderr",
    "sys.stdin",
    "sys.__stdout__",
    "sys.__stderr__",
    "builtins.print",
    "builtins.input",
    "pprint",
    "tqdm.write",
    "tqdm.tqdm.write",
    "rich.print",
    "click.echo",
    "typer.echo",
)


def main_script() -> Path | None:
    """The main script's file, or None where there is none to read or it is not the user's:
    ``python -c``, a piped script, a notebook, or a library's entry point (``python -m`` of
    an installed package, Ray's worker)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None:
        return None
    path = Path(path).resolve()
    installed = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    if not path.is_file() or any(folder in path.parents for folder in installed):
        return None
    return path


def missed_lines(source: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of each top-level statement of ``source`` whose effects workers
    will not see (see the module docstring); [] if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    imported = _imported_names(tree)
    lines = source.splitlines()
    found = []
    for node in _top_level(tree.body):
        if _missed(node, imported):
            found.append((node.lineno, lines[node.lineno - 1].strip()))
    return found


@cache
def script_missed_lines(path: Path) -> tuple[tuple[int, str], ...]:
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError):
        return ()
    return tuple(missed_lines(source))


def setup_is_shared(options: PoolOptions) -> bool:
    """Whether envs in workers see the set-up that envs in the main process see: under fork, with
    ``worker_init`` or ``import_main``, or when the main script has nothing workers would miss."""
    if options.start_method == "fork" or options.worker_init is not None or options.import_main:
        return True
    path = main_script()
    return path is None or not script_missed_lines(path)


@cache
def warn_once(path: Path | None) -> None:
    """Log the statements of the script at ``path`` that workers will not see, once per process."""
    found = script_missed_lines(path) if path is not None else ()
    if not found:
        return
    shown = "\n".join(f"  line {number}: {line}" for number, line in found[:10])
    more = f"\n  ... and {len(found) - 10} more" if len(found) > 10 else ""
    logger.warning(
        "shmvec: worker processes do not run your main script, so envs in workers will not see what these "
        "lines of %s do:\n%s%s\nLogging, warnings filters, environment variables, the random/np.random states and "
        "Gymnasium registrations are carried to the workers; for the rest, pass worker_init= (a function that "
        "does the same in each worker) or import_main=True (each worker imports the script, as SubprocVecEnv's "
        "do). Envs stay all in workers or all in the main process meanwhile. To silence this: "
        'logging.getLogger("shmvec.script").setLevel(logging.ERROR)',
        path,
        shown,
        more,
    )


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """Name bound by an import anywhere in the script -> the dotted path it stands for."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    names[root] = root
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name
    return names


def _top_level(body: list[ast.stmt]):
    """The statements that run when the script is imported, compound statements opened
    (the ``__main__`` block excepted), definitions left closed."""
    for node in body:
        if isinstance(node, ast.If) and _is_main_guard(node.test):
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.If | ast.For | ast.AsyncFor | ast.While):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.With | ast.AsyncWith):
            yield from _top_level(node.body)
        elif isinstance(node, ast.Try | ast.TryStar):
            for part in (node.body, *(handler.body for handler in node.handlers), node.orelse, node.finalbody):
                yield from _top_level(part)
        else:
            yield node


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = {_source_of(test.left), _source_of(test.comparators[0])}
    return sides == {"__name__", "'__main__'"}


def _source_of(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else repr(node.value) if isinstance(node, ast.Constant) else ""


def _missed(node: ast.stmt, imported: dict[str, str]) -> bool:
    if isinstance(node, ast.Expr):
        value = node.value.value if isinstance(node.value, ast.Await) else node.value
        if isinstance(value, ast.Call):
            path = _imported_path(value.func, imported)
            return path is not None and not _carried(path)
        return False
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
        targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
        return any(_changes_imported(target, imported) for target in targets)
    return False


def _changes_imported(target: ast.expr, imported: dict[str, str]) -> bool:
    """Whether assigning to ``target`` changes an attribute or item of something imported."""
    if isinstance(target, ast.Tuple | ast.List):
        return any(_changes_imported(element, imported) for element in target.elts)
    if not isinstance(target, ast.Attribute | ast.Subscript):
        return False
    path = _imported_path(target.value, imported)
    return path is not None and not _starts_with(path, ENVIRON)


def _imported_path(node: ast.expr, imported: dict[str, str]) -> str | None:
    """The dotted path ``node`` names through an imported name (``np.random.seed`` ->
    ``numpy.random.seed``; calls and items on the way are looked through), or None if its
    root is not imported."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call | ast.Subscript):
            node = node.func if isinstance(node, ast.Call) else node.value
        elif isinstance(node, ast.Name):
            root = imported.get(node.id)
            return None if root is None else ".".join([root, *reversed(parts)])
        else:
            return None


def _carried(path: str) -> bool:
    return any(_starts_with(path, prefix) for prefix in CARRIED + OWN_STREAMS)


def _starts_with(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")
