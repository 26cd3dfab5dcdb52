"""Typed InferTensorContents -> the binary tensor layout (infscaler.api.grpc.mapping.
contents_to_bytes): every datatype as tensor_to_bytes lays it out, narrowing casts
range-checked in every chunk, the element count checked before any value is read, BYTES
refused (413) where decoding would pass the HTTP path's bound, and no intermediate
larger than the result (tracemalloc)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from infscaler.api.codec import ProtocolError, tensor_to_bytes
from infscaler.api.codec_tensors import BYTES_DECODE_SLACK
from infscaler.api.grpc.mapping import CONTENTS_FIELD, contents_to_bytes
from infscaler.api.grpc.wire import CONVERT_CHUNK
from infscaler.proto import grpc_service_pb2 as pb

N = CONVERT_CHUNK * 2 + 5  # three chunks
RNG = np.random.default_rng(0)
ARRAYS = {
    "BOOL": RNG.integers(0, 2, N).astype(bool),
    "UINT8": RNG.integers(0, 256, N).astype(np.uint8),
    "UINT16": RNG.integers(0, 2**16, N).astype(np.uint16),
    "UINT32": RNG.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32),
    "UINT64": RNG.integers(0, 2**64, N, dtype=np.uint64),
    "INT8": RNG.integers(-128, 128, N).astype(np.int8),
    "INT16": RNG.integers(-(2**15), 2**15, N).astype(np.int16),
    "INT32": RNG.integers(-(2**31), 2**31, N).astype(np.int32),
    "INT64": RNG.integers(-(2**63), 2**63, N, dtype=np.int64),
    "FP32": RNG.standard_normal(N).astype(np.float32),
    "FP64": RNG.standard_normal(N),
    "BYTES": np.array(
        [bytes(RNG.integers(0, 256, i % 7, dtype=np.uint8)) for i in range(N)], dtype=object
    ),
}


def _contents(datatype: str, values) -> pb.InferTensorContents:
    c = pb.InferTensorContents()
    getattr(c, CONTENTS_FIELD[datatype]).extend(values)
    return c


@pytest.mark.parametrize("datatype", list(ARRAYS))
def test_every_datatype_is_laid_out_as_tensor_to_bytes_does(datatype: str) -> None:
    arr = ARRAYS[datatype]
    got = contents_to_bytes(_contents(datatype, arr.tolist()), datatype, [N], "input 'x'")
    assert bytes(got) == bytes(tensor_to_bytes(arr, datatype))


@pytest.mark.parametrize(
    ("datatype", "bad"),
    [("INT8", 128), ("INT8", -129), ("INT16", 2**15), ("UINT8", 256), ("UINT16", 2**16)],
)
def test_a_value_out_of_range_is_refused_in_any_chunk(datatype: str, bad: int) -> None:
    values = [0] * N
    values[-1] = bad  # in the last chunk
    with pytest.raises(ProtocolError) as e:
        contents_to_bytes(_contents(datatype, values), datatype, [N], "input 'x'")
    assert e.value.status == 400 and f"outside {datatype}'s range" in str(e.value)


class _Unreadable:
    """A repeated field that may be counted, never read."""

    def __len__(self) -> int:
        return 10

    def __iter__(self):
        raise AssertionError("values read before the count was checked")


class _Contents:
    int_contents = _Unreadable()

    def ListFields(self):  # noqa: N802 - protobuf's name
        return [(pb.InferTensorContents.DESCRIPTOR.fields_by_name["int_contents"], None)]


def test_the_count_is_checked_before_any_value_is_read() -> None:
    with pytest.raises(ProtocolError) as e:
        contents_to_bytes(_Contents(), "INT8", [3, 4], "input 'x'")
    assert "int_contents holds 10 values but shape [3, 4] needs 12" in str(e.value)


def test_faults_are_refused() -> None:
    with pytest.raises(ProtocolError, match="FP16 has no InferTensorContents field"):
        contents_to_bytes(pb.InferTensorContents(), "FP16", [1], "x")
    with pytest.raises(ProtocolError, match="go in int_contents, not fp32_contents"):
        contents_to_bytes(_contents("FP32", [1.0]), "INT32", [1], "x")


def test_bytes_beyond_the_http_decode_bound_are_413() -> None:
    n = BYTES_DECODE_SLACK // 30  # 2-byte elements: 43 bytes decoded for 6 of layout
    with pytest.raises(ProtocolError) as e:
        contents_to_bytes(_contents("BYTES", [b"ab"] * n), "BYTES", [n], "input 'x'")
    assert e.value.status == 413 and "at most twice the data's size plus 1 MB" in str(e.value)
    few = BYTES_DECODE_SLACK // 60
    out = contents_to_bytes(_contents("BYTES", [b"ab"] * few), "BYTES", [few], "input 'x'")
    assert len(out) == 6 * few


@pytest.mark.parametrize(
    ("datatype", "n"), [("INT8", 1 << 20), ("FP64", 1 << 19), ("BYTES", 1 << 14)]
)
def test_no_intermediate_is_larger_than_the_result(datatype: str, n: int) -> None:
    values = [b"x" * 100] * n if datatype == "BYTES" else [1] * n
    contents = _contents(datatype, values)
    del values
    tracemalloc.start()
    try:
        out = contents_to_bytes(contents, datatype, [n], "input 'x'")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= len(out) + 64 * CONVERT_CHUNK, (peak, len(out))
