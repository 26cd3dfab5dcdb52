"""What the ``dla`` engine loads with: :func:`probe_dla` (the provider probe of
:mod:`infscaler.engines.gpu.probe`); the build is :mod:`infscaler.engines.tensorrt.loader`'s
(``dla_core``, ``gpu_fallback``) or :func:`~infscaler.engines.gpu.loader.open_ort_gpu_session`.
"""

from __future__ import annotations

from infscaler.engines.gpu.probe import probe_providers

__all__ = ["probe_dla", "probe_dla_backend"]


def probe_dla_backend() -> tuple[str | None, str]:
    """``("onnxruntime-trt-dla" | "tensorrt-dla", what runs it)`` or ``(None, why not)``."""
    return probe_providers().dla_backend()


def probe_dla() -> tuple[bool, str]:
    """``(True, what runs it)`` or ``(False, reason)`` (what TensorRT lacks, or that the
    host has no DLA core)."""
    backend, text = probe_dla_backend()
    return backend is not None, text
