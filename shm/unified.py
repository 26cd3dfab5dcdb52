"""Unified-memory backend: slabs the iGPU and DLA read in place (Jetson; InfScaler §IV-B).

On Jetson (Xavier / Orin) CPU, iGPU and DLA share one DRAM. A slab mapped by
:class:`~infscaler.shm.slabmap.SlabMap` is ordinary host memory; registering it with CUDA
as *mapped* pinned memory gives a device pointer through which GPU kernels and TensorRT
engines (GPU or DLA) read and write the same bytes, no copy:

- memory another process created (our case: a POSIX shm slab) is registered after the
  fact: ``pycuda.driver.register_host_memory(ndarray_view, flags=DEVICEMAP | PORTABLE)``
  (``cuMemHostRegister``), then ``.base.get_device_pointer()``
  (``cuMemHostGetDevicePointer``). Page-aligned start and size are required; pool slabs
  are both.
- memory this process allocates itself can be allocated mapped from the start:
  ``pycuda.driver.pagelocked_empty(shape, dtype, mem_flags=host_alloc_flags.DEVICEMAP)``
  (``cudaHostAlloc(..., cudaHostAllocMapped)``), then ``.base.get_device_pointer()``.
  That memory cannot be shared with other processes by name, hence registration here.

``cuMemHostRegister`` needs a device that can map host memory
(``CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY``); on Tegra it also needs I/O coherence
(Xavier and later). On a discrete GPU the same code works, but the GPU reads the mapped
pages over PCIe: correct, not fast (the runtime copies to device memory there instead).

Sources: CUDA Driver API ``cuMemHostRegister`` / ``cuMemHostGetDevicePointer``; CUDA
for Tegra application note (memory management, pinned memory); PyCUDA documentation,
"Post-Allocation Pagelocking" (``register_host_memory``, ``RegisteredHostMemory``).

pycuda is imported lazily: importing this module never needs CUDA. Without pycuda, the
CUDA driver or a device, :func:`unified_memory_available` says why and
:class:`UnifiedSlab` raises :class:`UnifiedMemoryUnavailable`; nothing is faked.
"""

from __future__ import annotations

import contextlib

import numpy as np

from infscaler.base.errors import InfScalerError

__all__ = ["UnifiedMemoryUnavailable", "UnifiedSlab", "unified_memory_available"]


class UnifiedMemoryUnavailable(InfScalerError):
    """This host cannot map shared memory into a GPU's address space (reason in the message)."""


def _driver(device: int = 0):
    """(pycuda.driver, pycuda Device) or raise UnifiedMemoryUnavailable with the reason."""
    try:
        import pycuda.driver as cuda  # lazy: the CPU path never imports CUDA
    except ImportError as exc:
        raise UnifiedMemoryUnavailable(
            f"pycuda is not installed ({exc})",
            hint="on Jetson: pip install 'infscaler[jetson]' (needs JetPack's CUDA)",
        ) from None
    try:
        cuda.init()
        count = cuda.Device.count()
    except Exception as exc:  # pycuda.driver.Error and friends: no driver / no device
        raise UnifiedMemoryUnavailable(f"no CUDA device: CUDA driver init failed ({exc})") from None
    if count == 0:
        raise UnifiedMemoryUnavailable("no CUDA device: the CUDA driver reports 0 devices")
    if not 0 <= device < count:
        raise UnifiedMemoryUnavailable(f"no CUDA device {device}: {count} device(s) present")
    dev = cuda.Device(device)
    if not dev.get_attribute(cuda.device_attribute.CAN_MAP_HOST_MEMORY):
        raise UnifiedMemoryUnavailable(
            f"CUDA device {device} ({dev.name()}) cannot map host memory"
        )
    return cuda, dev


def unified_memory_available(device: int = 0) -> tuple[bool, str]:
    """Whether slabs can be mapped into CUDA device ``device``'s address space.

    Returns:
        ``(True, description)`` (integrated GPU: zero copy in shared DRAM; discrete GPU:
        mapped over PCIe), or ``(False, reason)``: "pycuda is not installed ...",
        "no CUDA device ...", or the device cannot map host memory.
    """
    try:
        cuda, dev = _driver(device)
    except UnifiedMemoryUnavailable as exc:
        return False, exc.message
    if dev.get_attribute(cuda.device_attribute.INTEGRATED):
        return True, f"{dev.name()}: integrated GPU, mapped host memory is the same DRAM"
    return True, f"{dev.name()}: discrete GPU, mapped host memory is read over PCIe (slow)"


class UnifiedSlab:
    """A slab's host mapping registered with CUDA as mapped pinned memory.

    Args:
        buf: the whole slab, e.g. ``SlabMap.slab_view(slab)`` (page-aligned start and
            length, writable), bytes.
        device: CUDA device ordinal.

    The registration is made in the device's primary context (the one the CUDA runtime
    and TensorRT use) with ``DEVICEMAP | PORTABLE``, so the device pointer is valid for
    every context in this process. Keep the ``UnifiedSlab`` (and so the slab mapping)
    alive while the GPU may touch it; :meth:`close` unregisters (page-unlocks); it does
    not unmap or free anything.

    Raises:
        UnifiedMemoryUnavailable: no pycuda / CUDA device / host-memory mapping.
        ValueError: ``buf`` is read-only or not page-aligned.
    """

    def __init__(self, buf, *, device: int = 0) -> None:
        cuda, dev = _driver(device)
        host = np.frombuffer(buf, dtype=np.uint8)
        if not host.flags.writeable:
            raise ValueError("UnifiedSlab needs a writable buffer")
        page = 4096
        if host.ctypes.data % page or host.nbytes % page:
            raise ValueError(
                f"cuMemHostRegister needs a page-aligned buffer; got address "
                f"0x{host.ctypes.data:x}, {host.nbytes} bytes"
            )
        self.nbytes = host.nbytes
        self._cuda = cuda
        self._context = dev.retain_primary_context()
        self._context.push()
        try:
            flags = cuda.mem_host_register_flags.DEVICEMAP | cuda.mem_host_register_flags.PORTABLE
            self._registered = cuda.register_host_memory(host, flags=flags)
            self._device_ptr = int(self._registered.base.get_device_pointer())
        except cuda.Error as exc:
            self._context.pop()
            self._context.detach()
            raise UnifiedMemoryUnavailable(
                f"cuMemHostRegister failed on CUDA device {device} ({dev.name()}): {exc}",
                hint="Tegra devices without I/O coherence (Nano, TX2) cannot register memory "
                "another process created; copy into pagelocked_empty(..., DEVICEMAP) there",
            ) from exc
        except Exception:
            self._context.pop()
            self._context.detach()
            raise
        self._context.pop()
        self._closed = False

    def device_pointer(self, offset: int = 0) -> int:
        """The device address of byte ``offset`` of the slab (e.g. a token's offset).

        Raises:
            ValueError: ``offset`` outside the slab. RuntimeError: closed.
        """
        if self._closed:
            raise RuntimeError("UnifiedSlab is closed")
        if not 0 <= offset < self.nbytes:
            raise ValueError(f"offset {offset} outside the slab's {self.nbytes} bytes")
        return self._device_ptr + offset

    def close(self) -> None:
        """Unregister the memory from CUDA (idempotent); the mapping itself stays."""
        if self._closed:
            return
        self._closed = True
        self._context.push()
        try:
            self._registered.base.unregister()
        finally:
            self._context.pop()
            with contextlib.suppress(Exception):
                self._context.detach()
            self._registered = None

    def __enter__(self) -> UnifiedSlab:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
