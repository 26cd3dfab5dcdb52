"""Engines (cpu / gpu / dla): one interface, real onnxruntime / TensorRT, nothing faked.

The cpu engine runs everywhere and is checked against a plain onnxruntime session, on
small onnx.helper graphs and on the trained PP-OCR text-direction classifier. The gpu and
dla engines must say why this host lacks them; the tests that need the hardware skip with
that reason here and run on a GPU host / a Jetson.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from infscaler.base.errors import InfScalerError, ModelLoadError, ModelNotInstalledError
from infscaler.engines import (
    ENGINE_KINDS,
    Engine,
    EngineUnavailable,
    InferenceError,
    TensorInfo,
    create_engine,
    engine_availability,
    engine_class,
)
from infscaler.engines.tensorrt.cache import EngineCache
from infscaler.engines.tensorrt.loader import bind_shapes, read_signature
from tests.helpers import f32, make_model, rand, save

GPU_OK, GPU_REASON = engine_class("gpu").availability()
DLA_OK, DLA_REASON = engine_class("dla").availability()
needs_gpu = pytest.mark.skipif(not GPU_OK, reason=f"no gpu engine on this host: {GPU_REASON}")
needs_dla = pytest.mark.skipif(not DLA_OK, reason=f"no dla engine on this host: {DLA_REASON}")
CLS_OUT = "save_infer_model/scale_0.tmp_1"


# --------------------------------------------------------------------------- models


def two_input_model():
    """y = a + Gather(table, indices): inputs a float32 [2, 3] and indices int64 [2]."""
    nodes = [
        helper.make_node("Gather", ["table", "indices"], ["g"], name="gather", axis=0),
        helper.make_node("Add", ["a", "g"], ["y"], name="add"),
    ]
    inputs = [f32("a", [2, 3]), helper.make_tensor_value_info("indices", TensorProto.INT64, [2])]
    return make_model(nodes, inputs, [f32("y", [2, 3])], {"table": rand(5, 3, seed=7)})


def dynamic_batch_model():
    """y = Relu(x @ w): x float32 [N, 4] (N dynamic) -> y [N, 3]."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
        helper.make_node("Relu", ["m"], ["y"], name="relu"),
    ]
    return make_model(nodes, [f32("x", ["N", 4])], [f32("y", ["N", 3])], {"w": rand(4, 3, seed=3)})


