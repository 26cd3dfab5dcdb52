"""The KServe v2 codec (infscaler.api.codec): round trips, every refusal, shared memory I/O.

Checked against the protocol docs: the v2 REST request / response JSON,
``extension_binary_data.md`` (binary layout, Inference-Header-Content-Length,
binary_data_size / binary_data / binary_data_output) and ``extension_shared_memory.md``
(shared_memory_region / _offset / _byte_size).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from infscaler.api.codec import (
    DATATYPES,
    HEADER_LENGTH,
    ProtocolError,
    RequestedOutput,
    ShmTensor,
    TensorSpec,
    datatype_of,
    decode_infer_request,
    decode_infer_response,
    deserialize_bytes,
    encode_infer_request,
    encode_infer_response,
    serialize_bytes,
)
from infscaler.api.sysshm import SharedMemoryRegion, SystemSharedMemoryRegistry

NUMERIC = [d for d in DATATYPES if d != "BYTES"]


# -- helpers ------------------------------------------------------------------------------


def header_len(headers: dict[str, str]) -> int | None:
    h = headers.get(HEADER_LENGTH)
    return int(h) if h is not None else None


def roundtrip_request(inputs: dict[str, Any], binary: bool, **kw: Any):
    body, headers = encode_infer_request(inputs, binary=binary, **kw)
    return decode_infer_request(body, header_length=header_len(headers))


def roundtrip_response(outputs: dict[str, Any], binary: bool, **kw: Any):
    body, headers = encode_infer_response(
        model_name="m", request_id="r", outputs=outputs, requested=None, binary_default=binary, **kw
    )
    return decode_infer_response(body, header_length=header_len(headers)), headers


def as_bytes_list(a: np.ndarray) -> list[bytes]:
    return [
        v.encode() if isinstance(v, str) else bytes(v) for v in np.asarray(a).reshape(-1).tolist()
    ]


def assert_same(sent: np.ndarray, got: np.ndarray, *, bit_exact: bool) -> None:
    sent = np.asarray(sent)
    assert got.shape == sent.shape
    if datatype_of(sent) == "BYTES":
        assert got.dtype == object
        assert as_bytes_list(got) == as_bytes_list(sent)
        return
    assert got.dtype == DATATYPES[datatype_of(sent)]
    if bit_exact:
        assert got.tobytes() == np.ascontiguousarray(sent, dtype=got.dtype).tobytes()
    else:  # JSON: NaN loses its sign / payload, nothing else changes
        assert np.array_equal(got, sent, equal_nan=got.dtype.kind == "f")


def sample(datatype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    """A tensor of ``datatype`` with extreme values where the type has them."""
    n = int(np.prod(shape))
    if datatype == "BYTES":
        vals = [b"", b"abc", "h\u00e9llo".encode(), b"\x00a\x00", b"x" * 40, "\u6f22".encode()]
        return np.array((vals * n)[:n], dtype=object).reshape(shape)
    dt = DATATYPES[datatype]
    if datatype == "BOOL":
        return (np.arange(n) % 2 == 0).reshape(shape)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        vals = [info.min, info.max, 0, 1, info.max // 3, info.min // 2]
    else:
        info = np.finfo(dt)
        vals = [float(info.min), float(info.max), -0.0, float(info.tiny), 0.1, -3.5]
    return np.array((vals * n)[:n], dtype=dt).reshape(shape)


def body_of(doc: dict[str, Any], *blobs: bytes) -> tuple[bytes, int | None]:
    head = json.dumps(doc).encode()
    return head + b"".join(blobs), (len(head) if blobs else None)


def decode(doc: dict[str, Any], *blobs: bytes, **kw: Any):
    body, hl = body_of(doc, *blobs)
    kw.setdefault("header_length", hl)
    return decode_infer_request(body, **kw)


def refused(doc_or_body: Any, *blobs: bytes, status: int = 400, **kw: Any) -> str:
    """The ProtocolError message of decoding this request."""
    with pytest.raises(ProtocolError) as ei:
        if isinstance(doc_or_body, bytes):
            decode_infer_request(doc_or_body, **{"header_length": None, **kw})
        else:
            decode(doc_or_body, *blobs, **kw)
    assert ei.value.status == status
    return str(ei.value)


def inp(name: str = "x", datatype: str = "FP32", shape: list | None = None, **kw: Any) -> dict:
    d = {"name": name, "datatype": datatype, "shape": [2, 2] if shape is None else shape}
    d.update(kw)
    return d


@pytest.fixture
def shm_key():
    key = f"/infscaler-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield key
    with contextlib.suppress(FileNotFoundError):
        os.unlink("/dev/shm" + key)


# -- datatypes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, expected",
    [
        (np.bool_, "BOOL"),
        (np.uint8, "UINT8"),
        (np.uint16, "UINT16"),
        (np.uint32, "UINT32"),
        (np.uint64, "UINT64"),
        (np.int8, "INT8"),
        (np.int16, "INT16"),
        (np.int32, "INT32"),
        (np.int64, "INT64"),
        (np.float16, "FP16"),
        (np.float32, "FP32"),
        (np.float64, "FP64"),
        (">f4", "FP32"),
        ("U5", "BYTES"),
        ("S3", "BYTES"),
        (object, "BYTES"),
    ],
)
def test_datatype_of(dtype: Any, expected: str) -> None:
    assert datatype_of(np.zeros(2, dtype=dtype)) == expected
    assert datatype_of(np.dtype(dtype)) == expected
    if expected != "BYTES":
        assert DATATYPES[expected] == np.dtype(dtype).newbyteorder("<")


@pytest.mark.parametrize("dtype", [np.complex64, "M8[s]", [("a", "i4")]])
def test_datatype_of_refuses(dtype: Any) -> None:
    with pytest.raises(ProtocolError, match="has no v2 datatype"):
        datatype_of(np.zeros(1, dtype=dtype))


def test_bytes_layout_is_length_prefixed_little_endian() -> None:
    raw = serialize_bytes(np.array([b"ab", "\u00e9", b""], dtype=object))
    assert (
        raw == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 2) + "\u00e9".encode() + b"\0\0\0\0"
    )
    back = deserialize_bytes(raw, [3])
    assert back.tolist() == [b"ab", "\u00e9".encode(), b""]


# -- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_roundtrip_every_datatype(datatype: str, binary: bool) -> None:
    a = sample(datatype)
    req = roundtrip_request({"t": a}, binary)
    assert list(req.inputs) == ["t"]
    assert_same(a, req.inputs["t"], bit_exact=True)  # all of sample() survives JSON exactly
    res, headers = roundtrip_response({"t": a}, binary)
    assert_same(a, res.outputs["t"], bit_exact=True)
    if binary:
        assert headers["Content-Type"] == "application/octet-stream"
    else:
        assert headers == {"Content-Type": "application/json"}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (1,), (1, 1, 1, 5)])
@pytest.mark.parametrize("datatype", ["FP16", "BOOL", "BYTES", "INT64"])
def test_roundtrip_0d_and_empty(datatype: str, shape: tuple[int, ...], binary: bool) -> None:
    a = sample(datatype, shape)
    assert_same(a, roundtrip_request({"t": a}, binary).inputs["t"], bit_exact=True)
    assert_same(a, roundtrip_response({"t": a}, binary)[0].outputs["t"], bit_exact=True)


def test_str_and_fixed_bytes_arrays_are_bytes_tensors() -> None:
    for a in (np.array(["h\u00e9", "", "z"]), np.array([b"a", b"bc"], dtype="S2")):
        for binary in (True, False):
            got = roundtrip_request({"s": a}, binary).inputs["s"]
            assert got.dtype == object and got.tolist() == as_bytes_list(a)


def test_non_finite_floats_survive_json() -> None:
    a = np.array([np.inf, -np.inf, np.nan, -0.0], np.float32)
    got = roundtrip_request({"f": a}, binary=False).inputs["f"]
    assert np.isposinf(got[0]) and np.isneginf(got[1]) and np.isnan(got[2])
    assert np.signbit(got[3])


def test_big_endian_arrays_go_little_endian() -> None:
    a = np.arange(4, dtype=">i4")
    body, headers = encode_infer_request({"x": a}, binary=True)
    assert body[header_len(headers) :] == np.arange(4, dtype="<i4").tobytes()
    assert roundtrip_request({"x": a}, True).inputs["x"].tolist() == [0, 1, 2, 3]


def test_json_data_flat_nested_and_scalar_are_row_major() -> None:
    want = np.arange(6, dtype=np.int32).reshape(2, 3)
    for data in ([0, 1, 2, 3, 4, 5], [[0, 1, 2], [3, 4, 5]]):
        got = decode({"inputs": [inp(datatype="INT32", shape=[2, 3], data=data)]}).inputs["x"]
        assert got.dtype == np.int32 and np.array_equal(got, want), data
    # ragged or re-shaped nesting is refused: nested data must have exactly the shape
    for dt, data in (
        ("INT32", [[0, 1], [2, 3, 4, 5]]),
        ("INT32", [[[0]], 1, [2, [3, 4]], 5]),
        ("INT32", [[0, 1], [2, 3], [4, 5]]),
        ("INT32", [[[0], [1], [2]], [[3], [4], [5]]]),
        ("BYTES", [["a", "b"], ["c", "d", "e", "f"]]),
        ("FP32", [[0.5, 1, 2], 3, 4, 5]),
    ):
        with pytest.raises(ProtocolError, match="nested data"):
            decode({"inputs": [inp(datatype=dt, shape=[2, 3], data=data)]})
    for data in (7, [7]):
        got = decode({"inputs": [inp(datatype="UINT16", shape=[], data=data)]}).inputs["x"]
        assert got.shape == () and got == 7
    got = decode({"inputs": [inp(datatype="FP32", shape=[0, 4], data=[])]}).inputs["x"]
    assert got.shape == (0, 4) and got.dtype == np.float32


def test_json_integers_beyond_int64_and_floats_from_ints() -> None:
    got = decode({"inputs": [inp(datatype="UINT64", shape=[2], data=[2**64 - 1, 0])]}).inputs["x"]
    assert got.tolist() == [2**64 - 1, 0] and got.dtype == np.uint64
    got = decode({"inputs": [inp(datatype="FP64", shape=[3], data=[1, 2.5, -3])]}).inputs["x"]
    assert got.tolist() == [1.0, 2.5, -3.0]


def test_request_fields_and_binary_output_defaults() -> None:
    doc = {
        "id": "req-7",
        "parameters": {"binary_data_output": True, "timeout_ms": 50},
        "inputs": [inp(data=[1, 2, 3, 4])],
        "outputs": [
            {"name": "a"},
            {"name": "b", "parameters": {"binary_data": False}},
            {"name": "c", "parameters": {"binary_data": True}},
        ],
    }
    req = decode(doc)
    assert req.id == "req-7"
    assert req.parameters == {"binary_data_output": True, "timeout_ms": 50}
    assert req.binary_output_default is True
    assert req.outputs == [
        RequestedOutput("a", True, None),
        RequestedOutput("b", False, None),
        RequestedOutput("c", True, None),
    ]
    assert decode({"inputs": [inp(data=[1, 2, 3, 4])], "outputs": []}).outputs is None
    assert decode({"inputs": [inp(data=[1, 2, 3, 4])]}).binary_output_default is False


def test_mixed_json_binary_and_binary_order() -> None:
    a = np.arange(4, dtype=np.uint32).reshape(2, 2)
    b = np.array([True, False, True])
    doc = {
        "inputs": [
            inp("a", "UINT32", [2, 2], parameters={"binary_data_size": 16}),
            inp("j", "INT8", [2], data=[-1, 1]),
            inp("b", "BOOL", [3], parameters={"binary_data_size": 3}),
        ]
    }
    req = decode(doc, a.tobytes(), b"\x01\x00\x01")
    assert list(req.inputs) == ["a", "j", "b"]
    assert np.array_equal(req.inputs["a"], a) and np.array_equal(req.inputs["b"], b)
    assert req.inputs["j"].tolist() == [-1, 1]
    # a BOOL byte other than 0 / 1 reads as true
    assert decode(
        {"inputs": [inp("b", "BOOL", [2], parameters={"binary_data_size": 2})]}, b"\x02\x00"
    ).inputs["b"].tolist() == [True, False]


def test_decoded_arrays_are_writable_copies() -> None:
    body, headers = encode_infer_request({"x": np.zeros(4, np.float32)}, binary=True)
    x = decode_infer_request(body, header_length=header_len(headers)).inputs["x"]
    x[0] = 1.0  # not a read-only view of the body
    assert x.flags.writeable and x.flags.c_contiguous


def test_response_selects_orders_and_mixes_outputs() -> None:
    outs = {
        "a": np.arange(3, dtype=np.int16),
        "b": np.array(["x", "y"]),
        "c": np.ones((2, 2), np.float16),
    }
    body, headers = encode_infer_response(
        model_name="m",
        model_version="3",
        request_id="id-1",
        outputs=outs,
        requested=[RequestedOutput("c", True), RequestedOutput("a", False)],
        binary_default=False,
        parameters={"latency_ms": 1.5, "unit_ms.det": 0.25, "n": np.int64(2)},
    )
    hl = int(headers[HEADER_LENGTH])
    doc = json.loads(body[:hl])
    assert doc["model_name"] == "m" and doc["model_version"] == "3" and doc["id"] == "id-1"
    assert doc["parameters"] == {"latency_ms": 1.5, "unit_ms.det": 0.25, "n": 2}
    assert [o["name"] for o in doc["outputs"]] == ["c", "a"]
    assert doc["outputs"][0] == {
        "name": "c",
        "datatype": "FP16",
        "shape": [2, 2],
        "parameters": {"binary_data_size": 8},
    }
    assert doc["outputs"][1] == {"name": "a", "datatype": "INT16", "shape": [3], "data": [0, 1, 2]}
    assert body[hl:] == outs["c"].tobytes()
    res = decode_infer_response(body, header_length=hl)
    assert list(res.outputs) == ["c", "a"] and res.id == "id-1" and res.model_version == "3"


def test_non_utf8_bytes_output_goes_binary_even_when_json_asked() -> None:
    out = np.array([b"\xff\xfe", b"ok"], dtype=object)
    body, headers = encode_infer_response(
        model_name="m", request_id=None, outputs={"o": out}, requested=None, binary_default=False
    )
    doc = json.loads(body[: int(headers[HEADER_LENGTH])])
    assert "id" not in doc and doc["outputs"][0]["parameters"]["binary_data_size"] == 12
    res = decode_infer_response(body, header_length=int(headers[HEADER_LENGTH]))
    assert res.outputs["o"].tolist() == [b"\xff\xfe", b"ok"]


# -- hypothesis: encode -> decode is the identity -----------------------------------------

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def tensors(draw: st.DrawFn) -> np.ndarray:
    datatype = draw(st.sampled_from(list(DATATYPES)))
    shape = draw(shapes)
    if datatype == "BYTES":
        elems = st.one_of(st.binary(max_size=12), st.text(max_size=6))
        return draw(hnp.arrays(object, shape, elements=elems))
    return draw(hnp.arrays(DATATYPES[datatype], shape))


tensor_maps = st.dictionaries(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8),
    tensors(),
    min_size=1,
    max_size=3,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensor_maps, st.booleans())
def test_property_request_roundtrip(inputs: dict[str, np.ndarray], binary: bool) -> None:
    req = roundtrip_request(inputs, binary, request_id="p")
    assert list(req.inputs) == list(inputs) and req.id == "p"
    for k, a in inputs.items():
        assert_same(a, req.inputs[k], bit_exact=binary)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensor_maps, st.booleans())
def test_property_response_roundtrip(outputs: dict[str, np.ndarray], binary: bool) -> None:
    res, _ = roundtrip_response(outputs, binary)
    assert list(res.outputs) == list(outputs)
    for k, a in outputs.items():
        assert_same(a, res.outputs[k], bit_exact=binary)


# -- refusals: request framing and JSON ----------------------------------------------------


def test_refuses_bad_json_and_shapes_of_the_document() -> None:
    assert "not valid JSON" in refused(b"{not json")
    assert "not valid UTF-8" in refused(b'{"inputs": "\xff"}')
    assert "must be a JSON object, got list" in refused(b"[1, 2]")
    assert 'needs "inputs"' in refused({"id": "x"})
    assert '"inputs" must be a list, got dict' in refused({"inputs": {}})
    assert "inputs[0] must be a JSON object" in refused({"inputs": [3]})
    assert "request id must be a string, got int" in refused({"id": 3, "inputs": []})
    assert "parameters must be a JSON object" in refused({"inputs": [], "parameters": [1]})
    assert "binary_data_output must be true or false" in refused(
        {"inputs": [], "parameters": {"binary_data_output": 1}}
    )


def test_binary_after_json_without_header_gets_a_hint() -> None:
    body, _ = body_of({"inputs": [inp(parameters={"binary_data_size": 16})]}, bytes(16))
    msg = refused(body)
    assert "not valid JSON" in msg and HEADER_LENGTH in msg


@pytest.mark.parametrize(
    "item, message",
    [
        ({"datatype": "FP32", "shape": [1], "data": [1]}, 'inputs[0] needs a "name"'),
        ({"name": "x", "shape": [1], "data": [1]}, "input 'x' needs a \"datatype\""),
        (
            {"name": "x", "datatype": "FP8", "shape": [1], "data": [1]},
            "input 'x': unknown datatype 'FP8'",
        ),
        (
            {"name": "x", "datatype": "BF16", "shape": [1], "data": [1]},
            "input 'x': unknown datatype 'BF16'",
        ),
        ({"name": "x", "datatype": "FP32", "data": [1]}, "input 'x' needs a \"shape\""),
        (
            {"name": "x", "datatype": "FP32", "shape": [2, -1], "data": [1]},
            "shape [2, -1] has a negative dimension",
        ),
        (
            {"name": "x", "datatype": "FP32", "shape": [1.5], "data": [1]},
            "shape must be a list of integers",
        ),
        (
            {"name": "x", "datatype": "FP32", "shape": [True], "data": [1]},
            "shape must be a list of integers",
        ),
        ({"name": "x", "datatype": "FP32", "shape": [2, 2]}, "input 'x' has no data"),
        (
            {"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]},
            "input 'x': shape [2, 2] has 4 elements but the data has 3",
        ),
        (
            {"name": "x", "datatype": "BYTES", "shape": [3], "data": ["a"]},
            "input 'x': shape [3] has 3 elements but the data has 1",
        ),
        (
            {"name": "x", "datatype": "FP32", "shape": [2], "data": ["a", "b"]},
            "input 'x': FP32 data must be JSON numbers, got strings",
        ),
        (
            {"name": "x", "datatype": "FP32", "shape": [2], "data": [1, None]},
            "input 'x': FP32 data must be JSON numbers, found NoneType",
        ),
        (
            {"name": "x", "datatype": "INT8", "shape": [2], "data": [1, 1.5]},
            "input 'x': INT8 data must be JSON integers, found 1.5",
        ),
        (
            {"name": "x", "datatype": "INT8", "shape": [2], "data": [1, 300]},
            "input 'x': value 300 is out of range for INT8",
        ),
        (
            {"name": "x", "datatype": "UINT8", "shape": [2], "data": [-1, 3]},
            "input 'x': value -1 is out of range for UINT8",
        ),
        (
            {"name": "x", "datatype": "UINT64", "shape": [2], "data": [-1, 2**64 - 1]},
            "input 'x': value -1 is out of range for UINT64",
        ),
        (
            {"name": "x", "datatype": "INT64", "shape": [1], "data": [2**70]},
            "input 'x': value 1180591620717411303424 is out of range for INT64",
        ),
        (
            {"name": "x", "datatype": "FP16", "shape": [1], "data": [1e6]},
            "input 'x': value 1000000.0 is out of range for FP16",
        ),
        (
            {"name": "x", "datatype": "BOOL", "shape": [2], "data": [1, 0]},
            "input 'x': BOOL data must be JSON true / false, got integers",
        ),
        (
            {"name": "x", "datatype": "BYTES", "shape": [2], "data": ["a", 3]},
            "input 'x': BYTES data must be JSON strings, element 1 is int",
        ),
        (
            {"name": "x", "datatype": "FP32", "shape": [1], "data": [1], "parameters": 3},
            "input 'x': parameters must be a JSON object",
        ),
    ],
)
def test_refuses_bad_inputs(item: dict[str, Any], message: str) -> None:
    assert message in refused({"inputs": [item]})


def test_refuses_duplicate_inputs_and_outputs() -> None:
    assert "input 'x' is given more than once" in refused(
        {"inputs": [inp(data=[1] * 4), inp(data=[2] * 4)]}
    )
    doc = {"inputs": [inp(data=[1] * 4)], "outputs": [{"name": "y"}, {"name": "y"}]}
    assert "requested output 'y' is requested more than once" in refused(doc)


def test_refuses_bad_requested_outputs() -> None:
    base = {"inputs": [inp(data=[1] * 4)]}
    assert '"outputs" must be a list' in refused({**base, "outputs": {"y": 1}})
    assert 'outputs[0] needs a "name"' in refused({**base, "outputs": [{}]})
    assert "binary_data must be true or false" in refused(
        {**base, "outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]}
    )
    assert "classification extension is not supported" in refused(
        {**base, "outputs": [{"name": "y", "parameters": {"classification": 3}}]}
    )


# -- refusals: binary data ----------------------------------------------------------------


def test_refuses_binary_size_mismatch_and_overrun() -> None:
    doc = {"inputs": [inp("x", "INT32", [2, 2], parameters={"binary_data_size": 15})]}
    assert (
        "input 'x': binary_data_size 15 does not match shape [2, 2] of INT32 (16 bytes)"
        in refused(doc, bytes(15))
    )
    doc = {"inputs": [inp("x", "INT32", [2, 2], parameters={"binary_data_size": 16})]}
    assert (
        "input 'x': binary_data_size 16 runs past the end of the body (8 of 8 binary bytes left)"
        in refused(doc, bytes(8))
    )
    assert "16 bytes of binary data after the JSON header are not claimed" in refused(
        doc, bytes(32)
    )
    doc = {"inputs": [inp("x", "INT32", [2, 2], parameters={"binary_data_size": -4})]}
    assert "binary_data_size must be a non-negative integer, got -4" in refused(doc, bytes(4))


def test_refuses_header_length_problems() -> None:
    body, hl = body_of({"inputs": [inp(parameters={"binary_data_size": 16})]}, bytes(16))
    assert f"{HEADER_LENGTH} is {len(body) + 1} but the body has only {len(body)} bytes" in refused(
        body, header_length=len(body) + 1
    )
    assert f"{HEADER_LENGTH} must be a non-negative integer, got -1" in refused(
        body, header_length=-1
    )
    doc = {"inputs": [inp(parameters={"binary_data_size": 0})]}
    assert f"has binary_data_size but the request has no {HEADER_LENGTH} header" in refused(
        doc, header_length=None
    )
    assert "not valid JSON" in refused(body, header_length=hl - 1)  # cut inside the JSON


def test_refuses_malformed_binary_bytes() -> None:
    doc = {"inputs": [inp("s", "BYTES", [2], parameters={"binary_data_size": 11})]}
    blob = struct.pack("<I", 2) + b"ab" + struct.pack("<I", 9) + b"c"
    assert "input 's': BYTES element 1 claims 9 bytes but only 1 remain" in refused(doc, blob)
    doc = {"inputs": [inp("s", "BYTES", [1], parameters={"binary_data_size": 8})]}
    assert "input 's': 2 bytes left over after the 1 BYTES elements" in refused(
        doc, struct.pack("<I", 2) + b"abcd"
    )
    doc = {"inputs": [inp("s", "BYTES", [2], parameters={"binary_data_size": 10})]}
    assert "input 's': BYTES data ends after 1 of 2 elements (at byte 8 of 10)" in refused(
        doc, struct.pack("<I", 4) + b"abcd" + b"xy"
    )
    # a huge shape over a tiny body is refused before anything is allocated
    doc = {"inputs": [inp("s", "BYTES", [10**6, 10**6], parameters={"binary_data_size": 4})]}
    assert "input 's': 4 bytes cannot hold 1000000000000 BYTES elements" in refused(doc, bytes(4))


def test_refuses_data_given_two_ways() -> None:
    doc = {"inputs": [inp(data=[1, 2, 3, 4], parameters={"binary_data_size": 16})]}
    assert "input 'x': give its data one way only" in refused(doc, bytes(16))


# -- refusals: model specs and limits -----------------------------------------------------

SPECS = [TensorSpec("image", "UINT8", [-1, -1, 3]), TensorSpec("k", "INT32", [])]


def img(shape: list[int], datatype: str = "UINT8") -> dict[str, Any]:
    return inp("image", datatype, shape, data=[0] * int(np.prod(shape)))


def test_input_specs_accept_wildcards() -> None:
    req = decode({"inputs": [img([4, 5, 3]), inp("k", "INT32", [], data=1)]}, input_specs=SPECS)
    assert req.inputs["image"].shape == (4, 5, 3) and req.inputs["k"].shape == ()


def test_input_specs_refusals() -> None:
    k = inp("k", "INT32", [], data=1)
    assert "unknown input 'mask'; the model's inputs are ['image', 'k']" in refused(
        {"inputs": [img([1, 1, 3]), k, inp("mask", data=[0] * 4)]}, input_specs=SPECS
    )
    assert "missing input(s) ['k']; the model needs ['image', 'k']" in refused(
        {"inputs": [img([1, 1, 3])]}, input_specs=SPECS
    )
    assert "input 'image': datatype FP32 does not match the model's UINT8" in refused(
        {"inputs": [img([1, 1, 3], "FP32"), k]}, input_specs=SPECS
    )
    assert "input 'image': shape [2, 2, 4] does not match the model's [-1, -1, 3]" in refused(
        {"inputs": [img([2, 2, 4]), k]}, input_specs=SPECS
    )
    assert "input 'image': shape [2, 3] does not match the model's [-1, -1, 3]" in refused(
        {"inputs": [img([2, 3]), k]}, input_specs=SPECS
    )
    assert "input 'image' is given more than once" in refused(
        {"inputs": [img([1, 1, 3]), img([1, 1, 3]), k]}, input_specs=SPECS
    )


def test_max_elements() -> None:
    doc = {"inputs": [inp("x", "FP32", [1000, 1000], parameters={"binary_data_size": 4_000_000})]}
    msg = refused(doc, header_length=len(json.dumps(doc)), max_elements=100_000)
    assert (
        "input 'x': shape [1000, 1000] has 1000000 elements; this server accepts at most 100000"
        in msg
    )
    assert decode({"inputs": [inp(data=[0] * 4)]}, max_elements=4).inputs["x"].size == 4


# -- encoding refusals --------------------------------------------------------------------


def test_encode_refuses_unknown_outputs_and_uncarriable_dtypes() -> None:
    with pytest.raises(
        ProtocolError, match=r"unknown output\(s\) \['z'\] requested; model m has outputs \['y'\]"
    ) as ei:
        encode_infer_response(
            model_name="m",
            request_id=None,
            outputs={"y": np.zeros(1)},
            requested=[RequestedOutput("z")],
            binary_default=False,
        )
    assert ei.value.status == 400
    with pytest.raises(
        ProtocolError, match="output 'c': numpy dtype complex64 has no v2 datatype"
    ) as ei:
        encode_infer_response(
            model_name="m",
            request_id=None,
            outputs={"c": np.zeros(1, np.complex64)},
            requested=None,
            binary_default=True,
        )
    assert ei.value.status == 500
    with pytest.raises(
        ProtocolError, match="output 'o': a BYTES element must be bytes or str, got int"
    ) as ei:
        encode_infer_response(
            model_name="m",
            request_id=None,
            outputs={"o": np.array([1, "a"], dtype=object)},
            requested=None,
            binary_default=False,
        )
    assert ei.value.status == 500
    with pytest.raises(ProtocolError, match="input 'c': numpy dtype complex128"):
        encode_infer_request({"c": np.zeros(1, complex)})


# -- shared memory ------------------------------------------------------------------------


def test_shm_inputs_and_outputs_bit_exact(shm_key: str) -> None:
    a = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    a[0, 0] = -np.nan  # payload and sign must survive: no JSON on this path
    s = np.array([b"\x00\xffraw", "t\u00ebxt".encode(), b""], dtype=object)
    with SharedMemoryRegion.create(shm_key, 4096) as region, SystemSharedMemoryRegistry() as reg:
        na = region.set(a, offset=0)
        ns = region.set(s, offset=128)
        assert na == a.nbytes and ns == len(serialize_bytes(s))
        reg.register("in", shm_key, 0, 1024)
        reg.register("out", shm_key, 1024, 3072)
        inputs = {
            "a": ShmTensor("in", "FP32", [3, 5], na),
            "s": ShmTensor("in", "BYTES", [3], ns, offset=128),
            "j": np.arange(3, dtype=np.int8),
        }
        body, headers = encode_infer_request(
            inputs,
            outputs=[
                RequestedOutput("a2", shm=("out", 16, 512)),
                RequestedOutput("s2", shm=("out", 600, 100)),
                RequestedOutput("j"),
            ],
            binary=False,
        )
        doc = json.loads(body)
        assert doc["inputs"][0] == {
            "name": "a",
            "datatype": "FP32",
            "shape": [3, 5],
            "parameters": {
                "shared_memory_region": "in",
                "shared_memory_offset": 0,
                "shared_memory_byte_size": 60,
            },
        }
        req = decode_infer_request(body, header_length=header_len(headers), shm=reg)
        assert req.inputs["a"].tobytes() == a.tobytes()
        assert req.inputs["s"].tolist() == s.tolist()
        assert req.outputs[0].shm == ("out", 16, 512)
        outs = {"a2": req.inputs["a"] * 2, "s2": req.inputs["s"], "j": req.inputs["j"]}
        body, headers = encode_infer_response(
            model_name="m",
            request_id=None,
            outputs=outs,
            requested=req.outputs,
            binary_default=False,
            shm=reg,
        )
        doc = json.loads(body)
        assert doc["outputs"][0] == {
            "name": "a2",
            "datatype": "FP32",
            "shape": [3, 5],
            "parameters": {
                "shared_memory_region": "out",
                "shared_memory_offset": 16,
                "shared_memory_byte_size": 60,
            },
        }
        assert "data" not in doc["outputs"][1] and doc["outputs"][2]["data"] == [0, 1, 2]
        got = region.get(np.float32, [3, 5], offset=1024 + 16)
        assert got.tobytes() == outs["a2"].tobytes()
        assert region.get("BYTES", [3], offset=1024 + 600).tolist() == s.tolist()
        res = decode_infer_response(body, header_length=header_len(headers))
        assert list(res.outputs) == ["j"]
        assert res.shm_outputs["a2"] == {
            "datatype": "FP32",
            "shape": [3, 5],
            "shared_memory_region": "out",
            "shared_memory_offset": 16,
            "shared_memory_byte_size": 60,
        }


def test_shm_refusals(shm_key: str) -> None:
    with SharedMemoryRegion.create(shm_key, 256) as region, SystemSharedMemoryRegistry() as reg:
        region.set(np.zeros(8, np.float32))
        reg.register("r", shm_key, 0, 64)

        def shm_input(**params: Any) -> dict[str, Any]:
            return {"inputs": [inp("x", "FP32", [2, 2], parameters=params)]}

        assert "input 'x': shared memory region 'nope' is not registered" in refused(
            shm_input(shared_memory_region="nope", shared_memory_byte_size=16), shm=reg
        )
        assert (
            "input 'x': offset 56 + byte_size 16 is beyond shared memory region 'r' (64 bytes)"
            in refused(
                shm_input(
                    shared_memory_region="r", shared_memory_byte_size=16, shared_memory_offset=56
                ),
                shm=reg,
            )
        )
        assert (
            "input 'x': shared_memory_byte_size 12 does not match shape [2, 2] of FP32 (16 bytes)"
            in refused(shm_input(shared_memory_region="r", shared_memory_byte_size=12), shm=reg)
        )
        assert "needs both shared_memory_region and shared_memory_byte_size" in refused(
            shm_input(shared_memory_region="r"), shm=reg
        )
        assert "shared_memory_offset must be a non-negative integer, got -8" in refused(
            shm_input(
                shared_memory_region="r", shared_memory_byte_size=16, shared_memory_offset=-8
            ),
            shm=reg,
        )
        assert "input 'x': system shared memory is not available on this server" in refused(
            shm_input(shared_memory_region="r", shared_memory_byte_size=16), shm=None
        )
        doc = {
            "inputs": [
                inp(
                    "x",
                    data=[1] * 4,
                    parameters={"shared_memory_region": "r", "shared_memory_byte_size": 16},
                )
            ]
        }
        assert "input 'x': give its data one way only" in refused(doc, shm=reg)
        out = {
            "inputs": [inp(data=[1] * 4)],
            "outputs": [
                {
                    "name": "y",
                    "parameters": {"shared_memory_region": "gone", "shared_memory_byte_size": 4},
                }
            ],
        }
        assert "requested output 'y': shared memory region 'gone' is not registered" in refused(
            out, shm=reg
        )
        out["outputs"][0]["parameters"] = {
            "shared_memory_region": "r",
            "shared_memory_byte_size": 65,
        }
        assert (
            "requested output 'y': offset 0 + byte_size 65 is beyond shared memory region 'r'"
            in refused(out, shm=reg)
        )

        with pytest.raises(ProtocolError) as ei:
            encode_infer_response(
                model_name="m",
                request_id=None,
                outputs={"y": np.zeros(5, np.float32)},
                requested=[RequestedOutput("y", shm=("r", 48, 16))],
                binary_default=False,
                shm=reg,
            )
        assert ei.value.status == 400
        assert (
            "output 'y' is 20 bytes (FP32 [5]) but its shared memory range (region 'r', offset 48) holds only 16"
            in str(ei.value)
        )
        reg.unregister("r")  # gone between request and response
        with pytest.raises(
            ProtocolError, match="output 'y': shared memory region 'r' is not registered"
        ):
            encode_infer_response(
                model_name="m",
                request_id=None,
                outputs={"y": np.zeros(2, np.float32)},
                requested=[RequestedOutput("y", shm=("r", 0, 16))],
                binary_default=False,
                shm=reg,
            )


def test_decode_response_refusals() -> None:
    with pytest.raises(ProtocolError, match="unknown datatype 'X'"):
        decode_infer_response(
            b'{"outputs":[{"name":"y","datatype":"X","shape":[1],"data":[1]}]}', header_length=None
        )
    with pytest.raises(ProtocolError, match="runs past the end of the response body"):
        head = b'{"outputs":[{"name":"y","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":4}}]}'
        decode_infer_response(head + b"ab", header_length=len(head))
    with pytest.raises(ProtocolError, match="neither data"):
        decode_infer_response(
            b'{"outputs":[{"name":"y","datatype":"FP32","shape":[1]}]}', header_length=None
        )


def test_unit_ms_travels_as_flat_double_parameters() -> None:
    """Per-unit times are one ``unit_ms.<unit>`` double each (v2 parameters are
    scalars) and read back as a dict, in order; non-numbers are not times."""
    from infscaler.api.codec import InferResult, unit_ms_of, unit_ms_parameters

    params = unit_ms_parameters({"det": 12.5, "rec": 3})
    assert params == {"unit_ms.det": 12.5, "unit_ms.rec": 3.0}
    assert all(type(v) is float for v in params.values())
    mixed = {"latency_ms": 16.0, **params, "unit_ms.bad": "x", "unit_ms.flag": True}
    assert unit_ms_of(mixed) == {"det": 12.5, "rec": 3.0}
    assert InferResult("m", None, {}, mixed).unit_ms == {"det": 12.5, "rec": 3.0}
    assert InferResult("m", None, {}).unit_ms == {}


def _parts_header(*inputs: tuple[str, str, list[int], int]) -> bytes:
    doc = {
        "inputs": [
            {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": b}}
            for n, d, s, b in inputs
        ]
    }
    return json.dumps(doc).encode()


def test_binary_data_in_parts_is_read_in_place_or_joined() -> None:
    x = np.arange(6, dtype=np.float32)
    y = np.arange(4, dtype=np.int32)
    header = _parts_header(("x", "FP32", [6], 24), ("y", "INT32", [4], 16))
    own = [bytearray(x.tobytes()), bytearray(y.tobytes())]
    got = decode_infer_request(header, header_length=len(header), copy=False, parts=own)
    np.testing.assert_array_equal(got.inputs["x"], x)
    np.testing.assert_array_equal(got.inputs["y"], y)
    assert np.shares_memory(got.inputs["x"], np.frombuffer(own[0], np.uint8))
    # the same bytes cut elsewhere: y spans two parts and is joined
    flat = x.tobytes() + y.tobytes()
    cut = [flat[:30], flat[30:]]
    got = decode_infer_request(header, header_length=len(header), parts=cut)
    np.testing.assert_array_equal(got.inputs["x"], x)
    np.testing.assert_array_equal(got.inputs["y"], y)


def test_binary_data_in_parts_is_checked_as_a_body() -> None:
    header = _parts_header(("x", "FP32", [2], 8))
    with pytest.raises(ProtocolError, match="runs past the end of the body"):
        decode_infer_request(header, header_length=len(header), parts=[b"\0" * 4])
    with pytest.raises(ProtocolError, match="4 bytes of binary data after the JSON header"):
        decode_infer_request(header, header_length=len(header), parts=[b"\0" * 8, b"\0" * 4])
