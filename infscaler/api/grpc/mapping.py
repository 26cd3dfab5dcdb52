"""The v2 gRPC messages <-> the codec's tensors (pure; no I/O but the shared memory registry
passed in). Errors: :class:`~infscaler.api.codec.ProtocolError`, mapped to a gRPC status
code by :func:`grpc_code` (Triton's pairing).

Sources: Triton ``grpc_service.proto``, ``src/grpc/grpc_utils.cc``; KServe v2
``required_api.md``. More: docs/api.md, "`infscaler/api/grpc/mapping.py`".
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from infscaler.api.codec import (
    DATATYPES,
    InferRequest,
    ProtocolError,
    RequestedOutput,
    TensorSpec,
    datatype_of,
    decode_infer_request,
    tensor_to_bytes,
)
from infscaler.api.codec_tensors import (
    BYTES_ELEMENT_OVERHEAD,
    bytes_decode_bound,
    bytes_too_large,
    dumps,
)
from infscaler.api.grpc.wire import CONVERT_CHUNK, InferScan, raw_views, strip_raw
from infscaler.proto import grpc_service_pb2 as pb

__all__ = [
    "CONTENTS_FIELD",
    "contents_to_bytes",
    "decode_message",
    "decode_model_infer",
    "encode_model_infer",
    "from_parameters",
    "grpc_code",
    "model_infer_parts",
    "to_parameters",
]

#: v2 datatype -> the ``InferTensorContents`` field that carries it (FP16: none)
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

#: HTTP status -> gRPC status code (Triton's own pairing)
_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.ALREADY_EXISTS,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_code(status: int) -> grpc.StatusCode:
    """The gRPC status code for an HTTP error ``status`` (UNKNOWN for one not mapped;
    other 4xx: INVALID_ARGUMENT, other 5xx: INTERNAL)."""
    if status in _CODES:
        return _CODES[status]
    if 400 <= status < 500:
        return grpc.StatusCode.INVALID_ARGUMENT
    if 500 <= status < 600:
        return grpc.StatusCode.INTERNAL
    return grpc.StatusCode.UNKNOWN


# -- parameters ---------------------------------------------------------------------------


def from_parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    """A map of ``InferParameter`` as plain values (bool, int, float or str); one with no
    value set is left out."""
    out: dict[str, Any] = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        if which is not None:
            out[key] = getattr(p, which)
    return out


def to_parameters(target: Any, values: Mapping[str, Any]) -> None:
    """Fill the ``InferParameter`` map ``target`` from plain values: bool, int (int64;
    uint64 above its range), finite float, str; anything else as its JSON text."""
    for key, v in values.items():
        p = target[key]
        if isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int | np.integer):
            if int(v) >= 1 << 63:
                p.uint64_param = int(v)
            else:
                p.int64_param = int(v)
        elif isinstance(v, float | np.floating) and math.isfinite(v):
            p.double_param = float(v)
        elif isinstance(v, str):
            p.string_param = v
        else:
            p.string_param = json.dumps(v, default=str)


# -- requests -----------------------------------------------------------------------------


#: InferTensorContents field -> the numpy type of its values (what upb holds)
_CONTAINER: dict[str, np.dtype] = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
}
_U32 = struct.Struct("<I")  # a BYTES element's length


class _Typed:
    """One input's typed contents, checked, with the size of its binary layout."""

    __slots__ = ("values", "datatype", "name", "count", "size", "where")

    def __init__(self, values: Any, datatype: str, name: str, count: int, where: str) -> None:
        self.values, self.datatype, self.name, self.count, self.where = (
            values,
            datatype,
            name,
            count,
            where,
        )
        if datatype == "BYTES":
            self.size = _bytes_layout_size(values, count, where)
        else:
            self.size = count * DATATYPES[datatype].itemsize

    def write(self, out: memoryview) -> None:
        """The binary layout into ``out`` (``size`` bytes), a chunk at a time."""
        if self.datatype == "BYTES":
            pos = 0
            for v in self.values:
                n = len(v)
                _U32.pack_into(out, pos, n)
                out[pos + 4 : pos + 4 + n] = v
                pos += 4 + n
            return
        dtype, container = DATATYPES[self.datatype], _CONTAINER[self.name]
        target = np.frombuffer(out, dtype=dtype, count=self.count)
        narrow = dtype.kind in "iu" and dtype.itemsize < container.itemsize
        it = iter(self.values)
        for start in range(0, self.count, CONVERT_CHUNK):
            k = min(CONVERT_CHUNK, self.count - start)
            chunk = np.fromiter(it, dtype=container, count=k)
            if narrow and (chunk.min() < np.iinfo(dtype).min or chunk.max() > np.iinfo(dtype).max):
                info = np.iinfo(dtype)
                raise ProtocolError(
                    f"{self.where}: a value of {self.name} is outside {self.datatype}'s range "
                    f"[{info.min}, {info.max}]"
                )
            target[start : start + k] = chunk


