"""The test layout the README describes: every test file is in tests/unit/ or
tests/integration/ (pyproject's testpaths collect nothing else), and .ci/run runs the
README's test command."""

from __future__ import annotations

import re

from tests import REPO_ROOT

ROOT = REPO_ROOT
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


def test_test_folders_mirror_the_package() -> None:
    """tests/unit/<part>/ and tests/integration/<part>/ are named for the package part they
    test (``runtime/serving`` tests ``infscaler.runtime.serving``), each a package
    (``__init__.py``: test modules of the same name in two folders do not clash)."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        packages = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    for kind in ("unit", "integration"):
        for d in sorted(p for p in (TESTS / kind).rglob("*") if p.is_dir()):
            if d.name == "__pycache__":
                continue
            rel = d.relative_to(TESTS / kind)
            assert (d / "__init__.py").is_file(), f"tests/{kind}/{rel} has no __init__.py"
            pkg = "infscaler." + ".".join(rel.parts)
            assert pkg in packages, f"tests/{kind}/{rel} mirrors no package ({pkg})"
