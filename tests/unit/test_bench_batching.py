"""bench/batching.py's model rewrite (batchable): axis 0 made a dynamic batch dim, with a
constant Reshape's leading 1 made 0, and a batch's outputs equal to batch-1 runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from tests.helpers import bench_module, f32, make_model, rand, save


def _reshape_model() -> onnx.ModelProto:
    """x [1, 4, 2, 2] -> Conv -> Reshape [1, 16] -> y: a batch-1 model with a flatten."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Reshape", ["c", "shape"], ["y"], name="flat"),
    ]
    inits = {"w": rand(4, 4, 1, 1, seed=1), "shape": np.array([1, 16], np.int64)}
    return make_model(nodes, [f32("x", [1, 4, 2, 2])], [f32("y", [1, 16])], inits)


def test_batchable_makes_axis_0_a_batch_dim(tmp_path: Path) -> None:
    bench = bench_module("batching")
    src = save(_reshape_model(), tmp_path / "m.onnx")
    out = bench.batchable(src, tmp_path / "m_batch.onnx")
    m = onnx.load(str(out))
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    assert m.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "N"
    shape = next(i for i in m.graph.initializer if i.name == "shape")
    assert numpy_helper.to_array(shape).tolist() == [0, 16]
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    one = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((3, 4, 2, 2)).astype(np.float32)
    got = sess.run(None, {"x": x})[0]
    want = np.concatenate([one.run(None, {"x": x[i : i + 1]})[0] for i in range(3)])
    assert got.shape == (3, 16)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
