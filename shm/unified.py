"""Unified-memory backend: slabs the iGPU and DLA read in place (Jetson; InfScaler §IV-B).

Sources: CUDA Driver API ``cuMemHostRegister`` / ``cuMemHostGetDevicePointer`` /
``cuMemHostUnregister`` / ``cuDeviceGetAttribute``; CUDA for Tegra application note
(memory management, pinned memory).

More (details, why it is so, history, figures): docs/architecture.md, "`shm/unified.py`".
"""

from __future__ import annotations

import numpy as np

from infscaler.base.errors import InfScalerError

__all__ = [
    "UnifiedMemoryUnavailable",
    "UnifiedSlab",
    "UnifiedSlabMap",
    "unified_memory_available",
]

#: ``CUdevice_attribute`` values (cuda.h).
CU_DEVICE_ATTRIBUTE_INTEGRATED = 18
CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19
#: ``cuMemHostRegister`` flags (cuda.h).
CU_MEMHOSTREGISTER_PORTABLE = 0x01
CU_MEMHOSTREGISTER_DEVICEMAP = 0x02
PAGE = 4096


class UnifiedMemoryUnavailable(InfScalerError):
    """This host cannot map shared memory into a GPU's address space (reason in the message)."""


def _driver(device: int = 0):
    """A :class:`CudaDriver` whose device ``device`` maps host memory, or raise
    :class:`UnifiedMemoryUnavailable` with the reason."""
    from infscaler.engines.tensorrt.cuda import open_cuda_driver  # lazy: ctypes + libcuda

    driver, why = open_cuda_driver()
    if driver is None:
        raise UnifiedMemoryUnavailable(why)
    count = driver.device_count()
    if not 0 <= device < count:
        raise UnifiedMemoryUnavailable(f"no CUDA device {device}: {count} device(s) present")
    if not driver.device_attribute(device, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY):
        raise UnifiedMemoryUnavailable(
            f"CUDA device {device} ({driver.device_name(device)}) cannot map host memory"
        )
    return driver


def unified_memory_available(device: int = 0) -> tuple[bool, str]:
    """Whether slabs can be mapped into CUDA device ``device``'s address space.

    Returns:
        ``(True, description)`` (integrated GPU: zero copy in shared DRAM; discrete GPU:
        mapped over PCIe), or ``(False, reason)``: "no CUDA device ..." (no driver, no
        device) or the device cannot map host memory.
    """
    try:
        driver = _driver(device)
    except UnifiedMemoryUnavailable as exc:
        return False, exc.message
    name = driver.device_name(device)
    if driver.device_attribute(device, CU_DEVICE_ATTRIBUTE_INTEGRATED):
        return True, f"{name}: integrated GPU, mapped host memory is the same DRAM"
    return True, f"{name}: discrete GPU, mapped host memory is read over PCIe (slow)"


