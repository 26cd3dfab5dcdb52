"""The v2 API over a Unix socket: a real Service and server, the real Client, function-
stage pipelines (the OCR pipeline on real models is in test_serve_ocr.py)."""

from __future__ import annotations

import json
import os
import stat
import sys

import httpx
import numpy as np
import pytest

from infscaler.api.client import Client, InferenceServerError, ShmOutput, ShmTensor
from infscaler.api.server import ServerThread
from infscaler.api.sysshm import SharedMemoryRegion
from infscaler.base.config import load_pipeline
from infscaler.base.errors import InfScalerError
from infscaler.base.security import SecurityPolicy
from infscaler.service.service import Service
from tests import TESTS_DIR

HERE = TESTS_DIR  # tests/: stagefuncs.py

CHAIN = {
    "name": "chain",
    "description": "x * 2 + 1",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": ["z"],
    "stages": [
        {"name": "scale", "function": "stagefuncs:scale", "inputs": ["x"], "outputs": ["y"]},
        {"name": "add", "function": "stagefuncs:add_one", "inputs": ["y"], "outputs": ["z"]},
    ],
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """One service + server for the module (userspace channel: the eBPF path is covered
    by test_runtime.py; the API does not depend on it)."""
    tmp = tmp_path_factory.mktemp("api")
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{HERE}{os.pathsep}{old}" if old else str(HERE)
    # and here: the deploy loads the function stages in this process too (run alone, no
    # earlier test had put tests/ on sys.path)
    sys.path.insert(0, str(HERE))
    sock = tmp / "api.sock"
    try:
        with Service(state_dir=tmp / "state", control_path="userspace", pool_mb=64) as svc:
            svc.deploy(load_pipeline(CHAIN))
            policy = SecurityPolicy.create(allow_functions=["stagefuncs"])
            with ServerThread(svc, sock, max_body_mb=1, security=policy):
                yield svc, str(sock)
    finally:
        os.environ["PYTHONPATH"] = old
        sys.path.remove(str(HERE))


@pytest.fixture
def client(served):
    with Client(served[1]) as c:
        yield c


def raw(served, method: str, path: str, **kw) -> httpx.Response:
    transport = httpx.HTTPTransport(uds=served[1])
    with httpx.Client(transport=transport, base_url="http://infscaler", timeout=30) as h:
        return h.request(method, path, **kw)


def test_socket_mode_health_and_metadata(served, client: Client) -> None:
    mode = stat.S_IMODE(os.stat(served[1]).st_mode)
    assert mode == 0o660
    assert client.is_live() and client.is_ready()
    meta = client.server_metadata()
    assert (
        "system_shared_memory" in meta["extensions"] and "binary_tensor_data" in meta["extensions"]
    )
    models = client.models()
    assert [m["name"] for m in models] == ["chain"] and models[0]["ready"]
    md = client.model_metadata("chain")
    assert md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert [o["name"] for o in md["outputs"]] == ["z"]
    assert client.model_ready("chain")


@pytest.mark.parametrize("binary", [True, False])
def test_infer_json_and_binary(client: Client, binary: bool) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    res = client.infer("chain", {"x": x}, binary=binary)
    np.testing.assert_array_equal(res.outputs["z"], x * 2 + 1)
    assert float(res.parameters["latency_ms"]) > 0
    assert set(res.unit_ms) == {"scale", "add"}
    assert all(isinstance(res.parameters[f"unit_ms.{u}"], float) for u in ("scale", "add"))
    assert "unit_ms" not in res.parameters


def test_infer_through_system_shared_memory(served, client: Client) -> None:
    x = np.random.default_rng(1).random((3, 4), dtype=np.float32)
    key_in, key_out = f"isc_test_in_{os.getpid()}", f"isc_test_out_{os.getpid()}"
    with (
        SharedMemoryRegion.create(key_in, x.nbytes) as rin,
        SharedMemoryRegion.create(key_out, x.nbytes) as rout,
    ):
        rin.set(x)
        client.register_system_shm("in", key_in, x.nbytes)
        client.register_system_shm("out", key_out, x.nbytes)
        try:
            res = client.infer(
                "chain",
                {"x": ShmTensor("in", "FP32", [3, 4], x.nbytes)},
                outputs={"z": ShmOutput("out", x.nbytes)},
            )
            assert "z" in res.shm_outputs and "z" not in res.outputs
            np.testing.assert_array_equal(rout.get(np.float32, (3, 4)), x * 2 + 1)
            names = {r["name"] for r in client.system_shm_status()}
            assert {"in", "out"} <= names
        finally:
            client.unregister_system_shm()
    assert client.system_shm_status() == []


@pytest.mark.parametrize(
    "path, body, headers, status, fragment",
    [
        ("/v2/models/nope/infer", b"{}", {}, 404, "unknown model 'nope'"),
        ("/v2/models/chain/infer", b"{not json", {}, 400, "JSON"),
        (
            "/v2/models/chain/infer",
            json.dumps(
                {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}
            ).encode(),
            {},
            400,
            "shape",
        ),
        (
            "/v2/models/chain/infer",
            json.dumps(
                {
                    "inputs": [
                        {"name": "x", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]}
                    ]
                }
            ).encode(),
            {},
            400,
            "datatype",
        ),
        (
            "/v2/models/chain/infer",
            json.dumps(
                {
                    "inputs": [
                        {"name": "q", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
                    ]
                }
            ).encode(),
            {},
            400,
            "q",
        ),
        (
            "/v2/models/chain/infer",
            b"{}",
            {"Inference-Header-Content-Length": "abc"},
            400,
            "integer",
        ),
        ("/v2/models/chain/infer", b"x" * (2 << 20), {}, 413, "too large"),
        (
            "/v2/systemsharedmemory/region/r/register",
            b'{"key": "nope_missing", "byte_size": 8}',
            {},
            400,
            "nope_missing",
        ),
        ("/v2/repository/models/x/load", b"{}", {}, 400, "parameters.config"),
    ],
)
def test_bad_requests_get_v2_errors_and_the_server_stays_up(
    served, client: Client, path: str, body: bytes, headers: dict, status: int, fragment: str
) -> None:
    r = raw(served, "POST", path, content=body, headers=headers)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert fragment in err, err
    # the server and the pipeline still answer
    res = client.infer("chain", {"x": np.ones((1, 4), np.float32)})
    np.testing.assert_array_equal(res.outputs["z"], 3.0)


def test_unknown_routes_and_models(served, client: Client) -> None:
    assert raw(served, "GET", "/v2/models/nope").status_code == 404
    assert raw(served, "GET", "/v2/nothing/here").status_code == 404
    with pytest.raises(InferenceServerError) as exc:
        client.infer("nope", {"x": np.ones((1, 4), np.float32)})
    assert exc.value.status == 404


def test_statistics_and_status(served, client: Client) -> None:
    for _ in range(5):
        client.infer("chain", {"x": np.ones((1, 4), np.float32)})
    from tests.helpers import wait_for

    def counted() -> dict | None:  # instances report their executions when idle
        got = client.stats("chain")["model_stats"][0]
        return got if got["inference_count"] >= 5 else None

    st = wait_for(counted, 20.0, "5 inferences counted")
    assert st["name"] == "chain" and st["execution_count"] == st["inference_count"]
    assert st["inference_stats"]["success"]["count"] >= 5
    assert (
        st["latency_ms"]["p50_ms"] > 0 and st["latency_ms"]["p99_ms"] >= st["latency_ms"]["p50_ms"]
    )
    assert [u["unit"] for u in st["units"]] == ["scale", "add"]
    assert all(u["instances"] and u["instances"][0]["pid"] > 0 for u in st["units"])
    allstats = client.stats()["model_stats"]
    assert [s["name"] for s in allstats] == ["chain"]
    status = client.status()
    assert status["control_path"]["kind"] == "userspace"
    assert status["pool"]["cap_mb"] == 64 and status["pool"]["slots_in_use"] >= 0
    assert status["pipelines"][0]["units"][0]["instances"][0]["cores"]


def test_repository_load_replace_unload(served, client: Client) -> None:
    d = dict(CHAIN, name="other")
    res = client.load("second", d)
    assert res["loaded"]
    assert {m["name"] for m in client.models()} == {"chain", "second"}
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(client.infer("second", {"x": x}).outputs["z"], 3.0)
    # reload with another pipeline under the same name: the new one answers
    d2 = dict(CHAIN, outputs=["y"], stages=CHAIN["stages"][:1])
    client.load("second", d2)
    np.testing.assert_array_equal(client.infer("second", {"x": x}).outputs["y"], 2.0)
    index = {m["name"]: m["state"] for m in client.repository_index()}
    assert index == {"chain": "READY", "second": "READY"}
    client.unload("second")
    assert [m["name"] for m in client.models()] == ["chain"]
    with pytest.raises(InferenceServerError) as exc:
        client.load("bad", {"stages": [{"name": "s", "function": "nope"}]})
    assert exc.value.status == 400 and "module:callable" in str(exc.value)
    assert [m["name"] for m in client.models()] == ["chain"]


def test_second_server_on_the_same_socket_is_refused(served) -> None:
    with pytest.raises(InfScalerError, match="another InfScaler service is listening"):
        ServerThread(served[0], served[1]).start()
