"""Slot layout: named numpy tensors in one slot of the tensor pool (InfScaler §IV-B).

A slot holds a small header followed by the tensors' bytes. Readers get numpy views
straight into the slot (zero copy); writers either copy arrays in once
(:func:`write_tensors`) or get writable views first (:func:`allocate_tensors`) so an
engine writes its outputs in place.

More (details, why it is so, history, figures): docs/architecture.md, "`shm/tensors.py`".
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping, Sequence

import numpy as np

from infscaler.base.errors import InfScalerError

__all__ = [
    "ALIGNMENT",
    "SLOT_MAGIC",
    "SlotFormatError",
    "TensorSpec",
    "allocate_tensors",
    "read_tensors",
    "tensors_nbytes",
    "write_tensors",
]

SLOT_MAGIC = b"ISCT"
SLOT_VERSION = 1
ALIGNMENT = 64
MAX_NDIM = 64  # numpy 2's limit
_FIXED = struct.Struct("<4sHHIQ")  # magic, version, count, header_bytes, used_bytes
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")
_TAIL = struct.Struct("<QQ")  # data offset, nbytes
_ALLOWED_KINDS = frozenset("biufcmMSU")  # bool, ints, floats, complex, (time)deltas, bytes, str
# what ``dtype.str`` looks like for those kinds; anything else in a header is refused unparsed
_DTYPE_STR = re.compile(r"^[<>|=][biufcmMSU][1-9][0-9]{0,8}(\[[0-9]*[a-zA-Z]+\])?$")

#: ``(shape, dtype)``: a tensor to lay out without having its data yet.
TensorSpec = tuple[Sequence[int], np.dtype | str | type]


class SlotFormatError(InfScalerError):
    """A slot's contents are not a valid tensor layout, or tensors cannot be laid out.

    Raised by :func:`read_tensors` on garbage, truncated or inconsistent headers, and by
    the writers when a dtype is refused (object / structured), a name is too long, or
    the tensors do not fit in the buffer.
    """


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _check_dtype(dtype: np.dtype, name: str) -> str:
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise SlotFormatError(
            f"tensor {name!r}: dtype {dtype} is not plain bytes (object / structured dtypes are refused)",
            hint="convert it to a numeric, bool, bytes (S) or unicode (U) dtype",
        )
    if dtype.kind not in _ALLOWED_KINDS or dtype.itemsize == 0:
        raise SlotFormatError(f"tensor {name!r}: dtype {dtype} cannot be stored in a slot")
    code = dtype.str
    if len(code) > 255:  # pragma: no cover - numpy dtype strings are short
        raise SlotFormatError(f"tensor {name!r}: dtype string too long")
    return code


def _normalize(
    tensors: Mapping[str, np.ndarray | TensorSpec],
) -> list[tuple[bytes, str, tuple[int, ...], int]]:
    """(name utf-8, dtype str, shape, nbytes) per tensor, checked."""
    if len(tensors) > 0xFFFF:
        raise SlotFormatError(f"{len(tensors)} tensors in one slot; at most 65535")
    out = []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise SlotFormatError(f"tensor names must be str, got {type(name).__name__}")
        raw = name.encode("utf-8")
        if len(raw) > 0xFFFF:
            raise SlotFormatError(f"tensor name of {len(raw)} bytes; at most 65535")
        if isinstance(value, np.ndarray):
            dtype, shape = value.dtype, tuple(int(d) for d in value.shape)
        elif isinstance(value, np.generic):
            dtype, shape = value.dtype, ()
        else:
            try:
                shape_in, dtype_in = value
                dtype = np.dtype(dtype_in)
                shape = tuple(int(d) for d in shape_in)
            except (TypeError, ValueError) as exc:
                raise SlotFormatError(
                    f"tensor {name!r}: expected a numpy array or a (shape, dtype) pair, got {value!r}"
                ) from exc
        if len(shape) > MAX_NDIM or any(d < 0 for d in shape):
            raise SlotFormatError(f"tensor {name!r}: invalid shape {shape}")
        code = _check_dtype(dtype, name)
        out.append((raw, code, shape, math.prod(shape) * dtype.itemsize))
    return out


def _header_bytes(entries: list[tuple[bytes, str, tuple[int, ...], int]]) -> int:
    size = _FIXED.size
    for raw, code, shape, _ in entries:
        size += _U16.size + len(raw) + _U8.size + len(code) + _U8.size
        size += _U64.size * len(shape) + _TAIL.size
    return size


def _layout(entries) -> tuple[int, list[int], int]:
    """(header_bytes, data offsets, used_bytes)."""
    header = _header_bytes(entries)
    offsets = []
    pos = _align(header)
    for *_, nbytes in entries:
        offsets.append(pos)
        pos = _align(pos + nbytes)
    used = offsets[-1] + entries[-1][3] if entries else header
    return header, offsets, used


def tensors_nbytes(tensors: Mapping[str, np.ndarray | TensorSpec]) -> int:
    """Bytes a slot needs for ``tensors`` (name -> array, or -> ``(shape, dtype)``):
    header + 64-byte-aligned data; the FAULT's and the DATA token's ``length``.

    Raises:
        SlotFormatError: a refused dtype, a bad shape, a name over 65535 bytes.
    """
    return _layout(_normalize(tensors))[2]


def _write_header(buf: memoryview, entries, header: int, offsets: list[int], used: int) -> None:
    pos = _FIXED.size
    for (raw, code, shape, nbytes), off in zip(entries, offsets, strict=True):
        _U16.pack_into(buf, pos, len(raw))
        pos += _U16.size
        buf[pos : pos + len(raw)] = raw
        pos += len(raw)
        _U8.pack_into(buf, pos, len(code))
        pos += _U8.size
        buf[pos : pos + len(code)] = code.encode("ascii")
        pos += len(code)
        _U8.pack_into(buf, pos, len(shape))
        pos += _U8.size
        for d in shape:
            _U64.pack_into(buf, pos, d)
            pos += _U64.size
        _TAIL.pack_into(buf, pos, off, nbytes)
        pos += _TAIL.size
    assert pos == header
    # The fixed part last: a reader never sees a valid magic over half-written entries
    # (within one process; across processes the token handover orders the writes).
    _FIXED.pack_into(buf, 0, SLOT_MAGIC, SLOT_VERSION, len(entries), header, used)


def _as_buffer(buf) -> memoryview:
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1 or not mv.c_contiguous:
        mv = mv.cast("B")
    return mv


def _allocate(buf, specs) -> tuple[dict[str, np.ndarray], int]:
    mv = _as_buffer(buf)
    if mv.readonly:
        raise TypeError("writing tensors needs a writable buffer")
    entries = _normalize(specs)
    header, offsets, used = _layout(entries)
    if used > len(mv):
        raise SlotFormatError(
            f"tensors need {used} bytes, the slot has {len(mv)}",
            hint="fault a slot of at least tensors_nbytes(...) bytes",
        )
    _write_header(mv, entries, header, offsets, used)
    views = {}
    for (raw, code, shape, _), off in zip(entries, offsets, strict=True):
        views[raw.decode("utf-8")] = np.ndarray(shape, np.dtype(code), buffer=mv, offset=off)
    return views, used


def allocate_tensors(
    buf: memoryview, specs: Mapping[str, np.ndarray | TensorSpec]
) -> dict[str, np.ndarray]:
    """Lay out tensors in the writable slot ``buf`` and return writable views of their
    (uninitialised) data, so an engine writes its outputs in place.

    Args:
        buf: a writable slot (e.g. :meth:`~infscaler.shm.slabmap.SlabMap.slot_view`).
        specs: name -> ``(shape, dtype)`` (or an array: its shape and dtype).

    Returns:
        name -> C-contiguous ``np.ndarray`` sharing memory with ``buf``, in order.

    Raises:
        SlotFormatError: refused dtype / bad shape / name too long, or more bytes than
            ``len(buf)``.
        TypeError: ``buf`` is read-only.
    """
    return _allocate(buf, specs)[0]


def write_tensors(buf: memoryview, tensors: Mapping[str, np.ndarray]) -> int:
    """Copy ``tensors`` (any strides, 0-d fine) into the writable slot ``buf``, once each;
    returns the bytes used (header + data), the DATA token's ``length``.

    Raises:
        SlotFormatError: as :func:`allocate_tensors`.
        TypeError: ``buf`` is read-only.
    """
    arrays = {name: np.asarray(value) for name, value in tensors.items()}
    views, used = _allocate(buf, arrays)
    for name, view in views.items():
        np.copyto(view, arrays[name], casting="no")
    return used


class _Reader:
    """Bounds-checked cursor over the header region. ``what`` names the field read, as
    ``what % arg`` (formatted only for the error: this runs for every slot read)."""

    def __init__(self, mv: memoryview, end: int) -> None:
        self.mv, self.pos, self.end = mv, _FIXED.size, end

    def take(self, n: int, what: str, arg: object = None) -> memoryview:
        if self.pos + n > self.end:
            raise SlotFormatError(f"slot header truncated while reading {what % (arg,)}")
        out = self.mv[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, st: struct.Struct, what: str, arg: object = None) -> int:
        return st.unpack(self.take(st.size, what, arg))[0]


#: dtype codes :func:`read_tensors` has checked, and their dtypes
_READ_DTYPES: dict[str, np.dtype] = {}


def _read_dtype(code_raw: bytes, name: str) -> np.dtype:
    """The dtype a slot header names (``code_raw``, its ``dtype.str``), checked: no
    object dtype, parsable, canonical, storable (:func:`_check_dtype`)."""
    code = code_raw.decode("latin-1")
    dtype = _READ_DTYPES.get(code)
    if dtype is not None:
        return dtype
    if code.startswith("|O"):
        raise SlotFormatError(f"tensor {name!r}: object dtype {code!r} is refused")
    try:
        if not _DTYPE_STR.match(code):
            raise ValueError(code)
        dtype = np.dtype(code)
    except (TypeError, ValueError) as exc:
        raise SlotFormatError(f"tensor {name!r}: unparsable dtype {code_raw!r}") from exc
    if dtype.str != code:
        raise SlotFormatError(f"tensor {name!r}: dtype {code!r} is not in canonical form")
    _check_dtype(dtype, name)
    if len(_READ_DTYPES) < 256:  # codes are few; a hostile header cannot grow it past this
        _READ_DTYPES[code] = dtype
    return dtype


def read_tensors(buf: memoryview) -> dict[str, np.ndarray]:
    """Read-only zero-copy views of the tensors in slot ``buf`` (at least the DATA
    token's ``length`` bytes): name -> C-contiguous ``np.ndarray`` in order. Copy what
    must outlive the slot's lease.

    Raises:
        SlotFormatError: bad magic or version, a header or tensor beyond ``buf``, a
            refused or unparsable dtype, a size not matching the shape, misaligned or
            overlapping data.
    """
    mv = _as_buffer(buf).toreadonly()
    if len(mv) < _FIXED.size:
        raise SlotFormatError(f"slot of {len(mv)} bytes is shorter than the tensor header")
    magic, version, count, header, used = _FIXED.unpack_from(mv, 0)
    if magic != SLOT_MAGIC:
        raise SlotFormatError(f"bad slot magic {bytes(magic)!r} (expected {SLOT_MAGIC!r})")
    if version != SLOT_VERSION:
        raise SlotFormatError(f"unsupported slot layout version {version}")
    if not _FIXED.size <= header <= used <= len(mv):
        raise SlotFormatError(
            f"slot header claims {header} header bytes and {used} used bytes, "
            f"the buffer has {len(mv)}"
        )
    rd = _Reader(mv, header)
    out: dict[str, np.ndarray] = {}
    prev_end = header
    for i in range(count):
        name_len = rd.unpack(_U16, "tensor %d name length", i)
        try:
            name = bytes(rd.take(name_len, "tensor %d name", i)).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SlotFormatError(f"tensor {i}: name is not UTF-8") from exc
        code_len = rd.unpack(_U8, "tensor %r dtype length", name)
        dtype = _read_dtype(bytes(rd.take(code_len, "tensor %r dtype", name)), name)
        ndim = rd.unpack(_U8, "tensor %r ndim", name)
        if ndim > MAX_NDIM:
            raise SlotFormatError(f"tensor {name!r}: ndim {ndim} above {MAX_NDIM}")
        shape = tuple(rd.unpack(_U64, "tensor %r dims", name) for _ in range(ndim))
        off, nbytes = _TAIL.unpack(rd.take(_TAIL.size, "tensor %r offset", name))
        if math.prod(shape) * dtype.itemsize != nbytes:
            raise SlotFormatError(
                f"tensor {name!r}: {nbytes} bytes does not match shape {shape} of {dtype}"
            )
        if off % ALIGNMENT or off < prev_end or off + nbytes > used:
            raise SlotFormatError(
                f"tensor {name!r}: data at [{off}, {off + nbytes}) is misaligned, overlaps "
                f"the header or a previous tensor, or runs past the {used} used bytes"
            )
        if name in out:
            raise SlotFormatError(f"tensor name {name!r} appears twice")
        prev_end = off + nbytes
        out[name] = np.ndarray(shape, dtype, buffer=mv, offset=off)
    if rd.pos != header:
        raise SlotFormatError(f"slot header has {header - rd.pos} trailing bytes")
    return out
