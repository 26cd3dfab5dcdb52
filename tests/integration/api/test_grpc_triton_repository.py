"""A Triton model repository (two models with config.pbtxt) served by ``infscaler serve
REPO`` answers Triton's own gRPC client on the gRPC socket beside the HTTP one
(``svc.sock`` -> ``svc-grpc.sock``): readiness, the repository index, metadata and
config of each model, and inference bit-exact with onnxruntime on the same model files
(``add`` batched and ``mm`` at its latest version)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

tg = pytest.importorskip("tritonclient.grpc")

from tests.helpers import rand  # noqa: E402
from tests.integration.cli.test_triton_repository import _ort, _repository, _Serve  # noqa: E402


def _infer(c, model: str, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict:
    inputs = []
    for name, arr in feeds.items():
        i = tg.InferInput(name, list(arr.shape), "FP32")
        i.set_data_from_numpy(arr)
        inputs.append(i)
    r = c.infer(model, inputs, outputs=[tg.InferRequestedOutput(o) for o in outputs])
    return {o: r.as_numpy(o) for o in outputs}


def _check_served_configs(c, http_sock: Path) -> None:
    """ModelConfig is the config.pbtxt as written (batch dim out of dims, instance
    groups, batching, ignored fields too), with Triton's defaults filled; the same over
    HTTP (``GET /v2/models/<m>/config``, int64 as numbers)."""
    import httpx

    add = c.get_model_config("add", as_json=True)["config"]
    assert add["name"] == "add" and add["platform"] == "onnxruntime_onnx"
    assert add["backend"] == "onnxruntime"  # filled
    assert add["max_batch_size"] == 8
    assert [(t["name"], t["dims"]) for t in add["input"]] == [("a", ["4"]), ("b", ["4"])]
    assert add["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]
    assert add["dynamic_batching"]["max_queue_delay_microseconds"] == "1000"
    assert add["optimization"]["graph"]["level"] == 1  # served as written, though ignored
    mm = c.get_model_config("mm", as_json=True)["config"]
    assert (mm["name"], mm["platform"], mm["backend"]) == ("mm", "onnxruntime_onnx", "onnxruntime")
    assert "max_batch_size" not in mm  # 0, as the file left it
    transport = httpx.HTTPTransport(uds=str(http_sock))
    with httpx.Client(transport=transport, base_url="http://infscaler", timeout=30) as h:
        r = h.get("/v2/models/add/config")
        assert r.status_code == 200, r.text
        doc = r.json()
        assert h.get("/v2/models/add/versions/1/config").json() == doc
        assert h.get("/v2/models/nope/config").status_code == 404
    assert doc["name"] == "add" and doc["max_batch_size"] == 8
    assert [(t["name"], t["data_type"], t["dims"]) for t in doc["input"]] == [
        ("a", "TYPE_FP32", [4]),
        ("b", "TYPE_FP32", [4]),
    ]
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
    assert doc["instance_group"] == add["instance_group"]


def test_a_served_triton_repository_answers_tritonclient_grpc(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    serve = _Serve(tmp_path, str(repo))
    try:
        serve.wait_ready()
        grpc_sock = tmp_path / "svc-grpc.sock"
        assert grpc_sock.is_socket(), "".join(serve.lines)
        c = tg.InferenceServerClient(url=f"unix:{grpc_sock}")
        try:
            assert c.is_server_ready()
            assert c.is_model_ready("add") and c.is_model_ready("mm")
            index = c.get_model_repository_index(as_json=True)["models"]
            assert sorted((m["name"], m["state"]) for m in index) == [
                ("add", "READY"),
                ("mm", "READY"),
            ]

            meta = c.get_model_metadata("add", as_json=True)
            assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
                ("a", "FP32", ["-1", "4"]),
                ("b", "FP32", ["-1", "4"]),
            ]
            assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": ["-1", "4"]}]
            cfg = c.get_model_config("mm", as_json=True)["config"]
            assert cfg["name"] == "mm"
            assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]] == [
                ("x", "TYPE_FP32", ["-1", "3"])
            ]
            assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["output"]] == [
                ("z", "TYPE_FP32", ["-1", "2"])
            ]

            _check_served_configs(c, tmp_path / "svc.sock")

            a, b = rand(5, 4, seed=1, scale=3.0), rand(5, 4, seed=2, scale=3.0)
            got = _infer(c, "add", {"a": a, "b": b}, ["y"])["y"]
            (want,) = _ort(repo / "add" / "1" / "model.onnx", {"a": a, "b": b})
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()

            x = rand(7, 3, seed=3, scale=1.0)
            got = _infer(c, "mm", {"x": x}, ["z"])["z"]
            (want,) = _ort(repo / "mm" / "2" / "model.onnx", {"x": x})  # the latest
            (old,) = _ort(repo / "mm" / "1" / "model.onnx", {"x": x})
            assert got.shape == (7, 2) and got.tobytes() == want.tobytes()
            assert got.tobytes() != old.tobytes()
        finally:
            c.close()
    finally:
        serve.stop()
