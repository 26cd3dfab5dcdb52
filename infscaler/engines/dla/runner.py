"""The ``dla`` engine's runner: :class:`DLAEngine`, a model on a Jetson DLA core through
onnxruntime's TensorRT EP or native TensorRT.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from infscaler.engines.base import InferenceError
from infscaler.engines.dla.loader import probe_dla, probe_dla_backend
from infscaler.engines.gpu.runner import OrtGpuPath

__all__ = ["DLAEngine"]


class DLAEngine(OrtGpuPath):
    """A model on DLA core ``device_index`` (see :mod:`infscaler.engines.dla`)."""

    kind = "dla"
    _dla = True

    @classmethod
    def _probe(cls) -> tuple[bool, str]:
        return probe_dla()

    @classmethod
    def backend(cls) -> str | None:
        """``"onnxruntime-trt-dla"``, ``"tensorrt-dla"``, or None when the host has no DLA."""
        return probe_dla_backend()[0] if cls.availability()[0] else None

    @classmethod
    def _host_precisions(cls) -> tuple[str, ...]:
        # the TensorRT EP's int8 needs a calibration table (trt_int8_calibration_table_name),
        # which this engine does not take
        return ("fp16",) if cls.backend() == "onnxruntime-trt-dla" else ("fp16", "int8")

    def _check_options(self) -> None:
        if self.precision == "fp32":
            raise InferenceError(
                "engine 'dla' does not run fp32: the DLA computes in fp16 or int8 only",
                hint="use precision fp16 (or int8 with a Q/DQ-quantized model), or engine 'gpu' "
                "for fp32",
            )
        super()._check_options()

    def _load(self) -> None:
        self._backend = self.backend()
        if self._backend == "onnxruntime-trt-dla":
            self._load_ort("dla")
            self._trt_info.update(
                dla_core=self.device_index, allow_gpu_fallback=self.allow_gpu_fallback
            )
        else:
            self._load_tensorrt()

    def _infer(self, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        if self._backend == "onnxruntime-trt-dla":
            return self._infer_ort(feeds, outputs)
        return self._infer_tensorrt(feeds, outputs)

    def _close(self) -> None:
        if self._backend == "onnxruntime-trt-dla":
            self._close_ort(0)
        else:
            self._close_tensorrt()
        self._backend = None

    def _describe(self) -> dict[str, Any]:
        d = super()._describe()
        d.setdefault("backend", "tensorrt-dla")
        return d
