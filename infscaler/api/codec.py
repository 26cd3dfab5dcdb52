"""The Open Inference Protocol (KServe v2) codec: inference requests and responses.

Pure functions between HTTP bodies and numpy arrays, for the server (decode a request,
encode a response) and the client (encode a request, decode a response). The only I/O
is through a :class:`~infscaler.api.sysshm.SystemSharedMemoryRegistry` passed in, for tensors
that travel through system shared memory.

Sources: KServe / Triton ``protocol/`` docs: the v2 REST inference request / response
JSON (``$inference_request``, ``$request_input``, ``$request_output``,
``$inference_response``, ``$response_output``), ``extension_binary_data.md``,
``extension_shared_memory.md``.

More (details, why it is so, history, figures): docs/api.md, "`infscaler/api/codec.py`".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from infscaler.api.codec_json import (
    HEADER_LENGTH,
    MAX_JSON_DEPTH,
    MAX_TIMEOUT_MS,
    check_parameters,
    nonneg_int,
    params_of,
    parse_header_length,
    parse_json,
    parse_json_object,
    parse_queue_params,
    parse_shape,
    parse_timeout_ms,
    shm_params,
    split_body,
)
from infscaler.api.codec_tensors import (
    DATATYPES,
    ProtocolError,
    datatype_of,
    deserialize_bytes,
    dumps,
    from_json_data,
    is_int,
    json_default,
    serialize_bytes,
    tensor_from_bytes,
    tensor_to_bytes,
    to_json_data,
)

if TYPE_CHECKING:
    from infscaler.api.sysshm import SystemSharedMemoryRegistry

__all__ = [
    "DATATYPES",
    "HEADER_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_TIMEOUT_MS",
    "InferRequest",
    "InferResult",
    "ProtocolError",
    "RequestedOutput",
    "ShmOutput",
    "ShmTensor",
    "UNIT_MS_PREFIX",
    "TensorSpec",
    "datatype_of",
    "decode_infer_request",
    "decode_infer_response",
    "deserialize_bytes",
    "encode_infer_request",
    "encode_infer_response",
    "json_default",
    "parse_header_length",
    "parse_json_object",
    "parse_queue_params",
    "parse_timeout_ms",
    "serialize_bytes",
    "tensor_from_bytes",
    "tensor_to_bytes",
    "unit_ms_of",
    "unit_ms_parameters",
]


# -- data model ---------------------------------------------------------------------------


@dataclass
class TensorSpec:
    """What a model takes: a tensor ``name``, its v2 ``datatype`` and ``shape``
    (-1: any size along that dimension; the rank must match)."""

    name: str
    datatype: str
    shape: list[int]


@dataclass
class RequestedOutput:
    """An output the request asked for (``$request_output``).

    Attributes:
        binary: return it as binary data (its ``binary_data`` parameter, else the
            request's ``binary_data_output``).
        shm: ``(region, offset, byte_size)`` to write it to system shared memory instead.
    """

    name: str
    binary: bool = False
    shm: tuple[str, int, int] | None = None


@dataclass
class InferRequest:
    """A decoded inference request (``$inference_request``).

    Attributes:
        id: the request's ``id`` (echoed in the response), or None.
        inputs: name -> array, in request order. BYTES inputs are ``object`` arrays of ``bytes``.
        outputs: the requested outputs in request order; None: all outputs, each binary
            iff ``binary_output_default``.
        parameters: the request's ``parameters`` object as sent (e.g. ``timeout_ms``).
        binary_output_default: the request parameter ``binary_data_output``.
    """

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    binary_output_default: bool = False


@dataclass
class ShmTensor:
    """An input tensor already in a registered system shared memory region
    (``extension_shared_memory.md``): ``byte_size`` bytes at ``offset`` in ``region``,
    laid out as binary tensor data of ``datatype`` / ``shape``."""

    region: str
    datatype: str
    shape: list[int]
    byte_size: int
    offset: int = 0


@dataclass
class ShmOutput:
    """Where an output should go: at most ``byte_size`` bytes at ``offset`` in the
    registered system shared memory ``region``."""

    region: str
    byte_size: int
    offset: int = 0


@dataclass
class InferResult:
    """A decoded inference response (``$inference_response``).

    Attributes:
        outputs: name -> array for outputs that came in the body (JSON or binary); BYTES
            as ``object`` arrays of ``bytes`` (the client may decode them to ``str``).
        parameters: the response's ``parameters``, each a scalar (InfScaler:
            ``latency_ms``, and ``unit_ms.<unit>`` per served unit: ms, double).
        shm_outputs: outputs written to shared memory: name -> ``datatype``, ``shape`` and
            their parameters (``shared_memory_region``, ``shared_memory_offset``,
            ``shared_memory_byte_size``: the bytes actually written).
    """

    model_name: str
    id: str | None
    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any] = field(default_factory=dict)
    shm_outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    model_version: str | None = None

    def as_numpy(self, name: str) -> np.ndarray | None:
        """The output ``name``, or None (tritonclient's spelling)."""
        return self.outputs.get(name)

    @property
    def unit_ms(self) -> dict[str, float]:
        """Per served unit, the ms it spent on this request (:func:`unit_ms_of` of the
        parameters; empty when the service sent none)."""
        return unit_ms_of(self.parameters)


#: the response parameter of one unit's time: ``unit_ms.<unit name>`` (ms, double)
UNIT_MS_PREFIX = "unit_ms."


def unit_ms_parameters(unit_ms: Mapping[str, float]) -> dict[str, float]:
    """Unit name -> ms as flat response parameters, ``{"unit_ms.<unit>": ms}`` (doubles:
    KServe v2 / Triton parameters are scalars, never nested)."""
    return {f"{UNIT_MS_PREFIX}{name}": float(ms) for name, ms in unit_ms.items()}


def unit_ms_of(parameters: Mapping[str, Any]) -> dict[str, float]:
    """The ``unit_ms.<unit>`` parameters of a response as unit name -> ms (in the order
    sent; a value that is not a number is left out)."""
    out: dict[str, float] = {}
    for key, value in parameters.items():
        if (
            key.startswith(UNIT_MS_PREFIX)
            and isinstance(value, int | float)
            and not isinstance(value, bool)
        ):
            out[key[len(UNIT_MS_PREFIX) :]] = float(value)
    return out


# -- request decoding (server) ------------------------------------------------------------


def _shm_call(shm: SystemSharedMemoryRegistry | None, where: str, op: str, *args: Any) -> Any:
    """``shm.<op>(*args)`` (``check``, ``read`` or ``write``) with ``where`` in its error."""
    if shm is None:
        raise ProtocolError(f"{where}: system shared memory is not available on this server")
    try:
        return getattr(shm, op)(*args)
    except ProtocolError as exc:
        raise ProtocolError(f"{where}: {exc.message}", exc.status, exc.hint) from None


def _check_spec(spec: TensorSpec, datatype: str, shape: list[int], where: str) -> None:
    if datatype != spec.datatype:
        raise ProtocolError(
            f"{where}: datatype {datatype} does not match the model's {spec.datatype}"
        )
    if len(shape) != len(spec.shape) or any(
        s != -1 and s != d for s, d in zip(spec.shape, shape, strict=True)
    ):
        raise ProtocolError(
            f"{where}: shape {shape} does not match the model's {list(spec.shape)} (-1: any size)"
        )


#: keys of an input's parameters that put its data in system shared memory
_SHM_PARAMS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")


def binary_inputs(header: bytes) -> list[tuple[str, np.dtype, tuple[int, ...], int]] | None:
    """The inputs of a request whose JSON part is ``header``, when every one travels as
    binary tensor data of a fixed-size datatype (not BYTES or BOOL): ``(name, dtype,
    shape, binary_data_size)`` each, in the order their bytes follow the header; None
    when any does not (or the header is not such JSON), and the body is then decoded
    as usual. A plan only: it never raises, and :func:`decode_infer_request` checks
    everything again (sizes here match each shape, names are unique)."""
    try:
        doc = parse_json(header, "request", len(header))
    except ProtocolError:
        return None
    items = doc.get("inputs")
    if not isinstance(items, list) or not items:
        return None
    out: list[tuple[str, np.dtype, tuple[int, ...], int]] = []
    for item in items:
        if not isinstance(item, dict) or "data" in item:
            return None
        name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
        p = item.get("parameters")
        if (
            not isinstance(name, str)
            or datatype in ("BYTES", "BOOL")
            or datatype not in DATATYPES
            or not isinstance(p, dict)
            or any(k in p for k in _SHM_PARAMS)
            or not isinstance(shape, list)
            or not all(is_int(d) and d >= 0 for d in shape)
        ):
            return None
        dtype = DATATYPES[datatype]
        size = p.get("binary_data_size")
        if not is_int(size) or size != math.prod(shape) * dtype.itemsize:
            return None
        out.append((name, dtype, tuple(int(d) for d in shape), int(size)))
    if len({name for name, *_ in out}) != len(out):
        return None
    return out


def decode_infer_request(
    body: bytes,
    *,
    header_length: int | None,
    input_specs: Sequence[TensorSpec] | None = None,
    shm: SystemSharedMemoryRegistry | None = None,
    max_elements: int | None = None,
    copy: bool = True,
    parts: Sequence[Any] | None = None,
) -> InferRequest:
    """Decode and validate an inference request body (v2 ``$inference_request``).

    Args:
        body: the HTTP body: a JSON object, or (binary tensor data extension) a JSON object
            of ``header_length`` bytes followed by the inputs' binary data.
        header_length: the ``Inference-Header-Content-Length`` header as an int, or None.
        input_specs: the model's inputs; when given, every input must be named exactly
            once with its datatype and a matching shape (-1 matches any size).
        shm: the system shared memory registry inputs may name, and outputs may target.
        max_elements: refuse any input with more elements than this.
        copy: False: binary tensor data inputs are zero-copy views of ``body`` (where
            the layout allows; see :func:`tensor_from_bytes`): for a body the caller owns
            and leaves unchanged while the inputs are in use. Shared memory inputs are
            always copied (the client may rewrite its region).
        parts: the binary tensor data as buffers laid end to end, in place of the bytes
            after the header in ``body`` (which then holds the header alone); an input
            whose bytes lie within one part is read from it (a view with ``copy=False``),
            one that spans parts from their bytes joined. The gRPC path's
            ``raw_input_contents``, decoded without laying them out in one body first.

    Returns:
        An :class:`InferRequest`: each input an array of its datatype's dtype and shape
        (a copy, never a view of ``body`` or of shared memory, unless ``copy=False``);
        BYTES as ``object``
        arrays of ``bytes``; 0-d and empty tensors as such.

    Raises:
        ProtocolError: (400) with a message naming the input / output and the fault: bad
            JSON or a missing / mistyped field; an unknown datatype; element count != the
            shape's; ``binary_data_size`` that does not match the tensor or runs past the
            body, or binary bytes nobody claims; ``header_length`` beyond the body; an
            unknown, missing or duplicate input (vs ``input_specs``); datatype or shape
            not the model's; an unregistered shared memory region, or offset + size beyond
            it; more than ``max_elements`` elements; a duplicate requested output.
    """
    header, blobs = split_body(body, header_length)
    doc = parse_json(header, "request", header_length)
    req_id, params, binary_default = _request_fields(doc)
    specs = {s.name: s for s in input_specs} if input_specs is not None else None
    if parts is not None:
        if len(blobs):
            raise ValueError("give the binary data in body or in parts, not in both")
        binary = _BinaryData(blobs, header_length, parts=[memoryview(p).cast("B") for p in parts])
    else:
        binary = _BinaryData(blobs, header_length)
    inputs = _decode_inputs(doc.get("inputs"), specs, binary, shm, max_elements, copy)
    outputs = _decode_requested(doc.get("outputs"), binary_default, shm)
    return InferRequest(
        id=req_id,
        inputs=inputs,
        outputs=outputs,
        parameters=params,
        binary_output_default=binary_default,
    )


def _request_fields(doc: dict[str, Any]) -> tuple[str | None, dict[str, Any], bool]:
    """``(id, parameters, binary_data_output)`` of an inference request object, checked
    (the id a string, the parameters valid, ``binary_data_output`` a bool; default False).
    """
    req_id = doc.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise ProtocolError(f"request id must be a string, got {type(req_id).__name__}")
    params = params_of(doc, "request")
    check_parameters(params, "request")
    binary_default = params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise ProtocolError(
            f"request parameter binary_data_output must be true or false, got {binary_default!r}"
        )
    return req_id, params, binary_default


@dataclass
class _BinaryData:
    """The binary tensor data after a request's JSON header (binary tensor data
    extension), handed to the inputs that claim it in order.

    Attributes:
        blobs: the bytes after the JSON header.
        header_length: the ``Inference-Header-Content-Length`` header (None: none given).
        cursor: how many bytes inputs have claimed so far.
    """

    blobs: memoryview
    header_length: int | None
    cursor: int = 0
    #: the binary data as byte views laid end to end, in place of ``blobs`` (None: blobs)
    parts: list[memoryview] | None = None

    @property
    def total(self) -> int:
        """Bytes of binary data in all."""
        return len(self.blobs) if self.parts is None else sum(len(p) for p in self.parts)

    def _range(self, start: int, size: int) -> Any:
        """Bytes ``start .. start + size`` of the binary data: a view where they lie in
        one buffer, else the parts' bytes joined (a copy)."""
        if self.parts is None:
            return self.blobs[start : start + size]
        pieces, pos = [], 0
        for p in self.parts:
            lo, hi = max(start - pos, 0), min(start + size - pos, len(p))
            if lo < hi:
                if hi - lo == size:
                    return p[lo:hi]
                pieces.append(p[lo:hi])
            pos += len(p)
        return b"".join(pieces)

    def take(
        self, raw_size: Any, where: str, datatype: str, shape: list[int], count: int, copy: bool
    ) -> np.ndarray:
        """The next input's tensor of ``raw_size`` bytes (its ``binary_data_size``)."""
        total, cursor = self.total, self.cursor
        size = nonneg_int(raw_size, "binary_data_size", where)
        if self.header_length is None:
            raise ProtocolError(
                f"{where} has binary_data_size but the request has no {HEADER_LENGTH} header"
            )
        if cursor + size > total:
            raise ProtocolError(
                f"{where}: binary_data_size {size} runs past the end of the body "
                f"({total - cursor} of {total} binary bytes left)"
            )
        if datatype != "BYTES" and size != count * DATATYPES[datatype].itemsize:
            raise ProtocolError(
                f"{where}: binary_data_size {size} does not match shape {shape} of "
                f"{datatype} ({count * DATATYPES[datatype].itemsize} bytes)"
            )
        tensor = tensor_from_bytes(self._range(cursor, size), datatype, shape, where, copy=copy)
        self.cursor = cursor + size
        return tensor

    def check_claimed(self) -> None:
        """Every byte was claimed by an input's ``binary_data_size``."""
        total, cursor = self.total, self.cursor
        if cursor != total:
            raise ProtocolError(
                f"{total - cursor} bytes of binary data after the JSON header are not "
                f"claimed by any input's binary_data_size (claimed: {cursor} of {total})"
            )


def _decode_inputs(
    raw_inputs: Any,
    specs: dict[str, TensorSpec] | None,
    binary: _BinaryData,
    shm: SystemSharedMemoryRegistry | None,
    max_elements: int | None,
    copy: bool,
) -> dict[str, np.ndarray]:
    """The request's ``"inputs"`` list decoded, by name (see
    :func:`decode_infer_request`): each input checked, its tensor read from where it
    travels; then every binary byte claimed and (with ``specs``) every input given."""
    if not isinstance(raw_inputs, list):
        raise ProtocolError(
            'the request needs "inputs": a list of {name, datatype, shape, data} objects'
            if raw_inputs is None
            else f'"inputs" must be a list, got {type(raw_inputs).__name__}'
        )
    inputs: dict[str, np.ndarray] = {}
    for i, item in enumerate(raw_inputs):
        name, where, datatype, shape, count = _input_fields(i, item, inputs, specs, max_elements)
        inputs[name] = _input_tensor(item, where, datatype, shape, count, binary, shm, copy)
    binary.check_claimed()
    if specs is not None:
        missing = [n for n in specs if n not in inputs]
        if missing:
            raise ProtocolError(f"missing input(s) {missing}; the model needs {list(specs)}")
    return inputs


def _input_fields(
    i: int,
    item: Any,
    given: Mapping[str, Any],
    specs: dict[str, TensorSpec] | None,
    max_elements: int | None,
) -> tuple[str, str, str, list[int], int]:
    """``(name, where, datatype, shape, element count)`` of ``inputs[i]``, checked: an
    object with a new name (one of ``specs``' where given), a known datatype and a shape
    (the model's, and within ``max_elements``). ``given``: the inputs decoded before it."""
    if not isinstance(item, dict):
        raise ProtocolError(f"inputs[{i}] must be a JSON object, got {type(item).__name__}")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f'inputs[{i}] needs a "name" (a non-empty string)')
    where = f"input '{name}'"
    if name in given:
        raise ProtocolError(f"{where} is given more than once")
    if specs is not None and name not in specs:
        raise ProtocolError(f"unknown {where}; the model's inputs are {sorted(specs)}", 400)
    datatype = item.get("datatype")
    if not isinstance(datatype, str):
        raise ProtocolError(f'{where} needs a "datatype" (e.g. "FP32")')
    if datatype not in DATATYPES:
        raise ProtocolError(
            f"{where}: unknown datatype {datatype!r}; supported: {', '.join(DATATYPES)}"
        )
    if "shape" not in item:
        raise ProtocolError(f'{where} needs a "shape" (a list of integers; [] for a scalar)')
    shape = parse_shape(item["shape"], where)
    if specs is not None:
        _check_spec(specs[name], datatype, shape, where)
    count = math.prod(shape)
    if max_elements is not None and count > max_elements:
        raise ProtocolError(
            f"{where}: shape {shape} has {count} elements; this server accepts at most {max_elements}"
        )
    return name, where, datatype, shape, count


