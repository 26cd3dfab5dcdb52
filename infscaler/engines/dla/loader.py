"""What the ``dla`` engine loads with: its availability check (:func:`probe_dla`,
answered by the provider probe of :mod:`infscaler.engines.gpu.probe` in a subprocess: the
TensorRT EP with ``trt_dla_enable`` starting a session, else native TensorRT + pycuda + a
CUDA device + DLA cores). On the native path the engine is built and cached by
:mod:`infscaler.engines.tensorrt.loader` with the DLA settings of the
:class:`~infscaler.engines.tensorrt.loader.BuildSpec` (``dla_core``, ``gpu_fallback``); on
the onnxruntime path the session is
:func:`~infscaler.engines.gpu.loader.open_ort_gpu_session` with ``engine="dla"``.
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
