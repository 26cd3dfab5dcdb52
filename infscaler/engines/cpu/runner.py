"""The ``cpu`` engine's runner: :class:`CPUEngine`, a model in an onnxruntime CPU EP
session (see :mod:`infscaler.engines.cpu` for the session's settings) in this process,
pinned to ``cores``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnxruntime as ort

from infscaler.engines.base import Engine, InferenceError, mib, process_memory_bytes
from infscaler.engines.cpu.loader import open_cpu_session, probe_cpu
from infscaler.engines.onnxrt.loader import CPU_PROVIDER
from infscaler.engines.onnxrt.runner import run_session, session_tensor_infos

__all__ = ["CPUEngine"]

log = logging.getLogger("infscaler.engines.cpu")


class CPUEngine(Engine):
    """onnxruntime CPU EP engine (fp32 only: the model runs as it is typed).

    ``memory_mb`` is this process's USS growth across :meth:`load` (RSS where USS is unreadable).
    """

    kind = "cpu"

    def __init__(self, model_path: Any, **options: Any) -> None:
        super().__init__(model_path, **options)
        self._session: ort.InferenceSession | None = None

    @classmethod
    def _probe(cls) -> tuple[bool, str]:
        return probe_cpu()

    @classmethod
    def _host_precisions(cls) -> tuple[str, ...]:
        return ("fp32",)

    def _check_options(self) -> None:
        if self.precision != "fp32":
            raise InferenceError(
                f"engine 'cpu' runs precision fp32 only (onnxruntime's CPU EP runs the model "
                f"as typed), got '{self.precision}'",
                hint="use engine 'gpu' or 'dla' for fp16 / int8, or quantize the model itself",
            )

    def _load(self) -> None:
        path = self._model_file()
        before = process_memory_bytes()
        session = open_cpu_session(path, self.threads)
        after = process_memory_bytes()
        self._inputs = session_tensor_infos(session.get_inputs(), path)
        self._outputs = session_tensor_infos(session.get_outputs(), path)
        self._session = session
        self._memory_mb = mib(after - before)

    def _infer(self, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        session = self._session
        if session is None:
            raise InferenceError("engine 'cpu' was closed")
        return run_session(session, feeds, outputs)

    def _close(self) -> None:
        self._session = None

    def _describe(self) -> dict[str, Any]:
        session = self._session
        opts = session.get_session_options() if session is not None else None
        return {
            "backend": "onnxruntime",
            # read back from the live session: what onnxruntime was given
            "session_intra_op_threads": None if opts is None else opts.intra_op_num_threads,
            "provider": CPU_PROVIDER,
            "onnxruntime_version": ort.__version__,
            "inter_op_threads": 1,
            "execution_mode": "sequential",
            "allow_spinning": False,
            "pinned": bool(self.cores) and self._loaded,
        }