def _input_tensor(
    item: dict[str, Any],
    where: str,
    datatype: str,
    shape: list[int],
    count: int,
    binary: _BinaryData,
    shm: SystemSharedMemoryRegistry | None,
    copy: bool,
) -> np.ndarray:
    """One input's tensor, from the one way its data travels: system shared memory,
    binary data after the JSON header, or JSON ``"data"``."""
    p = params_of(item, where)
    ref = shm_params(p, where)
    has_data = "data" in item
    has_binary = "binary_data_size" in p
    if sum((ref is not None, has_data, has_binary)) > 1:
        raise ProtocolError(
            f'{where}: give its data one way only: "data", binary_data_size, or shared memory'
        )
    if ref is not None:
        return _shm_input(ref, where, datatype, shape, count, shm)
    if has_binary:
        return binary.take(p["binary_data_size"], where, datatype, shape, count, copy)
    if has_data:
        return from_json_data(item["data"], datatype, shape, where)
    raise ProtocolError(
        f'{where} has no data: give "data", parameters.binary_data_size, or '
        "parameters.shared_memory_region / shared_memory_byte_size"
    )


def _shm_input(
    ref: tuple[str, int, int],
    where: str,
    datatype: str,
    shape: list[int],
    count: int,
    shm: SystemSharedMemoryRegistry | None,
) -> np.ndarray:
    """One input's tensor read from system shared memory (``ref``: region, offset, byte
    size), its byte size checked against the shape."""
    expected = count * DATATYPES[datatype].itemsize
    if datatype != "BYTES" and ref[2] != expected:
        raise ProtocolError(
            f"{where}: shared_memory_byte_size {ref[2]} does not match shape {shape} "
            f"of {datatype} ({expected} bytes)"
        )
    # a private copy (pread): the client's object may change or shrink meanwhile
    data = _shm_call(shm, where, "read", *ref)
    return tensor_from_bytes(data, datatype, shape, where, copy=False)


