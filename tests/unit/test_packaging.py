"""pyproject's ``packages`` lists every package folder (one with ``__init__.py``) under the
``package-dir`` folders: a folder left out would be missing from the wheel users install,
and only the editable checkout would import it."""

from __future__ import annotations

import tomllib

from tests import REPO_ROOT


def test_every_package_folder_is_in_the_wheel() -> None:
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for pkg, folder in setuptools["package-dir"].items():
        root = REPO_ROOT / folder
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join((pkg, *rel.parts)))
    assert "infscaler.runtime.serving" in found and "infscaler.engines.tensorrt" in found
    assert found - listed == set(), f"add to pyproject's packages: {sorted(found - listed)}"
    assert listed - found == set(), f"listed but not a package folder: {sorted(listed - found)}"
