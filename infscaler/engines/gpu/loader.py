"""What the ``gpu`` engine loads with: which backend serves it on this host
(:func:`probe_gpu_backend`, its availability check) and, on the onnxruntime CUDA EP
backend, its session in the device's primary context (:func:`open_cuda_ep_session`). The
TensorRT backend builds and loads through :mod:`infscaler.engines.tensorrt`.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from infscaler.engines.base import EngineUnavailable, InferenceError
from infscaler.engines.onnxrt.loader import CUDA_PROVIDER, load_session
from infscaler.engines.tensorrt.cuda import CudaDriver, cuda_devices
from infscaler.engines.tensorrt.loader import probe_tensorrt_host

__all__ = ["ORT_CUDA_MISSING", "open_cuda_ep_session", "probe_gpu_backend"]

ORT_CUDA_MISSING = (
    "onnxruntime {version} has no CUDAExecutionProvider (pip install onnxruntime-gpu)"
)


def probe_gpu_backend() -> tuple[str | None, str]:
    """``("tensorrt" | "onnxruntime-cuda", what runs it)`` or ``(None, why not)``."""
    host = probe_tensorrt_host()
    if not host["missing"]:
        return "tensorrt", (
            f"TensorRT {host['version']} on {host['devices'][0]} "
            f"({len(host['devices'])} CUDA device(s), pycuda buffers)"
        )
    missing = list(host["missing"])
    has_ep = CUDA_PROVIDER in ort.get_available_providers()
    devices = host["devices"]
    if has_ep and devices:
        return "onnxruntime-cuda", (
            f"onnxruntime {ort.__version__} CUDAExecutionProvider on {devices[0]} "
            f"(TensorRT path unavailable: {'; '.join(missing)})"
        )
    if not has_ep:
        missing.append(ORT_CUDA_MISSING.format(version=ort.__version__))
    elif not devices:
        _, why = cuda_devices()
        if why and why not in missing:
            missing.append(why)
    return None, "; ".join(missing)


def open_cuda_ep_session(
    path: Path, *, threads: int, device_index: int
) -> tuple[CudaDriver, ort.InferenceSession, int]:
    """An onnxruntime CUDA EP session of the model at ``path`` on CUDA device
    ``device_index``, whose primary context stays retained (release it with
    ``driver.release_primary(device_index)`` when the session is dropped).

    Returns:
        The driver, the session, and the device memory the session took in bytes (free
        device memory before minus after, in the primary context: device-wide).

    Raises:
        EngineUnavailable: the CUDA driver failed, or onnxruntime could not start the CUDA EP.
        InferenceError: ``device_index`` is not a device of this host.
        ModelLoadError: as :func:`~infscaler.engines.onnxrt.loader.load_session`.
    """
    try:
        driver = CudaDriver()
        count = driver.device_count()
    except Exception as exc:  # noqa: BLE001
        raise EngineUnavailable(f"engine 'gpu': the CUDA driver failed: {exc}") from exc
    if not 0 <= device_index < count:
        raise InferenceError(
            f"CUDA device {device_index} does not exist: this host has {count} "
            f"(indices 0-{count - 1})"
        )
    ctx = driver.retain_primary(device_index)  # the context onnxruntime will use
    try:
        free0 = driver.mem_free(ctx)
        # the loader's CUDA EP options: use_tf32 "0", so fp32 means fp32 (TF32 is on by
        # default on Ampere+); it raises EngineUnavailable when the EP does not start
        session = load_session(path, engine="gpu", threads=threads, device_index=device_index)
        free1 = driver.mem_free(ctx)
    except BaseException:
        driver.release_primary(device_index)
        raise
    return driver, session, free0 - free1
