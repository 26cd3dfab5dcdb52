"""bench/vs_triton.py's command line (``--quick`` fills only what was not given), its
per-point CPU reading of a server's process tree, and its model rewrite
(``with_batch_dim``): axis 0 made a dynamic batch dim, with a constant Reshape's leading 1
made 0, and a batch's outputs equal to batch-1 runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from tests.helpers import bench_module, f32, make_model, rand, save


def test_quick_keeps_the_models_and_points_given() -> None:
    vt = bench_module("vs_triton")
    a = vt.parse_args(["--quick", "--models", "resnet50", "--concurrency", "1,2,4", "--loads", ""])
    assert a.models == ["resnet50"] and a.concurrency == [1, 2, 4] and a.loads == []
    assert a.duration_s == 5.0 and a.name == "vs_triton_quick" and a.state_dir is None
    q = vt.parse_args(["--quick"])
    assert q.models == ["squeezenet"] and q.concurrency == [1, 4] and q.loads == [0.5]
    full = vt.parse_args(["--state-dir", "/tmp/s", "--name", "x", "--settle-s", "0"])
    assert full.models == ["resnet50", "ppocrv4-det", "squeezenet"]
    assert full.concurrency == [1, 2, 4, 8] and full.duration_s == 15.0
    assert full.state_dir == Path("/tmp/s") and full.name == "x" and full.settle_s == 0.0


def test_baseline_adds_an_auto_served_by_another_install() -> None:
    vt = bench_module("vs_triton")
    a = vt.parse_args(["--configs", "triton 1x2", "--baseline", "/opt/other/bin/infscaler"])
    names = [s.name for s in vt.suts(a)]
    assert names == ["ours auto", "triton 1x2"]
    a = vt.parse_args(
        ["--configs", "ours auto baseline,ours auto", "--baseline", "/opt/other/bin/infscaler"]
    )
    got = vt.suts(a)
    assert [s.name for s in got] == ["ours auto baseline", "ours auto"]
    assert got[0].exe == Path("/opt/other/bin/infscaler") and got[1].exe == vt.INFSCALER


def test_tree_cpu_counts_the_serving_process_apart_from_the_rest() -> None:
    vt = bench_module("vs_triton")
    tree = vt.TreeCpu(os.getpid(), [os.getpid()], interval_s=0.05)
    t_end = time.process_time() + 0.2
    while time.process_time() < t_end:  # 0.2 s of this process's CPU
        sum(range(1000))
    server, rest = tree.stop()
    assert server >= 0.1
    assert rest == 0.0  # no child process
    assert tree.pids() == 1


def _reshape_model() -> onnx.ModelProto:
    """x [1, 4, 2, 2] -> Conv -> Reshape [1, 16] -> y: a batch-1 model with a flatten."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Reshape", ["c", "shape"], ["y"], name="flat"),
    ]
    inits = {"w": rand(4, 4, 1, 1, seed=1), "shape": np.array([1, 16], np.int64)}
    return make_model(nodes, [f32("x", [1, 4, 2, 2])], [f32("y", [1, 16])], inits)


def test_with_batch_dim_makes_axis_0_a_batch_dim(tmp_path: Path) -> None:
    vt = bench_module("vs_triton")
    src = save(_reshape_model(), tmp_path / "m.onnx")
    out = vt.with_batch_dim(src, tmp_path / "m_batch.onnx")
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
