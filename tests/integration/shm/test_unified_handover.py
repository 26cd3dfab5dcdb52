"""A zero-copy CPU -> GPU -> CPU handover through the unified-memory backend (§IV-B).

Three processes share one token pool, as a CPU -> GPU -> CPU pipeline would: a spawned
**producer** (CPU only) writes ``x`` into a slot it was granted; the **GPU stage** (this
process) registers the slot's slab with CUDA (:class:`~infscaler.shm.UnifiedSlabMap`) and
runs a kernel that reads ``x`` and writes ``y = 2 x + 1`` into a second slot through
device pointers, with no ``memcpy`` in either direction; a spawned **consumer** (CPU only)
reads ``y`` from its slot. On a Jetson the GPU reaches the slabs in the same DRAM; on a
discrete GPU over PCIe (correct, slower: ``bench/unified_handover.py`` measures it).

Needs the NVIDIA driver and a CUDA device that maps host memory; the handover also needs
pycuda and nvcc (the kernel is compiled with ``pycuda.compiler.SourceModule``).
Everywhere else the tests skip with the reason.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import shutil

import numpy as np
import pytest

from infscaler.shm import (
    SlabMap,
    TensorPool,
    TokenKind,
    UnifiedSlabMap,
    allocate_tensors,
    read_tensors,
    tensors_nbytes,
    unified_memory_available,
    write_tensors,
)

AVAILABLE, REASON = unified_memory_available()
HAVE_PYCUDA = importlib.util.find_spec("pycuda") is not None
NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"unified memory unavailable: {REASON}")

KERNEL = r"""
__global__ void affine(const float *x, float *y, float a, float b, unsigned long long n)
{
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
"""
N = 1_000_003  # not a multiple of the block: the kernel's bound check matters


def _produce(service_id: str, token: bytes, seed: int, queue) -> None:
    """Spawned, CPU only: write x into the granted slot; report the DATA length."""
    from infscaler.shm import SlabMap, Token, write_tensors

    try:
        with SlabMap(service_id) as slabs:
            x = np.random.default_rng(seed).standard_normal(N).astype(np.float32)
            queue.put(("ok", write_tensors(slabs.slot_view(Token.unpack(token)), {"x": x})))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


def _consume(service_id: str, token: bytes, seed: int, queue) -> None:
    """Spawned, CPU only: read y from the slot the GPU wrote; check it against numpy."""
    from infscaler.shm import SlabMap, Token, read_tensors

    try:
        with SlabMap(service_id) as slabs:
            y = read_tensors(slabs.slot_view(Token.unpack(token)))["y"]
            x = np.random.default_rng(seed).standard_normal(N).astype(np.float32)
            queue.put(("ok", (y.shape, str(y.dtype), float(np.abs(y - (2 * x + 1)).max()))))
    except BaseException as exc:  # noqa: BLE001
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


def _run(ctx, target, *args):
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    try:
        status, value = queue.get(timeout=120)
    finally:
        proc.join(timeout=30)
    assert status == "ok", value
    assert proc.exitcode == 0
    return value


@pytest.mark.skipif(not HAVE_PYCUDA, reason="pycuda is not installed (it runs the kernel)")
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (pycuda compiles the kernel)")
def test_cpu_gpu_cpu_handover_in_place():
    import pycuda.driver as cuda
    from pycuda.compiler import SourceModule

    ctx = mp.get_context("spawn")  # CUDA is initialised here: children must not fork it
    affine = module = None
    pool = TensorPool(256 * 1024 * 1024, slab_bytes=16 * 1024 * 1024)
    slabs = SlabMap(pool.service_id)
    device = cuda.Device(0).retain_primary_context()
    device.push()
    try:
        nbytes = N * 4 + 4096
        src = pool.fault(nbytes, owner=1)
        grant = src.to_token(TokenKind.GRANT)
        length = _run(ctx, _produce, pool.service_id, grant.pack(), 7)
        data = src.to_token(TokenKind.DATA, length=length)

        dst = pool.fault(nbytes, owner=2)
        out = dst.to_token(TokenKind.GRANT)
        with UnifiedSlabMap(slabs) as unified:
            x = read_tensors(slabs.slot_view(data))["x"]  # a view of the slab, not a copy
            y = allocate_tensors(slabs.slot_view(out), {"y": ((N,), np.float32)})["y"]
            y.fill(np.nan)  # the consumer must see the kernel's values, not leftovers
            module = SourceModule(KERNEL)  # compiled by nvcc, loaded in the primary context
            affine = module.get_function("affine")
            affine(
                np.uintp(unified.device_pointer(data, x)),
                np.uintp(unified.device_pointer(out, y)),
                np.float32(2.0),
                np.float32(1.0),
                np.uint64(N),
                block=(256, 1, 1),
                grid=((N + 255) // 256, 1),
            )
            cuda.Context.synchronize()
            assert unified.registered() == sorted({src.slab, dst.slab})
            # the GPU wrote the slot in place: this process's view sees it too
            assert np.array_equal(y[:5], 2 * x[:5] + 1)
            with pytest.raises(ValueError, match="not inside"):
                unified.device_pointer(data, np.zeros(4, np.float32))  # not slab memory
        done = dst.to_token(TokenKind.DATA, length=tensors_nbytes({"y": ((N,), np.float32)}))
        shape, dtype, err = _run(ctx, _consume, pool.service_id, done.pack(), 7)
        assert tuple(shape) == (N,) and dtype == "float32"
        assert err <= 1e-5
    finally:
        affine = module = None  # unload the kernel while its context is current
        device.pop()
        device.detach()
        slabs.close()
        pool.close()


def test_registered_slab_pointers_follow_the_slot_offsets():
    """device_pointer(token, view) = the slab's base pointer + the view's offset in it."""
    pool = TensorPool(64 * 1024 * 1024, slab_bytes=1024 * 1024)
    slabs = SlabMap(pool.service_id)
    try:
        a = pool.fault(60_000, owner=1)
        b = pool.fault(60_000, owner=1)
        assert a.slab == b.slab and a.offset != b.offset
        ta, tb = a.to_token(TokenKind.GRANT), b.to_token(TokenKind.GRANT)
        write_tensors(slabs.slot_view(ta), {"v": np.arange(10, dtype=np.int64)})
        write_tensors(slabs.slot_view(tb), {"v": np.arange(10, dtype=np.int64)})
        with UnifiedSlabMap(slabs) as unified:
            va = read_tensors(slabs.slot_view(ta))["v"]
            vb = read_tensors(slabs.slot_view(tb))["v"]
            base = unified.slab(a.slab).device_pointer(0)
            pa, pb = unified.device_pointer(ta, va), unified.device_pointer(tb, vb)
            assert pb - pa == b.offset - a.offset
            assert a.offset <= pa - base < a.offset + a.size
            assert unified.registered() == [a.slab]
            unified.forget(a.slab)
            assert unified.registered() == []
            with pytest.raises(ValueError, match="C-contiguous"):
                unified.device_pointer(ta, read_tensors(slabs.slot_view(ta))["v"][::2])
    finally:
        slabs.close()
        pool.close()
