"""Vertical scaling configuration: ``max_threads`` validated and carried to the unit. Scaling
threads live under load is in tests/integration/runtime/scaling/test_scale_threads.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from infscaler.base.config import load_pipeline
from tests.integration.runtime.scaling.test_scale_threads import matmul_chain

ROWS, WIDTH, LAYERS = 512, 512, 8


def test_max_threads_is_validated_and_reaches_the_unit(tmp_path: Path) -> None:
    from infscaler.base.errors import ConfigError
    from infscaler.runtime.serving.pipeline import compile_pipeline

    path = matmul_chain(tmp_path / "chain.onnx")
    stage = {"name": "mm", "model": str(path), "threads": 1, "max_threads": 2}
    (u,) = compile_pipeline(
        load_pipeline({"name": "mm", "stages": [stage]}), state_dir=tmp_path / "s"
    ).units
    assert (u.threads, u.max_threads) == (1, 2)
    with pytest.raises(ConfigError, match=r"max_threads \(1\) is below threads \(2\)"):
        load_pipeline({"name": "mm", "stages": [{**stage, "threads": 2, "max_threads": 1}]})
    fn = {
        "name": "f",
        "function": "tests.stagefuncs:double",
        "inputs": ["x"],
        "outputs": ["y"],
        "max_threads": 2,
    }
    with pytest.raises(ConfigError, match="max_threads applies to model stages on the cpu"):
        load_pipeline({"name": "f", "stages": [fn]})
