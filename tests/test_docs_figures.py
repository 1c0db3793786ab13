"""The docs' measured figures say where they come from, and the docs' links lead somewhere.

- Every row of the README's Performance table and of ``docs/benchmarks.md``'s tables names the
  commit it was measured on (a commit of this repository, where git can tell), a date and a
  machine; a row measured on the H100 box says that it predates the rewritten GPU hand-off.
- The README's first-screen performance line names a commit and a date, and its figures are
  rows of the Performance table (one figure, one source).
- The README stays within 200 lines; no page names an issue number.
- Every relative link (and image) in the README, CONTRIBUTING and ``docs/`` resolves: the file
  exists and, for ``page.md#anchor``, the page has a heading with that anchor (GitHub's slugs).

The checkers take the text, so the self-tests at the end feed them a stripped row and a broken
link and see them fail.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
PAGES = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 200

HASH = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
H100_NOTE = "before the hand-off rewrite"
FENCE = re.compile(r"^```.*?^```", flags=re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
ISSUE = re.compile(r"\bissues?\s+#?\d+|(?:^|[\s(])#\d+\b", flags=re.IGNORECASE)


def prose(markdown: str) -> str:
    """``markdown`` without its fenced code blocks and inline code (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", markdown))


# ---- tables of measured figures -------------------------------------------------------------


def tables(markdown: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each pipe table outside code blocks: its header cells and its rows' cells."""
    found, lines = [], FENCE.sub("", markdown).splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1]):
            header, rows, i = cells(lines[i]), [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(cells(lines[i]))
                i += 1
            found.append((header, rows))
        else:
            i += 1
    return found


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def section(markdown: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## `` heading."""
    start = markdown.index(f"\n## {heading}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end >= 0 else None]


@functools.cache
def git_knows_commits() -> bool:
    """Whether ``git cat-file`` can tell a commit of this repository from any hex string."""
    if shutil.which("git") is None:
        return False
    try:
        shallow = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return shallow.returncode == 0 and shallow.stdout.strip() == "false"


@functools.cache
def is_commit(candidate: str) -> bool:
    if not git_knows_commits():
        return bool(re.search(r"[a-f]", candidate))  # a hash's look, at least: not a plain number
    done = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{candidate}^{{commit}}"], capture_output=True, timeout=30
    )
    return done.returncode == 0


def row_problems(header: list[str], row: list[str]) -> list[str]:
    """What a row of measured figures lacks: a commit, a date, a machine, the H100 note."""
    text = " | ".join(row)
    problems = []
    if not any(is_commit(candidate) for candidate in HASH.findall(text)):
        problems.append("names no commit of this repository (a short hash, 7 or more hex digits)")
    if not DATE.search(text):
        problems.append("names no date (YYYY-MM-DD)")
    machines = [i for i, name in enumerate(header) if "machine" in name.lower()]
    if not machines:
        problems.append(f"its table has no machine column: {header}")
    elif not all(i < len(row) and row[i] for i in machines):
        problems.append("names no machine")
    if "H100" in text and H100_NOTE not in text:
        problems.append(f"is an H100 figure that does not say {H100_NOTE!r}")
    return problems


def performance_rows() -> list[tuple[str, list[str], list[str]]]:
    """(page, header, row) for every row of the README's Performance tables and docs/benchmarks.md's tables."""
    found, readme = [], section(README.read_text(), "Performance")
    for page, text in (("README.md", readme), ("benchmarks.md", BENCHMARKS.read_text())):
        for header, rows in tables(text):
            found.extend((page, header, row) for row in rows)
    return found


ROWS = performance_rows()


def test_the_performance_tables_are_found():
    pages = {page for page, _, _ in ROWS}
    assert pages == {"README.md", "benchmarks.md"}, pages
    assert len(ROWS) >= 10


def row_id(i: int, page: str, row: list[str]) -> str:
    return f"{page}:{i}:{row[0].encode('ascii', 'ignore').decode()[:40]}"


@pytest.mark.parametrize("page, header, row", ROWS, ids=[row_id(i, page, row) for i, (page, _, row) in enumerate(ROWS)])
def test_each_performance_row_names_its_commit_date_and_machine(page, header, row):
    problems = row_problems(header, row)
    assert not problems, f"{page}: the row {row[0]!r} " + "; ".join(problems)


def first_screen_performance_line(markdown: str) -> str:
    """The README's paragraph that starts with ``**Performance:**``, before the first ``## `` heading."""
    head = markdown.split("\n## ", 1)[0]
    found = re.search(r"^\*\*Performance:\*\*.*?(?=\n\n)", head, flags=re.MULTILINE | re.DOTALL)
    assert found, "the README's first screen has no **Performance:** line"
    return found.group(0)


def test_the_first_screens_performance_line_names_its_commit_and_comes_from_the_table():
    text = README.read_text()
    line = first_screen_performance_line(text)
    assert any(is_commit(candidate) for candidate in HASH.findall(line)), line
    assert DATE.search(line) and "H100" in line and "hand-off was rewritten" in line, line
    table = section(text, "Performance")
    for figure in re.findall(r"\b\d+\.\d+x\b", line):
        assert f"**{figure}**" in table, f"{figure} of the first screen is no figure of the Performance table"


def test_the_readme_stays_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the most is {README_MAX_LINES}"


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_no_page_names_an_issue_number(page):
    found = ISSUE.findall(prose(page.read_text()))
    assert not found, f"{page.relative_to(ROOT)} names {found}: say what changed, for users"


# ---- links ----------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def broken_links(page: Path, markdown: str) -> list[str]:
    """The relative links of ``markdown`` (the text of ``page``) that lead nowhere."""
    broken = []
    for target in LINK.findall(prose(markdown)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.IGNORECASE):
            continue  # https:, mailto:: not this repository's
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            shown = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
            broken.append(f"{target}: {shown} does not exist")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: {where.name} has no heading with the anchor #{anchor}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_each_relative_link_resolves(page):
    broken = broken_links(page, page.read_text())
    assert not broken, f"{page.relative_to(ROOT)}: " + "\n".join(broken)


# ---- the checkers fail where they should ----------------------------------------------------


def test_a_row_stripped_of_its_commit_fails():
    page, header, row = next((p, h, r) for p, h, r in ROWS if p == "README.md")
    stripped = [HASH.sub("", cell) for cell in row]
    assert row_problems(header, row) == []
    assert any("commit" in problem for problem in row_problems(header, stripped))


def test_a_row_naming_an_unknown_commit_fails_where_git_can_tell():
    if not git_knows_commits():
        pytest.skip("no git history here: only a hash's look is checked")
    header = ["workload", "machine", "figure", "measured on"]
    assert row_problems(header, ["x", "2-core VM", "1.0x", "abcdef1 (2026-11-27), one run"]) != []


def test_an_h100_row_without_its_note_fails():
    _, header, row = next((p, h, r) for p, h, r in ROWS if "H100" in " ".join(r))
    without = [cell.replace(H100_NOTE, "") for cell in row]
    assert any("H100" in problem for problem in row_problems(header, without))


def test_a_broken_link_and_a_missing_anchor_are_found():
    text = "[a](docs/usage.md) [b](docs/nowhere.md) [c](docs/usage.md#no-such-heading) [d](#performance) `[e](x.md)`"
    broken = broken_links(README, text)
    assert len(broken) == 2 and "nowhere.md" in broken[0] and "no-such-heading" in broken[1], broken
