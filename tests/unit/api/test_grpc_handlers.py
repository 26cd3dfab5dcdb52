"""The gRPC handlers' checks before anything is parsed (infscaler.api.grpc.handlers), on
a fake service: a call of a connection the gate no longer holds (peer uid -1) is
refused but for ServerLive / ServerReady; a control message over the control body
limit is RESOURCE_EXHAUSTED unparsed; bytes protobuf cannot parse are INVALID_ARGUMENT;
ModelInfer reserves what its decode holds beyond twice the message (and that too while
the gate does not), gives it back, and decodes a large message off the event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest

from infscaler.api.codec import ProtocolError
from infscaler.api.grpc import handlers as h
from infscaler.api.grpc.wire import decode_limit, scan_model_infer
from infscaler.base.quotas import PeerQuotas
from infscaler.base.security import Peer
from infscaler.proto import grpc_service_pb2 as pb

NOBODY = Peer(-1, -1, -1)
OTHER = Peer(4321, 65534, 65534)


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class _Context:
    def peer(self) -> str:
        return "unix:/x"

    def time_remaining(self) -> float | None:
        return None

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        raise _Aborted(code, message)


class _Service:
    """The service's surface the handlers use: one pipeline ``m`` of an FP32 [-1] input
    that answers with its input; reservations recorded."""

    def __init__(self) -> None:
        self.reserved: list[tuple[int, int | None]] = []
        self.released: list[tuple[int, int | None]] = []
        spec = SimpleNamespace(name="x", datatype="FP32", shape=[-1])
        self.dep = SimpleNamespace(
            name="m", pipeline=SimpleNamespace(inputs=[spec], outputs=[], units=[]), route=None
        )

    def deployments(self) -> list[Any]:
        return [self.dep]

    def deployment(self, name: str) -> Any:
        if name != "m":
            raise ProtocolError(f"no model {name!r}", 404)
        return self.dep

    def ready(self, name: str | None = None) -> bool:
        return True

    def reserve_bytes(self, nbytes: int, uid: int | None) -> None:
        self.reserved.append((nbytes, uid))

    def release_bytes(self, nbytes: int, uid: int | None) -> None:
        self.released.append((nbytes, uid))

    def submit(self, name: str, inputs: Any, *args: Any, **kw: Any) -> Any:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        result = SimpleNamespace(
            outputs={"y": np.zeros(1, np.float32)},
            latency_ms=1.0,
            items=None,
            unit_ms=lambda units: {},
        )
        fut.set_result(result)
        return fut


class _View:
    """A request's view of no shared memory (nothing read, nothing to give back)."""

    def release(self) -> None:
        pass


class _Shm:
    def __init__(self) -> None:
        self.registered: list[str] = []

    def for_peer(self, peer: Peer, **limits: Any) -> Any:
        return _View()

    def register(self, name: str, *args: Any) -> None:
        self.registered.append(name)


def _handlers(peer: Peer, **kw: Any) -> h.Handlers:
    return h.Handlers(_Service(), _Shm(), lambda ctx: peer, **kw)


def _call(handlers: h.Handlers, method: str, message: bytes) -> Any:
    return asyncio.run(getattr(handlers, method)(message, _Context()))


def _infer(n: int, *, typed: bool = False) -> bytes:
    req = pb.ModelInferRequest(model_name="m")
    t = req.inputs.add(name="x", datatype="FP32", shape=[n])
    if typed:
        t.contents.fp32_contents.extend(np.ones(n, np.float32))
    else:
        req.raw_input_contents.append(np.ones(n, np.float32).tobytes())
    return req.SerializeToString()


