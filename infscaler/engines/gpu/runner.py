"""The ``gpu`` engine's runner: :class:`GPUEngine` (TensorRT EP, native TensorRT or CUDA EP)
and :class:`OrtGpuPath`, the onnxruntime path it shares with the ``dla`` engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from infscaler.engines.base import InferenceError, mib
from infscaler.engines.gpu.iobinding import BoundSession
from infscaler.engines.gpu.loader import ORT_BACKENDS, open_ort_gpu_session, probe_gpu_backend
from infscaler.engines.gpu.probe import probe_providers
from infscaler.engines.onnxrt.runner import session_tensor_infos
from infscaler.engines.tensorrt.cuda import CudaDriver
from infscaler.engines.tensorrt.runner import TensorRTEngine

__all__ = ["GPUEngine", "OrtGpuPath"]


class OrtGpuPath(TensorRTEngine):
    """What the gpu and dla engines share on their onnxruntime backends: the session
    (:func:`~infscaler.engines.gpu.loader.open_ort_gpu_session`), run through IOBinding
    (:class:`~infscaler.engines.gpu.iobinding.BoundSession`), and its release."""

    def __init__(self, model_path: Any, **options: Any) -> None:
        super().__init__(model_path, **options)
        self._backend: str | None = None
        self._session: ort.InferenceSession | None = None
        self._bound: BoundSession | None = None
        self._driver: CudaDriver | None = None

    @classmethod
    def backend(cls) -> str | None:
        raise NotImplementedError

    def _load_ort(self, engine: str) -> None:
        path = self._model_file()
        driver, session, used = open_ort_gpu_session(
            path,
            engine=engine,
            threads=self.threads,
            device_index=self.device_index,
            precision=self.precision,
            cache_dir=self.cache_dir,
            gpu_fallback=self.allow_gpu_fallback,
        )
        cuda_index = 0 if engine == "dla" else self.device_index
        self._driver = driver
        self._session = session
        self._bound = BoundSession(session, device_index=cuda_index)
        self._inputs = session_tensor_infos(session.get_inputs(), path)
        self._outputs = session_tensor_infos(session.get_outputs(), path)
        self._memory_mb = mib(used)
        self._trt_info = {
            "backend": self._backend,
            "provider": ORT_BACKENDS[str(self._backend)],
            "onnxruntime_version": ort.__version__,
            "device": driver.device_name(cuda_index),
            "session_providers": list(session.get_providers()),
        }

    def _infer_ort(
        self,
        feeds: dict[str, np.ndarray],
        outputs: list[str],
        out: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        bound = self._bound
        if bound is None:
            raise InferenceError(f"engine '{self.kind}' was closed")
        return bound.run(feeds, outputs, out)

    def _close_ort(self, cuda_index: int) -> None:
        self._bound = None
        self._session = None
        if self._driver is not None:
            with contextlib.suppress(Exception):  # nothing more to release
                self._driver.release_primary(cuda_index)
            self._driver = None

    def _describe(self) -> dict[str, Any]:
        d = super()._describe()
        if self._bound is not None:
            d.update(self._bound.describe())
        d.setdefault("backend", self.backend())
        return d


class GPUEngine(OrtGpuPath):
    """A model on CUDA device ``device_index``; ``threads``: onnxruntime's intra-op threads."""

    kind = "gpu"

    @classmethod
    def _probe(cls) -> tuple[bool, str]:
        backend, text = probe_gpu_backend()
        return backend is not None, text

    @classmethod
    def backend(cls) -> str | None:
        """``"onnxruntime-trt"``, ``"tensorrt"``, ``"onnxruntime-cuda"``, or None when the
        host has no GPU path."""
        return probe_gpu_backend()[0] if cls.availability()[0] else None

    @classmethod
    def _host_precisions(cls) -> tuple[str, ...]:
        backend = cls.backend()
        if backend == "onnxruntime-trt":
            return ("fp32", "fp16")
        if backend != "tensorrt":
            return ("fp32",)
        host = probe_providers().native()
        return (
            ("fp32",)
            + (("fp16",) if host.get("fast_fp16") else ())
            + (("int8",) if host.get("fast_int8") else ())
        )

    def _precision_hint(self) -> str | None:
        if self.backend() == "onnxruntime-cuda":
            return (
                "fp16 on the GPU needs TensorRT: onnxruntime-gpu's TensorRT EP (libnvinfer "
                "on LD_LIBRARY_PATH) or pip install tensorrt pycuda"
            )
        return None

    def _load(self) -> None:
        self._backend = self.backend()
        if self._backend == "tensorrt":
            self._load_tensorrt()
        else:
            self._load_ort("gpu")

    def _infer(self, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        if self._backend == "tensorrt":
            return self._infer_tensorrt(feeds, outputs)
        return self._infer_ort(feeds, outputs)

    def _close(self) -> None:
        if self._backend == "tensorrt":
            self._close_tensorrt()
        else:
            self._close_ort(self.device_index)
        self._backend = None
