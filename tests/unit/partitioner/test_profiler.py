"""Tests of infscaler.partitioner.profiler (per-node times, T_o, T_p, caching)."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from infscaler.base.errors import InfScalerError, ModelLoadError
from infscaler.base.models import resolve_model
from infscaler.engines import EngineUnavailable, available
from infscaler.partitioner import ortrace, profiler
from infscaler.partitioner.loader import load_model, random_feeds
from infscaler.partitioner.ortrace import node_times_from_trace
from infscaler.partitioner.profiler import (
    BoundaryOverhead,
    ModelProfile,
    host_description,
    host_fingerprint,
    measure_boundary_overhead,
    profile_cache_path,
    profile_model,
    profiled_engines,
)

GPU_OK, GPU_REASON = available("gpu")


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path / "cache"))


def _conv_model(hw: int | None = 16) -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Add(skip) -> GlobalAveragePool; input x: 1x4xHxW."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 8, 3, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["a"], name="add"),
        helper.make_node("GlobalAveragePool", ["a"], ["y"], name="gap"),
    ]
    dims = [1, 4, hw, hw] if hw else [1, 4, "H", "W"]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _feeds(hw: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).random((1, 4, hw, hw), dtype=np.float32)}


def test_profiled_engines_on_this_host():
    """The profiler's engines are the engine layer's: the backend that serves each."""
    engines = profiled_engines()
    assert engines["cpu"] == "onnxruntime-cpu"
    assert list(engines) == ["cpu", "gpu", "dla"]
    for kind, backend in engines.items():
        assert (backend is not None) == available(kind)[0]
    if engines["gpu"] is None:
        assert "CUDAExecutionProvider" in available("gpu")[1]
    assert "unknown engine" in available("npu")[1]


def test_host_fingerprint_and_description():
    fp = host_fingerprint()
    assert fp == host_fingerprint() and len(fp) == 12
    desc = host_description()
    assert desc["fingerprint"] == fp
    assert desc["onnxruntime"] == onnxruntime.__version__
    assert "CPUExecutionProvider" in desc["providers"]
    assert desc["cores"] >= 1 and desc["cpu_model"]


def test_profile_small_model_nodes_and_totals():
    model = _conv_model(32)
    prof = profile_model(model, _feeds(32), model_sha256="ab" * 32, warmup=1, repeats=3)
    assert set(prof.node_ms) == {"conv1", "relu1", "conv2", "add", "gap"}
    assert all(v >= 0 for v in prof.node_ms.values())
    assert prof.node_ms["conv1"] > 0 and prof.node_ms["conv2"] > 0
    assert prof.total_ms > 0 and prof.unoptimized_total_ms > 0
    assert prof.unoptimized_total_ms >= max(prof.node_ms.values())
    assert prof.unmatched_ms == {}
    assert prof.engine == "cpu" and prof.provider == "CPUExecutionProvider"
    assert prof.host == host_fingerprint()
    assert prof.input_shapes == {"x": (1, 4, 32, 32)}
    assert (prof.warmup, prof.repeats) == (1, 3) and prof.threads >= 1
    assert ModelProfile.from_dict(json.loads(json.dumps(prof.to_dict()))) == prof


def test_profile_from_path_and_trace_deleted(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    onnx.save(_conv_model(8), str(path))
    monkeypatch.setattr(ortrace.tempfile, "tempdir", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    prof = profile_model(path, _feeds(8), model_sha256="cd" * 32, warmup=0, repeats=2, cache=False)
    assert prof.node_ms["conv1"] > 0
    assert list((tmp_path / "t").iterdir()) == []  # the trace and its directory are gone


def test_profile_keeps_the_runs_outputs_but_never_caches_them(tmp_path):
    model, feeds = _conv_model(16), _feeds(16)
    prof = profile_model(model, feeds, model_sha256="ab" * 32, warmup=1, repeats=2)
    assert set(prof.outputs) == {"unoptimized", "optimized"}
    for optimized in (False, True):
        so = onnxruntime.SessionOptions()
        so.graph_optimization_level = (
            onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
            if optimized
            else onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        )
        so.intra_op_num_threads = prof.threads
        sess = onnxruntime.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        got = prof.outputs["optimized" if optimized else "unoptimized"]["y"]
        np.testing.assert_array_equal(got, sess.run(["y"], feeds)[0])
    d = prof.to_dict()
    assert "outputs" not in d and ModelProfile.from_dict(json.loads(json.dumps(d))) == prof
    cached = profile_model(model, feeds, model_sha256="ab" * 32, warmup=1, repeats=2)
    assert cached.outputs is None and cached == prof

    # a stub of a loaded model (weights read from its file), node names given
    big = numpy_helper.from_array(np.full((64, 4, 3, 3), 0.01, np.float32), "big")  # 9 KiB
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "big"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"], name="relu"),
        ],
        "stubbed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 8, 8])],
        initializer=[big],
    )
    path = tmp_path / "stubbed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    loaded = load_model(path)
    assert set(loaded.weight_refs) == {"big"}
    stub = loaded.stub()
    names = [n.name for n in loaded.model.graph.node]
    kw = {"model_sha256": loaded.sha256, "warmup": 0, "repeats": 1, "cache": False}
    a = profile_model(stub, _feeds(8), **kw)
    b = profile_model(stub, _feeds(8), node_names=names, **kw)
    assert set(a.node_ms) == set(b.node_ms) == {"conv", "relu"}
    assert a.node_ms["conv"] > 0


def test_cache_reused_without_session(monkeypatch):
    model, feeds = _conv_model(16), _feeds(16)
    first = profile_model(model, feeds, model_sha256="ef" * 32, warmup=1, repeats=2)
    path = profile_cache_path("ef" * 32, "cpu", feeds, warmup=1, repeats=2)
    assert path.is_file() and path.name.startswith("ef" * 8 + "-cpu-" + host_fingerprint())

    def boom(*args, **kwargs):
        raise AssertionError("a session was created although the profile is cached")

    monkeypatch.setattr(onnxruntime, "InferenceSession", boom)
    second = profile_model(model, feeds, model_sha256="ef" * 32, warmup=1, repeats=2)
    assert second == first
    with pytest.raises(InfScalerError, match="session was created"):
        profile_model(model, feeds, model_sha256="ef" * 32, warmup=1, repeats=2, cache=False)


def test_cache_false_remeasures(monkeypatch):
    model, feeds = _conv_model(16), _feeds(16)
    profile_model(model, feeds, model_sha256="12" * 32, warmup=0, repeats=2)
    created = []
    real = onnxruntime.InferenceSession

    def counting(*args, **kwargs):
        created.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", counting)
    prof = profile_model(model, feeds, model_sha256="12" * 32, warmup=0, repeats=2, cache=False)
    assert len(created) == 2  # profiling session + T_o session
    assert prof.node_ms["conv1"] > 0


def test_cache_key_changes_with_shape_and_settings():
    kw = {"warmup": 0, "repeats": 1}
    a = profile_cache_path("34" * 32, "cpu", _feeds(8), **kw)
    b = profile_cache_path("34" * 32, "cpu", _feeds(16), **kw)
    c = profile_cache_path("34" * 32, "cpu", _feeds(8), warmup=0, repeats=2)
    d = profile_cache_path("34" * 32, "cpu", {"x": _feeds(8)["x"].astype(np.float16)}, **kw)
    assert len({a, b, c, d}) == 4
    model = _conv_model(None)  # dynamic H, W
    p8 = profile_model(model, _feeds(8), model_sha256="34" * 32, warmup=0, repeats=1)
    p16 = profile_model(model, _feeds(16), model_sha256="34" * 32, warmup=0, repeats=1)
    assert p8.input_shapes["x"] == (1, 4, 8, 8) and p16.input_shapes["x"] == (1, 4, 16, 16)
    assert a.is_file() and b.is_file()


def test_corrupt_cache_is_remeasured():
    model, feeds = _conv_model(8), _feeds(8)
    path = profile_cache_path("56" * 32, "cpu", feeds, warmup=0, repeats=1)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    prof = profile_model(model, feeds, model_sha256="56" * 32, warmup=0, repeats=1)
    assert prof.node_ms["conv1"] > 0
    assert ModelProfile.from_dict(json.loads(path.read_text())) == prof


def test_bad_feeds_and_settings_raise_user_errors():
    model = _conv_model(8)
    with pytest.raises(InfScalerError, match="could not run"):
        profile_model(model, {"x": np.zeros((1, 3, 8, 8), np.float32)}, model_sha256="0" * 64)
    with pytest.raises(InfScalerError, match="repeats"):
        profile_model(model, _feeds(8), model_sha256="0" * 64, repeats=0)


@pytest.mark.skipif(GPU_OK, reason="this host has the gpu engine")
def test_gpu_engine_unavailable_names_what_is_missing():
    with pytest.raises(EngineUnavailable) as exc:
        profile_model(_conv_model(8), _feeds(8), engine="gpu", model_sha256="0" * 64)
    assert GPU_REASON in str(exc.value)  # the engine layer's one reason
    assert "CUDAExecutionProvider" in str(exc.value)
    with pytest.raises(EngineUnavailable):
        measure_boundary_overhead(engine="gpu")
    with pytest.raises(EngineUnavailable):
        profiler.measure_latency(_conv_model(8), _feeds(8), engine="gpu")


@pytest.mark.skipif(available("dla")[0], reason="this host is a Jetson with DLA cores")
def test_dla_engine_unavailable():
    with pytest.raises(EngineUnavailable, match="DLA"):
        profile_model(_conv_model(8), _feeds(8), engine="dla", model_sha256="0" * 64)


def test_unknown_engine_is_a_config_error():
    with pytest.raises(InfScalerError, match="unknown engine kind 'npu'"):
        profile_model(_conv_model(8), _feeds(8), engine="npu", model_sha256="0" * 64)


@pytest.mark.skipif(not GPU_OK, reason=f"no gpu engine: {GPU_REASON}")
def test_gpu_profile():
    prof = profile_model(
        _conv_model(32), _feeds(32), engine="gpu", model_sha256="78" * 32, warmup=2, repeats=3
    )
    assert set(prof.node_ms) == {"conv1", "relu1", "conv2", "add", "gap"}
    assert prof.provider in ("CUDAExecutionProvider", "TensorRT")
    assert prof.total_ms > 0


def _ev(name, ts, dur, cat="Node"):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "ph": "X", "args": {}}


def test_node_times_from_trace_skips_warmup_runs():
    events = [
        _ev("model_loading_array", 0, 5, "Session"),
        # warm-up run: slow
        _ev("model_run", 100, 1000, "Session"),
        _ev("a_kernel_time", 110, 900),
        _ev("b_kernel_time", 1010, 50),
        # measured runs
        _ev("model_run", 2000, 100, "Session"),
        _ev("a_kernel_time", 2010, 10),
        _ev("b_kernel_time", 2030, 20),
        _ev("b_kernel_time", 2060, 20),  # b runs twice in this run: summed
        _ev("model_run", 3000, 100, "Session"),
        _ev("a_kernel_time", 3010, 30),
        _ev("fused_trt_kernel_time", 3050, 6),
        _ev("model_run", 4000, 100, "Session"),
        _ev("a_kernel_time", 4010, 20),
        _ev("b_kernel_time", 4030, 60),
    ]
    node_ms, unmatched, totals = node_times_from_trace(events, ["a", "b", "c"], skip_runs=1)
    assert node_ms["a"] == pytest.approx(0.020)  # median(10, 30, 20) µs
    assert node_ms["b"] == pytest.approx(0.040)  # median(40, 0, 60) µs
    assert node_ms["c"] == 0.0
    assert unmatched == {"fused_trt": pytest.approx(0.0)}  # median(0, 6, 0)
    assert totals == pytest.approx([0.050, 0.036, 0.080])


def test_node_times_from_trace_without_run_events():
    events = [_ev("a_kernel_time", t, d) for t, d in [(0, 500), (10, 2), (20, 4), (30, 6)]]
    node_ms, _, totals = node_times_from_trace(events, ["a"], skip_runs=1)
    assert node_ms["a"] == pytest.approx(0.004)
    assert len(totals) == 3


def test_boundary_overhead():
    bo = measure_boundary_overhead(tensor_bytes=1 << 20, repeats=10)
    assert bo.fixed_ms > 0 and bo.per_mb_ms >= 0
    sizes = [0, 1_000, 1_000_000, 10_000_000, 100_000_000]
    values = [bo.ms(n) for n in sizes]
    assert values == sorted(values) and values[0] == pytest.approx(bo.fixed_ms)
    assert BoundaryOverhead.from_dict(json.loads(json.dumps(bo.to_dict()))) == bo
    assert bo.engine == "cpu" and bo.host == host_fingerprint() and bo.tensor_bytes == 1 << 20


def test_boundary_overhead_cached(monkeypatch):
    first = measure_boundary_overhead(tensor_bytes=1 << 16, repeats=5)

    def boom(*args, **kwargs):
        raise AssertionError("session created")

    monkeypatch.setattr(onnxruntime, "InferenceSession", boom)
    assert measure_boundary_overhead(tensor_bytes=1 << 16, repeats=5) == first
    with pytest.raises(InfScalerError, match="session created"):
        measure_boundary_overhead(tensor_bytes=1 << 16, repeats=5, cache=False)


def test_boundary_ms_formula():
    bo = BoundaryOverhead(fixed_ms=0.5, per_mb_ms=2.0)
    assert bo.ms(0) == 0.5 and bo.ms(3_000_000) == pytest.approx(6.5)


@pytest.mark.parametrize("alias", ["squeezenet", "shufflenet"])
def test_real_models(alias):
    lm = load_model(resolve_model(alias))
    feeds = random_feeds({n: lm.tensors[n] for n in lm.graph_inputs})
    prof = profile_model(lm.model, feeds, model_sha256=lm.sha256, warmup=1, repeats=2)
    names = [n.name for n in lm.model.graph.node]
    assert list(prof.node_ms) == names
    assert all(v >= 0 for v in prof.node_ms.values())
    convs = [n.name for n in lm.model.graph.node if n.op_type == "Conv"]
    assert convs and all(prof.node_ms[c] > 0 for c in convs)
    assert prof.total_ms > 0
    assert prof.unoptimized_total_ms >= sum(prof.node_ms[c] for c in convs) * 0.5
    assert prof.unmatched_ms == {}


def test_measure_corun_compares_copies_at_once_with_one_alone():
    from infscaler.partitioner.profiler import measure_corun

    feeds = _feeds(64)
    # one copy (or fewer cores than 2 x threads): nothing to co-run with
    assert measure_corun(_conv_model(64), feeds, copies=1) == 0.0
    f = measure_corun(_conv_model(64), feeds, threads=1, copies=2, repeats=6)
    assert isinstance(f, float) and f >= 0.0 and math.isfinite(f)
    # a model that cannot run on the feeds fails as measure_latency does
    with pytest.raises(ModelLoadError):
        measure_corun(_conv_model(64), {"x": np.zeros((1, 3, 8, 8), np.float32)}, copies=2)


def test_measure_idle_times_runs_after_each_gap_against_back_to_back():
    from infscaler.partitioner.profiler import measure_idle

    feeds = _feeds(64)
    got = measure_idle(_conv_model(64), feeds, threads=1, gaps_s=(0.004, 0.002), repeats=3)
    # one point per gap, in increasing order, each a factor >= 1 (clamped: noise can
    # make the runs after a gap a little faster than back to back)
    assert [g for g, _ in got] == [0.002, 0.004]
    assert all(f >= 1.0 and math.isfinite(f) for _, f in got)
    for bad in ((), (0.0,), (-1.0, 0.1)):
        with pytest.raises(ValueError, match="gaps_s"):
            measure_idle(_conv_model(64), feeds, gaps_s=bad)
    with pytest.raises(ModelLoadError):
        measure_idle(_conv_model(64), {"x": np.zeros((1, 3, 8, 8), np.float32)}, gaps_s=(0.001,))
