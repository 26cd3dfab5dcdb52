"""The ``cpu`` engine: onnxruntime's CPU execution provider on pinned cores.

Follows Polygraphy's onnxruntime backend (``polygraphy/backend/onnxrt/``: a session
loader, ``SessionFromOnnx``, and a runner, ``OnnxrtRunner``), with the settings InfScaler
needs for several single-model instances sharing a small CPU:

- ``intra_op_num_threads = threads``, ``inter_op_num_threads = 1``, ``ORT_SEQUENTIAL``:
  one operator at a time on the instance's own threads;
- ``graph_optimization_level = ORT_ENABLE_ALL``;
- ``session.intra_op.allow_spinning = "0"``: idle intra-op workers sleep instead of
  spinning. Measured in ``bench/README.md``: with spinning on, the workers of several
  sessions on a 2-core host steal the cores from each other (the chain of partitions took
  1.5-1.8x the whole model instead of 0.96-1.07x);
- ``cores`` pins the **whole process** with ``os.sched_setaffinity(0, cores)`` before the
  session (and so its thread pool) is created: InfScaler runs one engine per instance
  process.

The onnxruntime helpers here (:func:`session_options`, :func:`open_session`,
:func:`session_tensor_infos`, :func:`run_session`) also serve the GPU engine's CUDA EP path.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from infscaler.errors import ModelLoadError
from infscaler.runtime.engines.base import (
    Engine,
    InferenceError,
    TensorInfo,
    mib,
    process_memory_bytes,
)

log = logging.getLogger("infscaler.engines.cpu")

CPU_PROVIDER = "CPUExecutionProvider"

# onnxruntime's type strings (NodeArg.type) -> numpy dtypes.
_ORT_DTYPES: dict[str, np.dtype] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(double)": np.dtype(np.float64),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(bool)": np.dtype(np.bool_),
    "tensor(string)": np.dtype(object),
}


def session_options(threads: int) -> ort.SessionOptions:
    """onnxruntime session options for one instance (see the module docstring)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3  # errors only; warnings about unused initializers are noise
    return so


def open_session(
    path: Path, options: ort.SessionOptions, providers: Sequence[Any]
) -> ort.InferenceSession:
    """An ``InferenceSession`` on ``path``.

    Raises:
        ModelLoadError: onnxruntime cannot read the file (not ONNX, truncated), the model
            is invalid, or an operator is not implemented; the message is onnxruntime's.
    """
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=list(providers))
    except Exception as exc:  # onnxruntime raises its own pybind exception types
        msg = str(exc).strip()
        kind = type(exc).__name__
        if "INVALID_PROTOBUF" in msg or kind == "InvalidProtobuf":
            what = "is not a readable ONNX model (protobuf parsing failed: not ONNX, or truncated)"
        elif "NOT_IMPLEMENTED" in msg or kind == "NotImplemented":
            what = "uses an operator onnxruntime does not implement"
        else:
            what = "cannot be loaded by onnxruntime"
        raise ModelLoadError(
            f"model {path} {what}: {msg}",
            hint="check the file with `infscaler inspect` or onnx.checker.check_model",
        ) from exc


def session_tensor_infos(args: Sequence[Any], path: Path) -> list[TensorInfo]:
    """:class:`TensorInfo` for onnxruntime ``NodeArg`` s (``session.get_inputs()``).

    Raises:
        ModelLoadError: a non-tensor input / output (sequence, map), which engines do not
            feed.
    """
    infos = []
    for a in args:
        dtype = _ORT_DTYPES.get(a.type)
        if dtype is None:
            raise ModelLoadError(
                f"model {path}: tensor '{a.name}' has type {a.type}; engines take tensors only"
            )
        shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in (a.shape or ()))
        infos.append(TensorInfo(a.name, dtype, shape))
    return infos


def run_session(
    session: ort.InferenceSession, feeds: dict[str, np.ndarray], outputs: list[str]
) -> dict[str, np.ndarray]:
    """``session.run`` returning arrays the caller owns.

    onnxruntime's outputs can be views of buffers it keeps (``base`` is its capsule);
    those are copied.

    Raises:
        InferenceError: onnxruntime failed (its message; e.g. a shape that a Reshape
            inside the model cannot take).
    """
    try:
        results = session.run(outputs, feeds)
    except Exception as exc:  # onnxruntime's pybind exception types
        raise InferenceError(f"onnxruntime failed: {str(exc).strip()}") from exc
    out = {}
    for name, value in zip(outputs, results, strict=True):
        arr = np.asarray(value)
        if not arr.flags.owndata or arr.base is not None:
            arr = arr.copy()
        out[name] = arr
    return out


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
        session = open_session(path, session_options(self.threads), [CPU_PROVIDER])
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
