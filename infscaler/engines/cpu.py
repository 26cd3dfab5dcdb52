"""The ``cpu`` engine: onnxruntime's CPU execution provider on pinned cores.

Follows Polygraphy's onnxruntime backend (``polygraphy/backend/onnxrt/``: a session
loader, ``SessionFromOnnx``, and a runner, ``OnnxrtRunner``), with the settings InfScaler
needs for several single-model instances sharing a small CPU:

- ``intra_op_num_threads = threads``, ``inter_op_num_threads = 1``, ``ORT_SEQUENTIAL``:
  one operator at a time on the instance's own threads;
- ``graph_optimization_level = ORT_ENABLE_ALL``;
- ``session.intra_op.allow_spinning = "0"``: idle intra-op workers sleep instead of
  spinning. Measured in ``bench/HISTORY.md``: with spinning on, the workers of several
  sessions on a 2-core host steal the cores from each other (the chain of partitions took
  1.5-1.8x the whole model instead of 0.96-1.07x);
- ``cores`` pins the **whole process** with ``os.sched_setaffinity(0, cores)`` before the
  session (and so its thread pool) is created: InfScaler runs one engine per instance
  process.

The session is built by the engine layer's loader (:func:`.onnxrt.load_session`, with
:func:`.onnxrt.session_options`' defaults, which are these settings), the one that also
serves the GPU engine's CUDA EP path and every other onnxruntime session of InfScaler.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnxruntime as ort

from infscaler.engines.base import Engine, InferenceError, mib, process_memory_bytes
from infscaler.engines.onnxrt import (
    CPU_PROVIDER,
    load_session,
    run_session,
    session_tensor_infos,
)

log = logging.getLogger("infscaler.engines.cpu")


class CPUEngine(Engine):
    """onnxruntime CPU EP engine (see the module docstring for its session settings).

    ``memory_mb`` is this process's USS growth across :meth:`load` (RSS growth where USS
    cannot be read): the weights onnxruntime holds plus its session state, measured, not
    estimated. Only ``fp32`` is a precision here: the CPU EP runs the model as it is typed
    (a quantized model runs quantized).
    """

    kind = "cpu"

    def __init__(self, model_path: Any, **options: Any) -> None:
        super().__init__(model_path, **options)
        self._session: ort.InferenceSession | None = None

    @classmethod
    def _probe(cls) -> tuple[bool, str]:
        providers = ort.get_available_providers()
        if CPU_PROVIDER not in providers:
            return False, (
                f"onnxruntime {ort.__version__} has no {CPU_PROVIDER} (providers: {providers})"
                "; reinstall onnxruntime (pip install onnxruntime)"
            )
        return True, f"onnxruntime {ort.__version__} CPU EP"

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
        session = load_session(path, engine="cpu", threads=self.threads)
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
