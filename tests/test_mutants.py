"""tests/mutants.py counts a mutant as caught only when a test fails: a collection error, an
interrupted run, a usage error or no tests collected proves nothing about the mutant."""

from __future__ import annotations

import shlex

import pytest
from mutants import MUTANTS, ROOT, verdict


@pytest.mark.parametrize(("returncode", "stdout", "expected"), [
    (1, "FAILED tests/test_x.py::test_a - assert 0\n1 failed, 3 passed in 1s", "caught"),
    (0, "4 passed in 1s", "SURVIVED"),
    (2, "ERROR tests/test_x.py\nInterrupted: 1 error during collection",
     "BROKEN (pytest exit status 2, a collection error)"),
    # pytest-xdist reports a collection error with exit status 1
    (1, "ERROR tests/test_x.py\n1 error in 1s", "BROKEN (pytest exit status 1)"),
    (1, "==== ERROR collecting tests/test_x.py ====\nFAILED tests/test_y.py::test_b\n1 failed, 1 error",
     "BROKEN (pytest exit status 1, a collection error)"),
    (3, "INTERNALERROR> boom", "BROKEN (pytest exit status 3)"),
    (4, "ERROR: file or directory not found: tests/nope.py", "BROKEN (pytest exit status 4)"),
    (5, "no tests ran in 0.01s", "BROKEN (pytest exit status 5)"),
])
def test_only_a_test_failure_kills_a_mutant(returncode, stdout, expected):
    assert verdict(returncode, stdout) == expected


def test_every_named_test_file_must_fail():
    stdout = "FAILED tests/test_a.py::test_x - assert 0\n1 failed, 9 passed"
    assert verdict(1, stdout, ("tests/test_a.py",)) == "caught"
    assert verdict(1, stdout, ("tests/test_a.py", "tests/test_b.py")) == "SURVIVED in tests/test_b.py"


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_mutant_still_applies(name):
    """Every planted text is still in its file exactly once (a mutant whose original text moved
    would fail at run time, not prove anything)."""
    path, *change, tests = MUTANTS[name]
    replacements = change[0] if len(change) == 1 else [tuple(change)]
    for replacement in replacements:
        file, original, _ = replacement if len(replacement) == 3 else (path, *replacement)
        assert (ROOT / file).read_text().count(original) == 1, f"{name}: {file}"
    for test_file in [a for a in shlex.split(tests) if a.endswith(".py")]:
        assert (ROOT / test_file).exists(), test_file
