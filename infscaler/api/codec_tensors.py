"""The v2 tensor codec: datatypes, the binary layout of a tensor and its JSON ``data``.

The lowest layer of the Open Inference Protocol (KServe v2) code, used by
:mod:`infscaler.api.codec` (the request / response codec) and :mod:`infscaler.api.sysshm`
(tensors in system shared memory). Pure functions between numpy arrays and bytes / JSON
values; no I/O. Every malformed tensor raises :class:`ProtocolError` (HTTP 400) naming
the tensor and what was wrong.

- **Binary layout** (``extension_binary_data.md``): little-endian, row-major, no
  padding; BOOL one byte (0 / 1); BYTES each element a 4-byte little-endian unsigned
  length then its bytes (:func:`tensor_to_bytes`, :func:`tensor_from_bytes`).
- **JSON data** (v2 ``$request_input.data``): a flat or nested (row-major) list; BOOL as
  ``true`` / ``false``, numbers as JSON numbers, BYTES as UTF-8 strings
  (:func:`from_json_data`, :func:`to_json_data`).

The public names are re-exported by :mod:`infscaler.api.codec`; import them from there.

Sources: KServe / Triton ``protocol/`` docs (v2 REST ``$request_input`` /
``$response_output``, ``extension_binary_data.md``).
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from infscaler.base.errors import InfScalerError

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


#: what one BYTES element of ``n`` >= 2 bytes costs decoded, beyond its ``n`` bytes: a
#: CPython ``bytes`` object's header (33) and the object array's pointer (8); elements
#: of 0 and 1 byte are CPython's shared singletons (the pointer only)
BYTES_ELEMENT_OVERHEAD = 41
#: slack of :func:`parse_bytes`'s bound on the decoded size, bytes
BYTES_DECODE_SLACK = 1 << 20


def bytes_decode_bound(data_bytes: int) -> int:
    """The most bytes ``data_bytes`` of BYTES layout may decode to: twice them plus
    :data:`BYTES_DECODE_SLACK` (the in-flight budget counts a request at twice its body)."""
    return 2 * data_bytes + BYTES_DECODE_SLACK


def bytes_too_large(where: str, count: int, data_bytes: int) -> ProtocolError:
    """The refusal (413) of ``count`` BYTES elements in ``data_bytes`` of layout that
    would decode to more than :func:`bytes_decode_bound`."""
    return ProtocolError(
        f"{where}: {count} BYTES elements in {data_bytes} bytes would take more than "
        f"{bytes_decode_bound(data_bytes)} bytes decoded (each element of 2 or more bytes "
        f"is a Python object of {BYTES_ELEMENT_OVERHEAD} bytes plus its data; at most twice "
        "the data's size plus 1 MB is decoded)",
        413,
        hint="send fewer, longer elements, or the bytes as a UINT8 tensor",
    )


def parse_bytes(buf: Any, count: int, where: str, *, exact: bool) -> tuple[np.ndarray, int]:
    """``count`` BYTES elements (4-byte little-endian length, then the bytes) from the
    start of ``buf``: ``(object array of bytes, bytes used)``.

    The decoded array is bounded by what the data carried: at most twice its bytes plus
    :data:`BYTES_DECODE_SLACK` (the service's in-flight budget counts a request at twice
    its body). Millions of tiny elements would otherwise take ~10x their size in
    Python objects (:data:`BYTES_ELEMENT_OVERHEAD` each).

    Raises:
        ProtocolError: (400) truncated or left-over data; (413) it would decode to more
            than the bound.
    """
    mv = memoryview(buf).cast("B")
    pos, end = 0, len(mv)
    if count * 4 > end:  # every element has a 4-byte length: refuse before allocating
        raise ProtocolError(
            f"{where}: {end} bytes cannot hold {count} BYTES elements (each is a 4-byte "
            "little-endian length followed by its bytes)"
        )
    out = np.empty(count, dtype=object)
    bound = bytes_decode_bound(end)
    decoded = 8 * count
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
        if n > 1:
            decoded += BYTES_ELEMENT_OVERHEAD - 8 + n
            if decoded > bound:
                raise bytes_too_large(where, count, end)
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
    arr, _ = parse_bytes(buf, math.prod(shape), where, exact=True)
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


def is_int(v: Any) -> bool:
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


def from_json_data(data: Any, datatype: str, shape: list[int], where: str) -> np.ndarray:
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
        if is_int_type and all(is_int(v) for v in flat):
            info = np.iinfo(dtype)
            bad = next((v for v in flat if not info.min <= v <= info.max), None)
            if bad is not None:
                raise ProtocolError(f"{where}: value {bad} is out of range for {datatype}")
            arr = np.array(flat, dtype=dtype)
        elif is_int_type or datatype == "BOOL":
            bad = next(v for v in flat if not (is_int(v) if is_int_type else isinstance(v, bool)))
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


def to_json_data(array: np.ndarray, datatype: str) -> list[Any] | None:
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


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), default=json_default).encode("utf-8")
