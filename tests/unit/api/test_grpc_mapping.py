"""The pure gRPC <-> v2 codec mapping (infscaler.api.grpc.mapping): raw_input_contents and
typed InferTensorContents decode to the same tensors as the HTTP codec's binary data,
every datatype round-trips, faults are refused with the HTTP path's status, and HTTP
statuses map to Triton's gRPC codes."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from infscaler.api.codec import ProtocolError, TensorSpec, tensor_to_bytes
from infscaler.api.grpc import default_grpc_socket
from infscaler.api.grpc.mapping import (
    CONTENTS_FIELD,
    decode_model_infer,
    encode_model_infer,
    from_parameters,
    grpc_code,
    to_parameters,
)
from infscaler.proto import grpc_service_pb2 as pb

ARRAYS = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([[0, 7, 255]], np.uint8),
    "UINT16": np.array([[0, 7, 65535]], np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1]], np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1]], np.uint64),
    "INT8": np.array([[-128, 0, 127]], np.int8),
    "INT16": np.array([[-32768, 0, 32767]], np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1]], np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1]], np.int64),
    "FP16": np.array([[-1.5, 0.0, 65504.0]], np.float16),
    "FP32": np.array([[-1.5, np.nan, np.inf]], np.float32),
    "FP64": np.array([[-1.5, 1e-300, 1e300]], np.float64),
    "BYTES": np.array([[b"a", b"\xff\x00", b""]], dtype=object),
}


def _request(datatype: str, arr: np.ndarray, *, typed: bool) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", id="r1")
    t = req.inputs.add(name="x", datatype=datatype, shape=list(arr.shape))
    if typed:
        getattr(t.contents, CONTENTS_FIELD[datatype]).extend(arr.reshape(-1).tolist())
    else:
        req.raw_input_contents.append(bytes(tensor_to_bytes(arr, datatype)))
    return req


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype == object:
        return a.shape == b.shape and [bytes(x) for x in a.reshape(-1)] == list(b.reshape(-1))
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("datatype", list(ARRAYS))
def test_raw_input_contents_decode_bit_exact(datatype: str) -> None:
    arr = ARRAYS[datatype].astype(ARRAYS[datatype].dtype.newbyteorder("<"))
    spec = TensorSpec("x", datatype, [-1, 3])
    got = decode_model_infer(_request(datatype, arr, typed=False), [spec]).inputs["x"]
    assert _same(got, arr)


@pytest.mark.parametrize("datatype", [d for d in ARRAYS if d != "FP16"])
def test_typed_contents_decode_bit_exact(datatype: str) -> None:
    arr = ARRAYS[datatype]
    req = _request(datatype, arr, typed=True)
    got = decode_model_infer(req, [TensorSpec("x", datatype, [1, 3])]).inputs["x"]
    assert _same(got, arr)


def test_encode_round_trips_every_datatype_in_raw_output_contents() -> None:
    resp = encode_model_infer(
        model_name="m", request_id="r1", outputs=ARRAYS, requested=None, parameters={"a": 1}
    )
    assert resp.id == "r1" and resp.parameters["a"].int64_param == 1
    assert [o.name for o in resp.outputs] == list(ARRAYS)
    for o, raw in zip(resp.outputs, resp.raw_output_contents, strict=True):
        assert o.datatype == o.name and list(o.shape) == [1, 3]
        assert raw == bytes(tensor_to_bytes(ARRAYS[o.name], o.datatype))


def test_faults_are_refused_with_the_http_status() -> None:
    spec = [TensorSpec("x", "FP32", [-1, 3])]
    # a wrong datatype: the HTTP codec's check and message
    with pytest.raises(ProtocolError, match="does not match the model's FP32") as e:
        decode_model_infer(_request("INT32", ARRAYS["INT32"], typed=False), spec)
    assert e.value.status == 400
    # raw bytes that are not the shape's
    req = _request("FP32", ARRAYS["FP32"], typed=False)
    req.raw_input_contents[0] = b"\0" * 8
    with pytest.raises(ProtocolError, match="binary_data_size 8 does not match"):
        decode_model_infer(req, spec)
    # values in another field than the datatype's
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 3]).contents.int_contents.extend([1, 2, 3])
    with pytest.raises(ProtocolError, match="go in fp32_contents, not int_contents"):
        decode_model_infer(req, spec)
    # FP16 has no typed field
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP16", shape=[1, 3]).contents.fp32_contents.extend([1] * 3)
    with pytest.raises(ProtocolError, match="FP16 has no InferTensorContents field"):
        decode_model_infer(req, None)
    # an out-of-range typed value
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="INT8", shape=[1]).contents.int_contents.append(300)
    with pytest.raises(ProtocolError, match="outside INT8's range"):
        decode_model_infer(req, None)
    # raw contents for some inputs but not all
    req = _request("FP32", ARRAYS["FP32"], typed=False)
    req.inputs.add(name="y", datatype="FP32", shape=[1, 3])
    with pytest.raises(ProtocolError, match="1 entries for 2 inputs"):
        decode_model_infer(req, None)
    # an output the model does not produce
    from infscaler.api.codec import RequestedOutput

    with pytest.raises(ProtocolError, match="unknown output"):
        encode_model_infer(
            model_name="m",
            request_id=None,
            outputs={"z": ARRAYS["FP32"]},
            requested=[RequestedOutput("w", True)],
        )


def test_parameters_and_timeout() -> None:
    req = _request("FP32", ARRAYS["FP32"], typed=False)
    req.parameters["timeout"].int64_param = 250_000  # tritonclient: microseconds
    req.parameters["flag"].bool_param = True
    got = decode_model_infer(req, None)
    assert got.parameters["timeout_ms"] == 250.0 and got.parameters["flag"] is True
    assert got.id == "r1"
    resp = pb.ModelInferResponse()
    to_parameters(resp.parameters, {"b": False, "i": -3, "u": 2**64 - 1, "f": 0.5, "s": "x"})
    assert from_parameters(resp.parameters) == {
        "b": False,
        "i": -3,
        "u": 2**64 - 1,
        "f": 0.5,
        "s": "x",
    }


def test_status_codes_and_default_socket() -> None:
    assert grpc_code(400) is grpc.StatusCode.INVALID_ARGUMENT
    assert grpc_code(403) is grpc.StatusCode.PERMISSION_DENIED
    assert grpc_code(404) is grpc.StatusCode.NOT_FOUND
    assert grpc_code(413) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert grpc_code(429) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert grpc_code(503) is grpc.StatusCode.UNAVAILABLE
    assert grpc_code(418) is grpc.StatusCode.INVALID_ARGUMENT
    assert grpc_code(599) is grpc.StatusCode.INTERNAL
    assert default_grpc_socket("/run/infscaler/infscaler.sock") == (
        "/run/infscaler/infscaler-grpc.sock"
    )


def test_raw_entries_are_decoded_in_place_from_the_message() -> None:
    from infscaler.api.grpc.mapping import decode_message
    from infscaler.api.grpc.wire import scan_model_infer

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    z = np.array([[1, 2]], np.int64)
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[3, 4])
    req.inputs.add(name="z", datatype="INT64", shape=[1, 2])
    req.raw_input_contents.extend([x.tobytes(), z.tobytes()])
    message = req.SerializeToString()
    scan = scan_model_infer(message, limit=1 << 20)
    got = decode_message(message, scan, None).inputs
    np.testing.assert_array_equal(got["x"], x)
    np.testing.assert_array_equal(got["z"], z)
    wire = np.frombuffer(message, np.uint8)
    assert np.shares_memory(got["x"], wire) and np.shares_memory(got["z"], wire)  # no copy
    assert not got["x"].flags.writeable  # a view of the client's bytes: read-only