def dla_fallback_model():
    """Conv -> Relu (the DLA runs these) -> y, and ArgMax over channels (TopK in TensorRT,
    which the DLA cannot run) -> idx."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
        helper.make_node("ArgMax", ["y"], ["idx"], name="argmax", axis=1, keepdims=1),
    ]
    outputs = [
        f32("y", [1, 8, 8, 8]),
        helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 1, 8, 8]),
    ]
    inits = {"w": rand(8, 4, 3, 3, seed=11), "b": rand(8, seed=12)}
    return make_model(nodes, [f32("x", [1, 4, 8, 8])], outputs, inits)


def qdq_conv_model():
    """Explicitly quantized conv (int8 Q/DQ on the activation, per-channel int8 weights)."""
    w = np.random.default_rng(5).integers(-100, 100, size=(8, 4, 3, 3)).astype(np.int8)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], name="dqw", axis=0),
        helper.make_node("Conv", ["xd", "wd"], ["y"], name="conv", pads=[1, 1, 1, 1]),
    ]
    inits = {
        "sx": np.array(0.02, np.float32),
        "zx": np.array(0, np.int8),
        "wq": w,
        "sw": np.full(8, 0.001, np.float32),
        "zw": np.zeros(8, np.int8),
    }
    return make_model(nodes, [f32("x", [1, 4, 8, 8])], [f32("y", [1, 8, 8, 8])], inits)


@pytest.fixture
def two_input_path(tmp_path: Path) -> Path:
    return save(two_input_model(), tmp_path / "two_input.onnx")


@pytest.fixture
def dynamic_path(tmp_path: Path) -> Path:
    return save(dynamic_batch_model(), tmp_path / "dynamic.onnx")


@pytest.fixture(scope="module")
def cls_path() -> Path:
    """The trained PP-OCR text-direction classifier (rapidocr_onnxruntime's wheel)."""
    from infscaler.base.models import resolve_model

    try:
        return resolve_model("ppocr-cls")
    except ModelNotInstalledError as exc:
        pytest.skip(str(exc))


def reference(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A plain onnxruntime CPU session's outputs on the same feeds."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def cls_batch(n: int = 3, width: int = 192, seed: int = 0) -> np.ndarray:
    """Text-line crops as the classifier's preprocessing leaves them: [-1, 1] floats."""
    rng = np.random.default_rng(seed)
    return (rng.random((n, 3, 48, width), dtype=np.float32) * 2 - 1).astype(np.float32)


# --------------------------------------------------------------------------- registry


def test_engine_availability_covers_every_kind():
    avail = engine_availability()
    assert tuple(avail) == ENGINE_KINDS == ("cpu", "gpu", "dla")
    for kind, (ok, reason) in avail.items():
        assert isinstance(ok, bool) and isinstance(reason, str) and reason, kind
        assert engine_class(kind).availability() == (ok, reason)  # cached, same answer
    assert avail["cpu"][0] and "onnxruntime" in avail["cpu"][1]


def test_unknown_kind_lists_the_kinds(residual_path):
    with pytest.raises(InfScalerError) as info:
        create_engine("tpu", residual_path)
    for kind in ENGINE_KINDS:
        assert kind in str(info.value)
    with pytest.raises(InfScalerError):
        engine_class("npu")


def test_engine_classes_share_the_interface():
    for kind in ENGINE_KINDS:
        cls = engine_class(kind)
        assert issubclass(cls, Engine) and cls.kind == kind
        assert isinstance(cls.precisions, tuple)
    assert engine_class("cpu").precisions == ("fp32",)


# --------------------------------------------------------------------------- cpu


def test_cpu_matches_onnxruntime_on_small_graphs(residual_path, two_input_path):
    x = rand(1, 4, 8, 8, seed=9, scale=1.0)
    with create_engine("cpu", residual_path) as eng:
        out = eng.infer({"x": x})
    np.testing.assert_allclose(
        out["y"], reference(residual_path, {"x": x})["y"], rtol=1e-6, atol=1e-7
    )

    feeds = {"a": rand(2, 3, seed=1), "indices": np.array([4, 0], np.int64)}
    with create_engine("cpu", two_input_path, threads=2) as eng:
        out = eng.infer(feeds)
    np.testing.assert_allclose(out["y"], reference(two_input_path, feeds)["y"], rtol=1e-6)


def test_cpu_matches_onnxruntime_on_the_trained_classifier(cls_path):
    with create_engine("cpu", cls_path, threads=2) as eng:
        for n, width in ((3, 192), (1, 320)):  # dynamic batch and width
            x = cls_batch(n, width, seed=n)
            got = eng.infer({"x": x})
            want = reference(cls_path, {"x": x})
            assert list(got) == [CLS_OUT] and got[CLS_OUT].shape == (n, 2)
            np.testing.assert_allclose(got[CLS_OUT], want[CLS_OUT], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got[CLS_OUT].sum(axis=1), 1.0, atol=1e-5)  # softmax


def test_cpu_metadata(residual_path, two_input_path, dynamic_path, cls_path):
    with create_engine("cpu", residual_path) as eng:
        assert eng.inputs == [TensorInfo("x", np.float32, (1, 4, 8, 8))]
        assert eng.outputs == [TensorInfo("y", np.float32, (1, 2, 8, 8))]
    with create_engine("cpu", two_input_path) as eng:
        assert [(t.name, t.dtype, t.shape) for t in eng.inputs] == [
            ("a", np.dtype(np.float32), (2, 3)),
            ("indices", np.dtype(np.int64), (2,)),
        ]
    with create_engine("cpu", dynamic_path) as eng:
        assert eng.inputs[0].shape == (None, 4) and eng.inputs[0].is_dynamic
        assert eng.infer({"x": rand(5, 4)})["y"].shape == (5, 3)
    with create_engine("cpu", cls_path) as eng:
        assert eng.inputs == [TensorInfo("x", np.float32, (None, 3, None, None))]
        assert eng.outputs == [TensorInfo(CLS_OUT, np.float32, (None, 2))]
        d = eng.describe()
    json.dumps(d)  # describe() is JSON (instances report it to the supervisor)
    assert d["kind"] == "cpu" and d["precision"] == "fp32" and d["load_ms"] > 0
    assert d["inputs"] == [{"name": "x", "dtype": "float32", "shape": [None, 3, None, None]}]
    assert d["provider"] == "CPUExecutionProvider" and d["allow_spinning"] is False


@pytest.mark.parametrize(
    "feeds, words",
    [
        (
            {"a": rand(2, 3), "indices": np.zeros(2, np.int64), "b": rand(2)},
            ["unknown input 'b'", "'a'"],
        ),
        ({"a": rand(2, 3)}, ["missing input", "'indices'", "int64"]),
        (
            {"a": rand(2, 3).astype(np.float64), "indices": np.zeros(2, np.int64)},
            ["'a'", "float64", "float32"],
        ),
        ({"a": rand(2, 3), "indices": np.zeros(2, np.int32)}, ["'indices'", "int32", "int64"]),
        (
            {"a": rand(1, 2, 3), "indices": np.zeros(2, np.int64)},
            ["'a'", "rank 3", "rank 2", "[1, 2, 3]"],
        ),
        (
            {"a": rand(2, 4), "indices": np.zeros(2, np.int64)},
            ["'a'", "dimension 1 is 4", "takes 3", "[2, 3]"],
        ),
        (
            {"a": rand(2, 3), "indices": np.zeros(3, np.int64)},
            ["'indices'", "dimension 0 is 3", "[2]"],
        ),
    ],
    ids=["unknown", "missing", "dtype-float", "dtype-int", "rank", "fixed-dim", "fixed-dim-int"],
)
def test_cpu_bad_feeds_name_the_input(two_input_path, feeds, words):
    with create_engine("cpu", two_input_path) as eng, pytest.raises(InferenceError) as info:
        eng.infer(feeds)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_cpu_outputs_subset_owned_and_unknown(two_input_path):
    feeds = {"a": rand(2, 3), "indices": np.array([1, 2], np.int64)}
    with create_engine("cpu", two_input_path) as eng:
        out = eng.infer(feeds, outputs=["y"])
        assert list(out) == ["y"]
        y = out["y"]
        assert y.flags.owndata and y.flags.writeable
        first = y.copy()
        y[...] = 123.0  # the caller owns it: the next run is unaffected
        np.testing.assert_array_equal(eng.infer(feeds)["y"], first)
        assert eng.infer(feeds, outputs=[]) == {}
        with pytest.raises(InferenceError, match="unknown output 'z'"):
            eng.infer(feeds, outputs=["z"])


def test_cpu_lifecycle(residual_path):
    eng = create_engine("cpu", residual_path, threads=2)
    assert not eng.loaded and eng.memory_mb == 0.0 and eng.describe()["load_ms"] is None
    with pytest.raises(InferenceError, match="not loaded"):
        eng.infer({"x": rand(1, 4, 8, 8)})
    with pytest.raises(InferenceError, match="after load"):
        _ = eng.inputs
    assert eng.load() is eng and eng.load() is eng  # idempotent
    d = eng.describe()
    assert d["threads"] == 2 and d["session_intra_op_threads"] == 2
    eng.close()
    eng.close()
    with pytest.raises(InferenceError):
        eng.infer({"x": rand(1, 4, 8, 8)})
    with eng:  # loads again
        assert eng.infer({"x": rand(1, 4, 8, 8)})["y"].shape == (1, 2, 8, 8)
    assert not eng.loaded


def test_cpu_default_threads(residual_path):
    assert create_engine("cpu", residual_path).threads == 1
    assert create_engine("cpu", residual_path, cores=[0, 1]).threads == 2  # not loaded: no pin
    assert create_engine("cpu", residual_path, cores=[0, 1], threads=1).threads == 1


@pytest.mark.parametrize(
    "options, match",
    [
        ({"precision": "fp16"}, "fp32 only"),
        ({"precision": "fp8"}, "unknown precision"),
        ({"threads": 0}, "threads must be >= 1"),
        ({"cores": [10_000]}, r"cores \[10000\] do not exist"),
    ],
)
def test_cpu_bad_options(residual_path, options, match):
    before = os.sched_getaffinity(0)
    with pytest.raises(InferenceError, match=match):
        create_engine("cpu", residual_path, **options).load()
    assert os.sched_getaffinity(0) == before  # nothing pinned on a failed load


def test_bad_model_files(tmp_path, cls_path):
    text = tmp_path / "notes.onnx"
    text.write_text("this is not an onnx model\n")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(cls_path.read_bytes()[:4000])
    for path in (text, truncated, tmp_path / "missing.onnx"):
        with pytest.raises(ModelLoadError) as info:
            create_engine("cpu", path).load()
        assert str(path) in str(info.value)
    for path in (text, truncated):  # what the TensorRT engines read first
        with pytest.raises(ModelLoadError):
            read_signature(path)


# --------------------------------------------------------------------------- gpu / dla here


@pytest.mark.skipif(GPU_OK, reason="this host has a gpu engine")
def test_gpu_reports_unavailable_with_the_missing_piece(residual_path):
    assert GPU_REASON
    assert any(p in GPU_REASON for p in ("tensorrt", "pycuda", "CUDA", "onnxruntime"))
    assert "pip install" in GPU_REASON or "no CUDA device" in GPU_REASON
    eng = create_engine("gpu", residual_path)
    assert eng.precisions == ()
    with pytest.raises(EngineUnavailable) as info:
        eng.load()
    assert GPU_REASON in str(info.value) and not eng.loaded
    json.dumps(eng.describe())


@pytest.mark.skipif(DLA_OK, reason="this host has a dla engine")
def test_dla_reports_unavailable_with_the_missing_piece(residual_path):
    assert DLA_REASON and "DLA" in DLA_REASON
    assert any(p in DLA_REASON for p in ("tensorrt", "pycuda", "CUDA", "no DLA cores"))
    with pytest.raises(EngineUnavailable) as info:
        create_engine("dla", residual_path, precision="fp16").load()
    assert DLA_REASON in str(info.value)
    assert create_engine("dla", residual_path).describe()["fallback_layers"] is None


def test_dla_refuses_fp32(residual_path):
    with pytest.raises(InferenceError, match="fp16 or int8"):
        create_engine("dla", residual_path, precision="fp32").load()


@pytest.mark.parametrize("kind", ["gpu", "dla"])
def test_int8_without_qdq_needs_calibration(residual_path, tmp_path, kind):
    with pytest.raises(InferenceError, match="calibration"):
        create_engine(kind, residual_path, precision="int8").load()
    # a Q/DQ model passes this check (and then needs the hardware)
    qdq = save(qdq_conv_model(), tmp_path / "qdq.onnx")
    assert read_signature(qdq).has_qdq
    eng = create_engine(kind, qdq, precision="int8")
    if not engine_class(kind).availability()[0]:
        with pytest.raises(EngineUnavailable):
            eng.load()


def test_bind_shapes_for_tensorrt_profiles(dynamic_path, residual_path, cls_path):
    sig = read_signature(cls_path)
    assert [(t.name, t.shape) for t in sig.inputs] == [("x", (None, 3, None, None))]
    with pytest.raises(InferenceError) as info:
        bind_shapes(sig.inputs, {})
    assert "dynamic input" in str(info.value) and "'x'" in str(info.value)
    assert bind_shapes(sig.inputs, {"x": [2, 3, 48, 192]}) == {"x": (2, 3, 48, 192)}
    for bad, match in (
        ({"x": [2, 3, 48]}, "rank 3"),
        ({"x": [2, 4, 48, 192]}, "dimension 1 is 4"),
        ({"x": [0, 3, 48, 192]}, "dimension 0 is 0"),
        ({"y": [1]}, "unknown input"),
    ):
        with pytest.raises(InferenceError, match=match):
            bind_shapes(sig.inputs, bad)
    static = read_signature(residual_path)
    assert bind_shapes(static.inputs, {}) == {"x": (1, 4, 8, 8)}
    assert not static.has_qdq and static.float_types == {"float32"}
    assert bind_shapes(read_signature(dynamic_path).inputs, {"x": [7, 4]}) == {"x": (7, 4)}


def test_engine_cache_key_and_files(tmp_path):
    def cache(precision: str, dla_core: int | None = None) -> EngineCache:
        build = {"precision": precision, "dla_core": dla_core, "shapes": {"x": [1, 4]}}
        key = {
            "model_sha256": "ab" * 32,
            "gpu": "Orin (nvgpu)",
            "tensorrt": "10.3.0",
            "build": build,
        }
        return EngineCache(tmp_path / "engines", key=key, stem="part_0")

    a, b, c = cache("fp16"), cache("fp16"), cache("fp32")
    assert a.engine_path == b.engine_path != c.engine_path
    assert cache("fp16", 1).engine_path.name.count("-dla1-") == 1
    assert a.engine_path.name.startswith("part-0-abababababab-orin-nvgpu-trt10.3.0-fp16-")
    assert a.read() is None
    with a.locked():
        assert a.write(b"plan bytes", {"build_ms": 12.5, "fallback_layers": ["topk"]})
    plan, meta = b.read()
    assert plan == b"plan bytes" and meta["fallback_layers"] == ["topk"]
    assert meta["key"]["gpu"] == "Orin (nvgpu)"
    a.drop()
    assert b.read() is None


# --------------------------------------------------------------------------- on a GPU host

GPU_TOL = {"fp32": {"rtol": 1e-3, "atol": 1e-4}, "fp16": {"rtol": 2e-2, "atol": 2e-2}}


def _gpu_engine(path: Path, precision: str, **options) -> Engine:
    eng = create_engine("gpu", path, precision=precision, **options)
    if precision not in eng.precisions:
        pytest.skip(f"the gpu engine here runs {eng.precisions}, not {precision}")
    return eng


@needs_gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_matches_cpu(residual_path, cls_path, tmp_path, precision):
    x = rand(1, 4, 8, 8, seed=2, scale=1.0)
    with _gpu_engine(residual_path, precision, cache_dir=tmp_path) as eng:
        got = eng.infer({"x": x})["y"]
        assert eng.describe()["backend"] in ("tensorrt", "onnxruntime-cuda")
    np.testing.assert_allclose(got, reference(residual_path, {"x": x})["y"], **GPU_TOL[precision])

    x = cls_batch(2, 192)
    with _gpu_engine(cls_path, precision, cache_dir=tmp_path, shapes={"x": [2, 3, 48, 192]}) as eng:
        assert eng.inputs[0].name == "x" and eng.outputs[0].name == CLS_OUT
        assert eng.memory_mb > 0  # device memory the load took (weights, context, buffers)
        got = eng.infer({"x": x})[CLS_OUT]
    np.testing.assert_allclose(got, reference(cls_path, {"x": x})[CLS_OUT], **GPU_TOL[precision])


@needs_gpu
def test_gpu_int64_inputs_and_outputs(two_input_path, tmp_path):
    feeds = {"a": rand(2, 3), "indices": np.array([4, 1], np.int64)}
    with _gpu_engine(two_input_path, "fp32", cache_dir=tmp_path) as eng:
        got = eng.infer(feeds)["y"]
        assert [t.dtype for t in eng.inputs] == [np.float32, np.int64]
    np.testing.assert_allclose(got, reference(two_input_path, feeds)["y"], **GPU_TOL["fp32"])


@needs_gpu
def test_gpu_engine_cache_hit_on_second_load(residual_path, tmp_path):
    x = rand(1, 4, 8, 8, seed=4)
    first = _gpu_engine(residual_path, "fp32", cache_dir=tmp_path)
    with first:
        d1 = first.describe()
        if d1["backend"] != "tensorrt":
            pytest.skip("the gpu engine runs on onnxruntime's CUDA EP here (no TensorRT cache)")
        y1 = first.infer({"x": x})["y"]
    assert d1["cache_hit"] is False and Path(d1["engine_path"]).is_file()
    assert d1["build_ms"] > 0
    with _gpu_engine(residual_path, "fp32", cache_dir=tmp_path) as second:
        d2 = second.describe()
        y2 = second.infer({"x": x})["y"]
    assert d2["cache_hit"] is True and d2["engine_path"] == d1["engine_path"]
    assert d2["build_ms"] == d1["build_ms"]  # the build that made the cached engine
    np.testing.assert_array_equal(y1, y2)
    with _gpu_engine(residual_path, "fp16", cache_dir=tmp_path) as other:
        assert other.describe()["engine_path"] != d1["engine_path"]  # precision is in the key


@needs_gpu
def test_gpu_dynamic_inputs_need_shapes(dynamic_path, tmp_path):
    eng = _gpu_engine(dynamic_path, "fp32", cache_dir=tmp_path)
    if engine_class("gpu").backend() != "tensorrt":
        pytest.skip("onnxruntime's CUDA EP takes dynamic shapes as they come")
    with pytest.raises(InferenceError, match="'x'"):
        eng.load()
    with _gpu_engine(dynamic_path, "fp32", cache_dir=tmp_path, shapes={"x": [3, 4]}) as eng:
        assert eng.inputs[0].shape == (3, 4)
        x = rand(3, 4, seed=8)
        np.testing.assert_allclose(
            eng.infer({"x": x})["y"], reference(dynamic_path, {"x": x})["y"], **GPU_TOL["fp32"]
        )
        with pytest.raises(InferenceError, match="dimension 0 is 5"):
            eng.infer({"x": rand(5, 4)})


@needs_gpu
def test_gpu_int8_runs_a_qdq_model(tmp_path):
    path = save(qdq_conv_model(), tmp_path / "qdq.onnx")
    x = rand(1, 4, 8, 8, seed=6, scale=1.0)
    with _gpu_engine(path, "int8", cache_dir=tmp_path) as eng:
        got = eng.infer({"x": x})["y"]
    np.testing.assert_allclose(got, reference(path, {"x": x})["y"], rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------- on a Jetson


@needs_dla
def test_dla_reports_fallback_layers_and_matches_cpu(tmp_path):
    path = save(dla_fallback_model(), tmp_path / "fallback.onnx")
    x = rand(1, 4, 8, 8, seed=13, scale=1.0)
    with create_engine("dla", path, precision="fp16", cache_dir=tmp_path) as eng:
        d = eng.describe()
        out = eng.infer({"x": x})
    assert d["backend"] == "tensorrt" and d["dla_core"] == 0
    assert d["fallback_layers"], "ArgMax (TopK) cannot run on the DLA and must fall back"
    assert out["idx"].dtype == np.int64 and out["idx"].shape == (1, 1, 8, 8)
    np.testing.assert_allclose(out["y"], reference(path, {"x": x})["y"], rtol=5e-2, atol=5e-2)
    with create_engine("dla", path, precision="fp16", cache_dir=tmp_path) as again:
        d2 = again.describe()
    assert d2["cache_hit"] is True and d2["fallback_layers"] == d["fallback_layers"]
    with pytest.raises(InferenceError, match="cannot run on the DLA"):
        create_engine(
            "dla", path, precision="fp16", cache_dir=tmp_path / "strict", allow_gpu_fallback=False
        ).load()


@needs_dla
def test_dla_core_index_is_checked(residual_path, tmp_path):
    with pytest.raises(InferenceError, match="DLA core 7 does not exist"):
        create_engine(
            "dla", residual_path, precision="fp16", device_index=7, cache_dir=tmp_path
        ).load()
