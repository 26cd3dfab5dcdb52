"""The CUDA driver and device for the TensorRT engines (and :mod:`infscaler.shm`'s unified
memory); ``libcuda`` loads only when :class:`CudaDriver` is constructed.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from typing import Any

from infscaler.engines.base import InferenceError

__all__ = ["CudaDevice", "CudaDriver", "cuda_devices", "open_cuda_driver"]


class CudaDriver:
    """The few CUDA driver API calls the engines need (device lookup, ``cuMemGetInfo`` in the
    primary context), through ctypes on ``libcuda``.

    Raises:
        OSError: ``libcuda.so.1`` cannot be loaded.
        RuntimeError: a driver call failed (the call and the driver's error).
    """

    def __init__(self) -> None:
        lib = None
        errors = []
        for name in ("libcuda.so.1", "libcuda.so"):
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError as exc:
                errors.append(str(exc))
        if lib is None:
            raise OSError("; ".join(errors))
        self.lib = lib
        self._check(lib.cuInit(0), "cuInit")

    def _check(self, rc: int, call: str) -> None:
        if rc == 0:
            return
        text = ctypes.c_char_p()
        with contextlib.suppress(Exception):
            self.lib.cuGetErrorString(rc, ctypes.byref(text))
        detail = text.value.decode(errors="replace") if text.value else f"CUresult {rc}"
        raise RuntimeError(f"{call} failed: {detail}")

    def _fn(self, *names: str) -> Any:
        for n in names:
            f = getattr(self.lib, n, None)
            if f is not None:
                return f
        raise RuntimeError(f"libcuda lacks {names[0]}")

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        self._check(self.lib.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
        return n.value

    def _device(self, index: int) -> ctypes.c_int:
        dev = ctypes.c_int(0)
        self._check(self.lib.cuDeviceGet(ctypes.byref(dev), int(index)), "cuDeviceGet")
        return dev

    def device_name(self, index: int) -> str:
        buf = ctypes.create_string_buffer(256)
        self._check(
            self.lib.cuDeviceGetName(buf, ctypes.c_int(256), self._device(index)),
            "cuDeviceGetName",
        )
        return buf.value.decode(errors="replace")

    def retain_primary(self, index: int) -> ctypes.c_void_p:
        """Retain device ``index``'s primary context (keeps it alive until
        :meth:`release_primary`)."""
        ctx = ctypes.c_void_p()
        retain = self._fn("cuDevicePrimaryCtxRetain")
        self._check(retain(ctypes.byref(ctx), self._device(index)), "cuDevicePrimaryCtxRetain")
        return ctx

    def release_primary(self, index: int) -> None:
        release = self._fn("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease")
        self._check(release(self._device(index)), "cuDevicePrimaryCtxRelease")

    def device_attribute(self, index: int, attribute: int) -> int:
        """``cuDeviceGetAttribute``: a ``CU_DEVICE_ATTRIBUTE_*`` value of device ``index``."""
        value = ctypes.c_int(0)
        self._check(
            self.lib.cuDeviceGetAttribute(
                ctypes.byref(value), ctypes.c_int(attribute), self._device(index)
            ),
            "cuDeviceGetAttribute",
        )
        return int(value.value)

    @contextlib.contextmanager
    def current(self, ctx: ctypes.c_void_p) -> Iterator[None]:
        """``ctx`` pushed as the calling thread's current context while in the block."""
        push = self._fn("cuCtxPushCurrent_v2", "cuCtxPushCurrent")
        pop = self._fn("cuCtxPopCurrent_v2", "cuCtxPopCurrent")
        self._check(push(ctx), "cuCtxPushCurrent")
        try:
            yield
        finally:
            popped = ctypes.c_void_p()
            pop(ctypes.byref(popped))

    def mem_free(self, ctx: ctypes.c_void_p) -> int:
        """Free bytes on the device of ``ctx`` (device-wide, all processes)."""
        get = self._fn("cuMemGetInfo_v2", "cuMemGetInfo")
        with self.current(ctx):
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            self._check(get(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
            return int(free.value)

    def host_register(self, ctx: ctypes.c_void_p, address: int, nbytes: int, flags: int) -> int:
        """Page-lock ``nbytes`` of host memory at ``address`` for the device of ``ctx``
        (``cuMemHostRegister``, ``CU_MEMHOSTREGISTER_*`` flags) and return its device
        address (``cuMemHostGetDevicePointer``; needs the DEVICEMAP flag)."""
        register = self._fn("cuMemHostRegister_v2", "cuMemHostRegister")
        pointer = self._fn("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer")
        with self.current(ctx):
            host = ctypes.c_void_p(address)
            self._check(
                register(host, ctypes.c_size_t(nbytes), ctypes.c_uint(flags)), "cuMemHostRegister"
            )
            device = ctypes.c_uint64(0)
            try:
                self._check(
                    pointer(ctypes.byref(device), host, ctypes.c_uint(0)),
                    "cuMemHostGetDevicePointer",
                )
            except RuntimeError:
                self.lib.cuMemHostUnregister(host)
                raise
            return int(device.value)

    def host_unregister(self, ctx: ctypes.c_void_p, address: int) -> None:
        """Undo :meth:`host_register` (``cuMemHostUnregister``)."""
        with self.current(ctx):
            self._check(
                self.lib.cuMemHostUnregister(ctypes.c_void_p(address)), "cuMemHostUnregister"
            )


def open_cuda_driver() -> tuple[CudaDriver | None, str]:
    """``(CudaDriver, "")`` when the NVIDIA driver loads and reports a device; else
    ``(None, reason)``, the reason starting with ``"no CUDA device: "`` and saying why (no
    driver library, the driver's error, zero devices)."""
    try:
        drv = CudaDriver()
    except OSError:
        return None, (
            "no CUDA device: the NVIDIA driver library libcuda.so.1 is not loadable "
            "(no NVIDIA GPU driver on this host)"
        )
    except Exception as exc:  # noqa: BLE001 - cuInit failure: no device, driver mismatch
        return None, f"no CUDA device: {exc}"
    try:
        n = drv.device_count()
    except Exception as exc:  # noqa: BLE001
        return None, f"no CUDA device: {exc}"
    if n == 0:
        return None, "no CUDA device: the NVIDIA driver reports 0 devices"
    return drv, ""


def cuda_devices() -> tuple[list[str], str]:
    """Names of this host's CUDA devices, in index order, and ``""``; or ``([], reason)``
    (:func:`open_cuda_driver`'s reason, or the driver's error naming a device)."""
    drv, why = open_cuda_driver()
    if drv is None:
        return [], why
    try:
        names = [drv.device_name(i) for i in range(drv.device_count())]
    except Exception as exc:  # noqa: BLE001
        return [], f"no CUDA device: {exc}"
    return names, ""


class CudaDevice:
    """A CUDA device's primary context through pycuda, pushed only while in use (TensorRT uses
    the current context).

    Raises:
        InferenceError: ``index`` is not a device of this host.
    """

    def __init__(self, cuda: Any, index: int) -> None:
        cuda.init()
        count = cuda.Device.count()
        if not 0 <= index < count:
            raise InferenceError(
                f"CUDA device {index} does not exist: this host has {count} (indices 0-{count - 1})"
            )
        self.cuda = cuda
        self.index = index
        self.device = cuda.Device(index)
        self.name = str(self.device.name())
        major, minor = self.device.compute_capability()
        self.compute_capability = f"{major}.{minor}"
        self.context = self.device.retain_primary_context()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        self.context.push()
        try:
            yield
        finally:
            self.cuda.Context.pop()

    def mem_free(self) -> int:
        """Free device memory in bytes (call inside :meth:`active`; device-wide)."""
        return int(self.cuda.mem_get_info()[0])

    def release(self) -> None:
        with contextlib.suppress(Exception):
            self.context.detach()
