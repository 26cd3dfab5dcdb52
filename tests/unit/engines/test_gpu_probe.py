"""The gpu / dla provider probe (infscaler.engines.gpu.probe): the real probe on this host
(a subprocess; no CUDA here, so gpu and dla are unavailable with the reason), and its
parsing of the child's output: HERE is this host's output as the child printed it; the
other reports are written in the child's format to cover what a GPU host can print
(a session that started, one that fell back to the CPU EP, a crash, a timeout)."""

from __future__ import annotations

import copy
import json

import pytest

from infscaler.engines import available
from infscaler.engines.gpu import probe as P

HERE = json.loads(
    '{"probe": 1, "onnxruntime": "1.32.0", "onnxruntime_file": "/x/onnxruntime/__init__.py", '
    '"listed": ["AzureExecutionProvider", "CPUExecutionProvider"], "devices": [], '
    '"devices_why": "no CUDA device: the NVIDIA driver library libcuda.so.1 is not loadable '
    '(no NVIDIA GPU driver on this host)", "libnvinfer": [false, "TensorRT\'s libnvinfer is '
    "not loadable (libnvinfer.so.10: cannot open shared object file: No such file or "
    'directory): install TensorRT"], "dla_cores": 0, "sessions": {}, "native": {"devices": [], '
    '"missing": ["tensorrt is not installed (pip install tensorrt, or JetPack\'s '
    'python3-libnvinfer on a Jetson)", "pycuda is not installed (pip install pycuda; it needs '
    'the CUDA toolkit)", "no CUDA device: the NVIDIA driver library libcuda.so.1 is not '
    'loadable (no NVIDIA GPU driver on this host)"]}}'
)
ALL = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
NATIVE_MISSING = {"devices": ["NVIDIA H200"], "missing": ["tensorrt is not installed"]}


def report(**changes: object) -> P.ProviderReport:
    d = copy.deepcopy(HERE)
    d.update(changes)
    return P.parse_probe(json.dumps(d) + "\n", 0)


def test_this_host_reports_gpu_and_dla_unavailable_with_the_reason():
    r = P.probe_providers()  # found before the tests (conftest), from memory here
    assert r.ok, r.error
    backend, why = r.gpu_backend()
    if backend is not None:
        pytest.skip(f"this host has a gpu engine: {why}")
    assert "CUDAExecutionProvider" in why or "no CUDA device" in why
    assert r.dla_backend()[0] is None
    ok, reason = available("gpu")
    assert not ok and reason == why
    assert available("dla") == (False, r.dla_backend()[1])


