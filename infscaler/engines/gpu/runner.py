"""The ``gpu`` engine's runner: :class:`GPUEngine`, a model on a CUDA GPU through TensorRT
(:class:`~infscaler.engines.tensorrt.runner.TensorRTEngine`'s path) or onnxruntime's CUDA
execution provider (see :mod:`infscaler.engines.gpu` for how the backend is chosen).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import onnxruntime as ort

from infscaler.engines.base import InferenceError, mib
from infscaler.engines.gpu.loader import open_cuda_ep_session, probe_gpu_backend
from infscaler.engines.onnxrt.loader import CUDA_PROVIDER
from infscaler.engines.onnxrt.runner import run_session, session_tensor_infos
from infscaler.engines.tensorrt.cuda import CudaDriver
from infscaler.engines.tensorrt.loader import probe_tensorrt_host
from infscaler.engines.tensorrt.runner import TensorRTEngine

__all__ = ["GPUEngine"]


class GPUEngine(TensorRTEngine):
    """A model on a CUDA GPU (``device_index`` = CUDA device). See :mod:`infscaler.engines.gpu`.

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
        backend, text = probe_gpu_backend()
        return backend is not None, text

    @classmethod
    def backend(cls) -> str | None:
        """``"tensorrt"``, ``"onnxruntime-cuda"``, or None when the host has no GPU path."""
        return probe_gpu_backend()[0] if cls.availability()[0] else None

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
        driver, session, used = open_cuda_ep_session(
            path, threads=self.threads, device_index=self.device_index
        )
        self._driver = driver
        self._session = session
        self._inputs = session_tensor_infos(session.get_inputs(), path)
        self._outputs = session_tensor_infos(session.get_outputs(), path)
        self._memory_mb = mib(used)
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
