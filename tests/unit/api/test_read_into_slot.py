"""Binary tensor data read straight into the request's first pool slot
(``routes.read_into_slot``): the JSON part first, then each input's bytes into its place
in the lent slot, in whatever chunks they arrive; a body that ends early, a lost
connection or a request that does not decode gives the slot back and fails as before;
without a slot (or for inputs it does not take) the body is read into one buffer."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from infscaler.api.codec import HEADER_LENGTH, ProtocolError, TensorSpec, encode_infer_request
from infscaler.api.common import LIMITS, MAX_BODY, SHM_VIEW
from infscaler.api.routes import read_into_slot


class _Content:
    def __init__(self, chunks: list[Any]) -> None:
        self.chunks = list(chunks)

    async def readany(self) -> bytes:
        item = self.chunks.pop(0) if self.chunks else b""
        if isinstance(item, Exception):
            raise item
        return item


class _Request(dict):
    """What read_into_slot uses of an aiohttp request."""

    def __init__(self, length: int, chunks: list[Any]) -> None:
        super().__init__({SHM_VIEW: object()})
        self.content_length = length
        self.can_read_body = True
        self.app = {MAX_BODY: 16, LIMITS: SimpleNamespace(max_json_mb=1.0)}
        self.content = _Content(chunks)


class _Slot:
    """A lent slot: one buffer per input, released at most once."""

    def __init__(self, inputs: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
        self.buffers = {
            n: np.full(int(np.prod(shape)) * dtype.itemsize, 0xEE, np.uint8)
            for n, (shape, dtype) in inputs.items()
        }
        self.views = {n: memoryview(b) for n, b in self.buffers.items()}
        self.released = 0

    def release(self) -> None:
        self.released += 1


class _Lender:
    def __init__(self, give: bool = True) -> None:
        self.give, self.slots, self.asked = give, [], []

    def __call__(self, inputs: dict[str, Any]) -> _Slot | None:
        self.asked.append({n: (tuple(s), d) for n, (s, d) in inputs.items()})
        if not self.give:
            return None
        slot = _Slot(inputs)
        self.slots.append(slot)
        return slot


def _body(**tensors: np.ndarray) -> tuple[bytes, int]:
    body, headers = encode_infer_request(tensors)
    return body, int(headers[HEADER_LENGTH])


def _chunks(body: bytes, sizes: list[int]) -> list[bytes]:
    out, pos = [], 0
    for n in sizes:
        out.append(body[pos : pos + n])
        pos += n
    if pos < len(body):
        out.append(body[pos:])
    return out


A = np.arange(12, dtype=np.float32).reshape(3, 4)
B = np.arange(5, dtype=np.int64)
SPECS = [TensorSpec("a", "FP32", [3, 4]), TensorSpec("b", "INT64", [-1])]


@pytest.mark.parametrize("sizes", [[7], [1, 1, 1], [10**6], [3, 50, 2, 1, 40]])
def test_inputs_land_in_the_slot_in_any_chunking(sizes: list[int]) -> None:
    body, hl = _body(a=A, b=B)
    lend = _Lender()
    req, slot = asyncio.run(
        read_into_slot(_Request(len(body), _chunks(body, sizes)), SPECS, hl, lend)  # type: ignore[arg-type]
    )
    assert slot is lend.slots[0] and slot.released == 0
    assert lend.asked == [{"a": ((3, 4), np.dtype("<f4")), "b": ((5,), np.dtype("<i8"))}]
    np.testing.assert_array_equal(req.inputs["a"], A)
    np.testing.assert_array_equal(req.inputs["b"], B)
    # the inputs are the slot's bytes, not a copy
    assert np.shares_memory(req.inputs["a"], slot.buffers["a"])
    assert np.shares_memory(req.inputs["b"], slot.buffers["b"])
    assert slot.buffers["a"].tobytes() == A.tobytes()


@pytest.mark.parametrize(
    "cut, tail, fragment",
    [
        (250, [], "ended after 250 of its Content-Length"),
        (250, [ConnectionResetError("Connection lost")], "lost after 250 of the body's"),
    ],
)
def test_a_body_cut_short_gives_the_slot_back(cut: int, tail: list, fragment: str) -> None:
    body, hl = _body(a=A, b=B)
    assert hl < cut < len(body)
    lend = _Lender()
    with pytest.raises(web.HTTPBadRequest) as e:
        asyncio.run(
            read_into_slot(_Request(len(body), [body[:cut], *tail]), SPECS, hl, lend)  # type: ignore[arg-type]
        )
    assert fragment in e.value.reason
    assert [s.released for s in lend.slots] == [1]


def test_a_request_that_does_not_decode_gives_the_slot_back() -> None:
    body, hl = _body(a=A, b=B)
    lend = _Lender()
    specs = [TensorSpec("a", "FP32", [4, 3]), TensorSpec("b", "INT64", [-1])]
    with pytest.raises(ProtocolError, match="does not match the model"):
        asyncio.run(read_into_slot(_Request(len(body), [body]), specs, hl, lend))  # type: ignore[arg-type]
    assert [s.released for s in lend.slots] == [1]


def test_without_a_slot_the_body_is_read_into_one_buffer() -> None:
    body, hl = _body(a=A, b=B)
    lend = _Lender(give=False)
    req, slot = asyncio.run(
        read_into_slot(_Request(len(body), _chunks(body, [5, 90])), SPECS, hl, lend)  # type: ignore[arg-type]
    )
    assert slot is None and len(lend.asked) == 1
    np.testing.assert_array_equal(req.inputs["a"], A)
    np.testing.assert_array_equal(req.inputs["b"], B)


def test_inputs_it_does_not_take_are_decoded_as_before() -> None:
    # BOOL (decoding normalises its bytes) never goes to a slot; neither does a body
    # whose sizes do not add up (decoding refuses it, as before)
    flags = np.array([True, False, True])
    body, hl = _body(a=A, f=flags)
    lend = _Lender()
    specs = [TensorSpec("a", "FP32", [3, 4]), TensorSpec("f", "BOOL", [3])]
    req, slot = asyncio.run(read_into_slot(_Request(len(body), [body]), specs, hl, lend))  # type: ignore[arg-type]
    assert slot is None and lend.asked == []
    np.testing.assert_array_equal(req.inputs["f"], flags)
    body, hl = _body(a=A, b=B)
    with pytest.raises(ProtocolError, match="not claimed"):
        asyncio.run(read_into_slot(_Request(len(body) + 8, [body, b"x" * 8]), SPECS, hl, lend))  # type: ignore[arg-type]
    assert lend.asked == []


def test_bodies_it_does_not_take_are_left_unread() -> None:
    body, hl = _body(a=A, b=B)
    lend = _Lender()
    request = _Request(len(body), [body])
    request.app[LIMITS] = SimpleNamespace(max_json_mb=hl / 2 / (1 << 20))  # JSON over its limit
    assert asyncio.run(read_into_slot(request, SPECS, hl, lend)) is None  # type: ignore[arg-type]
    request = _Request(len(body), [body])
    request.content_length = None  # chunked
    assert asyncio.run(read_into_slot(request, SPECS, hl, lend)) is None  # type: ignore[arg-type]
    assert request.content.chunks == [body] and lend.asked == []
