"""The one engine layer (issue 14): every onnxruntime session is built in
``infscaler/engines/``, one availability probe, one ``EngineUnavailable``.

The source scans cover the installed package (its modules' own files) and the repo's
``bench/`` and ``scripts/``: benchmarks must time what serves. ``tests/`` is exempt: the
tests build independent onnxruntime sessions as oracles for the layer itself (a loader
bug checked against the same loader would be invisible).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import infscaler
import infscaler.ebpf
import infscaler.partitioner
import infscaler.runtime
import infscaler.shm
from infscaler.base.errors import ConfigError, InfScalerError, ModelLoadError
from infscaler.engines import (
    ENGINE_KINDS,
    EngineUnavailable,
    available,
    create_engine,
    engine_availability,
    require_engine,
)
from infscaler.engines.onnxrt.loader import load_session, session_options
from infscaler.partitioner import extract, profiler
from infscaler.partitioner.loader import load_model, random_feeds
from tests import REPO_ROOT

ENGINES_DIR = Path(infscaler.engines.__file__).parent
REPO = REPO_ROOT
GPU_OK, GPU_REASON = available("gpu")

#: calls that only the engine layer makes: building sessions / their options, probing
#: onnxruntime's providers
_LAYER_ONLY_CALLS = ("InferenceSession", "SessionOptions", "get_available_providers")


def _sources() -> list[Path]:
    roots = [
        Path(m.__file__).parent
        for m in (infscaler, infscaler.runtime, infscaler.partitioner, infscaler.shm)
    ]
    roots.append(Path(infscaler.ebpf.__file__).parent)
    roots += [REPO / "bench", REPO / "scripts"]
    files = sorted({p.resolve() for r in roots if r.is_dir() for p in r.rglob("*.py")})
    assert len(files) > 40, files  # the scan sees the package, not an empty folder
    return files


def _calls(path: Path, names: tuple[str, ...]) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in names:
                hits.append(f"{path}:{node.lineno} {name}(")
    return hits


def _in_layer(path: Path) -> bool:
    return ENGINES_DIR.resolve() in path.resolve().parents


#: the one session outside the engine layer, and why: the base (below the engines) turns a
#: bundled test model's constant weights into random ones and scales its logits with one
#: plain CPU run, before any engine, profile or service exists
_OUTSIDE_ALLOWED = {
    ("infscaler/base/models.py", "InferenceSession"),
    # the peer Triton serves in its own virtualenv, where this package is not installed:
    # onnxruntime inside PyTriton's callables, as a Triton user writes them
    ("bench/peers/pytriton_peer.py", "InferenceSession"),
    ("bench/peers/pytriton_peer.py", "SessionOptions"),
}


def _allowed(hit: str) -> bool:
    path, _, call = hit.partition(" ")
    rel = Path(path.split(":")[0]).resolve().relative_to(REPO).as_posix()
    return (rel, call.rstrip("(")) in _OUTSIDE_ALLOWED


def test_sessions_are_built_only_in_the_engine_layer() -> None:
    outside = [
        hit
        for p in _sources()
        if not _in_layer(p)
        for hit in _calls(p, _LAYER_ONLY_CALLS)
        if not _allowed(hit)
    ]
    assert outside == [], "build sessions with infscaler.engines.onnxrt:\n" + "\n".join(outside)
    inside = [hit for p in ENGINES_DIR.rglob("*.py") for hit in _calls(p, ("InferenceSession",))]
    assert len(inside) == 1 and "onnxrt/loader.py" in inside[0], inside  # the one loader


def test_one_engine_unavailable_class_and_no_second_probe() -> None:
    """No module but the engine layer defines an engine-unavailable error or an engine
    availability function."""
    found = []
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text())):
            name = getattr(node, "name", "")
            if isinstance(node, ast.ClassDef) and "engineunavailable" in name.lower():
                found.append(f"{p}: class {name}")
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                k in name.lower() for k in ("available_engines", "engine_unavailable")
            ):
                found.append(f"{p}: def {name}")
    assert [f for f in found if "infscaler/engines/base.py: class EngineUnavailable" not in f] == []
    assert any("class EngineUnavailable" in f for f in found)
    assert issubclass(EngineUnavailable, InfScalerError)
    assert not hasattr(profiler, "EngineUnavailableError")
    assert not hasattr(profiler, "available_engines")


def test_engine_layer_imports_only_base_modules() -> None:
    """infscaler/engines/ imports infscaler.base.errors / device / config / procutil (how
    its provider probe starts its child) and itself only, so the partitioner can use it as
    a base-layer service."""
    allowed = (
        "infscaler.base.errors",
        "infscaler.base.device",
        "infscaler.base.config",
        "infscaler.base.procutil",
    )
    bad = []
    for p in sorted(ENGINES_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            mods = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            for m in mods:
                if m.startswith("infscaler") and not (
                    m in allowed or m.startswith("infscaler.engines")
                ):
                    bad.append(f"{p.relative_to(ENGINES_DIR)}:{node.lineno} {m}")
    assert bad == []


def test_availability_is_one_probe() -> None:
    assert engine_availability() == {k: available(k) for k in ENGINE_KINDS}
    ok, reason = available("cpu")
    assert ok and "onnxruntime" in reason
    assert available("npu") == (False, available("npu")[1])
    assert "unknown engine" in available("npu")[1]
    with pytest.raises(ConfigError, match="unknown engine kind"):
        require_engine("npu")
    require_engine("cpu")  # no error
    assert profiler.profiled_engines()["cpu"] == "onnxruntime-cpu"


@pytest.mark.skipif(GPU_OK, reason="this host has the gpu engine (the negative case)")
def test_missing_gpu_is_one_error_with_one_reason(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_matmul_model(), str(path))
    ok, reason = available("gpu")
    assert not ok and reason
    raised = []
    with pytest.raises(EngineUnavailable) as exc:
        require_engine("gpu")
    raised.append(exc.value)
    with pytest.raises(EngineUnavailable) as exc:
        create_engine("gpu", path).load()
    raised.append(exc.value)
    with pytest.raises(EngineUnavailable) as exc:
        load_session(path, engine="gpu")
    raised.append(exc.value)
    with pytest.raises(EngineUnavailable) as exc:
        profiler.measure_latency(str(path), {"x": np.ones((2, 3), np.float32)}, engine="gpu")
    raised.append(exc.value)
    for err in raised:
        assert reason in str(err) and err.hint  # the probe's reason and what to do
    assert len({str(e) for e in raised}) == 1


def _matmul_model() -> onnx.ModelProto:
    """y = relu(x @ W + b): x float32 [N, 3], W [3, 4], b [4]."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    b = np.array([-1.0, 0.0, 0.5, 1.0], np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
            helper.make_node("Add", ["m", "b"], ["a"], name="add"),
            helper.make_node("Relu", ["a"], ["y"], name="relu"),
        ],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _expected(x: np.ndarray) -> np.ndarray:
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    return np.maximum(x @ w + np.array([-1.0, 0.0, 0.5, 1.0], np.float32), 0)