def _bytes_layout_size(values: Any, count: int, where: str) -> int:
    """The length-prefixed layout's size of ``values``, refused (413) where decoding it
    would hold more than :func:`~infscaler.api.codec.parse_bytes` allows (twice the
    layout plus its slack: the HTTP path's bound)."""
    size, decoded = 4 * count, 8 * count
    for v in values:
        n = len(v)
        size += n
        if n > 1:
            decoded += BYTES_ELEMENT_OVERHEAD - 8 + n
    if decoded > bytes_decode_bound(size):
        raise bytes_too_large(where, count, size)
    return size


def _typed(contents: Any, datatype: str, shape: Sequence[int], where: str) -> _Typed:
    name = CONTENTS_FIELD.get(datatype)
    if name is None:
        raise ProtocolError(
            f"{where}: {datatype} has no InferTensorContents field; send it in raw_input_contents"
        )
    others = [
        f.name for f, _ in contents.ListFields() if f.name != name
    ]  # e.g. fp32_contents for an INT32 input
    if others:
        raise ProtocolError(
            f"{where}: a {datatype} tensor's contents go in {name}, not {', '.join(others)}"
        )
    values = getattr(contents, name)
    count = math.prod(shape)
    if len(values) != count:
        raise ProtocolError(
            f"{where}: {name} holds {len(values)} values but shape {list(shape)} needs {count}"
        )
    return _Typed(values, datatype, name, count, where)


def contents_to_bytes(contents: Any, datatype: str, shape: Sequence[int], where: str) -> bytearray:
    """Typed ``InferTensorContents`` in the binary tensor layout of ``datatype``, converted a
    chunk at a time once the element count is checked against ``shape``.

    Raises:
        ProtocolError: (400) a datatype without a typed field (FP16), values in another
            field, a count that is not the shape's, a value out of range; (413) BYTES
            elements that would decode to more than the HTTP path's bound.
    """
    typed = _typed(contents, datatype, shape, where)
    out = bytearray(typed.size)
    typed.write(memoryview(out))
    return out


def model_infer_parts(req: Any, raw: Sequence[Any] | None = None) -> tuple[bytes, list[Any]]:
    """A ``ModelInferRequest`` as the JSON header of the HTTP binary tensor body and one
    buffer of binary data per input (raw entries as they are; typed contents converted).

    Args:
        req: an ``inference.ModelInferRequest``.
        raw: its ``raw_input_contents`` entries (default: the message's own).

    Raises:
        ProtocolError: (400) raw entries for some inputs but not all, an input with both
            raw and typed contents, a ``binary_data_size`` parameter, and what
            :func:`contents_to_bytes` refuses.
    """
    header, parts = _header_and_parts(req, raw)
    for i, part in enumerate(parts):
        if isinstance(part, _Typed):
            buf = bytearray(part.size)
            part.write(memoryview(buf))
            parts[i] = buf
    return header, parts


def _header_and_parts(req: Any, raw: Sequence[Any] | None) -> tuple[bytes, list[Any]]:
    """The JSON header and each input's data: a raw entry, or typed contents still to be
    written (``_Typed``). Arguments and errors: :func:`model_infer_parts`."""
    raw = req.raw_input_contents if raw is None else raw
    if raw and len(raw) != len(req.inputs):
        raise ProtocolError(
            f"raw_input_contents has {len(raw)} entries for {len(req.inputs)} inputs: give "
            "one per input, in the inputs' order, or none"
        )
    params = from_parameters(req.parameters)
    if "timeout" in params and "timeout_ms" not in params:  # tritonclient: microseconds
        t = params.pop("timeout")
        if isinstance(t, int) and not isinstance(t, bool) and t > 0:
            params["timeout_ms"] = t / 1e3
    doc: dict[str, Any] = {"parameters": params, "inputs": [], "outputs": []}
    if req.id:
        doc["id"] = req.id
    parts: list[Any] = []
    for i, t in enumerate(req.inputs):
        where = f"input '{t.name}'"
        p = from_parameters(t.parameters)
        if "binary_data_size" in p:
            raise ProtocolError(
                f"{where}: binary_data_size is not a gRPC parameter (the raw_input_contents "
                "entry has its size)"
            )
        item: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        part: Any = None
        if raw:
            if t.HasField("contents"):
                raise ProtocolError(
                    f"{where}: give its data one way only: raw_input_contents or contents"
                )
            part = raw[i]
        elif t.HasField("contents") and t.datatype in DATATYPES:
            part = _typed(t.contents, t.datatype, list(t.shape), where)
        if part is not None:
            p["binary_data_size"] = part.size if isinstance(part, _Typed) else len(part)
            parts.append(part)
        if p:
            item["parameters"] = p
        doc["inputs"].append(item)
    for o in req.outputs:
        p = from_parameters(o.parameters)
        p["binary_data"] = True
        doc["outputs"].append({"name": o.name, "parameters": p})
    return dumps(doc), parts


