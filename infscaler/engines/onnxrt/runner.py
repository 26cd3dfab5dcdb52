"""The onnxruntime runner of the engine layer: a built session's tensors as
:class:`~infscaler.engines.base.TensorInfo` and its outputs as arrays the caller owns.

More: docs/engines.md, "`infscaler/engines/onnxrt/runner.py`".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from infscaler.base.errors import ModelLoadError
from infscaler.engines.base import InferenceError, TensorInfo

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["run_session", "session_tensor_infos"]

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


def session_tensor_infos(args: Sequence[Any], path: Any) -> list[TensorInfo]:
    """:class:`~infscaler.engines.base.TensorInfo` for onnxruntime ``NodeArg`` s; ModelLoadError
    for a non-tensor (sequence, map).
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
    """``session.run`` returning arrays the caller owns (views of onnxruntime's buffers copied).

    Raises:
        InferenceError: onnxruntime failed (its message).
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