def test_the_per_host_cache_is_read_without_running_the_child(monkeypatch, tmp_path):
    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(P, "_static_report", lambda: None)  # as on a host with onnxruntime-gpu
    runs = []

    def child() -> P.ProviderReport:
        runs.append(1)
        return report(listed=ALL)

    monkeypatch.setattr(P, "run_probe", child)
    monkeypatch.setattr(P, "_MEMO", None)
    first = P.probe_providers()
    files = list((tmp_path / "probes").glob("providers-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["ok"] is True
    monkeypatch.setattr(P, "_MEMO", None)  # a new process: memory empty, disk kept
    again = P.probe_providers()
    assert runs == [1] and again.data == first.data
    P.probe_providers(refresh=True)
    assert runs == [1, 1]
    monkeypatch.setattr(P, "_MEMO", None)


def test_a_failed_probe_is_not_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(P, "_static_report", lambda: None)
    monkeypatch.setattr(P, "run_probe", lambda: P.parse_probe("", 1, "Segmentation fault"))
    r = P.probe_providers(refresh=True)
    assert not r.ok and "Segmentation fault" in r.error
    assert not list(tmp_path.rglob("providers-*.json"))
    monkeypatch.setattr(P, "_MEMO", None)


def test_cpu_build_of_onnxruntime():
    backend, why = report().gpu_backend()
    assert backend is None
    assert "has no CUDAExecutionProvider (pip install onnxruntime-gpu)" in why
    assert "native TensorRT: tensorrt is not installed" in why


def test_gpu_build_listing_cuda_on_a_host_without_driver_is_unavailable():
    r = report(listed=ALL)  # get_available_providers() lists CUDA, no device: never tried
    backend, why = r.gpu_backend()
    assert backend is None and "no CUDA device" in why
    assert r.dla_backend()[0] is None


def test_cuda_session_that_fell_back_to_cpu_does_not_count():
    r = report(
        listed=ALL, devices=["NVIDIA H200"], native=NATIVE_MISSING,
        sessions={"cuda": {"providers": ["CPUExecutionProvider"], "result_ok": True}},
    )  # fmt: skip
    backend, why = r.gpu_backend()
    assert backend is None
    assert "runs on ['CPUExecutionProvider']" in why


def test_cuda_session_that_failed_says_why():
    r = report(
        listed=ALL, devices=["NVIDIA H200"], native=NATIVE_MISSING,
        sessions={"cuda": {"error": "RuntimeError: libcublasLt.so.13: cannot open"}},
    )  # fmt: skip
    backend, why = r.gpu_backend()
    assert backend is None and "libcublasLt.so.13" in why


def test_cuda_ep_serves_where_libnvinfer_is_missing():
    r = report(
        listed=ALL, devices=["NVIDIA H200"], native=NATIVE_MISSING,
        sessions={"cuda": {"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                           "result_ok": True, "ms": 300.0}},
    )  # fmt: skip
    backend, text = r.gpu_backend()
    assert backend == "onnxruntime-cuda"
    assert "NVIDIA H200" in text and "libnvinfer" in text


def test_tensorrt_ep_is_preferred_and_dla_needs_its_own_session():
    ok = {"providers": ["TensorrtExecutionProvider", "CPUExecutionProvider"], "result_ok": True}
    sessions = {"cuda": {**ok, "providers": ["CUDAExecutionProvider"]}, "tensorrt": ok}
    r = report(listed=ALL, devices=["Orin"], libnvinfer=[True, "libnvinfer.so.10"],
               native=NATIVE_MISSING, sessions=sessions, dla_cores=2)  # fmt: skip
    assert r.gpu_backend()[0] == "onnxruntime-trt"
    backend, why = r.dla_backend()
    assert backend is None and "did not try" in why
    r = report(listed=ALL, devices=["Orin"], libnvinfer=[True, "libnvinfer.so.10"],
               native=NATIVE_MISSING, sessions={**sessions, "tensorrt-dla": ok}, dla_cores=2)  # fmt: skip
    backend, text = r.dla_backend()
    assert backend == "onnxruntime-trt-dla" and "2 DLA core(s)" in text


def test_dla_on_a_discrete_gpu_is_unavailable():
    ok = {"providers": ["TensorrtExecutionProvider"], "result_ok": True}
    r = report(listed=ALL, devices=["NVIDIA H200"], libnvinfer=[True, "libnvinfer.so.10"],
               native=NATIVE_MISSING, sessions={"tensorrt": ok}, dla_cores=0)  # fmt: skip
    backend, why = r.dla_backend()
    assert backend is None and "no DLA cores" in why


def test_native_tensorrt_when_onnxruntime_has_no_trt_ep():
    native = {"devices": ["NVIDIA A100"], "missing": [], "version": "10.3.0", "dla_cores": 0}
    r = report(listed=["CPUExecutionProvider"], devices=["NVIDIA A100"], native=native)
    assert r.gpu_backend() == (
        "tensorrt",
        "TensorRT 10.3.0 on NVIDIA A100 (1 CUDA device(s), pycuda buffers)",
    )
    assert "builder.num_DLA_cores == 0" in r.dla_backend()[1]


@pytest.mark.parametrize(
    ("stdout", "rc", "stderr", "needle"),
    [
        ("", None, "", "did not finish"),
        ("", 1, "ImportError: libcudart.so.13\n", "libcudart.so.13"),
        ("not json at all", 0, "", "printed no JSON"),
        ('{"probe": 99}', 0, "", "unknown report"),
        ("", 0, "", "no output"),
    ],
)
def test_broken_child_output_is_a_reason_not_an_engine(stdout, rc, stderr, needle):
    r = P.parse_probe(stdout, rc, stderr)
    assert not r.ok and needle in r.error
    assert r.gpu_backend() == (None, r.error)
    assert r.dla_backend()[0] is None


def test_probe_key_changes_with_the_library_path(monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/a")
    a = P.probe_key()
    monkeypatch.setenv("LD_LIBRARY_PATH", "/b")
    assert P.probe_key() != a and len(a) == 16