def decode_model_infer(
    req: Any,
    specs: Sequence[TensorSpec] | None,
    shm: Any = None,
    *,
    raw: Sequence[Any] | None = None,
) -> InferRequest:
    """Decode a ``ModelInferRequest`` with the HTTP path's checks
    (:func:`~infscaler.api.codec.decode_infer_request`): ``specs`` the model's inputs (None:
    not checked), ``shm`` the client's shared memory view, ``raw`` as :func:`model_infer_parts`.
    A ``timeout`` parameter (µs, tritonclient) becomes ``timeout_ms``.

    Raises:
        ProtocolError: what :func:`model_infer_parts` and ``decode_infer_request`` refuse.
    """
    header, parts = model_infer_parts(req, raw)
    return decode_infer_request(
        header, header_length=len(header), input_specs=specs, shm=shm, copy=False, parts=parts
    )


def decode_message(
    message: bytes, scan: InferScan, specs: Sequence[TensorSpec] | None, shm: Any = None
) -> InferRequest:
    """Parse and decode a serialized ``ModelInferRequest`` already scanned: its raw entries
    are read in place (read-only views of ``message``), the rest parsed and freed before the
    tensors are decoded; at its peak it holds what ``scan.held`` bounds.

    Raises:
        ProtocolError: (400) not protobuf, and what :func:`decode_model_infer` refuses.
    """
    try:
        req = pb.ModelInferRequest.FromString(strip_raw(message, scan))
    except DecodeError as exc:
        raise ProtocolError(f"not a valid ModelInferRequest message: {exc}") from None
    header, parts = model_infer_parts(req, raw_views(message, scan) if scan.raw else None)
    del req  # upb's arena goes before the body's tensors are decoded
    return decode_infer_request(
        header, header_length=len(header), input_specs=specs, shm=shm, copy=False, parts=parts
    )


# -- responses ----------------------------------------------------------------------------


def encode_model_infer(
    *,
    model_name: str,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray],
    requested: Sequence[RequestedOutput] | None,
    parameters: Mapping[str, Any] | None = None,
    shm: Any = None,
    model_version: str = "1",
) -> Any:
    """A ``ModelInferResponse`` of the requested ``outputs`` (all when ``requested`` is None):
    bytes in ``raw_output_contents``, or written to the output's shared memory range (then
    the ``shared_memory_*`` parameters and an empty raw entry).

    Raises:
        ProtocolError: (400) an unknown output, one larger than its shared memory range, a
            region gone; (500) a dtype the protocol cannot carry.
    """
    plan = [RequestedOutput(n, True, None) for n in outputs] if requested is None else requested
    unknown = [r.name for r in plan if r.name not in outputs]
    if unknown:
        raise ProtocolError(
            f"unknown output(s) {unknown} requested; model {model_name} has outputs {list(outputs)}"
        )
    resp = pb.ModelInferResponse(model_name=model_name, model_version=model_version)
    if request_id:
        resp.id = request_id
    if parameters:
        to_parameters(resp.parameters, parameters)
    for r in plan:
        where = f"output '{r.name}'"
        arr = np.asarray(outputs[r.name])
        try:
            datatype = datatype_of(arr)
            raw = tensor_to_bytes(arr, datatype)
        except ProtocolError as exc:
            raise ProtocolError(f"{where}: {exc.message}", 500) from None
        out = resp.outputs.add(name=r.name, datatype=datatype, shape=list(arr.shape))
        if r.shm is None:
            resp.raw_output_contents.append(bytes(raw))
            continue
        region, offset, size = r.shm
        if len(raw) > size:
            raise ProtocolError(
                f"{where} is {len(raw)} bytes ({datatype} {list(arr.shape)}) but its shared "
                f"memory range (region '{region}', offset {offset}) holds only {size}"
            )
        if shm is None:
            raise ProtocolError(f"{where}: system shared memory is not available here")
        shm.write(region, offset, raw)
        to_parameters(
            out.parameters,
            {
                "shared_memory_region": region,
                "shared_memory_offset": offset,
                "shared_memory_byte_size": len(raw),
            },
        )
        resp.raw_output_contents.append(b"")
    return resp
