"""The binary tensor data path without extra copies: the client sends a large body in
zero-copy pieces with a Content-Length, the server reads it into one buffer of that
length and decodes the inputs as views of it; limits and broken bodies fail alone."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from infscaler.api.client import Client
from infscaler.api.codec import (
    HEADER_LENGTH,
    decode_infer_request,
    encode_infer_request,
    tensor_from_bytes,
    tensor_to_bytes,
)


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


class _Content:
    def __init__(self, chunks: list[bytes | Exception]) -> None:
        self.chunks = list(chunks)  # a copy: parametrized lists are shared between runs

    async def readany(self) -> bytes:
        item = self.chunks.pop(0) if self.chunks else b""
        if isinstance(item, Exception):
            raise item
        return item


class _Request:
    """What read_body uses of an aiohttp request."""

    def __init__(self, length: int, chunks: list[bytes | Exception], max_mb: int = 4) -> None:
        from infscaler.api.common import MAX_BODY as _MAX_BODY

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
@pytest.mark.parametrize("binary", [False, True])
def test_read_body_errors_are_bad_requests(
    length: int, chunks: list, fragment: str, binary: bool
) -> None:
    import asyncio

    from aiohttp import web

    from infscaler.api.routes import read_body

    with pytest.raises(web.HTTPBadRequest) as e:
        asyncio.run(read_body(_Request(length, chunks), binary=binary))  # type: ignore[arg-type]
    assert fragment in e.value.reason


def test_read_body_fills_one_buffer_and_checks_the_limit() -> None:
    import asyncio

    from aiohttp import web

    from infscaler.api.routes import read_body

    body = asyncio.run(read_body(_Request(6, [b"ab", b"cde", b"f"])))  # type: ignore[arg-type]
    assert isinstance(body, bytearray) and body == b"abcdef"
    # binary tensor data: a buffer not zeroed first, every byte written, as a memoryview
    body = asyncio.run(read_body(_Request(6, [b"ab", b"cde", b"f"]), binary=True))  # type: ignore[arg-type]
    assert isinstance(body, memoryview) and len(body) == 6 and body.tobytes() == b"abcdef"
    with pytest.raises(web.HTTPRequestEntityTooLarge):
        asyncio.run(read_body(_Request((1 << 20) + 1, [], max_mb=1)))  # type: ignore[arg-type]
