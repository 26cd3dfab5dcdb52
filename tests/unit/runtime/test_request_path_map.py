"""The request-path map in docs/architecture.md ("The request path"): numbered steps 1..n, each with a
``file:function`` anchor, and every anchor in it names a function (or class) that
exists in that file, so the map cannot silently go stale when code moves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

#: the repository root (found upwards, so the test may live in tests/ or tests/unit/)
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
MAP = ROOT / "docs" / "architecture.md"
ANCHOR = re.compile(r"``([\w/]+\.py):([\w.]+)``")


def _doc() -> str:
    text = MAP.read_text()
    start = text.index("## The request path")
    return text[start : text.index("\n## ", start + 1)]


def _defines(path: Path, qualname: str) -> bool:
    """``qualname`` (``f``, ``Class``, ``Class.method``) is defined in ``path``."""
    body = ast.parse(path.read_text()).body
    node = None
    for part in qualname.split("."):
        node = next(
            (
                n
                for n in body
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and n.name == part
            ),
            None,
        )
        if node is None:
            return False
        body = node.body
    return True


def test_steps_are_numbered_in_order_and_each_has_an_anchor() -> None:
    steps = re.split(r"\n(?=\d+\. )", _doc())[1:]
    assert len(steps) >= 8
    for i, step in enumerate(steps, start=1):
        assert step.startswith(f"{i}. "), step[:40]
        assert ANCHOR.match(step.split(" ", 1)[1]), f"step {i} does not start with its anchor"


def test_every_anchor_resolves_to_a_real_function() -> None:
    anchors = ANCHOR.findall(_doc())
    assert len(anchors) >= 12
    missing = [
        f"{f}:{q}" for f, q in anchors if not (ROOT / f).is_file() or not _defines(ROOT / f, q)
    ]
    assert missing == [], f"stale anchors in docs/architecture.md: {missing}"


def test_the_resolver_rejects_what_does_not_exist() -> None:
    """The check itself can fail: a made-up method, a nested name at the wrong level."""
    frontend = ROOT / "runtime" / "serving" / "frontend.py"
    assert _defines(frontend, "FrontEnd.submit")
    assert not _defines(frontend, "FrontEnd.no_such_method")
    assert not _defines(frontend, "submit")  # a method is not a module-level function