def test_loader_runs_a_model_from_bytes_proto_and_path(tmp_path: Path) -> None:
    model = _matmul_model()
    path = tmp_path / "mm.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    for source in (model, model.SerializeToString(), path, str(path)):
        sess = load_session(source, threads=1)
        assert sess.get_providers() == ["CPUExecutionProvider"]
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], _expected(x), rtol=1e-5)
    # the defaults are the cpu engine's: threads, sequential, no spinning, all optimisations
    opts = load_session(path, threads=2).get_session_options()
    assert opts.intra_op_num_threads == 2 and opts.inter_op_num_threads == 1
    assert opts.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with create_engine("cpu", path, threads=2) as eng:
        assert eng.describe()["session_intra_op_threads"] == 2
        np.testing.assert_allclose(eng.infer({"x": x})["y"], _expected(x), rtol=1e-5)
    # what verification needs: no graph optimisation, onnxruntime's thread defaults
    opts = load_session(path, threads=None, optimization="none").get_session_options()
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def test_loader_external_data_folder(tmp_path: Path) -> None:
    """Bytes whose weights are referenced from a folder (the partitioner's stubs)."""
    model = _matmul_model()
    onnx.save_model(
        model,
        str(tmp_path / "mm.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="mm.data",
        size_threshold=0,
    )
    data = (tmp_path / "mm.onnx").read_bytes()
    x = np.ones((2, 3), np.float32)
    sess = load_session(data, external_data_folder=tmp_path)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _expected(x), rtol=1e-5)
    with pytest.raises(ModelLoadError):  # the references resolve against the folder only
        load_session(data, external_data_folder=tmp_path / "elsewhere")


def test_loader_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not a readable ONNX model") as exc:
        load_session(b"not an onnx model")
    assert exc.value.hint
    with pytest.raises(ConfigError, match="optimisation level"):
        session_options(1, optimization="fastest")
    with pytest.raises(ConfigError, match="threads"):
        session_options(0)
    with pytest.raises(ConfigError, match="unknown engine kind"):
        load_session(_matmul_model(), engine="npu")


def test_partitioner_builds_every_session_through_the_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Profiling, latency (B_k), boundary overhead and chain verification: every
    InferenceSession is constructed by onnxrt/loader.py, and the timed ones with the cpu
    engine's options."""
    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path / "cache"))
    built: list[tuple[str, str, str]] = []
    real = ort.InferenceSession

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            caller = inspect.stack()[1].filename
            super().__init__(*args, **kwargs)
            so = self.get_session_options()
            built.append(
                (
                    caller,
                    str(so.graph_optimization_level),
                    so.get_session_config_entry("session.intra_op.allow_spinning")
                    if so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                    else "",
                )
            )

    monkeypatch.setattr(ort, "InferenceSession", Recording)
    path = tmp_path / "mm.onnx"
    onnx.save(_matmul_model(), str(path))
    loaded = load_model(path, {"x": [4, 3]})
    feeds = random_feeds({"x": loaded.tensors["x"]}, seed=0)
    prof = profiler.profile_model(
        loaded.model, feeds, model_sha256=loaded.sha256, warmup=0, repeats=1, threads=1,
        cache=False,
    )  # fmt: skip
    assert prof.provider == "CPUExecutionProvider" and set(prof.node_ms) == {"mm", "add", "relu"}
    ms, out = profiler.measure_latency(str(path), feeds, warmup=0, repeats=1, threads=1)
    np.testing.assert_allclose(out["y"], _expected(feeds["x"]), rtol=1e-5)
    profiler.measure_boundary_overhead(tensor_bytes=64, repeats=1, cache=False)
    extract.verify_chain(loaded, [loaded.model], feeds=feeds, report_optimized=False)
    assert len(built) >= 6
    layer = str(ENGINES_DIR / "onnxrt" / "loader.py")
    assert {c for c, _, _ in built} == {layer}
    # the timed sessions (all optimisations) are the serving cpu engine's: no spinning
    timed = [spin for _, level, spin in built if spin]
    assert timed and set(timed) == {"0"}
