"""Every ``--option`` an error, hint or message of the package names exists: an option of
an ``infscaler`` command, of one of the package's own argparse programs, or of a foreign
tool named on purpose (listed here). Docstrings are left out (they cite other tools'
options as sources). A hint that names an option a user cannot pass is worse than none."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from infscaler.cli import COMMANDS, load_command
from tests import REPO_ROOT

ROOT = REPO_ROOT
PACKAGES = ("infscaler", "runtime", "partitioner", "shm", "ebpf", "profiles")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
#: options of other programs that messages name on purpose
FOREIGN = {
    "--overwrite": "kubectl label node ... --overwrite (the fleet's install lines)",
}


def _docstrings(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]


def _named_and_defined() -> tuple[dict[str, set[str]], set[str]]:
    named: dict[str, set[str]] = {}
    argparse_opts: set[str] = set()
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                argparse_opts.update(
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                )
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
            ):
                for opt in OPTION.findall(node.value):
                    named.setdefault(opt, set()).add(str(path.relative_to(ROOT)))
    return named, argparse_opts


def _cli_options() -> set[str]:
    opts: set[str] = {"--help", "--version"}
    for name in COMMANDS:
        cmd = load_command(name)
        for c in [cmd, *getattr(cmd, "commands", {}).values()]:
            for p in c.params:
                opts.update(o for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
    return opts


def test_every_option_a_message_names_exists() -> None:
    named, argparse_opts = _named_and_defined()
    known = _cli_options() | argparse_opts | set(FOREIGN)
    assert "--shapes" in known and "--max-regions-per-uid" in known  # the walk found them
    missing = {opt: sorted(where) for opt, where in named.items() if opt not in known}
    assert not missing, f"messages name options no command has: {missing}"


def test_the_walk_catches_a_made_up_option(tmp_path: Path) -> None:
    """The check is not vacuous: an option no command has is reported."""
    tree = ast.parse('raise ValueError("x", hint="pass --no-such-option")')
    docs = _docstrings(tree)
    found = {
        opt
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        for opt in OPTION.findall(node.value)
    }
    assert found == {"--no-such-option"} and "--no-such-option" not in _cli_options()
