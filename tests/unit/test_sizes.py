"""The size limits of ``scripts/check_sizes.py``: the package holds them, and the check
finds a file and a function over them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests import REPO_ROOT


def _checker():
    spec = importlib.util.spec_from_file_location(
        "check_sizes", REPO_ROOT / "scripts/check_sizes.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_package_file_or_function_is_over_the_limits() -> None:
    cs = _checker()
    files = cs.package_files()
    assert any(p.name == "frontend.py" for p in files)  # runtime/ is part of the package
    assert len(files) > 100
    found = cs.excesses(files)
    assert not found, "\n".join(found)


def test_the_check_finds_a_long_file_and_a_long_function(tmp_path: Path) -> None:
    cs = _checker()
    body = "\n".join(f"    x{i} = {i}" for i in range(130))
    long_fn = tmp_path / "long_fn.py"
    long_fn.write_text(f"def f():\n{body}\n    return 0\n\n\ndef g():\n    return 1\n")
    long_file = tmp_path / "long_file.py"
    long_file.write_text("\n".join(f"y{i} = {i}" for i in range(901)) + "\n")
    found = cs.excesses([long_fn, long_file], repo=tmp_path)
    assert len(found) == 2, found
    assert "long_fn.py:1: f is 132 lines" in found[0]
    assert "long_file.py: 901 lines" in found[1]
    assert cs.excesses([long_fn], max_function=140, repo=tmp_path) == []
