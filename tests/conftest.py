"""Fixtures shared by tests/unit and tests/integration (helpers to import are in
tests/helpers.py; the fixtures only integration tests use are in tests/integration/conftest.py;
tests/unit/conftest.py holds the guard that keeps unit tests free of processes)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import residual_model, save


@pytest.fixture
def residual_path(tmp_path: Path) -> Path:
    return save(residual_model(), tmp_path / "residual.onnx")


@pytest.fixture
def stagefuncs_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/stagefuncs.py importable here and in the instance processes a test starts
    (this directory on sys.path and on their PYTHONPATH)."""
    here = str(Path(__file__).parent)
    old = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{here}{os.pathsep}{old}" if old else here)
    monkeypatch.syspath_prepend(here)
