"""The Open Inference Protocol (KServe v2) codec: inference requests and responses.

Pure functions between HTTP bodies and numpy arrays, for the server (decode a request,
encode a response) and the client (encode a request, decode a response). The only I/O
is through a :class:`~infscaler.sysshm.SystemSharedMemoryRegistry` passed in, for tensors
that travel through system shared memory.

Three ways a tensor travels (the same for inputs and outputs):

- **JSON** ``"data"``: a flat or nested (row-major) list. BOOL as ``true`` / ``false``,
  integers and floats as JSON numbers (FP16 too; non-finite floats as Python's ``NaN`` /
  ``Infinity``), BYTES as JSON strings (UTF-8).
- **Binary** (``extension_binary_data.md``): the JSON object is followed by raw tensor
  bytes; the ``Inference-Header-Content-Length`` HTTP header gives the JSON object's
  length and each tensor's ``parameters.binary_data_size`` its byte count, in the order
  the tensors appear in the JSON. Little-endian, row-major, no padding; BOOL one byte
  (0 / 1); BYTES each element a 4-byte little-endian unsigned length then its bytes.
  Requested outputs ask for it with ``parameters.binary_data``; the request parameter
  ``binary_data_output`` sets the default.
- **System shared memory** (``extension_shared_memory.md``): parameters
  ``shared_memory_region``, ``shared_memory_offset`` (default 0) and
  ``shared_memory_byte_size`` name bytes in a region registered beforehand; the tensor's
  bytes there use the binary layout above, and the JSON carries no data.

numpy <-> v2 datatypes: ``bool`` BOOL, ``uint8..uint64`` UINT8..UINT64, ``int8..int64``
INT8..INT64, ``float16/32/64`` FP16/FP32/FP64, and BYTES for ``object`` arrays of
``bytes`` / ``str``, ``S`` (bytes) and ``U`` (str) arrays. Decoded BYTES tensors are
``object`` arrays of ``bytes``. BF16 is not supported (numpy has no bfloat16).

Every malformed request raises :class:`ProtocolError` (HTTP 400) whose message names the
tensor and what was wrong; the server sends it as ``{"error": message}``.

Sources: KServe / Triton ``protocol/`` docs: the v2 REST inference request / response
JSON (``$inference_request``, ``$request_input``, ``$request_output``,
``$inference_response``, ``$response_output``), ``extension_binary_data.md``,
``extension_shared_memory.md``.
"""

from __future__ import annotations

import json
import math
import re
import struct
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from infscaler.base.errors import InfScalerError

if TYPE_CHECKING:
    from infscaler.sysshm import SystemSharedMemoryRegistry

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
    "TensorSpec",
    "datatype_of",
    "decode_infer_request",
    "decode_infer_response",
    "deserialize_bytes",
    "encode_infer_request",
    "encode_infer_response",
    "error_body",
    "parse_header_length",
    "parse_json_object",
    "parse_timeout_ms",
    "serialize_bytes",
    "tensor_byte_size",
    "tensor_from_bytes",
    "tensor_to_bytes",
]

#: The HTTP header giving the length of the JSON object when binary data follows it.
HEADER_LENGTH = "Inference-Header-Content-Length"

#: v2 datatype -> numpy dtype (explicitly little-endian, the wire byte order).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}

#: Deepest JSON nesting a request may have (objects and lists together); deeper is 400.
MAX_JSON_DEPTH = 64
#: Largest ``timeout_ms`` request parameter: one hour.
MAX_TIMEOUT_MS = 3_600_000.0
#: Largest tensor dimension (and element count) a request may declare: 2**62.
MAX_DIM = 1 << 62
_INT64 = (-(1 << 63), (1 << 63) - 1)
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_DIGITS = re.compile(r"[0-9]{1,18}")

_SHM_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")
_LEN = struct.Struct("<I")


