"""The ``dla`` engine's runner: :class:`DLAEngine`, a model on a Jetson DLA core through
:class:`~infscaler.engines.tensorrt.runner.TensorRTEngine`'s path (see
:mod:`infscaler.engines.dla` for the DLA build and its precisions).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from infscaler.engines.base import InferenceError
from infscaler.engines.dla.loader import probe_dla
from infscaler.engines.tensorrt.runner import TensorRTEngine

__all__ = ["DLAEngine"]


class DLAEngine(TensorRTEngine):
    """A model on DLA core ``device_index`` (see :mod:`infscaler.engines.dla`)."""

    kind = "dla"
    _dla = True

    @classmethod
    def _probe(cls) -> tuple[bool, str]:
        return probe_dla()

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