class UnifiedSlab:
    """A slab's host mapping registered with CUDA as mapped pinned memory
    (``DEVICEMAP | PORTABLE`` in the device's primary context: the pointer is valid for
    every context of the process). Keeps a view of ``buf`` alive until :meth:`close`,
    which unregisters; it never unmaps or frees.

    Args:
        buf: the whole slab (``SlabMap.slab_view(slab)``), writable and page-aligned.
        device: CUDA device ordinal.

    Raises:
        UnifiedMemoryUnavailable: no CUDA driver / device / host-memory mapping, or the
            driver refused (message: its error).
        ValueError: ``buf`` is read-only or not page-aligned.
    """

    def __init__(self, buf, *, device: int = 0) -> None:
        driver = _driver(device)
        host = np.frombuffer(buf, dtype=np.uint8)
        if not host.flags.writeable:
            raise ValueError("UnifiedSlab needs a writable buffer")
        address = int(host.ctypes.data)
        if address % PAGE or host.nbytes % PAGE:
            raise ValueError(
                f"cuMemHostRegister needs a page-aligned buffer; got address "
                f"0x{address:x}, {host.nbytes} bytes"
            )
        self.nbytes = host.nbytes
        self.device = device
        self._driver = driver
        self._context = driver.retain_primary(device)
        try:
            self._device_ptr = driver.host_register(
                self._context,
                address,
                host.nbytes,
                CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE,
            )
        except RuntimeError as exc:
            driver.release_primary(device)
            raise UnifiedMemoryUnavailable(
                f"cuMemHostRegister failed on CUDA device {device} "
                f"({driver.device_name(device)}): {exc}",
                hint="Tegra devices without I/O coherence (Nano, TX2) cannot register memory "
                "another process created; copy into cuMemHostAlloc(..., DEVICEMAP) memory there",
            ) from exc
        self._host = host  # keeps the mapping alive while registered
        self._host_address = address
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

    def device_pointer_of(self, array: np.ndarray) -> int:
        """The device address of ``array``, a C-contiguous view into this slab through
        the same ``SlabMap`` mapping that was registered (e.g. a tensor of
        :func:`~infscaler.shm.tensors.read_tensors`); kernels and TensorRT bindings use
        it in place.

        Raises:
            ValueError: ``array`` is not C-contiguous or not inside this slab's mapping.
            RuntimeError: closed.
        """
        if self._closed:
            raise RuntimeError("UnifiedSlab is closed")
        if not array.flags.c_contiguous:
            raise ValueError("device_pointer_of needs a C-contiguous view of the slab")
        offset = int(array.__array_interface__["data"][0]) - self._host_address
        if offset < 0 or offset + array.nbytes > self.nbytes:
            raise ValueError(
                f"the array ({array.nbytes} bytes at slab offset {offset}) is not inside this "
                f"slab's {self.nbytes}-byte mapping: take views from the SlabMap whose "
                "slab_view was registered"
            )
        return self._device_ptr + offset

    def close(self) -> None:
        """Unregister the memory from CUDA (idempotent); the mapping itself stays."""
        if self._closed:
            return
        self._closed = True
        try:
            self._driver.host_unregister(self._context, self._host_address)
        finally:
            self._driver.release_primary(self.device)
            self._host = None

    def __enter__(self) -> UnifiedSlab:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class UnifiedSlabMap:
    """Every slab of a :class:`~infscaler.shm.slabmap.SlabMap` (``slabs``), registered
    with CUDA device ``device`` on first use and until :meth:`forget` / :meth:`close`:
    what a GPU / DLA instance holds to hand slot tensors to kernels in place. Forget a
    slab before the ``SlabMap`` drops it.

    Raises:
        UnifiedMemoryUnavailable: (from :meth:`device_pointer`) no CUDA driver / device /
            host-memory mapping.
    """

    def __init__(self, slabs, *, device: int = 0) -> None:
        self._slabs = slabs
        self._device = device
        self._registered: dict[int, UnifiedSlab] = {}

    def slab(self, slab: int) -> UnifiedSlab:
        """The registration of slab ``slab`` (made now if new)."""
        unified = self._registered.get(slab)
        if unified is None:
            unified = UnifiedSlab(self._slabs.slab_view(slab), device=self._device)
            self._registered[slab] = unified
        return unified

    def device_pointer(self, token, array: np.ndarray) -> int:
        """The device address of ``array``, a view of the slot ``token`` names (from this
        map's ``SlabMap``): input tensors from ``read_tensors``, outputs from
        ``allocate_tensors``.

        Raises:
            ValueError: ``array`` is not inside the token's slab.
            UnifiedMemoryUnavailable: the slab cannot be registered.
        """
        return self.slab(token.slab).device_pointer_of(array)

    def registered(self) -> list[int]:
        """Slab ids registered with CUDA in this process."""
        return sorted(self._registered)

    def forget(self, slab: int) -> None:
        """Unregister slab ``slab`` (no-op when it is not registered)."""
        unified = self._registered.pop(slab, None)
        if unified is not None:
            unified.close()

    def close(self) -> None:
        """Unregister every slab; the ``SlabMap`` and its mappings stay."""
        for slab in list(self._registered):
            self.forget(slab)

    def __enter__(self) -> UnifiedSlabMap:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