class ProtocolError(InfScalerError):
    """A request (or response) that breaks the v2 protocol.

    Attributes:
        status: the HTTP status to answer with: 400 (bad request, the default), 404
            (an unknown named thing, e.g. a shared memory region in a status request), or
            500 (the server produced something the protocol cannot carry).
        message: what was wrong; ``str(exc)`` is what goes into ``{"error": ...}``.
    """

    def __init__(self, message: str, status: int = 400, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.status = status


# -- tensors and their bytes --------------------------------------------------------------


def datatype_of(array: np.ndarray | np.dtype | type) -> str:
    """The v2 datatype of a numpy array (or dtype).

    ``bool`` -> BOOL, ``uint8``..``int64`` -> UINT8..INT64, ``float16/32/64`` ->
    FP16/FP32/FP64, ``U`` / ``S`` / ``object`` -> BYTES (either byte order).

    Raises:
        ProtocolError: a dtype the protocol has no datatype for (complex, datetime,
            structured, float128, ...).
    """
    dt = array.dtype if isinstance(array, np.ndarray | np.generic) else np.dtype(array)
    kind, size = dt.kind, dt.itemsize
    if kind == "b":
        return "BOOL"
    if kind in "iu" and size in (1, 2, 4, 8):
        return f"{'INT' if kind == 'i' else 'UINT'}{size * 8}"
    if kind == "f" and size in (2, 4, 8):
        return f"FP{size * 8}"
    if kind in "USO" and dt.fields is None:
        return "BYTES"
    raise ProtocolError(
        f"numpy dtype {dt} has no v2 datatype (supported: bool, int8..int64, uint8..uint64, "
        "float16/32/64, and bytes / str / object for BYTES)"
    )


def _element_bytes(value: Any, where: str | None) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    prefix = f"{where}: " if where else ""
    raise ProtocolError(f"{prefix}a BYTES element must be bytes or str, got {type(value).__name__}")


def serialize_bytes(array: np.ndarray, where: str | None = None) -> bytes:
    """A BYTES tensor in the binary layout: per element (row-major), a 4-byte little-endian
    unsigned length then the bytes (``extension_binary_data.md``). ``str`` elements are
    UTF-8 encoded; ``S`` arrays lose trailing NUL bytes (numpy's own semantics).

    Raises:
        ProtocolError: an element that is neither bytes nor str, or longer than 4 GiB.
    """
    parts: list[bytes] = []
    for value in np.asarray(array).reshape(-1).tolist():
        b = _element_bytes(value, where)
        if len(b) > 0xFFFFFFFF:
            raise ProtocolError(f"a BYTES element of {len(b)} bytes; at most 4 GiB")
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def _parse_bytes(buf: Any, count: int, where: str, *, exact: bool) -> tuple[np.ndarray, int]:
    mv = memoryview(buf).cast("B")
    pos, end = 0, len(mv)
    if count * 4 > end:  # every element has a 4-byte length: refuse before allocating
        raise ProtocolError(
            f"{where}: {end} bytes cannot hold {count} BYTES elements (each is a 4-byte "
            "little-endian length followed by its bytes)"
        )
    out = np.empty(count, dtype=object)
    for i in range(count):
        if pos + 4 > end:
            raise ProtocolError(
                f"{where}: BYTES data ends after {i} of {count} elements (at byte {pos} of {end}); "
                "each element is a 4-byte little-endian length followed by its bytes"
            )
        (n,) = _LEN.unpack_from(mv, pos)
        pos += 4
        if pos + n > end:
            raise ProtocolError(
                f"{where}: BYTES element {i} claims {n} bytes but only {end - pos} remain"
            )
        out[i] = mv[pos : pos + n].tobytes()
        pos += n
    if exact and pos != end:
        raise ProtocolError(
            f"{where}: {end - pos} bytes left over after the {count} BYTES elements "
            f"({pos} of {end} bytes used)"
        )
    return out, pos


def deserialize_bytes(buf: Any, shape: Sequence[int], where: str = "tensor") -> np.ndarray:
    """The inverse of :func:`serialize_bytes`: an ``object`` array of ``bytes`` of ``shape``.

    Raises:
        ProtocolError: truncated data, or bytes left over after the last element.
    """
    arr, _ = _parse_bytes(buf, math.prod(shape), where, exact=True)
    return arr.reshape(tuple(shape))


def tensor_to_bytes(array: np.ndarray, datatype: str | None = None) -> bytes | memoryview:
    """The binary layout of ``array`` as ``datatype`` (default: :func:`datatype_of`):
    little-endian, row-major, no padding; BOOL one byte; BYTES length-prefixed.

    Returns bytes, or a zero-copy ``memoryview`` of a C-contiguous little-endian array.

    Raises:
        ProtocolError: a dtype with no v2 datatype, or BYTES elements that are not bytes / str.
    """
    array = np.asarray(array)
    datatype = datatype or datatype_of(array)
    if datatype == "BYTES":
        return serialize_bytes(array)
    flat = np.ascontiguousarray(array, dtype=DATATYPES[datatype]).reshape(-1)
    return flat.view(np.uint8).data


def tensor_byte_size(array: np.ndarray) -> int:
    """How many bytes ``array`` takes in the binary layout (BYTES: with length prefixes)."""
    array = np.asarray(array)
    if datatype_of(array) == "BYTES":
        return len(serialize_bytes(array))
    return array.size * DATATYPES[datatype_of(array)].itemsize


def tensor_from_bytes(
    buf: Any, datatype: str, shape: Sequence[int], where: str = "tensor", *, copy: bool = True
) -> np.ndarray:
    """A numpy array (a copy; native layout) from the binary layout of ``datatype`` /
    ``shape``: the exact inverse of :func:`tensor_to_bytes`.

    ``copy=False``: a zero-copy view of ``buf`` where the layout allows (not BYTES or
    BOOL), read-only if ``buf`` is; only for a buffer the caller owns and leaves
    unchanged while the array is in use (the server's own request body).

    Raises:
        ProtocolError: ``buf`` is not exactly the size ``shape`` x ``datatype`` needs.
    """
    shape = tuple(int(d) for d in shape)
    if datatype == "BYTES":
        return deserialize_bytes(buf, shape, where)
    dtype = DATATYPES[datatype]
    mv = memoryview(buf).cast("B")
    need = math.prod(shape) * dtype.itemsize
    if len(mv) != need:
        raise ProtocolError(
            f"{where}: {len(mv)} bytes of data, but shape {list(shape)} of {datatype} needs "
            f"{need} bytes"
        )
    if datatype == "BOOL":
        return (np.frombuffer(mv, dtype=np.uint8) != 0).reshape(shape)
    arr = np.frombuffer(mv, dtype=dtype).reshape(shape)
    return arr.copy() if copy else arr


# -- JSON data ----------------------------------------------------------------------------


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_nesting(data: Any, shape: list[int], where: str) -> None:
    """Nested JSON ``data`` must have exactly ``shape``: every list at depth k holds
    ``shape[k]`` items, and only the innermost lists hold values. Flat data (a list of
    values, or a bare value) is left to the element count check. Iterative."""
    if not isinstance(data, list) or not any(isinstance(v, list) for v in data):
        return
    level: list[Any] = [data]
    for k, dim in enumerate(shape):
        nxt: list[Any] = []
        for node in level:
            if not isinstance(node, list) or len(node) != dim:
                got = f"a list of {len(node)}" if isinstance(node, list) else "a value"
                raise ProtocolError(
                    f"{where}: nested data does not match shape {shape}: at depth {k} "
                    f"expected a list of {dim}, found {got} (send nested lists of exactly "
                    "the shape, or the data flat in row-major order)"
                )
            nxt.extend(node)
        level = nxt
    bad = next((v for v in level if isinstance(v, list)), None)
    if bad is not None:
        raise ProtocolError(
            f"{where}: nested data is deeper than shape {shape} (send nested lists of "
            "exactly the shape, or the data flat in row-major order)"
        )


def _from_json_data(data: Any, datatype: str, shape: list[int], where: str) -> np.ndarray:
    """JSON ``data`` (flat, nested, or a bare scalar) as a ``datatype`` array of ``shape``.

    Nested data must have exactly ``shape`` (ragged or re-shaped nesting is refused);
    flat data must have exactly the shape's element count."""
    count = math.prod(shape)
    _check_nesting(data, shape, where)
    if datatype == "BYTES":
        flat = _flatten(data)
        if len(flat) != count:
            raise _count_error(where, shape, count, len(flat))
        out = np.empty(count, dtype=object)
        for i, v in enumerate(flat):
            if not isinstance(v, str):
                raise ProtocolError(
                    f"{where}: BYTES data must be JSON strings, element {i} is "
                    f"{type(v).__name__} {v!r:.40}"
                )
            out[i] = v.encode("utf-8")
        return out.reshape(shape)
    dtype = DATATYPES[datatype]
    try:
        arr = np.asarray(data)
    except (ValueError, OverflowError):  # ragged nesting, or an int beyond 64 bits
        arr = None
    is_int_type = datatype.startswith(("INT", "UINT"))
    # numpy infers object for ragged / huge values, and float64 for ints that mix
    # int64 and uint64 ranges (lossy): take the element-wise path then.
    if arr is None or arr.dtype == object or (is_int_type and arr.dtype.kind == "f"):
        flat = _flatten(data)
        kinds = {type(v) for v in flat}
        if not kinds <= {bool, int, float}:
            bad = next(v for v in flat if type(v) not in (bool, int, float))
            what = "booleans" if datatype == "BOOL" else "numbers"
            raise ProtocolError(
                f"{where}: {datatype} data must be JSON {what}, found {type(bad).__name__} {bad!r:.40}"
            )
        if is_int_type and all(_is_int(v) for v in flat):
            info = np.iinfo(dtype)
            bad = next((v for v in flat if not info.min <= v <= info.max), None)
            if bad is not None:
                raise ProtocolError(f"{where}: value {bad} is out of range for {datatype}")
            arr = np.array(flat, dtype=dtype)
        elif is_int_type or datatype == "BOOL":
            bad = next(v for v in flat if not (_is_int(v) if is_int_type else isinstance(v, bool)))
            raise ProtocolError(
                f"{where}: {datatype} data must be JSON "
                f"{'integers' if is_int_type else 'true / false'}, found {bad!r:.40}"
            )
        else:
            arr = np.array(flat, dtype=np.float64)
    if arr.size != count:
        raise _count_error(where, shape, count, arr.size)
    if count == 0:
        return np.zeros(shape, dtype=dtype)
    kind = arr.dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise ProtocolError(
                f"{where}: BOOL data must be JSON true / false, got {_kind_name(kind)}"
            )
    elif datatype.startswith(("INT", "UINT")):
        if kind not in "iu":
            raise ProtocolError(
                f"{where}: {datatype} data must be JSON integers, got {_kind_name(kind)}"
            )
        info = np.iinfo(dtype)
        lo, hi = arr.min(), arr.max()
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise ProtocolError(f"{where}: value {bad} is out of range for {datatype}")
    else:  # FP16 / FP32 / FP64
        if kind not in "iuf":
            raise ProtocolError(
                f"{where}: {datatype} data must be JSON numbers, got {_kind_name(kind)}"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            cast = arr.astype(dtype)
        overflow = np.isinf(cast) & np.isfinite(arr)
        if overflow.any():
            bad = arr[overflow].reshape(-1)[0]
            raise ProtocolError(f"{where}: value {bad} is out of range for {datatype}")
        return cast.reshape(shape)
    return arr.astype(dtype).reshape(shape)


def _kind_name(kind: str) -> str:
    return {
        "b": "booleans",
        "i": "integers",
        "u": "integers",
        "f": "floating-point numbers",
        "U": "strings",
        "S": "strings",
    }.get(kind, "mixed values")


def _count_error(where: str, shape: list[int], count: int, got: int) -> ProtocolError:
    return ProtocolError(f"{where}: shape {shape} has {count} elements but the data has {got}")


def _to_json_data(array: np.ndarray, datatype: str) -> list[Any] | None:
    """Flat JSON data for ``array``; None for BYTES that are not all valid UTF-8."""
    flat = np.asarray(array).reshape(-1)
    if datatype != "BYTES":
        return flat.astype(DATATYPES[datatype], copy=False).tolist()
    out = []
    for v in flat.tolist():
        if isinstance(v, str):
            out.append(v)
            continue
        try:
            out.append(_element_bytes(v, None).decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return out


def json_default(o: Any) -> Any:
    """``json.dumps`` fallback for numpy scalars / arrays, bytes, paths (as str)."""
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, bytes):
        return o.decode("utf-8", errors="replace")
    return str(o)


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), default=json_default).encode("utf-8")


