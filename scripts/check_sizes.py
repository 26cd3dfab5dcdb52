"""Check that the package stays readable: no file over 900 lines, no function over 120.

A long file hides its parts and a long function its steps; both limits are checked on
every test run (``tests/unit/test_sizes.py``). The package is every ``.py`` file of the
directories pyproject's ``package-dir`` maps (``infscaler/``, ``runtime/``,
``partitioner/``, ``shm/``, ``ebpf/``, ``profiles/``). A function's length runs from its
``def`` line (decorators excluded) to its last line, docstring and nested functions
included: a closure is part of the function that holds it.

Usage::

    .venv/bin/python scripts/check_sizes.py          # exit 1 and one line per excess
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
MAX_FILE_LINES = 900
MAX_FUNCTION_LINES = 120


def package_files(repo: Path = REPO) -> list[Path]:
    """The package's ``.py`` files (pyproject's ``package-dir`` directories), sorted."""
    with open(repo / "pyproject.toml", "rb") as f:
        dirs = set(tomllib.load(f)["tool"]["setuptools"]["package-dir"].values())
    files: set[Path] = set()
    for d in dirs:
        files.update(p for p in (repo / d).rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(files)


def excesses(
    files: list[Path],
    max_file: int = MAX_FILE_LINES,
    max_function: int = MAX_FUNCTION_LINES,
    repo: Path = REPO,
) -> list[str]:
    """One line per file over ``max_file`` lines and per function over ``max_function``."""
    out = []
    for path in files:
        text = path.read_text()
        rel = path.relative_to(repo)
        lines = len(text.splitlines())
        if lines > max_file:
            out.append(f"{rel}: {lines} lines (at most {max_file}): split it into modules")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > max_function:
                    out.append(
                        f"{rel}:{node.lineno}: {node.name} is {n} lines (at most "
                        f"{max_function}): break it into named steps"
                    )
    return out


def main() -> int:
    found = excesses(package_files())
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