def _decode_requested(
    raw: Any, binary_default: bool, shm: SystemSharedMemoryRegistry | None
) -> list[RequestedOutput] | None:
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        raise ProtocolError(f'"outputs" must be a list, got {type(raw).__name__}')
    out: list[RequestedOutput] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ProtocolError(f"outputs[{i}] must be a JSON object, got {type(item).__name__}")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ProtocolError(f'outputs[{i}] needs a "name" (a non-empty string)')
        where = f"requested output '{name}'"
        if name in seen:
            raise ProtocolError(f"{where} is requested more than once")
        seen.add(name)
        p = params_of(item, where)
        if "classification" in p:
            raise ProtocolError(f"{where}: the classification extension is not supported")
        binary = p.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise ProtocolError(f"{where}: binary_data must be true or false, got {binary!r}")
        ref = shm_params(p, where)
        if ref is not None:
            _shm_call(shm, where, "check", *ref)  # the region exists and holds the range
        out.append(RequestedOutput(name, binary, ref))
    return out


# -- response encoding (server) -----------------------------------------------------------


def _body_and_headers(
    doc: dict[str, Any], blobs: list[Any], join: bool = True
) -> tuple[Any, dict[str, str]]:
    header = dumps(doc)
    if not blobs:
        return (header if join else [header]), {"Content-Type": "application/json"}
    return (b"".join([header, *blobs]) if join else [header, *blobs]), {
        "Content-Type": "application/octet-stream",
        HEADER_LENGTH: str(len(header)),
    }


