"""Vertical scaling configuration: ``max_threads`` validated and carried to the unit. Scaling
threads live under load is in tests/integration/test_scale_threads.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infscaler.config import load_pipeline

ROWS, WIDTH, LAYERS = 512, 512, 8


def matmul_chain(path: Path) -> Path:
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    prev = "x"
    for i in range(LAYERS):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "y" if i == LAYERS - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_max_threads_is_validated_and_reaches_the_unit(tmp_path: Path) -> None:
    from infscaler.errors import ConfigError
    from infscaler.runtime.pipeline import compile_pipeline

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
