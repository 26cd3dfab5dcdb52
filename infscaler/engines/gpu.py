"""The ``gpu`` engine: TensorRT on a CUDA GPU, or onnxruntime's CUDA execution provider.

Two backends, chosen once per process by :meth:`GPUEngine.availability`:

1. ``tensorrt`` (preferred): tensorrt + pycuda + a CUDA device. The engine is built from
   the ONNX file and cached (:mod:`infscaler.engines.tensorrt`), then run with
   page-locked host buffers, device buffers and a CUDA stream. Precisions: fp32 (TF32
   off), fp16 (where ``builder.platform_has_fast_fp16``), int8 (models with Q/DQ nodes).
2. ``onnxruntime-cuda``: when the TensorRT path is missing but onnxruntime (the
   onnxruntime-gpu build) has the ``CUDAExecutionProvider``; fp32 only (the model as
   typed). Operators the CUDA EP lacks run on the CPU EP, as onnxruntime assigns them.

``describe()["backend"]`` says which one runs.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import onnxruntime as ort

from infscaler.engines.base import EngineUnavailable, InferenceError, mib
from infscaler.engines.onnxrt import (
    CUDA_PROVIDER,
    load_session,
    run_session,
    session_tensor_infos,
)
from infscaler.engines.tensorrt import (
    CudaDriver,
    TensorRTEngine,
    cuda_devices,
    probe_tensorrt_host,
)

ORT_CUDA_MISSING = (
    "onnxruntime {version} has no CUDAExecutionProvider (pip install onnxruntime-gpu)"
)


def _gpu_backend() -> tuple[str | None, str]:
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


class GPUEngine(TensorRTEngine):
    """A model on a CUDA GPU (``device_index`` = CUDA device). See the module docstring.

    ``threads`` sets onnxruntime's intra-op threads on the CUDA EP path (operators that
    fall back to the CPU); TensorRT runs no CPU thread pool.
    """

    kind = "gpu"

    def __init__(self, model_path: Any, **options: Any) -> None:
        super().__init__(model_path, **options)
        self._backend: str | None = None
        self._session: ort.InferenceSession | None = None
        self._driver: CudaDriver | None = None

    @classmethod
    def _probe(cls) -> tuple[bool, str]:
        backend, text = _gpu_backend()
        return backend is not None, text

    @classmethod
    def backend(cls) -> str | None:
        """``"tensorrt"``, ``"onnxruntime-cuda"``, or None when the host has no GPU path."""
        return _gpu_backend()[0] if cls.availability()[0] else None

    @classmethod
    def _host_precisions(cls) -> tuple[str, ...]:
        if cls.backend() != "tensorrt":
            return ("fp32",)
        host = probe_tensorrt_host()
        return (
            ("fp32",)
            + (("fp16",) if host.get("fast_fp16") else ())
            + (("int8",) if host.get("fast_int8") else ())
        )

    def _precision_hint(self) -> str | None:
        if self.backend() == "onnxruntime-cuda":
            return "fp16 / int8 on the GPU need TensorRT (pip install tensorrt pycuda)"
        return None

    def _load(self) -> None:
        self._backend = self.backend()
        if self._backend == "tensorrt":
            self._load_tensorrt()
        else:
            self._load_ort_cuda()

    def _load_ort_cuda(self) -> None:
        path = self._model_file()
        try:
            driver = CudaDriver()
            count = driver.device_count()
        except Exception as exc:  # noqa: BLE001
            raise EngineUnavailable(f"engine 'gpu': the CUDA driver failed: {exc}") from exc
        if not 0 <= self.device_index < count:
            raise InferenceError(
                f"CUDA device {self.device_index} does not exist: this host has {count} "
                f"(indices 0-{count - 1})"
            )
        ctx = driver.retain_primary(self.device_index)  # the context onnxruntime will use
        try:
            free0 = driver.mem_free(ctx)
            # the loader's CUDA EP options: use_tf32 "0", so fp32 means fp32 (TF32 is on by
            # default on Ampere+); it raises EngineUnavailable when the EP does not start
            session = load_session(
                path, engine="gpu", threads=self.threads, device_index=self.device_index
            )
            free1 = driver.mem_free(ctx)
        except BaseException:
            driver.release_primary(self.device_index)
            raise
        self._driver = driver
        self._session = session
        self._inputs = session_tensor_infos(session.get_inputs(), path)
        self._outputs = session_tensor_infos(session.get_outputs(), path)
        self._memory_mb = mib(free0 - free1)
        self._trt_info = {
            "backend": "onnxruntime-cuda",
            "provider": CUDA_PROVIDER,
            "onnxruntime_version": ort.__version__,
            "device": driver.device_name(self.device_index),
            "session_providers": list(session.get_providers()),
        }

    def _infer(self, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        if self._backend == "tensorrt":
            return self._infer_tensorrt(feeds, outputs)
        session = self._session
        if session is None:
            raise InferenceError("engine 'gpu' was closed")
        return run_session(session, feeds, outputs)

    def _close(self) -> None:
        if self._backend == "tensorrt":
            self._close_tensorrt()
        else:
            self._session = None
            if self._driver is not None:
                with contextlib.suppress(Exception):  # nothing more to release
                    self._driver.release_primary(self.device_index)
                self._driver = None
        self._backend = None

    def _describe(self) -> dict[str, Any]:
        d = super()._describe()
        d.setdefault("backend", self.backend())
        return d
