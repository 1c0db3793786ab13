"""The lowest versions ``pyproject.toml`` accepts are those CI's floors jobs install.

Two pin files, one per floors job of ``.ci/run``, each pinning every dependency of shmvec and of
its user-facing extras:

- ``.ci/floors-gym029.txt``: the lowest version ``pyproject.toml`` accepts of each (Gymnasium
  0.29.1, SB3's floor); its job runs SB3's side, as the Gymnasium side needs Gymnasium 1.1;
- ``.ci/floors.txt``: the same, but Gymnasium at the first release the Gymnasium side takes
  (``shmvec.gymnasium_1_1.VECTOR_API``) and SB3 at a release that takes it; its job runs the suite.

A floor raised or lowered in one file and not in the others fails here.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from shmvec.gymnasium_1_1 import VECTOR_API

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Extras whose every package the floors job installs at its floor. [ray] accepts one minor
# series only, which the first CI job runs; [dev] and [bench] hold the test and benchmark tools.
FLOORED_EXTRAS = ("sb3", "plot", "test")
ALSO_FLOORED = ("sb3-contrib",)  # in [dev] only, but tests/adapters/test_sb3_hot_calls.py runs MaskablePPO


LOWEST, VECTOR_SIDE = "floors-gym029.txt", "floors.txt"


def floors(name: str = LOWEST) -> dict[str, Version]:
    pins = {}
    for line in (ROOT / ".ci" / name).read_text().splitlines():
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


@pytest.mark.parametrize("name", [LOWEST, VECTOR_SIDE])
def test_every_dependency_of_shmvec_and_its_extras_has_a_floor(name):
    pins = floors(name)
    must = {canonicalize_name(n) for n in ALSO_FLOORED}
    for where, requirement in requirements():
        if where == "dependencies" or where in FLOORED_EXTRAS:
            must.add(canonicalize_name(requirement.name))
    assert sorted(must - set(pins)) == [], f"not in .ci/{name}"
    assert sorted(set(pins) - must) == [], f"in .ci/{name}, but no dependency of shmvec or its floored extras"


# Every mention of a floored package, in any extra ([dev] and [bench] repeat SB3's); the other
# [dev] and [bench] tools are tested at the versions the first CI job installs.
FLOORED = [(where, req) for where, req in requirements() if canonicalize_name(req.name) in floors()]


@pytest.mark.parametrize("where, requirement", FLOORED, ids=[f"{where}-{req.name}" for where, req in FLOORED])
def test_each_floor_is_the_one_ci_installs(where, requirement):
    pin = floors()[canonicalize_name(requirement.name)]
    assert lowest(requirement) == pin, f"{where}: {requirement} in pyproject.toml, {pin} in .ci/{LOWEST}"
    assert requirement.specifier.contains(pin), f"{where}: {requirement} refuses its own floor {pin}"
    other = floors(VECTOR_SIDE)[canonicalize_name(requirement.name)]
    assert requirement.specifier.contains(other), f"{where}: {requirement} refuses {other} of .ci/{VECTOR_SIDE}"


# Where the two jobs' pins differ: Gymnasium (and the SB3 releases that take each); elsewhere both
# are the floor.
DIFFERING = {"gymnasium", "stable-baselines3", "sb3-contrib"}


def test_the_gymnasium_side_is_tested_at_the_release_it_needs():
    lowest_pins, vector_pins = floors(), floors(VECTOR_SIDE)
    assert vector_pins["gymnasium"] == Version(VECTOR_API), "the Gymnasium side's floor is what its job installs"
    assert lowest_pins["gymnasium"] < vector_pins["gymnasium"]
    same = {name: pin for name, pin in vector_pins.items() if name not in DIFFERING}
    assert same == {name: lowest_pins[name] for name in same}, f"the two files differ outside {sorted(DIFFERING)}"
    assert all(lowest_pins[name] <= vector_pins[name] for name in DIFFERING)
