"""The binary tensor data path without extra copies: the client sends a large body in
zero-copy pieces with a Content-Length, the server reads it into one buffer of that
length and decodes the inputs as views of it; limits and broken bodies fail alone."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import httpx
import numpy as np
import pytest

from infscaler.base.config import load_pipeline
from infscaler.client import Client, InferenceServerError
from infscaler.protocol import (
    HEADER_LENGTH,
    decode_infer_request,
    encode_infer_request,
    tensor_from_bytes,
    tensor_to_bytes,
)
from infscaler.server import ServerThread
from infscaler.service import Service

HERE = Path(__file__).parent

CHAIN = {
    "name": "chain",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3, -1, -1]}],
    "outputs": ["z"],
    "stages": [
        {"name": "scale", "function": "stagefuncs:scale", "inputs": ["x"], "outputs": ["y"]},
        {"name": "add", "function": "stagefuncs:add_one", "inputs": ["y"], "outputs": ["z"]},
    ],
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("binary")
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{HERE}{os.pathsep}{old}" if old else str(HERE)
    sock = tmp / "api.sock"
    try:
        with Service(state_dir=tmp / "state", control_path="userspace", pool_mb=64) as svc:
            svc.deploy(load_pipeline(CHAIN))
            with ServerThread(svc, sock, max_body_mb=4):
                yield svc, str(sock)
    finally:
        os.environ["PYTHONPATH"] = old


def test_tensor_from_bytes_copy_or_view() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = bytearray(tensor_to_bytes(a))
    view = tensor_from_bytes(buf, "FP32", [3, 4], copy=False)
    copied = tensor_from_bytes(buf, "FP32", [3, 4])
    np.testing.assert_array_equal(view, a)
    np.testing.assert_array_equal(copied, a)
    assert np.shares_memory(view, np.frombuffer(buf, np.uint8))
    assert not np.shares_memory(copied, np.frombuffer(buf, np.uint8))
    # BOOL and BYTES always build new arrays
    b = tensor_from_bytes(bytearray(b"\x00\x01\x02"), "BOOL", [3], copy=False)
    assert b.tolist() == [False, True, True]


def test_decode_without_copy_views_the_body() -> None:
    x = np.random.default_rng(0).random((2, 3, 8, 8), dtype=np.float32)
    body, headers = encode_infer_request({"x": x})
    owned = bytearray(body)
    req = decode_infer_request(owned, header_length=int(headers[HEADER_LENGTH]), copy=False)
    np.testing.assert_array_equal(req.inputs["x"], x)
    assert np.shares_memory(req.inputs["x"], np.frombuffer(owned, np.uint8))
    req = decode_infer_request(owned, header_length=int(headers[HEADER_LENGTH]))
    assert not np.shares_memory(req.inputs["x"], np.frombuffer(owned, np.uint8))


def test_client_sends_large_bodies_in_pieces_with_a_length() -> None:
    x = np.random.default_rng(1).random((1, 3, 200, 200), dtype=np.float32)  # 480 KB
    seen: dict[str, object] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["headers"] = dict(request.headers)
        seen["body"] = request.read()
        body = json.dumps({"model_name": "m", "outputs": []}).encode()
        return httpx.Response(200, content=body, headers={"Content-Type": "application/json"})

    with Client("/x.sock", transport=httpx.MockTransport(handler)) as c:
        c.infer("m", {"x": x})
    joined, headers = encode_infer_request({"x": x}, binary_output=True)
    assert seen["body"] == joined
    assert seen["headers"]["content-length"] == str(len(joined))
    assert "transfer-encoding" not in seen["headers"]
    assert seen["headers"][HEADER_LENGTH.lower()] == headers[HEADER_LENGTH]


def test_large_binary_round_trip(served) -> None:
    _, sock = served
    x = np.random.default_rng(2).random((1, 3, 320, 320), dtype=np.float32)  # 1.2 MB
    with Client(sock) as c:
        for _ in range(3):
            res = c.infer("chain", {"x": x})
            np.testing.assert_array_equal(res.outputs["z"], x * 2 + 1)
        small = np.ones((1, 3, 2, 2), np.float32)
        np.testing.assert_array_equal(c.infer("chain", {"x": small}).outputs["z"], small * 3)


def test_body_over_the_limit_is_refused_before_reading(served) -> None:
    _, sock = served
    x = np.zeros((1, 3, 640, 640), np.float32)  # 4.9 MB > 4 MB
    with Client(sock) as c:
        with pytest.raises(InferenceServerError) as e:
            c.infer("chain", {"x": x})
        assert e.value.status == 413 and "4 MB" in str(e.value)
        assert c.infer("chain", {"x": np.ones((1, 3, 2, 2), np.float32)}).outputs["z"].shape


def test_truncated_body_fails_alone(served) -> None:
    _, sock = served
    x = np.ones((1, 3, 64, 64), np.float32)
    body, headers = encode_infer_request({"x": x})
    head = (
        "POST /v2/models/chain/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {len(body)}\r\n{HEADER_LENGTH}: {headers[HEADER_LENGTH]}\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(sock)
        s.sendall(head + body[: len(body) // 2])
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    except OSError:
        answer = b""
    finally:
        s.close()
    # either a 400 naming the short body or a closed connection; never a 200
    assert not answer.startswith(b"HTTP/1.1 200"), answer[:200]
    with Client(sock) as c:
        np.testing.assert_array_equal(c.infer("chain", {"x": x}).outputs["z"], x * 3)


class _Content:
    def __init__(self, chunks: list[bytes | Exception]) -> None:
        self.chunks = chunks

    async def readany(self) -> bytes:
        item = self.chunks.pop(0) if self.chunks else b""
        if isinstance(item, Exception):
            raise item
        return item


class _Request:
    """What read_body uses of an aiohttp request."""

    def __init__(self, length: int, chunks: list[bytes | Exception], max_mb: int = 4) -> None:
        from infscaler.server_common import MAX_BODY as _MAX_BODY

        self.content_length = length
        self.can_read_body = True
        self.app = {_MAX_BODY: max_mb}
        self.content = _Content(chunks)


@pytest.mark.parametrize(
    "length, chunks, fragment",
    [
        (10, [b"abcd", ConnectionResetError("Connection lost")], "lost after 4 of the body's 10"),
        (10, [b"abcd"], "ended after 4 of its Content-Length 10"),
        (3, [b"abcd"], "longer than its Content-Length 3"),
    ],
)
def test_read_body_errors_are_bad_requests(length: int, chunks: list, fragment: str) -> None:
    import asyncio

    from aiohttp import web

    from infscaler.server_routes import read_body

    with pytest.raises(web.HTTPBadRequest) as e:
        asyncio.run(read_body(_Request(length, chunks)))  # type: ignore[arg-type]
    assert fragment in e.value.reason


def test_read_body_fills_one_buffer_and_checks_the_limit() -> None:
    import asyncio

    from aiohttp import web

    from infscaler.server_routes import read_body

    body = asyncio.run(read_body(_Request(6, [b"ab", b"cde", b"f"])))  # type: ignore[arg-type]
    assert isinstance(body, bytearray) and body == b"abcdef"
    with pytest.raises(web.HTTPRequestEntityTooLarge):
        asyncio.run(read_body(_Request((1 << 20) + 1, [], max_mb=1)))  # type: ignore[arg-type]
