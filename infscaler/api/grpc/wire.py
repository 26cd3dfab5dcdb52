"""A ``ModelInferRequest``'s protobuf wire format scanned before anything parses it (pure):
its counts, where its ``raw_input_contents`` lie, and a bound on what parsing (upb) and
decoding would hold. Caps: 400 (INVALID_ARGUMENT); beyond ``limit`` bytes held: 413
(RESOURCE_EXHAUSTED).

Sources: https://protobuf.dev/programming-guides/encoding/; Triton ``grpc_service.proto``;
upb ``upb/message/array.c``. Why: docs/api.md, "`infscaler/api/grpc/wire.py`".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infscaler.api.codec_tensors import ProtocolError

__all__ = [
    "DECODE_SLACK",
    "MAX_DIMS",
    "MAX_FIELDS",
    "MAX_PARAMETERS",
    "MAX_TENSORS",
    "InferScan",
    "NotQuick",
    "decode_limit",
    "decode_work",
    "peek_model_name",
    "raw_views",
    "scan_model_infer",
    "strip_raw",
]

#: inputs, outputs and raw_input_contents entries a request may have, each
MAX_TENSORS = 1024
#: dims of one input's shape (the v2 codec's bound)
MAX_DIMS = 32
#: parameters of a request, its inputs and its outputs, in all
MAX_PARAMETERS = 4096
#: fields (each element of an unpacked repeated field is one) the scan walks, at most
MAX_FIELDS = 1 << 16
#: what a decode may hold beyond twice its message, bytes (codec_tensors' BYTES slack)
DECODE_SLACK = 1 << 20

#: what the decode holds for one input, output and parameter, and one shape dim, beyond
#: their strings (upb submessages and map entries; the JSON header's dicts and lists,
#: parsed back), bytes; measured with 2x margin (tests/unit/api/test_grpc_wire.py)
PER_TENSOR = 2048
PER_PARAMETER = 1024
PER_DIM = 128
#: bytes held per byte of the message that is not tensor data (names, datatypes, ids,
#: parameters, shapes, unknown fields): upb's copy, the Python str, the JSON header and
#: its checks, parsed back; and per byte the JSON header adds escaping it (a control
#: byte ``\\u00XX``: 5 more; a quote or backslash: 1; a non-ASCII byte: at most 2)
STRING_FACTOR = 10
ESCAPE_FACTOR = 6

#: typed elements the decode converts at a time (mapping.contents_to_bytes), and what
#: one holds meanwhile (the chunk's array, the values' Python objects), bytes
CONVERT_CHUNK = 1 << 13
_CHUNK_ELEMENT = 24
_TYPED_SLACK = 64 << 10
_BYTES_OBJECT = 48

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
#: InferTensorContents field -> its upb element size (and the largest item of its layout)
_ELEMENT = {1: 1, 2: 4, 3: 8, 4: 4, 5: 8, 6: 4, 7: 8}
_FIXED = {6: (_I32, 4), 7: (_I64, 8)}
#: upb's string view (pointer + length), one per bytes element
_VIEW = 16
_CHUNK = 1 << 20
_HIGH = bytes(range(0x80, 0x100))


def decode_limit(message_len: int) -> int:
    """The most a message of ``message_len`` bytes may hold decoded, bytes: twice it
    plus :data:`DECODE_SLACK` (what the HTTP socket's BYTES decode allows)."""
    return 2 * message_len + DECODE_SLACK


@dataclass
class InferScan:
    """What a ``ModelInferRequest`` holds, from its wire bytes.

    Attributes:
        model_name / model_version: the last of each on the wire ('' if none).
        inputs / outputs / parameters / max_dims: counts (dims: the most of one input).
        raw: each ``raw_input_contents`` entry as ``(field start, payload offset,
            payload length)``.
        elements: typed contents elements, all inputs.
        tensors_held: bytes the tensors' parse and decode would hold at their peak (bound).
        held: that plus the rest's: what the decode holds at its peak, at most, bytes.
    """

    model_name: str = ""
    model_version: str = ""
    inputs: int = 0
    outputs: int = 0
    parameters: int = 0
    max_dims: int = 0
    raw: list[tuple[int, int, int]] = field(default_factory=list)
    elements: int = 0
    tensors_held: int = 0
    held: int = 0


class _Walk:
    """The fields walked so far, against ``cap``."""

    __slots__ = ("n", "cap")

    def __init__(self, cap: int) -> None:
        self.n, self.cap = 0, cap

    def too_many(self) -> Exception:
        if self.cap < MAX_FIELDS:
            return NotQuick()
        return ProtocolError(
            f"the message has more than {MAX_FIELDS} fields (unpacked repeated values, "
            "bytes_contents elements, ...): send large tensors in raw_input_contents or "
            "system shared memory"
        )


class NotQuick(Exception):
    """:func:`scan_model_infer` given ``quick``: the message has more fields than that."""


def _bad(what: str) -> ProtocolError:
    return ProtocolError(f"not a valid ModelInferRequest message: {what}")


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise _bad(f"a varint longer than 10 bytes at byte {pos}")
    raise _bad(f"a varint cut off at byte {end}")


def _fields(buf: bytes, pos: int, end: int, walk: _Walk):
    """``(number, wire type, start, stop, key start)`` of each field of ``buf[pos:end]``:
    a LEN field's payload is ``buf[start:stop]``, a VARINT's value ``start``."""
    n = walk.n
    while pos < end:
        n += 1
        if n > walk.cap:
            walk.n = n
            raise walk.too_many()
        key_at = pos
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(buf, pos, end)
        num, wt = key >> 3, key & 7
        if wt == _LEN:
            if pos < end and buf[pos] < 0x80:
                stop = pos + 1 + buf[pos]
                pos += 1
            else:
                length, pos = _varint(buf, pos, end)
                stop = pos + length
        elif wt == _VARINT:
            if pos < end and buf[pos] < 0x80:
                value, stop = buf[pos], pos + 1
            else:
                value, stop = _varint(buf, pos, end)
            if num == 0:
                raise _bad(f"field number 0 at byte {key_at}")
            walk.n = n
            yield num, wt, value, stop, key_at
            n = walk.n
            pos = stop
            continue
        elif wt == _I64:
            stop = pos + 8
        elif wt == _I32:
            stop = pos + 4
        else:
            raise _bad(f"wire type {wt} (groups are not part of this protocol) at byte {key_at}")
        if num == 0:
            raise _bad(f"field number 0 at byte {key_at}")
        if stop > end:
            raise _bad(f"field {num} at byte {key_at} runs past its message's end ({end})")
        walk.n = n
        yield num, wt, pos, stop, key_at
        n = walk.n
        pos = stop
    walk.n = n


def _varints_in(buf: bytes, start: int, stop: int) -> int:
    """How many varints a packed payload holds: its bytes < 0x80 (each ends one),
    counted a chunk at a time in C (``bytes.translate`` deletes the others)."""
    if stop > start and buf[stop - 1] >= 0x80:
        raise _bad(f"a packed varint cut off at byte {stop}")
    mv = memoryview(buf)
    return sum(
        len(bytes(mv[i : min(i + _CHUNK, stop)]).translate(None, _HIGH))
        for i in range(start, stop, _CHUNK)
    )


def _upb_array(n: int, size: int, growth: int = 2) -> int:
    """What upb holds for a repeated field of ``n`` elements of ``size`` bytes: its
    power-of-two capacity, and (``growth`` 2) the arrays it outgrew in the arena."""
    return 0 if n == 0 else growth * max(4, 1 << (n - 1).bit_length()) * size


class _Contents:
    """One input's typed contents, summed over every occurrence on the wire."""

    __slots__ = ("counts", "chunks", "data", "data8", "big", "big_data", "unknown")

    def __init__(self) -> None:
        self.counts = [0] * 9
        self.chunks = [0] * 9  # LEN (packed) and single-element occurrences per field
        self.data = self.data8 = self.big = self.big_data = self.unknown = 0

    def add(self, buf: bytes, start: int, stop: int, walk: _Walk) -> None:
        for num, wt, a, b, key_at in _fields(buf, start, stop, walk):
            if num in _ELEMENT and wt == _LEN:  # packed
                if num in _FIXED:
                    width = _FIXED[num][1]
                    if (b - a) % width:
                        raise _bad(f"a packed field of {b - a} bytes, not a multiple of {width}")
                    self.counts[num] += (b - a) // width
                else:
                    self.counts[num] += _varints_in(buf, a, b)
                self.chunks[num] += 1
            elif num in _ELEMENT and wt == _FIXED.get(num, (_VARINT,))[0]:
                self.counts[num] += 1
                self.chunks[num] += 2  # unpacked: upb's array grows
            elif num == 8 and wt == _LEN:
                n = b - a
                self.counts[8] += 1
                self.data += n
                self.data8 += (n + 7) & ~7  # upb copies each into its arena, 8-aligned
                if n > 1:
                    self.big += 1
                    self.big_data += n
            else:
                self.unknown += b - key_at

    def held(self) -> tuple[int, int, int]:
        """(upb, layout, decoded) bytes: the parsed message's arrays, the binary tensor
        layout the decode writes (and its conversion's chunk), and what decoding that
        layout adds (BOOL's copy, BYTES' objects: 8 a pointer, 48 a ``bytes`` of 2 or
        more: 33 and pymalloc's 16-byte rounding)."""
        if not (any(self.counts) or self.unknown):
            return 0, 0, 0
        upb = layout = chunks = 0
        for num, size in _ELEMENT.items():
            n = self.counts[num]
            growth = 1 if num in _FIXED and self.chunks[num] == 1 else 2
            upb += _upb_array(n, size, growth)
            layout += n * size
            chunks += min(n, CONVERT_CHUNK) * _CHUNK_ELEMENT
        n = self.counts[8]
        upb += upb >> 6  # the arena's blocks: 1/64 more (measured: < 0.1%)
        strings = _upb_array(n, _VIEW) + self.data8 + 2 * self.unknown
        upb += strings + (strings >> 4)  # measured: < 3% more
        layout += 4 * n + self.data
        decoded = self.counts[1] + 8 * n + _BYTES_OBJECT * self.big + self.big_data
        # upb's submessages; the decode's JSON header and Python objects beside the chunk
        return upb + _TYPED_SLACK, layout + chunks + _TYPED_SLACK, decoded


def _utf8(buf: bytes, a: int, b: int, what: str) -> str:
    try:
        return bytes(buf[a:b]).decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(f"{what} is not UTF-8") from None


def _too_many(what: str, cap: int) -> ProtocolError:
    return ProtocolError(f"the request has more than {cap} {what}; at most {cap}")


def _input(
    buf: bytes, a: int, b: int, walk: _Walk, scan: InferScan, spans: list[tuple[int, int]]
) -> tuple[_Contents, int]:
    """One ``InferInputTensor``: its contents and its dims (parameters counted in
    ``scan``, the contents' place appended to ``spans``)."""
    contents, dims = _Contents(), 0
    for num, wt, x, y, _ in _fields(buf, a, b, walk):
        if num == 3 and wt == _LEN:
            dims += _varints_in(buf, x, y)
        elif num == 3 and wt == _VARINT:
            dims += 1
        elif num == 4 and wt == _LEN:
            scan.parameters += 1
        elif num == 5 and wt == _LEN:
            contents.add(buf, x, y, walk)
            spans.append((x, y))
        if dims > MAX_DIMS:
            raise ProtocolError(f"an input has more than {MAX_DIMS} dims; at most {MAX_DIMS}")
    return contents, dims


#: the bytes a JSON string escapes as ``\\u00XX`` (:meth:`_Held.rest`)
_CONTROL = bytes(range(0x20))


class _Held:
    """The running bound of :func:`scan_model_infer`, bytes."""

    __slots__ = ("dims", "upb", "layout", "decoded", "raw", "raw_wire", "spans")

    def __init__(self) -> None:
        self.dims = self.upb = self.layout = self.decoded = self.raw = self.raw_wire = 0
        self.spans: list[tuple[int, int]] = []  # the tensor data's, in order

    def tensors(self, scan: InferScan, size: int) -> int:
        """Held for the tensors: the body the decode writes, the larger of upb's arrays and
        what decoding adds, and the message parsed without its raw entries."""
        return (
            self.layout
            + self.raw
            + max(self.upb, self.decoded)
            + (size - self.raw_wire if scan.raw else 0)
        )

    def rest(self, scan: InferScan, strings: bytes) -> int:
        """Held for the ``strings`` (the message but its tensor data) and the
        structure (per item)."""
        n = len(strings)  # bytes of each class counted by deleting them (C speed)
        escapes = (
            5 * (n - len(strings.translate(None, _CONTROL)))
            + (n - len(strings.translate(None, b'"\\')))
            + 2 * (n - len(strings.translate(None, _HIGH)))
        )
        return (
            STRING_FACTOR * len(strings)
            + ESCAPE_FACTOR * escapes
            + PER_TENSOR * (scan.inputs + scan.outputs + len(scan.raw))
            + PER_PARAMETER * scan.parameters
            + PER_DIM * self.dims
        )


def scan_model_infer(
    message: bytes, *, limit: int | None = None, quick: int | None = None
) -> InferScan:
    """Scan a ``ModelInferRequest``'s wire bytes.

    Args:
        message: the serialized request.
        limit: refuse (413) once what it would hold exceeds this many bytes (None: no bound).
        quick: give up (:class:`NotQuick`) after walking this many fields.

    Raises:
        ProtocolError: (400) malformed wire data or over a cap; (413) over ``limit``.
    """
    buf, walk, scan, h = message, _Walk(min(quick or MAX_FIELDS, MAX_FIELDS)), InferScan(), _Held()
    size = len(buf)
    for num, wt, a, b, key_at in _fields(buf, 0, size, walk):
        if num == 1 and wt == _LEN:
            scan.model_name = _utf8(buf, a, b, "model_name")
        elif num == 2 and wt == _LEN:
            scan.model_version = _utf8(buf, a, b, "model_version")
        elif num == 4 and wt == _LEN:
            scan.parameters += 1
        elif num == 5 and wt == _LEN:
            scan.inputs += 1
            if scan.inputs > MAX_TENSORS:
                raise _too_many("inputs", MAX_TENSORS)
            contents, dims = _input(buf, a, b, walk, scan, h.spans)
            scan.max_dims = max(scan.max_dims, dims)
            scan.elements += sum(contents.counts)
            upb, layout, decoded = contents.held()
            h.dims += dims
            h.upb, h.layout, h.decoded = h.upb + upb, h.layout + layout, h.decoded + decoded
        elif num == 6 and wt == _LEN:
            scan.outputs += 1
            if scan.outputs > MAX_TENSORS:
                raise _too_many("outputs", MAX_TENSORS)
            for onum, owt, *_ in _fields(buf, a, b, walk):
                scan.parameters += onum == 2 and owt == _LEN
        elif num == 7 and wt == _LEN:
            scan.raw.append((key_at, a, b - a))
            if len(scan.raw) > MAX_TENSORS:
                raise _too_many("raw_input_contents entries", MAX_TENSORS)
            h.raw, h.raw_wire = h.raw + b - a, h.raw_wire + b - key_at
            h.spans.append((key_at, b))
        else:
            continue
        if scan.parameters > MAX_PARAMETERS:
            raise _too_many("parameters", MAX_PARAMETERS)
        if limit is not None and h.tensors(scan, size) > limit:
            raise _held_too_much(h.tensors(scan, size), size, limit)
    scan.tensors_held = h.tensors(scan, size)
    mv, pos, gaps = memoryview(buf), 0, []
    for a, b in h.spans:
        gaps.append(mv[pos:a])
        pos = b
    gaps.append(mv[pos:])
    scan.held = scan.tensors_held + h.rest(scan, b"".join(gaps))
    return scan


def decode_work(scan: InferScan, size: int) -> int:
    """The CPU a decode of a scanned message of ``size`` bytes takes, in typed elements
    converted (measured on one core: ~45 ns an element; ~8 us a tensor, the JSON
    header's part; ~2 us a parameter; a copied byte ~0.15 ns)."""
    return scan.elements + 200 * (scan.inputs + scan.outputs) + 50 * scan.parameters + size // 256


def _held_too_much(held: int, size: int, limit: int) -> ProtocolError:
    return ProtocolError(
        f"decoding this {size / 1e6:.1f} MB message would hold at least {held / 1e6:.1f} MB, "
        f"more than twice the message (at most {limit / 1e6:.1f} MB): send large tensors in "
        "raw_input_contents or system shared memory, not typed contents",
        413,
    )


def strip_raw(message: bytes, scan: InferScan) -> bytes:
    """``message`` without its ``raw_input_contents`` fields (a copy of the rest): what is
    parsed when the entries are read in place (:func:`raw_views`)."""
    if not scan.raw:
        return message
    mv, parts, pos = memoryview(message), [], 0
    for key_at, offset, length in scan.raw:
        parts.append(mv[pos:key_at])
        pos = offset + length
    parts.append(mv[pos:])
    return b"".join(parts)


def raw_views(message: bytes, scan: InferScan) -> list[memoryview]:
    """The ``raw_input_contents`` entries as views of ``message`` (no copy)."""
    mv = memoryview(message)
    return [mv[offset : offset + length] for _, offset, length in scan.raw]


#: fields :func:`peek_model_name` walks at most
PEEK_FIELDS = 64


def peek_model_name(head: bytes | memoryview) -> str | None:
    """The ``model_name`` of a ``ModelInferRequest`` from the first bytes of its message, or
    None when they do not show one before an ``inputs`` (5) or ``raw_input_contents`` (7)
    field (only a ``ModelInferRequest`` has those): cut off, not UTF-8 or not protobuf."""
    buf, end, pos, name = head, len(head), 0, None
    for _ in range(PEEK_FIELDS):
        try:
            key, pos = _varint(buf, pos, end)
            num, wt = key >> 3, key & 7
            if wt == _VARINT:
                _, pos = _varint(buf, pos, end)
                continue
            if wt == _LEN:
                size, pos = _varint(buf, pos, end)
            elif wt in (_I64, _I32):
                size = 8 if wt == _I64 else 4
            else:
                return None
        except ProtocolError:  # a varint cut off, or longer than 10 bytes
            return None
        if wt == _LEN and num in (5, 7):
            return name
        if pos + size > end:
            return None
        if num == 1 and wt == _LEN:
            try:
                name = bytes(buf[pos : pos + size]).decode()
            except UnicodeDecodeError:
                return None
        pos += size
    return None
