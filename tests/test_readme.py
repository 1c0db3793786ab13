"""README.md's Python examples, and those of the docs pages, run as pasted into a fresh script,
under the default start method.

Each ```python block is written to its own file in an empty directory and run with this
interpreter in a new process, as a user would run it: it must exit with 0 and print no
traceback (a worker's traceback on stderr counts too).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
TIMEOUT = 120  # seconds per example; each should take a few (the SB3 one trains briefly)


def python_blocks(markdown: str) -> list[str]:
    """The contents of every ```python fenced block, in order."""
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.MULTILINE | re.DOTALL)


BLOCKS = python_blocks(README.read_text())
DOCS = README.parent / "docs"
# Every docs page's examples but Ray's (a cluster start takes most of a minute here; tests/backends cover it).
DOC_BLOCKS = [
    (f"{page.stem}{i}", block)
    for page in sorted(DOCS.glob("*.md"))
    if page.stem != "ray"
    for i, block in enumerate(python_blocks(page.read_text()))
]


def run_script(source: str, directory: Path, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Run ``source`` as ``python script.py`` in ``directory`` (not the repository: shmvec must be installed)."""
    script = directory / "script.py"
    script.write_text(source)
    return subprocess.run([sys.executable, str(script)], cwd=directory, capture_output=True, text=True, timeout=timeout)


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 3, "the README's ```python blocks were not found"


@pytest.mark.parametrize("source", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs_as_a_script(source, tmp_path):
    result = run_script(source, tmp_path)
    report = f"exit code {result.returncode}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    assert result.returncode == 0, report
    assert "Traceback" not in result.stderr, report


@pytest.mark.parametrize("source", [b for _, b in DOC_BLOCKS], ids=[name for name, _ in DOC_BLOCKS])
def test_docs_example_runs_as_a_script(source, tmp_path):
    result = run_script(source, tmp_path)
    report = f"exit code {result.returncode}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    assert result.returncode == 0, report
    assert "Traceback" not in result.stderr, report


def test_the_demo_runs_and_says_what_the_default_chose(tmp_path):
    """The README's first command ends with ``python -m shmvec.demo``; a short run of it here."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "shmvec.demo",
            "--num-envs",
            "4",
            "--seconds",
            "0.05",
            "--rounds",
            "1",
            "--train-envs",
            "2",
            "--train-steps",
            "64",
            "--train-rounds",
            "1",
            "--wait-envs",
            "4",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert "the default chose: ShmPoolVecEnv(num_envs=2" in done.stdout  # the training run's
    trained = [line.split()[0] for line in done.stdout.splitlines() if line.endswith("x") and "s  " in line]
    assert trained[:2] == ["DummyVecEnv", "ShmPoolVecEnv"], done.stdout
    where = done.stdout.split("Where the default's last run spent its time", 1)[1]  # envs.timings, with a verdict
    assert "caller (policy, updates, logging)" in where and "\n* " in where, done.stdout
    waiting, stepping = done.stdout.split("Envs that wait for a simulator: 4 envs", 1)[1].split("CartPole-v1, 4 envs")
    assert "% CPU: waits)" in waiting, waiting  # the default saw that they wait
    assert [line.split()[0] for line in waiting.strip().splitlines()[-3:]] == [
        "DummyVecEnv",
        "SubprocVecEnv",
        "ShmPoolVecEnv",
    ], waiting
    assert "the default chose: ShmPoolVecEnv(num_envs=4" in stepping
    rows = [line.split()[0] for line in stepping.strip().splitlines()[-4:]]
    assert rows == ["DummyVecEnv", "SubprocVecEnv", "ShmPoolVecEnv", "ShmPoolVecEnv"], done.stdout
