"""The test layout the README describes: every test file is in tests/unit/ or
tests/integration/ (pyproject's testpaths collect nothing else), and .ci/run runs the
README's test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def test_every_test_file_is_unit_or_integration() -> None:
    stray = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not stray, (
        f"test files directly in tests/ are not collected: {stray}; move each to "
        "tests/unit/ (no processes) or tests/integration/ (README, 'Quick start')"
    )
    for kind in ("unit", "integration"):
        assert (TESTS / kind / "__init__.py").is_file()
        assert any((TESTS / kind).glob("test_*.py"))


def test_testpaths_are_both_kinds() -> None:
    # (tomllib is Python >= 3.11; the project supports 3.10)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'testpaths = ["tests/unit", "tests/integration"]' in pyproject
    assert '"slow: ' in pyproject


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"Set up and run the tests.*?```sh\n(.+?)\n```", readme, re.S)
    assert block, "README lost its 'Set up and run the tests' command"
    command = block.group(1).strip()
    assert "tests/unit" in command and "tests/integration" in command
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in [line.strip() for line in ci], f".ci/run does not run {command!r}"
