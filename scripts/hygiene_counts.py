"""Count module docstrings over a line limit and cross-module imports of ``_``-names.

- module docstrings: every ``.py`` under the package's directories (``infscaler/``,
  ``runtime/``, ``partitioner/``, ``shm/``, ``ebpf/``, ``profiles/``) and ``bench/``,
  ``deploy/``, ``scripts/``; the docstring's lines as written (``ast`` positions).
- ``_``-imports: ``from infscaler.X import _name`` (or ``from .x import _name``) in a
  module of ours or a test (``tests/`` too), ``X`` another module than the importer.

Usage::

    .venv/bin/python scripts/hygiene_counts.py [--limit 25] [--exclude PREFIX ...] [-v]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIRS = (
    "infscaler",
    "runtime",
    "partitioner",
    "shm",
    "ebpf",
    "profiles",
    "bench",
    "deploy",
    "scripts",
)
#: directory -> the package it is installed as (pyproject's package-dir)
PACKAGES = {
    "runtime": "infscaler.runtime",
    "partitioner": "infscaler.partitioner",
    "shm": "infscaler.shm",
    "ebpf": "infscaler.ebpf",
    "profiles": "infscaler.profiles",
}


def files(dirs: tuple[str, ...] = DIRS) -> list[Path]:
    """The ``.py`` files under ``dirs`` (generated protobuf modules left out)."""
    out = []
    for d in dirs:
        out += [p for p in (ROOT / d).rglob("*.py") if not p.name.endswith("_pb2.py")]
    return sorted(out)


def docstring_lines(tree: ast.Module) -> int:
    """Lines of the module docstring (0: none)."""
    first = tree.body[0] if tree.body else None
    value = first.value if isinstance(first, ast.Expr) else None
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return (first.end_lineno or first.lineno) - first.lineno + 1
    return 0


def private_imports(tree: ast.Module) -> list[tuple[str, str]]:
    """``(module, name)`` of every import of a ``_``-name from a module of ours."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            ours = node.level > 0 or mod == "infscaler" or mod.startswith("infscaler.")
            if not ours:
                continue
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(("." * node.level + mod, a.name))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=25, help="docstring lines allowed")
    ap.add_argument("--exclude", nargs="*", default=[], help="path prefixes left out")
    ap.add_argument("-v", "--verbose", action="store_true", help="list each offender")
    args = ap.parse_args()
    over, total, priv = [], 0, []
    for p in files((*DIRS, "tests")):
        rel = p.relative_to(ROOT).as_posix()
        if any(rel.startswith(e) for e in args.exclude):
            continue
        tree = ast.parse(p.read_text(), str(p))
        priv += [(rel, m, name) for m, name in private_imports(tree)]
        if rel.startswith("tests/"):
            continue  # docstrings: the package, bench/, deploy/, scripts/
        n = docstring_lines(tree)
        total += n
        if n > args.limit:
            over.append((n, rel))
    if args.verbose:
        for n, rel in sorted(over, reverse=True):
            print(f"docstring {n:4d} {rel}")
        for rel, m, name in priv:
            print(f"_-import  {rel}: from {m} import {name}")
    print(f"module docstrings over {args.limit} lines: {len(over)}")
    print(f"module docstring lines in all: {total}")
    print(f"cross-module _-imports: {len(priv)} in {len({r for r, _, _ in priv})} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