def error_body(message: str) -> bytes:
    """The v2 error object ``{"error": message}`` as JSON bytes (every extension's
    ``$..._error_response``)."""
    return _dumps({"error": message})


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
        parameters: the response's ``parameters`` (InfScaler: ``latency_ms``, ``unit_ms``).
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


# -- request decoding (server) ------------------------------------------------------------


def _split_body(body: bytes, header_length: int | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    if isinstance(header_length, bool) or not isinstance(header_length, int) or header_length < 0:
        raise ProtocolError(
            f"{HEADER_LENGTH} must be a non-negative integer, got {header_length!r}"
        )
    if header_length > len(body):
        raise ProtocolError(
            f"{HEADER_LENGTH} is {header_length} but the body has only {len(body)} bytes"
        )
    mv = memoryview(body)
    return mv[:header_length].tobytes(), mv[header_length:]


def _bracket_depth(raw: bytes) -> int:
    """The deepest running count of ``[`` / ``{`` minus ``]`` / ``}`` in ``raw`` (numpy)."""
    low = np.frombuffer(raw, dtype=np.uint8) | 0x20  # "[" -> "{", "]" -> "}"
    br = np.flatnonzero((low == 0x7B) | (low == 0x7D))
    if br.size == 0:
        return 0
    return int(np.cumsum(np.where(low[br] == 0x7B, 1, -1)).max())


def _json_depth(raw: bytes) -> int:
    """The deepest nesting of ``[`` / ``{`` in the JSON text ``raw``, without recursion.

    Fast path: brackets counted everywhere (numpy). Only when that exceeds
    :data:`MAX_JSON_DEPTH` are strings removed first (brackets inside strings do not
    nest), so a body is refused only for its real structure. Brackets inside strings can
    hide depth from the fast path; what they hide is bounded by the parser's own
    recursion limit, which :func:`_parse_json` turns into a 400 as well."""
    depth = _bracket_depth(raw)
    if depth > MAX_JSON_DEPTH and b'"' in raw:
        depth = _bracket_depth(_JSON_STRING.sub(b"", raw))
    return depth


def _parse_json(header: bytes, what: str, header_length: int | None) -> dict[str, Any]:
    """The JSON object ``header``: strict UTF-8 (no UTF-16 / 32 guessing), at most
    :data:`MAX_JSON_DEPTH` levels deep (checked before parsing, so no recursion limit
    is ever hit). ``NaN`` / ``Infinity`` are accepted (FP tensor data may hold them)."""
    try:
        text = bytes(header).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(
            f"the {what} must be UTF-8 encoded JSON; byte {exc.start} is not valid UTF-8 "
            f"({exc.reason})"
        ) from None
    depth = _json_depth(bytes(header))
    if depth > MAX_JSON_DEPTH:
        raise ProtocolError(
            f"the {what} JSON is nested {depth} levels deep; at most {MAX_JSON_DEPTH} are "
            "allowed (send tensor data flat, row-major)"
        )
    try:
        doc = json.loads(text)
    except RecursionError:  # a backstop: the depth check above refuses these first
        raise ProtocolError(f"the {what} JSON is nested too deeply") from None
    except ValueError as exc:
        if "Extra data" not in str(exc) and "\x00" in text[:8]:
            # UTF-16 / UTF-32 of ASCII is "valid" UTF-8 full of NULs
            raise ProtocolError(
                f"the {what} must be UTF-8 encoded JSON; it starts with NUL bytes (UTF-16 "
                "or UTF-32?)"
            ) from None
        hint = None
        if header_length is None and "Extra data" in str(exc):
            hint = f"binary tensor data after the JSON needs the {HEADER_LENGTH} header"
        raise ProtocolError(f"the {what} is not valid JSON: {exc}", hint=hint) from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"the {what} must be a JSON object, got {type(doc).__name__}")
    return doc


