"""BoundSession (infscaler.engines.gpu.iobinding) on a real onnxruntime CPU EP session:
the IOBinding path the gpu / dla engines take, checked against session.run. (The CPU EP
binds host memory like the CUDA EP binds its inputs' host copies; the device-pointer path
runs on a GPU host: scripts/gpu_check.sh.)"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from infscaler.engines.base import InferenceError
from infscaler.engines.gpu.iobinding import BoundSession


def _session() -> ort.InferenceSession:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 4])
    c = helper.make_tensor_value_info("C", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 4])
    z = helper.make_tensor_value_info("Z", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Add", ["X", "X"], ["Y"]), helper.make_node("Mul", ["C", "C"], ["Z"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x, c], [y, z]), opset_imports=[helper.make_opsetid("", 13)]
    )
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


class _Registered:
    """Host memory as UnifiedSlabMap presents it: one buffer, 'registered'."""

    integrated = False

    def __init__(self, buf: np.ndarray) -> None:
        self.buf = buf

    def pointer_of(self, array: np.ndarray) -> int | None:
        lo = self.buf.ctypes.data
        a = array.ctypes.data
        return a if lo <= a < lo + self.buf.nbytes else None


def test_matches_session_run_and_counts_how_tensors_were_bound():
    s = _session()
    bound = BoundSession(s)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    c = np.full((1, 4), 3, np.float32)
    got = bound.run({"X": x, "C": c}, ["Y", "Z"])
    want = s.run(["Y", "Z"], {"X": x, "C": c})
    np.testing.assert_array_equal(got["Y"], want[0])
    np.testing.assert_array_equal(got["Z"], want[1])
    # Z has a static shape: written into an array allocated before the run; Y (dynamic) by onnxruntime
    assert bound.counts == {"device": 0, "pinned": 0, "host": 2, "preallocated": 1, "ort": 1}
    assert got["Y"].flags.owndata and got["Z"].flags.owndata


def test_outputs_are_written_into_the_callers_arrays_and_rebinding_works():
    bound = BoundSession(_session())
    out = np.zeros((1, 4), np.float32)
    for k in (1.0, 2.0, 5.0):  # the binding is reused across runs
        got = bound.run(
            {"X": np.ones((3, 4), np.float32), "C": np.full((1, 4), k, np.float32)},
            ["Z"],
            out={"Z": out},
        )
        assert got["Z"] is out
        np.testing.assert_array_equal(out, np.full((1, 4), k * k, np.float32))


def test_non_contiguous_inputs_and_registered_memory():
    slab = np.zeros((4, 4), np.float32)
    slab[:] = np.arange(16, dtype=np.float32).reshape(4, 4)
    bound = BoundSession(_session(), host_memory=_Registered(slab))
    x = slab[1:3]  # a view inside the 'registered' buffer: bound as pinned host memory
    got = bound.run({"X": x, "C": np.ones((8, 4), np.float32)[::8]}, ["Y", "Z"])
    np.testing.assert_array_equal(got["Y"], 2 * x)
    assert bound.counts["pinned"] == 1 and bound.counts["host"] == 1


def test_a_wrong_output_array_is_refused():
    bound = BoundSession(_session())
    with pytest.raises(InferenceError, match="output 'Z'"):
        bound.run({"X": np.ones((1, 4), np.float32), "C": np.ones((1, 4), np.float32)}, ["Z"],
                  out={"Z": np.zeros((1, 4), np.float64)})  # fmt: skip
