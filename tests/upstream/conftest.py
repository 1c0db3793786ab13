"""This folder holds runners of other projects' test suites (docs/upstream-tests.md), not tests:
the repository's own ``python -m pytest`` leaves it alone (with ``--doctest-modules`` it would
otherwise import them)."""

collect_ignore_glob = ["*.py"]
