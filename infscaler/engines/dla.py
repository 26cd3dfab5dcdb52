"""The ``dla`` engine: TensorRT on a Jetson's Deep Learning Accelerator.

Built like the GPU engine (:mod:`infscaler.engines.tensorrt`) with, in the
builder config, ``default_device_type = trt.DeviceType.DLA``, ``DLA_core =
device_index`` and, when ``allow_gpu_fallback`` (the default), ``BuilderFlag.GPU_FALLBACK``:
layers the DLA cannot run (``config.can_run_on_DLA(layer)`` is False) go to the iGPU.
Their names are ``describe()["fallback_layers"]`` (kept with the cached engine). The
runtime gets ``IRuntime.DLA_core`` before deserialising.

The DLA computes in fp16 or int8 only:

- ``fp16``: the ``FP16`` builder flag (TensorRT 8 / 10);
- ``int8``: models quantized with Q/DQ nodes (INT8 flag, the rest fp16). TensorRT's
  implicit INT8 needs a calibrator fed with representative inputs, which this engine does
  not take: without Q/DQ nodes int8 is refused with an :class:`InferenceError`;
- ``fp32`` is refused.

DLA cores exist on Jetson AGX Xavier / Xavier NX (2), AGX Orin (2) and Orin NX (1-2); the
Orin Nano and every discrete GPU have none.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from infscaler.engines.base import InferenceError
from infscaler.engines.tensorrt import (
    DLA_ONLY_ON_JETSON,
    TensorRTEngine,
    probe_tensorrt_host,
)


class DLAEngine(TensorRTEngine):
    """A model on DLA core ``device_index`` (see the module docstring)."""

    kind = "dla"
    _dla = True

    @classmethod
    def _probe(cls) -> tuple[bool, str]:
        host = probe_tensorrt_host()
        if host["missing"]:
            return False, "; ".join(host["missing"]) + f"; {DLA_ONLY_ON_JETSON}"
        n = int(host.get("dla_cores", 0))
        if n <= 0:
            return False, (
                f"no DLA cores: {DLA_ONLY_ON_JETSON} (TensorRT {host['version']} on "
                f"{host['devices'][0]} reports builder.num_DLA_cores == 0)"
            )
        return True, f"TensorRT {host['version']}, {n} DLA core(s) beside {host['devices'][0]}"

    @classmethod
    def _host_precisions(cls) -> tuple[str, ...]:
        return ("fp16", "int8")

    def _check_options(self) -> None:
        if self.precision == "fp32":
            raise InferenceError(
                "engine 'dla' does not run fp32: the DLA computes in fp16 or int8 only",
                hint="use precision fp16 (or int8 with a Q/DQ-quantized model), or engine 'gpu' "
                "for fp32",
            )
        super()._check_options()

    def _load(self) -> None:
        self._load_tensorrt()

    def _infer(self, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        return self._infer_tensorrt(feeds, outputs)

    def _close(self) -> None:
        self._close_tensorrt()

    def _describe(self) -> dict[str, Any]:
        d = super()._describe()
        d.setdefault("backend", "tensorrt")
        return d