def parse_json_object(raw: bytes, what: str = "body") -> dict[str, Any]:
    """A JSON object from ``raw``: strict UTF-8, at most :data:`MAX_JSON_DEPTH` deep.

    Raises:
        ProtocolError: (400) not UTF-8, too deep, not JSON, or not an object.
    """
    return _parse_json(raw, what, None)


def parse_header_length(value: str | None) -> int | None:
    """The ``Inference-Header-Content-Length`` header as an int (None when absent).

    Raises:
        ProtocolError: (400) not a plain decimal integer of at most 18 digits (signs,
            spaces, underscores and exponents are refused).
    """
    if value is None:
        return None
    if not _DIGITS.fullmatch(value):
        raise ProtocolError(
            f"{HEADER_LENGTH} must be a non-negative integer (the JSON header's length in "
            f"bytes), got {value[:40]!r}"
        )
    return int(value)


def _check_parameters(params: dict[str, Any], where: str) -> None:
    """Triton's ``$parameters``: each value a bool, a finite number (integers in int64
    range) or a string; ``timeout_ms`` as :func:`parse_timeout_ms` wants it."""
    parse_timeout_ms(params)
    for k, v in params.items():
        if isinstance(v, bool | str):
            continue
        if isinstance(v, int):
            if not _INT64[0] <= v <= _INT64[1]:
                raise ProtocolError(
                    f"{where} parameter {k!r}: integer {v!s:.30} is outside the int64 range"
                )
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise ProtocolError(f"{where} parameter {k!r} must be a finite number, got {v}")
        else:
            raise ProtocolError(
                f"{where} parameter {k!r} must be a boolean, number or string, got "
                f"{type(v).__name__ if v is not None else 'null'}"
            )


