"""Check the layer contract (``.importlinter``) with import-linter.

import-linter (grimp) finds a package's modules by walking the directory of its root
package, and ours is not one directory: pyproject's ``package-dir`` maps
``infscaler.runtime`` to ``./runtime``, ``infscaler.shm`` to ``./shm``, and so on. So this
script first lays the ``.py`` files out as an installed wheel has them (``infscaler/``,
``infscaler/runtime/``, ...) in a temporary directory, then runs ``lint-imports`` there
with that directory first on ``PYTHONPATH`` (the layout is read from pyproject, so a new
mapped package is picked up). Nothing is imported: grimp parses the files.

Usage (from anywhere)::

    .venv/bin/python scripts/lint_imports.py            # exit 0: the contract holds
    .venv/bin/python scripts/lint_imports.py --keep DIR # leave the laid-out tree in DIR

``tests/integration/test_layers.py`` runs it on every test run, and again on a copy with a deliberate
upward import to show that it fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / ".importlinter"


def package_dirs(repo: Path = REPO) -> dict[str, Path]:
    """pyproject's ``[tool.setuptools] package-dir``: package -> its directory."""
    with open(repo / "pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {pkg: repo / d for pkg, d in mapping.items()}


def lay_out(dest: Path, repo: Path = REPO) -> Path:
    """Copy the package's ``.py`` files under ``dest`` as installed; returns ``dest``.

    Packages are laid out shortest name first, so a mapped subpackage (``./runtime``)
    lands inside its parent (``dest/infscaler/runtime``).
    """
    for pkg, src in sorted(package_dirs(repo).items(), key=lambda kv: kv[0].count(".")):
        target = dest.joinpath(*pkg.split("."))
        for py in src.rglob("*.py"):
            rel = py.relative_to(src)
            if "__pycache__" in rel.parts:
                continue
            out = target / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(py, out)
    return dest


def lint(root: Path, config: Path = CONFIG) -> subprocess.CompletedProcess[str]:
    """Run ``lint-imports --config CONFIG`` on the tree laid out at ``root``; its result
    (returncode 0: every contract kept; the report on stdout)."""
    # a wide terminal: import-linter wraps its report at the width, splitting the chains
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "240"}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())",
            str(config),
            "--no-cache",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="lay the tree out here and keep it")
    args = ap.parse_args(argv)
    if args.keep:
        root = lay_out(args.keep)
        res = lint(root)
    else:
        with tempfile.TemporaryDirectory(prefix="infscaler-layers-") as tmp:
            res = lint(lay_out(Path(tmp)))
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