def encode_infer_response(
    *,
    model_name: str,
    model_version: str = "1",
    request_id: str | None,
    outputs: Mapping[str, np.ndarray],
    requested: Sequence[RequestedOutput] | None,
    binary_default: bool,
    parameters: Mapping[str, Any] | None = None,
    shm: SystemSharedMemoryRegistry | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Encode an inference response (v2 ``$inference_response``).

    Args:
        outputs: what the model produced, name -> array (any dtype :func:`datatype_of`
            maps; BYTES as ``U`` / ``S`` / ``object`` of bytes or str).
        requested: the request's outputs (:attr:`InferRequest.outputs`): only these are
            sent, in this order, each as JSON, binary data, or into shared memory. None:
            every output, binary iff ``binary_default``.
        parameters: response parameters (numbers, strings, booleans).
        shm: the registry holding the regions requested outputs name.

    Returns:
        ``(body, headers)``. With no binary outputs the body is JSON and ``Content-Type``
        is ``application/json``; otherwise (``extension_binary_data.md``) the JSON is
        followed by the binary outputs in order, ``Content-Type`` is
        ``application/octet-stream`` and ``Inference-Header-Content-Length`` gives the
        JSON's length. Outputs sent to shared memory are written there and reported with
        ``shared_memory_region`` / ``_offset`` / ``_byte_size`` (bytes written) and no
        data. A BYTES output that is not valid UTF-8 cannot be JSON and goes as binary.

    Raises:
        ProtocolError: 400: an output requested that the model does not produce, or an
            output larger than its shared memory range (or the region is gone); 500: an
            output whose dtype the protocol cannot carry.
    """
    if requested is None:
        plan = [RequestedOutput(n, binary_default, None) for n in outputs]
    else:
        plan = list(requested)
        unknown = [r.name for r in plan if r.name not in outputs]
        if unknown:
            raise ProtocolError(
                f"unknown output(s) {unknown} requested; model {model_name} has outputs {list(outputs)}"
            )
    entries: list[dict[str, Any]] = []
    blobs: list[Any] = []
    for r in plan:
        where = f"output '{r.name}'"
        arr = np.asarray(outputs[r.name])
        try:
            datatype = datatype_of(arr)
        except ProtocolError as exc:
            raise ProtocolError(f"{where}: {exc.message}", 500) from None
        entry: dict[str, Any] = {"name": r.name, "datatype": datatype, "shape": list(arr.shape)}
        data = raw = None
        try:
            if r.shm is None and not r.binary:
                data = to_json_data(arr, datatype)
            if data is None:
                raw = tensor_to_bytes(arr, datatype)
        except ProtocolError as exc:
            raise ProtocolError(f"{where}: {exc.message}", 500) from None
        if data is not None:
            entry["data"] = data
        else:
            if r.shm is not None:
                region, offset, size = r.shm
                if len(raw) > size:
                    raise ProtocolError(
                        f"{where} is {len(raw)} bytes ({datatype} {list(arr.shape)}) but its shared "
                        f"memory range (region '{region}', offset {offset}) holds only {size}"
                    )
                _shm_call(shm, where, "write", region, offset, raw)
                entry["parameters"] = {
                    "shared_memory_region": region,
                    "shared_memory_offset": offset,
                    "shared_memory_byte_size": len(raw),
                }
            else:
                entry["parameters"] = {"binary_data_size": len(raw)}
                blobs.append(raw)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = dict(parameters)
    doc["outputs"] = entries
    return _body_and_headers(doc, blobs)


# -- request encoding / response decoding (client) ----------------------------------------


def encode_infer_request(
    inputs: Mapping[str, np.ndarray | ShmTensor],
    *,
    outputs: Sequence[RequestedOutput] | None = None,
    binary: bool = True,
    binary_output: bool | None = None,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    join: bool = True,
) -> tuple[Any, dict[str, str]]:
    """Encode an inference request (the client side of :func:`decode_infer_request`).

    Args:
        inputs: name -> array (any dtype :func:`datatype_of` maps), or a :class:`ShmTensor`
            for data already in a registered shared memory region.
        outputs: outputs to ask for; None: all (the server's choice).
        binary: send arrays as binary tensor data (else JSON ``data``; BYTES that are not
            valid UTF-8 always go binary).
        binary_output: the ``binary_data_output`` request parameter. None (the default):
            True when ``binary`` and no ``outputs`` are listed, as Triton's client
            libraries send it (``tritonclient.http``: "no outputs specified so set
            'binary_data_output' True"), else not sent.
        request_id: the request ``id``.
        parameters: more request parameters (e.g. ``timeout_ms``).
        join: False: the body as a list of parts (the JSON header, then each input's
            binary data as a zero-copy ``memoryview`` of the array where its layout
            allows) to send one after the other without joining them.

    Returns:
        ``(body, headers)`` with ``Content-Type`` and, when binary data follows the JSON,
        ``Inference-Header-Content-Length``. ``body``: bytes (a list with ``join=False``).

    Raises:
        ProtocolError: an input whose dtype the protocol cannot carry.
    """
    entries: list[dict[str, Any]] = []
    blobs: list[Any] = []
    for name, value in inputs.items():
        if isinstance(value, ShmTensor):
            if value.datatype not in DATATYPES:
                raise ProtocolError(
                    f"input '{name}': unknown datatype {value.datatype!r}; supported: {', '.join(DATATYPES)}"
                )
            entries.append(
                {
                    "name": name,
                    "datatype": value.datatype,
                    "shape": [int(d) for d in value.shape],
                    "parameters": {
                        "shared_memory_region": value.region,
                        "shared_memory_offset": int(value.offset),
                        "shared_memory_byte_size": int(value.byte_size),
                    },
                }
            )
            continue
        arr = np.asarray(value)
        try:
            datatype = datatype_of(arr)
        except ProtocolError as exc:
            raise ProtocolError(f"input '{name}': {exc.message}") from None
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        data = None if binary else to_json_data(arr, datatype)
        if data is not None:
            entry["data"] = data
        else:
            raw = tensor_to_bytes(arr, datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        entries.append(entry)
    doc: dict[str, Any] = {}
    if request_id is not None:
        doc["id"] = request_id
    params = dict(parameters or {})
    if binary_output is None and binary and outputs is None:
        binary_output = True
    if binary_output is not None:
        params["binary_data_output"] = bool(binary_output)
    if params:
        doc["parameters"] = params
    doc["inputs"] = entries
    if outputs is not None:
        doc["outputs"] = [_requested_json(r) for r in outputs]
    return _body_and_headers(doc, blobs, join)


def _requested_json(r: RequestedOutput) -> dict[str, Any]:
    if r.shm is not None:
        region, offset, size = r.shm
        return {
            "name": r.name,
            "parameters": {
                "shared_memory_region": region,
                "shared_memory_offset": int(offset),
                "shared_memory_byte_size": int(size),
            },
        }
    return {"name": r.name, "parameters": {"binary_data": bool(r.binary)}}


def decode_infer_response(body: bytes, *, header_length: int | None) -> InferResult:
    """Decode an inference response (the client side of :func:`encode_infer_response`).

    Args:
        body: the HTTP body. header_length: its ``Inference-Header-Content-Length``, or None.

    Returns:
        An :class:`InferResult`; BYTES outputs as ``object`` arrays of ``bytes``.

    Raises:
        ProtocolError: a malformed response (bad JSON, unknown datatype, sizes that do not
            match the shapes or the body).
    """
    header, blobs = split_body(body, header_length)
    doc = parse_json(header, "response", header_length)
    raw = doc.get("outputs", [])
    if not isinstance(raw, list):
        raise ProtocolError('response "outputs" must be a list')
    outputs: dict[str, np.ndarray] = {}
    shm_outputs: dict[str, dict[str, Any]] = {}
    cursor = 0
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ProtocolError(f'response outputs[{i}] must be an object with a "name"')
        name = item["name"]
        where = f"output '{name}'"
        datatype = item.get("datatype")
        if datatype not in DATATYPES:
            raise ProtocolError(f"{where}: unknown datatype {datatype!r}")
        shape = parse_shape(item.get("shape"), where)
        p = params_of(item, where)
        ref = shm_params(p, where)
        if ref is not None:
            shm_outputs[name] = {"datatype": datatype, "shape": shape, **p}
        elif "binary_data_size" in p:
            size = nonneg_int(p["binary_data_size"], "binary_data_size", where)
            if cursor + size > len(blobs):
                raise ProtocolError(
                    f"{where}: binary_data_size {size} runs past the end of the response body"
                )
            outputs[name] = tensor_from_bytes(blobs[cursor : cursor + size], datatype, shape, where)
            cursor += size
        elif "data" in item:
            outputs[name] = from_json_data(item["data"], datatype, shape, where)
        else:
            raise ProtocolError(f"{where} has neither data, binary_data_size nor shared memory")
    if cursor != len(blobs):
        raise ProtocolError(f"{len(blobs) - cursor} unclaimed bytes of binary data in the response")
    version = doc.get("model_version")
    return InferResult(
        model_name=str(doc.get("model_name", "")),
        id=doc.get("id"),
        outputs=outputs,
        parameters=params_of(doc, "response"),
        shm_outputs=shm_outputs,
        model_version=None if version is None else str(version),
    )