@pytest.mark.parametrize(
    ("method", "message"),
    [
        ("ModelInfer", _infer(4)),
        (
            "SystemSharedMemoryRegister",
            pb.SystemSharedMemoryRegisterRequest(name="r").SerializeToString(),
        ),
        ("SystemSharedMemoryStatus", b""),
        ("ModelReady", pb.ModelReadyRequest(name="m").SerializeToString()),
        ("ServerMetadata", b""),
    ],
)
def test_a_call_of_a_connection_gone_is_refused(method: str, message: bytes) -> None:
    handlers = _handlers(NOBODY)
    with pytest.raises(_Aborted) as e:
        _call(handlers, method, message)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert e.value.message == "the connection is gone; reconnect"
    assert handlers.service.reserved == [] and handlers.shm.registered == []


def test_liveness_and_readiness_answer_a_connection_gone() -> None:
    handlers = _handlers(NOBODY)
    assert _call(handlers, "ServerLive", b"").live
    assert _call(handlers, "ServerReady", b"").ready


def test_a_control_message_over_the_limit_is_refused_unparsed(monkeypatch) -> None:
    parsed: list[bytes] = []
    real = pb.SystemSharedMemoryRegisterRequest.FromString
    monkeypatch.setattr(
        pb.SystemSharedMemoryRegisterRequest,
        "FromString",
        staticmethod(lambda b: parsed.append(b) or real(b)),
    )
    handlers = _handlers(OTHER, quotas=PeerQuotas(control_body_kb=4))
    huge = pb.SystemSharedMemoryRegisterRequest(name="r" * 5000, key="/k").SerializeToString()
    with pytest.raises(_Aborted) as e:
        _call(handlers, "SystemSharedMemoryRegister", huge)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"{len(huge)} bytes; at most 4 KB" in e.value.message
    assert parsed == [] and handlers.shm.registered == []
    small = pb.SystemSharedMemoryRegisterRequest(
        name="r", key="/k", byte_size=4
    ).SerializeToString()
    _call(handlers, "SystemSharedMemoryRegister", small)
    assert handlers.shm.registered == ["r"]


def test_bytes_protobuf_cannot_parse_are_invalid_argument() -> None:
    for method, message in [("ModelReady", b"\x0a\x05ab"), ("ModelInfer", b"\x2a\x09\x0a")]:
        with pytest.raises(_Aborted) as e:
            _call(_handlers(OTHER), method, message)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value.message
        assert "not a valid" in e.value.message


@pytest.mark.parametrize("gate_reserves", [False, True])
def test_model_infer_reserves_beyond_twice_the_message(gate_reserves: bool) -> None:
    """What the scan says the decode holds beyond twice the message (plus, while the gate
    does not reserve, twice the message), under the client's uid; all given back."""
    for message in (_infer(4), _infer(200, typed=True)):
        handlers = _handlers(OTHER, gate_reserves=gate_reserves)
        resp = _call(handlers, "ModelInfer", message)
        assert [o.name for o in resp.outputs] == ["y"]
        extra = max(0, scan_model_infer(message).held - 2 * len(message))
        want = extra + (0 if gate_reserves else 2 * len(message))
        svc = handlers.service
        assert svc.reserved == ([(want, OTHER.uid)] if want else [])
        assert svc.released == svc.reserved


def test_a_decode_beyond_twice_the_message_is_resource_exhausted() -> None:
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="INT64", shape=[1 << 20]).contents.int64_contents.extend(
        [0] * (1 << 20)
    )
    handlers = _handlers(OTHER)
    with pytest.raises(_Aborted) as e:
        _call(handlers, "ModelInfer", req.SerializeToString())
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "more than twice the message" in e.value.message
    assert handlers.service.reserved == []


@pytest.mark.parametrize(
    ("message", "off_loop"),
    [(_infer(4), False), (_infer(1 << 16, typed=True), True), (_infer(1 << 22), True)],
)
def test_a_large_decode_leaves_the_event_loop(monkeypatch, message: bytes, off_loop: bool) -> None:
    threads: list[int] = []
    real = h.decode_message

    def decode(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(h, "decode_message", decode)
    assert scan_model_infer(message).tensors_held <= decode_limit(len(message))
    _call(_handlers(OTHER), "ModelInfer", message)
    assert len(threads) == 1 and (threads[0] != threading.get_ident()) == off_loop
