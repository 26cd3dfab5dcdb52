"""Unified-memory backend (infscaler.shm.unified): honest unavailability, real GPU test.

The backend talks to the CUDA driver library (libcuda) through ctypes. The GPU test also
needs pycuda (to read and write through the device pointer independently of our code) and
a CUDA device that can map host memory (a Jetson, or any CUDA GPU); everywhere else it
skips with the reason unified_memory_available() gives.
"""

from __future__ import annotations

import ctypes
import importlib.util

import numpy as np
import pytest

from infscaler.engines.tensorrt import cuda as engine_cuda
from infscaler.shm import (
    SlabMap,
    TensorPool,
    TokenKind,
    UnifiedMemoryUnavailable,
    UnifiedSlab,
    unified_memory_available,
    write_tensors,
)

HAVE_PYCUDA = importlib.util.find_spec("pycuda") is not None
AVAILABLE, REASON = unified_memory_available()


def _libcuda_loadable() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_libcuda_loadable(), reason="this host has the NVIDIA driver library")
def test_reports_unavailable_without_the_driver():
    ok, reason = unified_memory_available()
    assert ok is False
    assert reason.startswith("no CUDA device") and "libcuda.so.1" in reason
    with pytest.raises(UnifiedMemoryUnavailable, match="libcuda"):
        UnifiedSlab(bytearray(4096))


def test_reports_no_device_when_the_driver_fails(monkeypatch):
    """cuInit failing (driver present, no GPU / module mismatch) -> (False, "no CUDA device")."""

    class FailingDriver:
        def __init__(self):
            raise RuntimeError("cuInit failed: no CUDA-capable device is detected")

    monkeypatch.setattr(engine_cuda, "CudaDriver", FailingDriver)
    ok, reason = unified_memory_available()
    assert ok is False and reason.startswith("no CUDA device")
    assert "no CUDA-capable device" in reason


@pytest.mark.skipif(not AVAILABLE, reason=f"unified memory unavailable: {REASON}")
@pytest.mark.skipif(not HAVE_PYCUDA, reason="pycuda is not installed (the test reads through it)")
def test_gpu_reads_and_writes_the_slab_in_place():
    import pycuda.driver as cuda

    pool = TensorPool(64 * 1024 * 1024, slab_bytes=1024 * 1024)
    slabs = SlabMap(pool.service_id)
    try:
        ref = pool.fault(100_000, owner=1)
        tok = ref.to_token(TokenKind.GRANT)
        pattern = np.arange(25_000, dtype=np.float32)
        write_tensors(slabs.slot_view(tok), {"x": pattern})
        slot = np.frombuffer(slabs.slot_view(tok), np.uint8)
        with UnifiedSlab(slabs.slab_view(ref.slab)) as unified:
            ptr = unified.device_pointer(ref.offset)
            ctx = cuda.Device(0).retain_primary_context()
            ctx.push()
            try:
                seen = np.empty(ref.size, np.uint8)
                cuda.memcpy_dtoh(seen, ptr)  # the device reads the slot through its pointer
                assert np.array_equal(seen, slot)
                cuda.memcpy_htod(ptr, np.full(64, 7, np.uint8))  # and writes it in place
                ctx.synchronize()
            finally:
                ctx.pop()
                ctx.detach()
            assert np.all(slot[:64] == 7)
            with pytest.raises(ValueError):
                unified.device_pointer(unified.nbytes)
    finally:
        slabs.close()
        pool.close()
