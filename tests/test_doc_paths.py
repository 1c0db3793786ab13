"""Every module path and source file the README and the docs name exists: a module moved in a
re-layout without its docs fails here, not in a user's import."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
DOTTED = re.compile(r"\bshmvec(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PACKAGES = ("engine", "planning", "processes", "ipc", "adapters", "backends", "tools")
FILES = re.compile(
    r"\b(?:(?:shmvec|bench|tests|examples)/[A-Za-z0-9_/]+|(?:" + "|".join(PACKAGES) + r")/[a-z_]+)\.py\b"
)
LOGGERS = {"shmvec.script"}  # logger names, not modules
OTHER_PROJECTS = {"upstream-tests.md"}  # names files of the references' own test suites


def named(pattern: re.Pattern) -> list[tuple[str, str]]:
    return sorted({(page.name, match) for page in PAGES for match in pattern.findall(page.read_text())})


def resolve(dotted: str) -> object:
    """The module or attribute ``dotted`` names: the longest importable prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name and not ".".join(parts[:cut]).startswith(exc.name):
                raise  # a dependency of that module is missing, not the module
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("page, dotted", named(DOTTED))
def test_each_dotted_path_the_docs_name_resolves(page, dotted):
    if dotted in LOGGERS:
        return
    try:
        resolve(dotted)
    except (ImportError, AttributeError) as exc:
        missing = exc if isinstance(exc, ModuleNotFoundError) else exc.__cause__ or exc.__context__
        name = getattr(missing, "name", None) or ""
        if isinstance(missing, ModuleNotFoundError) and name and not name.startswith("shmvec"):
            pytest.skip(f"{dotted} needs {name}, not installed here")
        pytest.fail(f"{page} names {dotted}, which does not resolve: {exc!r}")


@pytest.mark.parametrize("page, path", named(FILES))
def test_each_source_file_the_docs_name_exists(page, path):
    if page in OTHER_PROJECTS:
        return
    if path.split("/")[0] in PACKAGES:
        path = f"shmvec/{path}"  # a module named by its package, as the docs name them
    assert (ROOT / path).is_file(), f"{page} names {path}, which does not exist"