def parse_timeout_ms(params: Mapping[str, Any] | None) -> float | None:
    """The request parameter ``timeout_ms`` as seconds (None when not given).

    Valid: a JSON number (int or float, not a boolean or a string), finite, with
    ``0 < timeout_ms <= MAX_TIMEOUT_MS`` (one hour).

    Raises:
        ProtocolError: (400) anything else; the message gives the allowed range.
    """
    if not params or "timeout_ms" not in params:
        return None
    v = params["timeout_ms"]
    allowed = f"a number of milliseconds with 0 < timeout_ms <= {MAX_TIMEOUT_MS:.0f} (1 hour)"
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ProtocolError(f"parameter timeout_ms must be {allowed}, got {v!r:.40}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ProtocolError(f"parameter timeout_ms must be {allowed}, got {v}")
    if not 0 < v <= MAX_TIMEOUT_MS:
        raise ProtocolError(f"parameter timeout_ms must be {allowed}, got {v!s:.30}")
    return float(v) / 1e3


def _params(obj: dict[str, Any], where: str) -> dict[str, Any]:
    p = obj.get("parameters")
    if p is None:
        return {}
    if not isinstance(p, dict):
        raise ProtocolError(f"{where}: parameters must be a JSON object, got {type(p).__name__}")
    return p


def _nonneg_int(value: Any, what: str, where: str) -> int:
    if not _is_int(value) or value < 0:
        raise ProtocolError(f"{where}: {what} must be a non-negative integer, got {value!r}")
    return value


def _shape(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(d) for d in value):
        raise ProtocolError(f"{where}: shape must be a list of integers, got {value!r:.60}")
    if any(d < 0 for d in value):
        raise ProtocolError(f"{where}: shape {value} has a negative dimension")
    if len(value) > 32:
        raise ProtocolError(f"{where}: shape has {len(value)} dimensions; at most 32")
    if any(d > MAX_DIM for d in value) or math.prod(value) > MAX_DIM:
        raise ProtocolError(f"{where}: shape {value!s:.80} declares more than 2**62 elements")
    return value


def _shm_params(params: dict[str, Any], where: str) -> tuple[str, int, int] | None:
    if not any(k in params for k in _SHM_KEYS):
        return None
    region = params.get("shared_memory_region")
    size = params.get("shared_memory_byte_size")
    if region is None or size is None:
        raise ProtocolError(
            f"{where}: shared memory needs both shared_memory_region and "
            "shared_memory_byte_size (shared_memory_offset is optional)"
        )
    if not isinstance(region, str) or not region:
        raise ProtocolError(f"{where}: shared_memory_region must be a non-empty string")
    offset = _nonneg_int(params.get("shared_memory_offset", 0), "shared_memory_offset", where)
    return region, offset, _nonneg_int(size, "shared_memory_byte_size", where)


def _shm_view(shm: SystemSharedMemoryRegistry | None, ref: tuple[str, int, int], where: str):
    if shm is None:
        raise ProtocolError(f"{where}: system shared memory is not available on this server")
    try:
        return shm.view(*ref)
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


def decode_infer_request(
    body: bytes,
    *,
    header_length: int | None,
    input_specs: Sequence[TensorSpec] | None = None,
    shm: SystemSharedMemoryRegistry | None = None,
    max_elements: int | None = None,
    copy: bool = True,
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
    header, blobs = _split_body(body, header_length)
    doc = _parse_json(header, "request", header_length)
    req_id = doc.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise ProtocolError(f"request id must be a string, got {type(req_id).__name__}")
    params = _params(doc, "request")
    _check_parameters(params, "request")
    binary_default = params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise ProtocolError(
            f"request parameter binary_data_output must be true or false, got {binary_default!r}"
        )

    specs = {s.name: s for s in input_specs} if input_specs is not None else None
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise ProtocolError(
            'the request needs "inputs": a list of {name, datatype, shape, data} objects'
            if raw_inputs is None
            else f'"inputs" must be a list, got {type(raw_inputs).__name__}'
        )
    inputs: dict[str, np.ndarray] = {}
    cursor = 0
    for i, item in enumerate(raw_inputs):
        if not isinstance(item, dict):
            raise ProtocolError(f"inputs[{i}] must be a JSON object, got {type(item).__name__}")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ProtocolError(f'inputs[{i}] needs a "name" (a non-empty string)')
        where = f"input '{name}'"
        if name in inputs:
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
        shape = _shape(item["shape"], where)
        if specs is not None:
            _check_spec(specs[name], datatype, shape, where)
        count = math.prod(shape)
        if max_elements is not None and count > max_elements:
            raise ProtocolError(
                f"{where}: shape {shape} has {count} elements; this server accepts at most {max_elements}"
            )
        p = _params(item, where)
        ref = _shm_params(p, where)
        has_data = "data" in item
        has_binary = "binary_data_size" in p
        if sum((ref is not None, has_data, has_binary)) > 1:
            raise ProtocolError(
                f'{where}: give its data one way only: "data", binary_data_size, or shared memory'
            )
        if ref is not None:
            expected = count * DATATYPES[datatype].itemsize
            if datatype != "BYTES" and ref[2] != expected:
                raise ProtocolError(
                    f"{where}: shared_memory_byte_size {ref[2]} does not match shape {shape} "
                    f"of {datatype} ({expected} bytes)"
                )
            view = _shm_view(shm, ref, where)
            try:
                inputs[name] = tensor_from_bytes(view, datatype, shape, where)
            finally:
                view.release()
        elif has_binary:
            size = _nonneg_int(p["binary_data_size"], "binary_data_size", where)
            if header_length is None:
                raise ProtocolError(
                    f"{where} has binary_data_size but the request has no {HEADER_LENGTH} header"
                )
            if cursor + size > len(blobs):
                raise ProtocolError(
                    f"{where}: binary_data_size {size} runs past the end of the body "
                    f"({len(blobs) - cursor} of {len(blobs)} binary bytes left)"
                )
            if datatype != "BYTES" and size != count * DATATYPES[datatype].itemsize:
                raise ProtocolError(
                    f"{where}: binary_data_size {size} does not match shape {shape} of "
                    f"{datatype} ({count * DATATYPES[datatype].itemsize} bytes)"
                )
            inputs[name] = tensor_from_bytes(
                blobs[cursor : cursor + size], datatype, shape, where, copy=copy
            )
            cursor += size
        elif has_data:
            inputs[name] = _from_json_data(item["data"], datatype, shape, where)
        else:
            raise ProtocolError(
                f'{where} has no data: give "data", parameters.binary_data_size, or '
                "parameters.shared_memory_region / shared_memory_byte_size"
            )
    if cursor != len(blobs):
        raise ProtocolError(
            f"{len(blobs) - cursor} bytes of binary data after the JSON header are not claimed "
            f"by any input's binary_data_size (claimed: {cursor} of {len(blobs)})"
        )
    if specs is not None:
        missing = [n for n in specs if n not in inputs]
        if missing:
            raise ProtocolError(f"missing input(s) {missing}; the model needs {list(specs)}")

    outputs = _decode_requested(doc.get("outputs"), binary_default, shm)
    return InferRequest(
        id=req_id,
        inputs=inputs,
        outputs=outputs,
        parameters=params,
        binary_output_default=binary_default,
    )


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
        p = _params(item, where)
        if "classification" in p:
            raise ProtocolError(f"{where}: the classification extension is not supported")
        binary = p.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise ProtocolError(f"{where}: binary_data must be true or false, got {binary!r}")
        ref = _shm_params(p, where)
        if ref is not None:
            _shm_view(shm, ref, where).release()  # the region exists and holds the range
        out.append(RequestedOutput(name, binary, ref))
    return out


# -- response encoding (server) -----------------------------------------------------------


def _body_and_headers(
    doc: dict[str, Any], blobs: list[Any], join: bool = True
) -> tuple[Any, dict[str, str]]:
    header = _dumps(doc)
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
                data = _to_json_data(arr, datatype)
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
                view = _shm_view(shm, (region, offset, len(raw)), where)
                try:
                    view[:] = raw
                finally:
                    view.release()
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
        binary_output: the ``binary_data_output`` request parameter (None: not sent).
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
        data = None if binary else _to_json_data(arr, datatype)
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
    header, blobs = _split_body(body, header_length)
    doc = _parse_json(header, "response", header_length)
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
        shape = _shape(item.get("shape"), where)
        p = _params(item, where)
        ref = _shm_params(p, where)
        if ref is not None:
            shm_outputs[name] = {"datatype": datatype, "shape": shape, **p}
        elif "binary_data_size" in p:
            size = _nonneg_int(p["binary_data_size"], "binary_data_size", where)
            if cursor + size > len(blobs):
                raise ProtocolError(
                    f"{where}: binary_data_size {size} runs past the end of the response body"
                )
            outputs[name] = tensor_from_bytes(blobs[cursor : cursor + size], datatype, shape, where)
            cursor += size
        elif "data" in item:
            outputs[name] = _from_json_data(item["data"], datatype, shape, where)
        else:
            raise ProtocolError(f"{where} has neither data, binary_data_size nor shared memory")
    if cursor != len(blobs):
        raise ProtocolError(f"{len(blobs) - cursor} unclaimed bytes of binary data in the response")
    version = doc.get("model_version")
    return InferResult(
        model_name=str(doc.get("model_name", "")),
        id=doc.get("id"),
        outputs=outputs,
        parameters=_params(doc, "response"),
        shm_outputs=shm_outputs,
        model_version=None if version is None else str(version),
    )
