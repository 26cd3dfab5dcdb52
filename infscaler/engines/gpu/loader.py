"""What the ``gpu`` engine loads with: :func:`probe_gpu_backend` (which backend serves it)
and :func:`open_ort_gpu_session` (the onnxruntime backends' session).
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from infscaler.engines.base import EngineUnavailable, InferenceError
from infscaler.engines.gpu.probe import TRT_PROVIDER, probe_providers
from infscaler.engines.onnxrt.loader import CUDA_PROVIDER, load_session, session_options
from infscaler.engines.tensorrt.cuda import CudaDriver

__all__ = [
    "ORT_BACKENDS",
    "open_ort_gpu_session",
    "probe_gpu_backend",
]

ORT_BACKENDS: dict[str, str] = {
    "onnxruntime-trt": TRT_PROVIDER,
    "onnxruntime-cuda": CUDA_PROVIDER,
    "onnxruntime-trt-dla": TRT_PROVIDER,
}
"""The onnxruntime backends of the gpu / dla engines -> the provider a session of each
must run on first (``session.get_providers()[0]``)."""


def probe_gpu_backend() -> tuple[str | None, str]:
    """``("onnxruntime-trt" | "tensorrt" | "onnxruntime-cuda", what runs it)`` or
    ``(None, why not)``: :meth:`~.probe.ProviderReport.gpu_backend` of the host's provider
    probe (a subprocess: this process initialises no CUDA)."""
    return probe_providers().gpu_backend()


def open_ort_gpu_session(
    path: Path,
    *,
    engine: str,
    threads: int,
    device_index: int,
    precision: str = "fp32",
    cache_dir: Path | None = None,
    gpu_fallback: bool = True,
) -> tuple[CudaDriver, ort.InferenceSession, int]:
    """An onnxruntime session of ``path`` on the gpu / dla provider, with CUDA device
    ``device_index``'s primary context retained (release with ``driver.release_primary``); for
    ``dla``, ``device_index`` is the DLA core and the CUDA device is 0.

    Returns:
        The driver, the session, and the device-wide free memory it took, bytes.

    Raises:
        EngineUnavailable: the CUDA driver or the provider failed.
        InferenceError: ``device_index`` is not a CUDA device of this host.
        ModelLoadError: as :func:`~infscaler.engines.onnxrt.loader.load_session`.
    """
    cuda_index = 0 if engine == "dla" else device_index
    try:
        driver = CudaDriver()
        count = driver.device_count()
    except Exception as exc:  # noqa: BLE001
        raise EngineUnavailable(f"engine '{engine}': the CUDA driver failed: {exc}") from exc
    if not 0 <= cuda_index < count:
        raise InferenceError(
            f"CUDA device {cuda_index} does not exist: this host has {count} "
            f"(indices 0-{count - 1})"
        )
    ctx = driver.retain_primary(cuda_index)  # the context onnxruntime will use
    try:
        free0 = driver.mem_free(ctx)
        # the loader's provider options: use_tf32 "0" on the CUDA EP (fp32 means fp32),
        # trt_fp16_enable for fp16, the TensorRT engine cache under the cache dir; it
        # raises EngineUnavailable when the provider does not start
        session = load_session(
            path,
            engine=engine,
            options=session_options(threads),
            device_index=device_index,
            precision=precision,
            cache_dir=cache_dir,
            gpu_fallback=gpu_fallback,
        )
        free1 = driver.mem_free(ctx)
    except BaseException:
        driver.release_primary(cuda_index)
        raise
    return driver, session, free0 - free1
