"""The Python client (infscaler.api.client): request formation and response parsing against an
in-process fake of the service (httpx.MockTransport), and the real Unix socket transport
against a small aiohttp server (web.UnixSite) that echoes through the codec."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import numpy as np
import pytest
from aiohttp import web

from infscaler.api.client import (
    DEFAULT_SOCKET,
    Client,
    InferenceServerError,
    ShmOutput,
    ShmTensor,
    default_socket_path,
)
from infscaler.api.codec import (
    HEADER_LENGTH,
    ProtocolError,
    TensorSpec,
    decode_infer_request,
    encode_infer_response,
)
from infscaler.api.sysshm import SharedMemoryRegion, SystemSharedMemoryRegistry
from infscaler.base.errors import InfScalerError

# -- an in-process fake of the service ------------------------------------------------------


class FakeService:
    """Just enough of the service's REST behaviour: models ``echo`` (outputs = inputs) and
    ``cold`` (not ready); a real shm registry; every request recorded."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.shm = SystemSharedMemoryRegistry()
        self.loaded: dict[str, Any] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        try:
            return self.route(request)
        except ProtocolError as exc:
            return httpx.Response(exc.status, json={"error": str(exc)})

    def route(self, r: httpx.Request) -> httpx.Response:
        m, path = r.method, unquote(r.url.raw_path.decode())
        ok = lambda data: httpx.Response(200, json=data)  # noqa: E731
        if m == "GET" and path == "/v2":
            return ok(
                {"name": "infscaler", "version": "0.1.0", "extensions": ["binary_tensor_data"]}
            )
        if m == "GET" and path == "/v2/health/live":
            return ok({"live": True})
        if m == "GET" and path == "/v2/health/ready":
            return httpx.Response(503, json={"error": "not ready: pipelines are not ready"})
        if m == "GET" and path == "/v2/models":
            return ok(
                {"models": [{"name": "echo", "ready": True}, {"name": "cold", "ready": False}]}
            )
        if m == "GET" and path == "/v2/models/stats":
            return ok({"model_stats": [{"name": "echo"}, {"name": "cold"}]})
        if m == "GET" and path == "/v2/infscaler/status":
            return ok({"control_path": {"kind": "userspace"}, "pipelines": []})
        if m == "POST" and path == "/v2/repository/index":
            return httpx.Response(
                200, json=[{"name": "echo", "version": "1", "state": "READY", "reason": ""}]
            )
        if path == "/v2/systemsharedmemory/status":
            return ok(self.shm.status())
        if path == "/v2/systemsharedmemory/unregister":
            self.shm.unregister()
            return ok({})
        if mm := re.fullmatch(
            r"/v2/systemsharedmemory/region/([^/]+)/(status|register|unregister)", path
        ):
            name, op = mm.group(1), mm.group(2)
            if op == "status":
                return ok(self.shm.status(name))
            if op == "register":
                d = json.loads(r.content)
                self.shm.register(name, d["key"], d["offset"], d["byte_size"])
            else:
                self.shm.unregister(name)
            return ok({})
        if mm := re.fullmatch(r"/v2/repository/models/([^/]+)/(load|unload)", path):
            name = mm.group(1)
            if mm.group(2) == "load":
                self.loaded[name] = json.loads(json.loads(r.content)["parameters"]["config"])
                return ok({"name": name, "loaded": True, "seconds": 0.5})
            if name not in self.loaded:
                return httpx.Response(404, json={"error": f"unknown model {name}"})
            del self.loaded[name]
            return ok({"name": name, "unloaded": True})
        mm = re.fullmatch(r"/v2/models/([^/]+)(/ready|/infer|/stats)?", path)
        if not mm or mm.group(1) not in ("echo", "cold", "a b"):
            return httpx.Response(404, json={"error": f"unknown model {path.split('/')[3]}"})
        name, op = mm.group(1), mm.group(2)
        if op is None:
            return ok({"name": name, "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}]})
        if op == "/ready":
            return (
                ok({"ready": True})
                if name != "cold"
                else httpx.Response(503, json={"error": "not ready"})
            )
        if op == "/stats":
            return ok({"model_stats": [{"name": name}]})
        h = r.headers.get(HEADER_LENGTH)
        req = decode_infer_request(r.content, header_length=int(h) if h else None, shm=self.shm)
        body, headers = encode_infer_response(
            model_name=name,
            request_id=req.id,
            outputs=req.inputs,
            requested=req.outputs,
            binary_default=req.binary_output_default,
            parameters={"latency_ms": 1.25, "echo_params": json.dumps(req.parameters)},
            shm=self.shm,
        )
        return httpx.Response(200, content=body, headers=headers)


@pytest.fixture
def fake() -> Iterator[FakeService]:
    f = FakeService()
    yield f
    f.shm.close()


@pytest.fixture
def client(fake: FakeService) -> Iterator[Client]:
    with Client("/run/fake.sock", transport=httpx.MockTransport(fake)) as c:
        yield c


@pytest.fixture
def shm_key() -> Iterator[str]:
    key = f"/infscaler-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield key
    with contextlib.suppress(FileNotFoundError):
        os.unlink("/dev/shm" + key)


def last_json(fake: FakeService) -> dict[str, Any]:
    r = fake.requests[-1]
    h = r.headers.get(HEADER_LENGTH)
    return json.loads(r.content[: int(h)] if h else r.content)


# -- MockTransport: requests and responses -------------------------------------------------


def test_health_metadata_and_models(client: Client, fake: FakeService) -> None:
    assert client.is_live() is True
    assert client.is_ready() is False  # 503
    assert client.server_metadata()["name"] == "infscaler"
    assert [m["name"] for m in client.models()] == ["echo", "cold"]
    assert client.model_metadata("echo")["inputs"][0]["datatype"] == "FP32"
    assert client.model_ready("echo") is True
    assert client.model_ready("cold") is False
    with pytest.raises(InferenceServerError) as ei:
        client.model_ready("nope")
    assert ei.value.status == 404 and ei.value.message == "unknown model nope"
    assert [(r.method, r.url.path) for r in fake.requests[:3]] == [
        ("GET", "/v2/health/live"),
        ("GET", "/v2/health/ready"),
        ("GET", "/v2"),
    ]


def test_infer_binary_request_and_response(client: Client, fake: FakeService) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = np.array(["h\u00e9llo", "w"])
    res = client.infer("echo", {"x": x, "t": t}, request_id="r-1", parameters={"timeout_ms": 250})
    r = fake.requests[-1]
    assert r.method == "POST" and r.url.path == "/v2/models/echo/infer"
    assert r.headers["Content-Type"] == "application/octet-stream"
    hl = int(r.headers[HEADER_LENGTH])
    doc = json.loads(r.content[:hl])
    assert doc["id"] == "r-1"
    assert doc["parameters"] == {"timeout_ms": 250, "binary_data_output": True}
    assert doc["inputs"][0] == {
        "name": "x",
        "datatype": "FP32",
        "shape": [3, 4],
        "parameters": {"binary_data_size": 48},
    }
    assert r.content[hl : hl + 48] == x.tobytes()
    assert "outputs" not in doc
    assert res.model_name == "echo" and res.id == "r-1"
    assert res.outputs["x"].dtype == np.float32 and np.array_equal(res.outputs["x"], x)
    assert res.outputs["t"].tolist() == ["h\u00e9llo", "w"]  # BYTES decoded to str
    assert res.parameters["latency_ms"] == 1.25
    assert json.loads(res.parameters["echo_params"])["timeout_ms"] == 250
    assert res.as_numpy("x") is res.outputs["x"] and res.as_numpy("zz") is None


def test_infer_json_and_bytes_decoding(client: Client, fake: FakeService) -> None:
    b = np.array([b"\xff\x00", b"ok"], dtype=object)
    res = client.infer("echo", {"i": np.array([[1, -2]], np.int8), "b": b}, binary=False)
    r = fake.requests[-1]
    doc = json.loads(r.content[: int(r.headers[HEADER_LENGTH])])  # non-UTF-8 BYTES forced binary
    assert doc["inputs"][0]["data"] == [1, -2]
    assert doc["parameters"] == {"binary_data_output": False}
    assert res.outputs["i"].tolist() == [[1, -2]]
    assert res.outputs["b"].tolist() == [b"\xff\x00", "ok"]  # invalid UTF-8 stays bytes
    res = client.infer("echo", {"b": b}, decode_bytes=False)
    assert res.outputs["b"].tolist() == [b"\xff\x00", b"ok"]
    res = client.infer("echo", {"f": np.float16(1.5) * np.ones(2, np.float16)}, binary=False)
    r = fake.requests[-1]
    assert r.headers["Content-Type"] == "application/json" and HEADER_LENGTH not in r.headers
    assert res.outputs["f"].dtype == np.float16


def test_infer_selects_outputs(client: Client, fake: FakeService) -> None:
    ins = {"a": np.zeros(2, np.int32), "b": np.ones(2, np.int32), "c": np.full(2, 2, np.int32)}
    res = client.infer("echo", ins, outputs=["c", "a"])
    assert last_json(fake)["outputs"] == [
        {"name": "c", "parameters": {"binary_data": True}},
        {"name": "a", "parameters": {"binary_data": True}},
    ]
    assert list(res.outputs) == ["c", "a"]
    res = client.infer("echo", ins, outputs="b", binary=False)
    assert last_json(fake)["outputs"] == [{"name": "b", "parameters": {"binary_data": False}}]
    assert list(res.outputs) == ["b"]
    with pytest.raises(InfScalerError, match=r"outputs\['a'\] must be a ShmOutput or None"):
        client.infer("echo", ins, outputs={"a": 3})
    with pytest.raises(InferenceServerError, match=r"unknown output\(s\) \['zz'\]") as ei:
        client.infer("echo", ins, outputs=["zz"])
    assert ei.value.status == 400


def test_infer_through_shared_memory(client: Client, fake: FakeService, shm_key: str) -> None:
    x = np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32)
    with SharedMemoryRegion.create(shm_key, 1024) as region:
        n = region.set(x)
        client.register_system_shm("in", shm_key, 512)
        client.register_system_shm("out", shm_key, 512, offset=512)
        assert json.loads(fake.requests[-1].content) == {
            "key": shm_key,
            "offset": 512,
            "byte_size": 512,
        }
        assert fake.requests[-1].url.path == "/v2/systemsharedmemory/region/out/register"
        assert [s["name"] for s in client.system_shm_status()] == ["in", "out"]
        assert client.system_shm_status("out") == [
            {"name": "out", "key": shm_key, "offset": 512, "byte_size": 512}
        ]
        res = client.infer(
            "echo",
            {"x": ShmTensor("in", "FP32", [2, 8], n), "y": np.arange(3, dtype=np.uint8)},
            outputs={"x": ShmOutput("out", 256, offset=16), "y": None},
        )
        doc = last_json(fake)
        assert doc["inputs"][0]["parameters"] == {
            "shared_memory_region": "in",
            "shared_memory_offset": 0,
            "shared_memory_byte_size": 64,
        }
        assert doc["outputs"][0] == {
            "name": "x",
            "parameters": {
                "shared_memory_region": "out",
                "shared_memory_offset": 16,
                "shared_memory_byte_size": 256,
            },
        }
        assert list(res.outputs) == ["y"]
        assert res.shm_outputs["x"]["shared_memory_byte_size"] == 64
        assert res.shm_outputs["x"]["shape"] == [2, 8]
        assert region.get(np.float32, [2, 8], offset=512 + 16).tobytes() == x.tobytes()
        with pytest.raises(InferenceServerError) as ei:
            client.system_shm_status("nope")
        assert ei.value.status == 404
        with pytest.raises(InferenceServerError, match="already registered") as ei:
            client.register_system_shm("in", shm_key, 16)
        assert ei.value.status == 400
        client.unregister_system_shm("in")
        assert fake.requests[-1].url.path == "/v2/systemsharedmemory/region/in/unregister"
        client.unregister_system_shm()
        assert fake.requests[-1].url.path == "/v2/systemsharedmemory/unregister"
        assert client.system_shm_status() == []


def test_stats_status_repository(client: Client, fake: FakeService, tmp_path: Path) -> None:
    assert client.stats()["model_stats"][1]["name"] == "cold"
    assert fake.requests[-1].url.path == "/v2/models/stats"
    assert client.stats("echo") == {"model_stats": [{"name": "echo"}]}
    assert fake.requests[-1].url.path == "/v2/models/echo/stats"
    assert client.status()["control_path"]["kind"] == "userspace"
    assert client.repository_index()[0]["state"] == "READY"
    assert fake.requests[-1].method == "POST"

    cfg = {"name": "p", "stages": [{"name": "s", "function": "m:f"}]}
    assert client.load("p", cfg) == {"name": "p", "loaded": True, "seconds": 0.5}
    r = fake.requests[-1]
    assert (r.method, r.url.path) == ("POST", "/v2/repository/models/p/load")
    body = json.loads(r.content)
    assert list(body) == ["parameters"] and isinstance(body["parameters"]["config"], str)
    assert fake.loaded["p"] == cfg

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "det.onnx").write_bytes(b"onnx")
    yml = tmp_path / "pipe.yaml"
    yml.write_text(
        "name: q\nstages:\n"
        "  - {name: det, model: models/det.onnx}\n"
        "  - {name: alias, model: ppocrv4-det}\n"
        "  - {name: gone, model: missing.onnx}\n"
    )
    client.load("q", yml)
    stages = fake.loaded["q"]["stages"]
    assert stages[0]["model"] == str((tmp_path / "models" / "det.onnx").resolve())
    assert stages[1]["model"] == "ppocrv4-det" and stages[2]["model"] == "missing.onnx"
    client.load("t", "name: t\nstages: []\n")  # inline YAML text
    assert fake.loaded["t"] == {"name": "t", "stages": []}
    with pytest.raises(InfScalerError, match="pipeline file not found"):
        client.load("x", tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(InfScalerError, match="a pipeline must be a mapping, got list"):
        client.load("x", tmp_path / "list.yaml")

    client.unload("p")
    assert fake.requests[-1].url.path == "/v2/repository/models/p/unload"
    with pytest.raises(InferenceServerError, match="unknown model p"):
        client.unload("p")


def test_model_names_are_url_quoted(client: Client, fake: FakeService) -> None:
    client.model_metadata("a b")
    assert fake.requests[-1].url.raw_path == b"/v2/models/a%20b"


def test_server_errors_become_inference_server_errors() -> None:
    def handler(r: httpx.Request) -> httpx.Response:
        if r.url.path.endswith("/infer"):
            return httpx.Response(413, json={"error": "request body too large"})
        if r.url.path == "/v2/models":
            return httpx.Response(502, text="<html>bad gateway</html>")
        if r.url.path == "/v2":
            return httpx.Response(200, text="not json")
        return httpx.Response(503, json={"error": "overloaded"})

    with Client("/x.sock", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(InferenceServerError) as ei:
            c.infer("m", {"x": np.zeros(1)})
        e = ei.value
        assert e.status == 413 and e.message == "request body too large"
        assert "shared memory" in e.hint and isinstance(e, InfScalerError)
        with pytest.raises(InferenceServerError) as ei:
            c.models()
        assert ei.value.status == 502 and ei.value.message == "<html>bad gateway</html>"
        with pytest.raises(InferenceServerError) as ei:
            c.stats("m")
        assert ei.value.status == 503 and "retry later" in str(ei.value)
        with pytest.raises(InfScalerError, match="something that is not JSON"):
            c.server_metadata()


@pytest.mark.parametrize(
    "exc, message",
    [
        (httpx.ReadTimeout("timed out"), "did not answer POST /v2/models/m/infer within 60 s"),
        (
            httpx.RemoteProtocolError("Server disconnected"),
            "lost the connection to the InfScaler service at /x.sock",
        ),
    ],
)
def test_transport_failures(exc: Exception, message: str) -> None:
    def handler(r: httpx.Request) -> httpx.Response:
        raise exc

    with Client("/x.sock", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(InfScalerError, match=re.escape(message)):
            c.infer("m", {"x": np.zeros(1)})
        assert c.is_live() is False


def test_malformed_infer_response() -> None:
    def handler(r: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=b'{"outputs":[{"name":"y","datatype":"FP32","shape":[2],"data":[1]}]}'
        )

    with (
        Client("/x.sock", transport=httpx.MockTransport(handler)) as c,
        pytest.raises(
            InfScalerError, match="malformed inference response.*has 2 elements but the data has 1"
        ),
    ):
        c.infer("m", {"x": np.zeros(1)})


def test_default_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFSCALER_SOCKET", raising=False)
    assert default_socket_path() == DEFAULT_SOCKET == "/run/infscaler/infscaler.sock"
    with Client() as c:
        assert c.socket_path == DEFAULT_SOCKET
    monkeypatch.setenv("INFSCALER_SOCKET", "/tmp/elsewhere.sock")
    with Client() as c:
        assert c.socket_path == "/tmp/elsewhere.sock"


# -- the real Unix socket transport ---------------------------------------------------------


def short_socket_path(tmp_path: Path) -> str:
    p = str(tmp_path / "s.sock")
    if len(p) < 100:  # sun_path is 108 bytes
        return p
    return os.path.join(tempfile.mkdtemp(prefix="isc-t"), "s.sock")


@pytest.fixture
def uds_server(tmp_path: Path) -> Iterator[str]:
    """An aiohttp server on a Unix socket: /v2/health/live, the shm register endpoint, and
    /v2/models/{name}/infer echoing inputs through the codec (model 'strict' checks specs)."""
    sock = short_socket_path(tmp_path)
    registry = SystemSharedMemoryRegistry()

    async def live(request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def register(request: web.Request) -> web.Response:
        d = await request.json()
        try:
            registry.register(request.match_info["name"], d["key"], d["offset"], d["byte_size"])
        except ProtocolError as exc:
            return web.json_response({"error": str(exc)}, status=exc.status)
        return web.json_response({})

    async def infer(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        specs = [TensorSpec("x", "FP32", [-1, 2])] if name == "strict" else None
        body = await request.read()
        h = request.headers.get(HEADER_LENGTH)
        try:
            req = decode_infer_request(
                body, header_length=int(h) if h else None, input_specs=specs, shm=registry
            )
            out, headers = encode_infer_response(
                model_name=name,
                request_id=req.id,
                outputs=req.inputs,
                requested=req.outputs,
                binary_default=req.binary_output_default,
                shm=registry,
            )
        except ProtocolError as exc:
            return web.json_response({"error": str(exc)}, status=exc.status)
        return web.Response(body=out, headers=headers)

    app = web.Application()
    app.router.add_get("/v2/health/live", live)
    app.router.add_post("/v2/systemsharedmemory/region/{name}/register", register)
    app.router.add_post("/v2/models/{name}/infer", infer)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.UnixSite(runner, sock).start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10), "the test server did not start"
    yield sock
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    registry.close()


def test_real_unix_socket_roundtrip(uds_server: str, shm_key: str) -> None:
    ins = {
        "f": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3),
        "h": np.array([0.5, -2], np.float16),
        "u": np.array([[2**64 - 1]], np.uint64),
        "b": np.array([True, False]),
        "s": np.array(["\u00e9", "plain"]),
        "z": np.zeros((0, 2), np.int16),
        "k": np.array(7, np.int32),
    }
    with Client(uds_server, timeout=10) as c:
        assert c.is_live() is True
        for binary in (True, False):
            res = c.infer("echo", ins, binary=binary, request_id=f"b{binary}")
            assert res.id == f"b{binary}" and list(res.outputs) == list(ins)
            for k, a in ins.items():
                got = res.outputs[k]
                assert got.shape == a.shape
                if k == "s":
                    assert got.tolist() == a.tolist()
                else:
                    assert got.dtype == a.dtype and got.tobytes() == a.tobytes()
        # a big binary tensor through the socket
        big = np.random.default_rng(3).integers(0, 255, (480, 640, 3), dtype=np.uint8)
        assert np.array_equal(c.infer("echo", {"image": big}).outputs["image"], big)
        # shared memory in and out
        x = np.arange(10, dtype=np.float64).reshape(5, 2)
        with SharedMemoryRegion.create(shm_key, 4096) as region:
            n = region.set(x)
            c.register_system_shm("r", shm_key, 4096)
            res = c.infer(
                "echo",
                {"x": ShmTensor("r", "FP64", [5, 2], n)},
                outputs={"x": ShmOutput("r", 2048, 2048)},
            )
            assert res.outputs == {} and res.shm_outputs["x"]["shared_memory_byte_size"] == 80
            assert region.get("FP64", [5, 2], offset=2048).tobytes() == x.tobytes()
            with pytest.raises(InferenceServerError, match="already registered"):
                c.register_system_shm("r", shm_key, 16)
        # the server's validation errors arrive as InferenceServerError with its message
        with pytest.raises(InferenceServerError) as ei:
            c.infer("strict", {"x": np.zeros((2, 3), np.float32)})
        assert ei.value.status == 400
        assert (
            ei.value.message
            == "input 'x': shape [2, 3] does not match the model's [-1, 2] (-1: any size)"
        )
        assert c.infer("strict", {"x": np.ones((4, 2), np.float32)}).outputs["x"].shape == (4, 2)
        with pytest.raises(InferenceServerError) as ei:
            c.models()  # not served by this small server
        assert ei.value.status == 404


def test_missing_socket_gives_a_clear_error(tmp_path: Path) -> None:
    sock = tmp_path / "nobody.sock"
    with Client(sock, timeout=5) as c:
        assert c.is_live() is False and c.is_ready() is False
        with pytest.raises(InfScalerError) as ei:
            c.models()
    e = ei.value
    assert not isinstance(e, InferenceServerError)
    assert e.message == f"cannot connect to the InfScaler service at {sock}: no socket there"
    assert (
        e.hint == "start it with `infscaler serve` (or systemctl start infscaler), or pass --socket"
    )
    assert "Hint: start it with `infscaler serve`" in str(e)


def test_stale_socket_and_not_a_socket(tmp_path: Path) -> None:
    import socket

    stale = short_socket_path(tmp_path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)  # bound, never listening: connection refused
    try:
        with (
            Client(stale, timeout=5) as c,
            pytest.raises(
                InfScalerError, match="cannot connect to the InfScaler service at .*(refused|Errno)"
            ),
        ):
            c.status()
    finally:
        s.close()
    plain = tmp_path / "plain"
    plain.write_text("")
    with (
        Client(plain, timeout=5) as c,
        pytest.raises(InfScalerError, match="the path exists but is not a socket") as ei,
    ):
        c.status()
    assert "--socket" in ei.value.hint
