"""The v2 JSON envelope: strict parsing and validation of the fields around the tensors.

The middle layer of the Open Inference Protocol (KServe v2) code, used by
:mod:`infscaler.api.codec` (the request / response codec) and the server's repository and
shared memory endpoints: splitting a body at ``Inference-Header-Content-Length``, strict
UTF-8 JSON with a bounded depth (checked before parsing), the ``$parameters`` object
(``timeout_ms``, ``binary_data_size``, the ``shared_memory_*`` triple), shapes. Pure
functions; every malformed field raises :class:`~infscaler.api.codec_tensors.ProtocolError`
(HTTP 400) naming the field.

The public names are re-exported by :mod:`infscaler.api.codec`; import them from there.

Sources: KServe / Triton ``protocol/`` docs (v2 REST ``$inference_request``,
``$parameters``, ``extension_binary_data.md``, ``extension_shared_memory.md``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from infscaler.api.codec_tensors import ProtocolError, is_int
from infscaler.base.levels import MAX_PRIORITY_LEVEL

#: The HTTP header giving the length of the JSON object when binary data follows it.
HEADER_LENGTH = "Inference-Header-Content-Length"

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


def split_body(body: bytes, header_length: int | None) -> tuple[bytes, memoryview]:
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
    recursion limit, which :func:`parse_json` turns into a 400 as well."""
    depth = _bracket_depth(raw)
    if depth > MAX_JSON_DEPTH and b'"' in raw:
        depth = _bracket_depth(_JSON_STRING.sub(b"", raw))
    return depth


def parse_json(header: bytes, what: str, header_length: int | None) -> dict[str, Any]:
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
    raw = bytes(header)
    # no deeper than the brackets it opens: most headers are checked by counting those
    depth = 0 if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH else _json_depth(raw)
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
    return parse_json(raw, what, None)


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


def check_parameters(params: dict[str, Any], where: str) -> None:
    """Triton's ``$parameters``: each value a bool, a finite number (integers in int64
    range) or a string; ``timeout_ms`` as :func:`parse_timeout_ms` wants it,
    ``priority`` and ``timeout`` as :func:`parse_queue_params` wants them."""
    parse_timeout_ms(params)
    parse_queue_params(params)
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


def parse_queue_params(params: Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    """``(priority, timeout_us)``: the request parameters ``priority`` (its priority
    level, 1 the highest; 0: the pipeline's) and ``timeout`` (its queue timeout, µs,
    honoured when the pipeline's queue policy allows it; 0: the policy's), Triton's
    (``docs/protocol/extension_parameters.md``; ``model_config.proto``'s
    ``ModelQueuePolicy``); None where not given.

    Raises:
        ProtocolError: (400) either not an integer (a JSON integer, not a boolean or a
            string), negative, or past its bound (``priority`` <= MAX_PRIORITY_LEVEL,
            ``timeout`` <= one hour).
    """
    if not params:
        return None, None
    out: list[int | None] = []
    for name, top, unit in (
        ("priority", MAX_PRIORITY_LEVEL, "a level, 1 the highest; 0: the pipeline's"),
        ("timeout", int(MAX_TIMEOUT_MS * 1000), "microseconds; 0: the pipeline's"),
    ):
        v = params.get(name)
        if v is not None and (isinstance(v, bool) or not is_int(v) or not 0 <= v <= top):
            raise ProtocolError(
                f"parameter {name} must be an integer 0 - {top} ({unit}), got {v!r:.40}"
            )
        out.append(None if v is None else int(v))
    return out[0], out[1]


def params_of(obj: dict[str, Any], where: str) -> dict[str, Any]:
    p = obj.get("parameters")
    if p is None:
        return {}
    if not isinstance(p, dict):
        raise ProtocolError(f"{where}: parameters must be a JSON object, got {type(p).__name__}")
    return p


def nonneg_int(value: Any, what: str, where: str) -> int:
    if not is_int(value) or value < 0:
        raise ProtocolError(f"{where}: {what} must be a non-negative integer, got {value!r}")
    return value


def parse_shape(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(is_int(d) for d in value):
        raise ProtocolError(f"{where}: shape must be a list of integers, got {value!r:.60}")
    if any(d < 0 for d in value):
        raise ProtocolError(f"{where}: shape {value} has a negative dimension")
    if len(value) > 32:
        raise ProtocolError(f"{where}: shape has {len(value)} dimensions; at most 32")
    if any(d > MAX_DIM for d in value) or math.prod(value) > MAX_DIM:
        raise ProtocolError(f"{where}: shape {value!s:.80} declares more than 2**62 elements")
    return value


def shm_params(params: dict[str, Any], where: str) -> tuple[str, int, int] | None:
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
    offset = nonneg_int(params.get("shared_memory_offset", 0), "shared_memory_offset", where)
    return region, offset, nonneg_int(size, "shared_memory_byte_size", where)
