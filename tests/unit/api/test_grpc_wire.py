"""The ModelInferRequest wire scan (infscaler.api.grpc.wire): for any valid message its
counts are the parsed message's and its raw entries read in place are the parsed ones;
hostile encodings (unpacked repeated fields, thousands of empty submessages, raw entries
or bytes elements, 1-byte varints) are refused by a cap, or the scan's bound is at least
what parsing (upb: malloc, read with mallinfo2) and decoding (Python: tracemalloc) hold;
malformed wire data is refused with 400."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infscaler.api.codec import ProtocolError, decode_infer_request
from infscaler.api.grpc.mapping import CONTENTS_FIELD, model_infer_parts
from infscaler.api.grpc.wire import (
    MAX_DIMS,
    MAX_FIELDS,
    MAX_PARAMETERS,
    MAX_TENSORS,
    NotQuick,
    decode_limit,
    decode_work,
    peek_model_name,
    raw_views,
    scan_model_infer,
    strip_raw,
)
from infscaler.proto import grpc_service_pb2 as pb


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, wt: int, payload: bytes) -> bytes:
    key = _varint(num << 3 | wt)
    return key + _varint(len(payload)) + payload if wt == 2 else key + payload


def _input(contents: bytes, name: bytes = b"x", datatype: bytes = b"INT64") -> bytes:
    """A request of one input whose InferTensorContents is ``contents`` (raw wire)."""
    tensor = _field(1, 2, name) + _field(2, 2, datatype) + _field(5, 2, contents)
    return _field(1, 2, b"m") + _field(5, 2, tensor)


# -- valid messages: the counts are the parsed message's -----------------------------------

_NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
_PARAMS = st.dictionaries(
    _NAMES,
    st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), _NAMES, st.floats()),
    max_size=3,
)
_CONTENTS = st.sampled_from([d for d in CONTENTS_FIELD if d != "BYTES"] + ["BYTES"])


def _values(datatype: str, n: int) -> st.SearchStrategy:
    kind = {
        "BOOL": st.booleans(),
        "INT64": st.integers(-(2**63), 2**63 - 1),
        "UINT64": st.integers(0, 2**64 - 1),
        "FP32": st.floats(width=32),
        "FP64": st.floats(),
        "BYTES": st.binary(max_size=5),
    }.get(
        datatype,
        st.integers(0, 2**31 - 1) if datatype.startswith("U") else st.integers(-(2**31), 2**31 - 1),
    )
    return st.lists(kind, min_size=n, max_size=n)


def _set(target, values: dict) -> None:
    for k, v in values.items():
        p = target[k]
        if isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int):
            p.int64_param = v
        elif isinstance(v, float):
            p.double_param = v
        else:
            p.string_param = v


@st.composite
def requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=draw(_NAMES), model_version=draw(_NAMES), id=draw(_NAMES))
    _set(req.parameters, draw(_PARAMS))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 4))):
        datatype = draw(_CONTENTS)
        shape = draw(st.lists(st.integers(0, 3), max_size=4))
        t = req.inputs.add(name=draw(_NAMES), datatype=datatype, shape=shape)
        _set(t.parameters, draw(_PARAMS))
        n = int(np.prod(shape))
        if raw:
            req.raw_input_contents.append(draw(st.binary(max_size=40)))
        elif draw(st.booleans()):
            getattr(t.contents, CONTENTS_FIELD[datatype]).extend(draw(_values(datatype, n)))
    for _ in range(draw(st.integers(0, 3))):
        _set(req.outputs.add(name=draw(_NAMES)).parameters, draw(_PARAMS))
    return req


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_the_scan_counts_what_parsing_finds(req: pb.ModelInferRequest) -> None:
    message = req.SerializeToString()
    scan = scan_model_infer(message)
    assert (scan.model_name, scan.model_version) == (req.model_name, req.model_version)
    assert (scan.inputs, scan.outputs) == (len(req.inputs), len(req.outputs))
    params = len(req.parameters) + sum(len(t.parameters) for t in req.inputs)
    assert scan.parameters == params + sum(len(o.parameters) for o in req.outputs)
    assert scan.max_dims == max((len(t.shape) for t in req.inputs), default=0)
    typed = sum(
        len(getattr(t.contents, f.name)) for t in req.inputs for f in t.contents.DESCRIPTOR.fields
    )
    assert scan.elements == typed
    assert [bytes(v) for v in raw_views(message, scan)] == list(req.raw_input_contents)
    stripped = pb.ModelInferRequest.FromString(strip_raw(message, scan))
    assert not stripped.raw_input_contents
    stripped.raw_input_contents.extend(req.raw_input_contents)
    assert stripped == req
    assert scan.tensors_held <= scan.held
    assert decode_work(scan, len(message)) >= scan.elements


# -- hostile encodings: refused by a cap, or bounded ---------------------------------------


def _empties(num: int, n: int) -> bytes:
    return _field(num, 2, b"") * n


@pytest.mark.parametrize(
    ("message", "says"),
    [
        (_empties(5, MAX_TENSORS + 1), f"more than {MAX_TENSORS} inputs"),
        (_empties(6, MAX_TENSORS + 1), f"more than {MAX_TENSORS} outputs"),
        (_empties(7, 100_000), f"more than {MAX_TENSORS} raw_input_contents entries"),
        (_empties(4, MAX_PARAMETERS + 1), f"more than {MAX_PARAMETERS} parameters"),
        (_field(5, 2, _field(3, 2, bytes(MAX_DIMS + 1))), f"more than {MAX_DIMS} dims"),
        (_field(5, 2, _field(3, 0, b"\x01") * (MAX_DIMS + 1)), f"more than {MAX_DIMS} dims"),
        (_input(_field(3, 0, b"\x01") * (MAX_FIELDS + 1)), f"more than {MAX_FIELDS} fields"),
        (_input(_field(9, 0, b"\x01") * (MAX_FIELDS + 1)), f"more than {MAX_FIELDS} fields"),
        (_input(_field(8, 2, b"") * (MAX_FIELDS + 1)), f"more than {MAX_FIELDS} fields"),
    ],
)
def test_a_message_beyond_a_cap_is_refused_naming_it(message: bytes, says: str) -> None:
    with pytest.raises(ProtocolError) as e:
        scan_model_infer(message, limit=decode_limit(len(message)))
    assert e.value.status == 400 and says in str(e.value)


@pytest.mark.parametrize(
    "message",
    [
        _input(_field(3, 2, bytes(4 << 20))),  # packed int64 of 1-byte varints: 16 B each
        _input(_field(2, 2, bytes(2 << 20)), datatype=b"INT8"),
        _input(_field(8, 2, b"") * 60_000, datatype=b"BYTES"),
        _input(_field(3, 0, b"\x00") * 60_000),  # unpacked
        _input(_field(1, 2, bytes(1 << 20)), datatype=b"BOOL"),
    ],
    ids=["int64-varints", "int8-varints", "empty-bytes", "unpacked-int64", "bool"],
)
def test_a_decode_beyond_twice_the_message_is_refused(message: bytes) -> None:
    limit = decode_limit(len(message))
    with pytest.raises(ProtocolError) as e:
        scan_model_infer(message, limit=limit)
    assert e.value.status == 413
    assert "more than twice the message" in str(e.value) and "raw_input_contents" in str(e.value)
    assert scan_model_infer(message).tensors_held > limit  # unbounded: the same bound


def test_malformed_wire_data_is_refused() -> None:
    good = _input(_field(3, 2, b"\x01\x02"))
    for bad, says in [
        (good[:-1], "runs past"),
        (_field(5, 2, b"") + b"\x2a", "cut off"),  # a VARINT key without its value
        (b"\x0b", "groups"),  # field 1, wire type 3
        (b"\x00\x00", "field number 0"),
        (_input(_field(3, 2, b"\x81")), "cut off"),
        (_input(_field(6, 2, b"\x00\x00\x00")), "not a multiple of 4"),
        (_field(1, 2, b"\xff"), "not UTF-8"),
        (b"\x08" + b"\xff" * 11, "longer than 10 bytes"),
    ]:
        with pytest.raises(ProtocolError) as e:
            scan_model_infer(bad)
        assert e.value.status == 400 and says in str(e.value), (bad, str(e.value))


def test_quick_gives_up_past_its_fields() -> None:
    message = _empties(6, 100)
    with pytest.raises(NotQuick):
        scan_model_infer(message, quick=50)
    assert scan_model_infer(message, quick=200).outputs == 100


# -- the bound holds: measured ---------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_HAS_MALLINFO2 = hasattr(_libc, "mallinfo2")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


def _malloced() -> int:
    _libc.mallinfo2.restype = _MallInfo2
    m = _libc.mallinfo2()
    return m.uordblks + m.hblkhd


def _held(message: bytes) -> int:
    """What parsing and decoding ``message`` hold at their peak, bytes: upb's parse
    (malloc) with the header and parts' build (tracemalloc), then their decode (what
    ``decode_message`` does)."""
    scan = scan_model_infer(message)
    gc.collect()
    tracemalloc.start()
    try:
        before = _malloced()
        req = pb.ModelInferRequest.FromString(strip_raw(message, scan))
        upb = _malloced() - before
        try:
            header, parts = model_infer_parts(req, raw_views(message, scan) if scan.raw else None)
        except ProtocolError:
            return upb + tracemalloc.get_traced_memory()[1]
        build = tracemalloc.get_traced_memory()[1]
        del req
        tracemalloc.reset_peak()
        with contextlib.suppress(ProtocolError):
            decode_infer_request(header, header_length=len(header), copy=False, parts=parts)
        return max(upb + build, tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()


def _typed(datatype: str, values) -> bytes:
    req = pb.ModelInferRequest(model_name="m")
    t = req.inputs.add(name="x", datatype=datatype, shape=[len(values)])
    getattr(t.contents, CONTENTS_FIELD[datatype]).extend(values)
    return req.SerializeToString()


def _many_tensors() -> bytes:
    req = pb.ModelInferRequest(model_name="m")
    for i in range(MAX_TENSORS):
        t = req.inputs.add(name=f"input_{i}", datatype="FP32", shape=[1] * MAX_DIMS)
        t.parameters["p"].string_param = "v"
        req.raw_input_contents.append(b"\0" * 4)
        req.outputs.add(name=f"o{i}").parameters["binary_data"].bool_param = True
    return req.SerializeToString()


def _strings(char: str) -> bytes:
    req = pb.ModelInferRequest(model_name="m", id=char * 100_000)
    req.inputs.add(name=char * 100_000, datatype="FP32", shape=[1])
    req.raw_input_contents.append(b"\0" * 4)
    req.parameters["s"].string_param = char * 100_000
    return req.SerializeToString()


@pytest.mark.skipif(not _HAS_MALLINFO2, reason="needs glibc's mallinfo2 to see upb's memory")
@pytest.mark.parametrize(
    "message",
    [
        _typed("FP32", np.ones(1 << 20, np.float32)),
        _typed("FP32", np.ones((1 << 18) + 1, np.float32)),
        _typed("FP64", np.ones(1 << 19)),
        _typed("INT8", [1] * 100_000),
        _typed("INT64", [1] * 100_000),
        _typed("UINT64", [2**64 - 1] * 65_536),
        _typed("INT32", [-1] * 65_537),
        _typed("BOOL", [True] * 300_000),
        _typed("BYTES", [b""] * 20_000),
        _typed("BYTES", [b"ab"] * 20_000),
        _typed("BYTES", [b"x" * 1000] * 2_000),
        _input(_field(3, 0, b"\x00") * 30_000),  # unpacked
        _input(_field(6, 2, b"\0" * 4000) * 256, datatype=b"FP32"),  # packed in 256 chunks
        _input(_field(99, 0, b"\x00") * 60_000),  # unknown fields
        _many_tensors(),
        _strings("a"),
        _strings("\x01"),
        _strings("\u4e00"),
        _strings("\U0001f600"),
    ],
    ids=lambda m: f"{len(m)}B",
)
def test_the_bound_is_at_least_what_parsing_and_decoding_hold(message: bytes) -> None:
    scan = scan_model_infer(message)
    held = _held(message)
    assert scan.held >= held, (scan.held, held)


def test_peek_model_name_names_only_an_inference_and_never_guesses() -> None:
    req = pb.ModelInferRequest(model_name="résnet", id="r1")
    req.parameters["timeout"].int64_param = 5
    req.inputs.add(name="x", datatype="FP32", shape=[1, 3])
    req.raw_input_contents.append(np.zeros(3, np.float32).tobytes())
    wire = req.SerializeToString()
    assert peek_model_name(wire) == "résnet"
    assert peek_model_name(memoryview(wire)) == "résnet"
    # every cut: the name once the inputs field begins, before that nothing
    starts = wire.index(b"\x2a")  # field 5, length-delimited
    for k in range(len(wire) + 1):
        assert peek_model_name(wire[:k]) == ("résnet" if k >= starts + 2 else None)
    # raw contents alone also prove an inference; a metadata request (field 1 only) does not
    raw_only = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"ab"])
    assert peek_model_name(raw_only.SerializeToString()) == "m"
    assert peek_model_name(pb.ModelMetadataRequest(name="m").SerializeToString()) is None
    # not protobuf, a bad name, a group wire type: None (the full parse judges those)
    assert peek_model_name(b"\xff" * 12) is None
    assert peek_model_name(b"\x0a\x02\xff\xfe\x2a\x00") is None
    assert peek_model_name(b"\x0b\x2a\x00") is None
