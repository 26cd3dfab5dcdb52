"""The client (:class:`~infscaler.api.client.Client`) against a tiny asyncio HTTP server
on a real Unix socket in this process: status codes, Content-Length, chunked and
read-to-close bodies, the error JSON, a dead socket, a path that is no socket, a
timeout, a connection closed before or during an answer, binary tensor data both ways."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from infscaler.api.client import Client, InferenceServerError
from infscaler.api.codec import decode_infer_request, encode_infer_response
from infscaler.base.errors import InfScalerError

#: path -> the raw answer bytes (or a callable of the request's (head, body))
Routes = dict[str, "bytes | Callable[[bytes, bytes], bytes]"]


def _answer(status: str, body: bytes, headers: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode() + body


def _chunked(body: bytes, size: int = 7) -> bytes:
    chunks = b"".join(
        f"{len(body[i : i + size]):x};ext=1\r\n".encode() + body[i : i + size] + b"\r\n"
        for i in range(0, len(body), size)
    )
    return (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\nX-T: 1\r\n\r\n"
    )


def _infer(head: bytes, body: bytes) -> bytes:
    """Decode the request as the server does; answer y = x * 2 in binary."""
    hl = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"inference-header-content-length")
    )
    req = decode_infer_request(body, header_length=hl)
    x = req.inputs["x"]
    words = np.array([b"caf\xc3\xa9", b"\xff"], dtype=object)
    out, headers = encode_infer_response(
        model_name="m",
        request_id=None,
        outputs={"y": x * 2, "w": words},
        requested=None,
        binary_default=True,
        parameters={"latency_ms": 1.5, **(req.parameters or {})},
    )
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return _answer("200 OK", out, extra)


ROUTES: Routes = {
    "/v2/infscaler/status": _answer("200 OK", b'{"pipelines": []}'),
    "/v2/models/m": _chunked(json.dumps({"name": "m", "inputs": []}).encode()),
    "/v2/models/nope": _answer("404 Not Found", b'{"error": "unknown model nope"}'),
    "/v2/models/plain": _answer("500 Internal Server Error", b"it broke\n"),
    "/v2/models/empty": _answer("503 Service Unavailable", b""),
    "/v2/models/close": b"HTTP/1.1 200 OK\r\n\r\n" + b'{"to": "close"}',
    "/v2/models/short": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}",
    "/v2/models/garbage": b"SSH-2.0-OpenSSH\r\n\r\n",
    "/v2/models/m/infer": _infer,
    "/v2/health/live": _answer("200 OK", b""),
    "/v2/health/ready": _answer("503 Service Unavailable", b'{"error": "not ready"}'),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = str(tmp_path_factory.mktemp("uds") / "api.sock")
    seen: list[bytes] = []
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = await r.readuntil(b"\r\n\r\n")
        seen.append(head)
        n = next(
            (
                int(ln.split(b":")[1])
                for ln in head.split(b"\r\n")
                if ln.lower().startswith(b"content-length")
            ),
            0,
        )
        body = await r.readexactly(n)
        target = head.split(b" ")[1].decode()
        if target == "/v2/models/slow":
            await asyncio.sleep(2)
        if target == "/v2/models/hangup":
            w.close()
            return
        ans = ROUTES.get(target, _answer("404 Not Found", b'{"error": "no route"}'))
        w.write(ans(head, body) if callable(ans) else ans)
        await w.drain()
        w.close()

    async def main() -> None:
        srv = await asyncio.start_unix_server(handle, path)
        started.set()
        async with srv:
            await srv.serve_forever()

    task = loop.create_task(main())

    def run() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(5)
    yield path
    loop.call_soon_threadsafe(task.cancel)
    t.join(5)
    loop.close()


def test_json_by_content_length_and_chunked(server: str) -> None:
    c = Client(server)
    assert c.status() == {"pipelines": []}
    assert c.model_metadata("m") == {"name": "m", "inputs": []}  # chunked, with a trailer
    assert c.request("GET", "/v2/models/close").json() == {"to": "close"}  # read to the end


def test_error_json_and_plain_error_bodies(server: str) -> None:
    c = Client(server)
    with pytest.raises(InferenceServerError) as e:
        c.model_metadata("nope")
    assert e.value.status == 404 and e.value.message == "unknown model nope"
    with pytest.raises(InferenceServerError) as e:
        c.model_metadata("plain")
    assert e.value.status == 500 and e.value.message == "it broke"
    with pytest.raises(InferenceServerError) as e:
        c.model_metadata("empty")
    assert e.value.status == 503 and e.value.message == "HTTP 503 Service Unavailable"
    assert e.value.hint and "retry" in e.value.hint


def test_probes(server: str) -> None:
    c = Client(server)
    assert c.is_live() is True
    assert c.is_ready() is False


def test_broken_answers_are_lost_connections(server: str) -> None:
    c = Client(server)
    for name in ("short", "garbage", "hangup"):
        with pytest.raises(InfScalerError) as e:
            c.model_metadata(name)
        assert not isinstance(e.value, InferenceServerError)
        assert "lost the connection" in e.value.message, name
        assert f"GET /v2/models/{name}" in e.value.message, name


def test_timeout(server: str) -> None:
    with pytest.raises(InfScalerError) as e:
        Client(server, timeout=0.2).model_metadata("slow")
    assert "did not answer GET /v2/models/slow within 0.2 s" in e.value.message


def test_binary_infer_round_trip(server: str) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    res = Client(server).infer("m", {"x": x}, parameters={"latency_ms": 5.0})
    np.testing.assert_array_equal(res.outputs["y"], x * 2)
    assert res.outputs["y"].dtype == np.float32
    assert res.outputs["w"].tolist() == ["café", b"\xff"]  # UTF-8 where valid
    assert res.parameters["latency_ms"] == 5.0


def test_large_body_in_parts(server: str) -> None:
    x = np.random.default_rng(0).random((1, 3, 256, 256), dtype=np.float32)  # 768 KiB
    res = Client(server).infer("m", {"x": x})
    np.testing.assert_array_equal(res.outputs["y"], x * 2)


def test_no_socket_dead_socket_and_not_a_socket(tmp_path: Path) -> None:
    with pytest.raises(InfScalerError) as e:
        Client(tmp_path / "none.sock").status()
    assert "no socket there" in e.value.message and "infscaler serve" in (e.value.hint or "")
    dead = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(dead))
    s.close()  # the file stays; nothing listens
    with pytest.raises(InfScalerError) as e:
        Client(dead).status()
    assert "Connection refused" in e.value.message and "infscaler serve" in (e.value.hint or "")
    plain = tmp_path / "file"
    plain.write_text("x")
    with pytest.raises(InfScalerError) as e:
        Client(plain).status()
    assert "not a socket" in e.value.message and "--socket" in (e.value.hint or "")
