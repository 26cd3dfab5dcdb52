"""The onnxruntime backend of the engine layer, laid out like Polygraphy's
``polygraphy/backend/onnxrt/``: :mod:`.loader` builds every ``onnxruntime.InferenceSession``
of InfScaler (:func:`load_session`, with :func:`session_options` and the providers of an
engine kind, :func:`providers_for`), :mod:`.runner` reads a session's tensors and runs it
(:func:`session_tensor_infos`, :func:`run_session`).

It serves the ``cpu`` engine (onnxruntime's CPU EP), the ``gpu`` engine's fallback path
(onnxruntime's CUDA EP, where TensorRT is missing) and every other onnxruntime session of
InfScaler (the partitioner's profiler and verification, model probing, variants, unit
profiles, the reference runner, the bench scripts). On a Jetson it is the ``cpu`` engine's
path (the Arm cores); the ``gpu`` engine's default there is TensorRT
(:mod:`infscaler.engines.tensorrt`).

Importing this package neither imports onnxruntime nor starts a thread pool (see
:mod:`.loader`).
"""

from infscaler.engines.onnxrt.loader import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    OPTIMIZATION_LEVELS,
    execution_providers,
    load_session,
    providers_for,
    session_options,
)
from infscaler.engines.onnxrt.runner import run_session, session_tensor_infos

__all__ = [
    "CPU_PROVIDER",
    "CUDA_PROVIDER",
    "OPTIMIZATION_LEVELS",
    "execution_providers",
    "load_session",
    "providers_for",
    "run_session",
    "session_options",
    "session_tensor_infos",
]
