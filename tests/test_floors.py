"""The lowest versions ``pyproject.toml`` accepts are those CI's floors job installs.

``.ci/floors.txt`` pins, for every dependency of shmvec and of its user-facing extras, the
lowest version ``pyproject.toml`` accepts; ``.ci/run`` installs exactly those and runs the
suite. A floor raised or lowered in one file and not in the other fails here.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Extras whose every package the floors job installs at its floor. [ray] accepts one minor
# series only, which the first CI job runs; [dev] and [bench] hold the test and benchmark tools.
FLOORED_EXTRAS = ("sb3", "plot", "test")
ALSO_FLOORED = ("sb3-contrib",)  # in [dev] only, but tests/adapters/test_sb3_hot_calls.py runs MaskablePPO


def floors() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / ".ci" / "floors.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", f"{line!r}: a floor is pinned with =="
            pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def requirements() -> list[tuple[str, Requirement]]:
    """Every requirement of pyproject.toml, with where it is (``dependencies`` or an extra's name)."""
    found = [("dependencies", Requirement(text)) for text in PYPROJECT["dependencies"]]
    for extra, texts in PYPROJECT["optional-dependencies"].items():
        found += [(extra, Requirement(text)) for text in texts]
    return [(where, req) for where, req in found if canonicalize_name(req.name) != "shmvec"]


def lowest(requirement: Requirement) -> Version | None:
    bounds = [Version(spec.version) for spec in requirement.specifier if spec.operator in (">=", "==", "~=")]
    return max(bounds) if bounds else None


def test_every_dependency_of_shmvec_and_its_extras_has_a_floor():
    pins = floors()
    must = {canonicalize_name(n) for n in ALSO_FLOORED}
    for where, requirement in requirements():
        if where == "dependencies" or where in FLOORED_EXTRAS:
            must.add(canonicalize_name(requirement.name))
    assert sorted(must - set(pins)) == [], "not in .ci/floors.txt"


# Every mention of a floored package, in any extra ([dev] and [bench] repeat SB3's); the other
# [dev] and [bench] tools are tested at the versions the first CI job installs.
FLOORED = [(where, req) for where, req in requirements() if canonicalize_name(req.name) in floors()]


@pytest.mark.parametrize("where, requirement", FLOORED, ids=[f"{where}-{req.name}" for where, req in FLOORED])
def test_each_floor_is_the_one_ci_installs(where, requirement):
    pin = floors()[canonicalize_name(requirement.name)]
    assert lowest(requirement) == pin, f"{where}: {requirement} in pyproject.toml, {pin} in .ci/floors.txt"
    assert requirement.specifier.contains(pin), f"{where}: {requirement} refuses its own floor {pin}"
