"""Slot layout (infscaler.shm.tensors): round trips, zero copy, refusals, hostile headers."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from infscaler.shm.tensors import (
    ALIGNMENT,
    SlotFormatError,
    allocate_tensors,
    read_tensors,
    tensors_nbytes,
    write_tensors,
)


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Arbitrary bit patterns (NaNs, denormals, any bool byte is normalised) of a dtype."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    raw = rng.bytes(n * dtype.itemsize)
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    )


def mixed_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = random_array(rng, (8, 10), np.float64)
    return {
        "f32": random_array(rng, (3, 5, 7), np.float32),
        "u8": random_array(rng, (100,), np.uint8),
        "i64": random_array(rng, (4, 4), np.int64),
        "f16": random_array(rng, (33,), np.float16),
        "mask": random_array(rng, (2, 9), np.bool_),
        "scalar": np.array(3.25, np.float32),  # 0-d
        "strided": base[::2, 1::3],  # non-contiguous
        "transposed": random_array(rng, (5, 6), np.int16).T,
        "big_endian": random_array(rng, (6,), ">i4"),
        "complex": random_array(rng, (3,), np.complex64),
        "text": np.array(["ab", "cde", "ü"]),
        "empty": np.zeros((0, 3), np.float32),
        "名前": np.arange(3, dtype=np.uint16),
    }


def test_round_trip_bit_exact_and_zero_copy():
    tensors = mixed_tensors()
    need = tensors_nbytes(tensors)
    buf = bytearray(need + 100)
    mv = memoryview(buf)
    used = write_tensors(mv, tensors)
    assert used == need
    out = read_tensors(mv)
    assert list(out) == list(tensors)  # names in order
    slot = np.frombuffer(buf, np.uint8)
    for name, arr in tensors.items():
        got = out[name]
        assert same_bits(got, arr), name
        assert got.flags.c_contiguous
        assert not got.flags.writeable
        if got.nbytes:
            assert np.shares_memory(got, slot), name  # a view into the slot, no copy
            assert (got.ctypes.data - slot.ctypes.data) % ALIGNMENT == 0
        with pytest.raises(ValueError):
            got[...] = 0


def test_read_needs_only_used_bytes():
    tensors = mixed_tensors(1)
    buf = bytearray(tensors_nbytes(tensors) + 4096)
    used = write_tensors(memoryview(buf), tensors)
    out = read_tensors(memoryview(buf)[:used])
    assert all(same_bits(out[k], v) for k, v in tensors.items())


def test_allocate_gives_writable_views_into_the_slot():
    specs = {"logits": ((4, 10), np.float32), "ids": ((4,), "<i8"), "flag": ((), bool)}
    buf = bytearray(tensors_nbytes(specs))
    views = allocate_tensors(memoryview(buf), specs)
    assert list(views) == list(specs)
    slot = np.frombuffer(buf, np.uint8)
    for name, (shape, dtype) in specs.items():
        v = views[name]
        assert v.shape == tuple(shape) and v.dtype == np.dtype(dtype) and v.flags.writeable
        assert np.shares_memory(v, slot)
    views["logits"][:] = np.arange(40, dtype=np.float32).reshape(4, 10)  # the engine writes
    views["ids"][:] = [7, 8, 9, 10]
    views["flag"][()] = True
    out = read_tensors(memoryview(buf))
    assert np.array_equal(out["logits"], np.arange(40, dtype=np.float32).reshape(4, 10))
    assert out["ids"].tolist() == [7, 8, 9, 10]
    assert bool(out["flag"]) is True


def test_empty_mapping_round_trips():
    buf = bytearray(64)
    used = write_tensors(memoryview(buf), {})
    assert used == tensors_nbytes({}) and read_tensors(memoryview(buf)) == {}


@pytest.mark.parametrize(
    "value",
    [
        np.array([object(), 1], dtype=object),
        np.zeros(3, dtype=[("a", "<i4"), ("b", "<f4")]),
        np.zeros(2, dtype="V8"),
    ],
    ids=["object", "structured", "void"],
)
def test_refused_dtypes(value):
    buf = bytearray(4096)
    with pytest.raises(SlotFormatError, match="dtype"):
        write_tensors(memoryview(buf), {"x": value})
    assert bytes(buf) == bytes(4096)  # nothing written


def test_too_small_buffer_is_refused_before_writing():
    tensors = {"x": np.ones(1000, np.float32)}
    buf = bytearray(tensors_nbytes(tensors) - 1)
    with pytest.raises(SlotFormatError, match="need"):
        write_tensors(memoryview(buf), tensors)
    assert bytes(buf) == bytes(len(buf))


def test_read_only_buffer_cannot_be_written():
    with pytest.raises(TypeError):
        write_tensors(memoryview(bytes(4096)), {"x": np.ones(3)})


def _valid_slot() -> bytes:
    tensors = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.int64)}
    buf = bytearray(tensors_nbytes(tensors))
    write_tensors(memoryview(buf), tensors)
    return bytes(buf)


def test_garbage_and_truncated_headers_are_rejected():
    valid = _valid_slot()
    for cut in range(len(valid)):  # every truncation of a valid slot
        with pytest.raises(SlotFormatError):
            read_tensors(memoryview(valid[:cut]))
    rng = random.Random(0)
    for n in (0, 3, 20, 64, 4096):
        with pytest.raises(SlotFormatError):
            read_tensors(memoryview(bytes(rng.getrandbits(8) for _ in range(n))))
    with pytest.raises(SlotFormatError, match="magic"):
        read_tensors(memoryview(b"XXXX" + valid[4:]))
    with pytest.raises(SlotFormatError, match="version"):
        read_tensors(memoryview(valid[:4] + struct.pack("<H", 9) + valid[6:]))


def _entry(name: bytes, dtype: bytes, shape, offset: int, nbytes: int) -> bytes:
    out = struct.pack("<H", len(name)) + name + struct.pack("<B", len(dtype)) + dtype
    out += struct.pack("<B", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
    return out + struct.pack("<QQ", offset, nbytes)


def _slot(entries: list[bytes], used: int, size: int = 4096, count: int | None = None) -> bytes:
    body = b"".join(entries)
    header = 20 + len(body)
    fixed = struct.pack(
        "<4sHHIQ", b"ISCT", 1, len(entries) if count is None else count, header, used
    )
    raw = fixed + body
    return raw + bytes(size - len(raw))


@pytest.mark.parametrize(
    ("slot", "match"),
    [
        (_slot([_entry(b"x", b"<f4", [4], 64, 16)], used=5000), "used bytes"),  # used > buffer
        (_slot([_entry(b"x", b"<f4", [4], 4096, 16)], used=4096), "runs past"),  # data beyond
        (_slot([_entry(b"x", b"<f4", [4], 64, 17)], used=128), "does not match"),
        (_slot([_entry(b"x", b"<f4", [2**40], 64, 2**42)], used=4096), "runs past"),
        (_slot([_entry(b"x", b"<f4", [4], 65, 16)], used=128), "misaligned"),
        (_slot([_entry(b"x", b"<f4", [4], 0, 16)], used=128), "overlaps"),  # over the header
        (
            _slot([_entry(b"x", b"<f4", [32], 128, 128), _entry(b"y", b"<f4", [4], 192, 16)], 512),
            "overlaps",
        ),
        (_slot([_entry(b"x", b"|O", [2], 64, 16)], used=128), "object"),
        (_slot([_entry(b"x", b"not-a-dtype", [2], 64, 8)], used=128), "unparsable"),
        (_slot([_entry(b"x", b"float32", [2], 64, 8)], used=128), "unparsable"),
        (_slot([_entry(b"x", b"<i4,<f4", [2], 64, 16)], used=128), "unparsable"),
        (_slot([_entry(b"x", b"=f4", [2], 64, 8)], used=128), "canonical"),
        (_slot([_entry(b"x", b"|V8", [2], 64, 16)], used=128), "unparsable"),
        (_slot([_entry(b"\xff\xfe", b"<f4", [2], 64, 8)], used=128), "UTF-8"),
        (_slot([_entry(b"x", b"<f4", [2], 64, 8)], used=128, count=2), "truncated"),
        (_slot([_entry(b"x", b"<f4", [2], 64, 8)], used=128, count=0), "trailing"),
        (
            _slot([_entry(b"x", b"<f4", [2], 128, 8), _entry(b"x", b"<f4", [2], 192, 8)], 256),
            "twice",
        ),
    ],
)
def test_inconsistent_headers_are_rejected(slot, match):
    with pytest.raises(SlotFormatError, match=match):
        read_tensors(memoryview(slot))


def test_random_corruption_never_escapes_the_buffer():
    """Flip header bytes at random: either SlotFormatError or views inside the buffer."""
    valid = bytearray(_valid_slot())
    header = struct.unpack_from("<I", valid, 8)[0]
    rng = random.Random(1)
    outcomes = {"rejected": 0, "read": 0}
    for _ in range(3000):
        buf = bytearray(valid)
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(header)] = rng.getrandbits(8)
        base = np.frombuffer(buf, np.uint8)
        try:
            out = read_tensors(memoryview(buf))
        except SlotFormatError:
            outcomes["rejected"] += 1
            continue
        outcomes["read"] += 1
        lo, hi = base.ctypes.data, base.ctypes.data + len(buf)
        for arr in out.values():
            assert lo <= arr.ctypes.data and arr.ctypes.data + arr.nbytes <= hi
    assert outcomes["rejected"] > 0


dtypes = st.sampled_from(["<f4", "<f8", "<f2", "|u1", "<i8", "<i2", "|b1", "<c8", ">u4"])


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=0, max_size=12),
        dtypes.flatmap(
            lambda dt: hnp.arrays(
                np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)
            )
        ),
        max_size=5,
    )
)
def test_round_trip_property(tensors):
    buf = bytearray(tensors_nbytes(tensors))
    assert write_tensors(memoryview(buf), tensors) == len(buf)
    out = read_tensors(memoryview(buf))
    assert list(out) == list(tensors)
    for name, arr in tensors.items():
        assert same_bits(out[name], arr)
