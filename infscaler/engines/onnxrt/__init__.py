"""The onnxruntime backend of the engine layer, laid out like Polygraphy's
``polygraphy/backend/onnxrt/``: :mod:`.loader` builds every ``onnxruntime.InferenceSession``
of InfScaler (:func:`load_session`, with :func:`session_options` and the providers of an
engine kind, :func:`providers_for`), :mod:`.runner` reads a session's tensors and runs it
(:func:`session_tensor_infos`, :func:`run_session`).

It serves the ``cpu`` engine (onnxruntime's CPU EP), the ``gpu`` engine's onnxruntime
paths (the TensorRT EP, the CUDA EP), the ``dla`` engine's (the TensorRT EP with a DLA
core) and every other onnxruntime session of
InfScaler (the partitioner's profiler and verification, model probing, variants, unit
profiles, the reference runner, the bench scripts). On a Jetson it is the ``cpu`` engine's
path (the Arm cores), and with JetPack's onnxruntime-gpu the ``gpu`` and ``dla`` engines'
default (the TensorRT EP: see :mod:`infscaler.engines.gpu`).

Importing this package neither imports onnxruntime nor starts a thread pool (see
:mod:`.loader`).
"""

from infscaler.engines.onnxrt.loader import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    OPTIMIZATION_LEVELS,
    TRT_PROVIDER,
    execution_providers,
    gpu_provider_options,
    load_session,
    providers_for,
    session_options,
)
from infscaler.engines.onnxrt.runner import run_session, session_tensor_infos

__all__ = [
    "CPU_PROVIDER",
    "CUDA_PROVIDER",
    "TRT_PROVIDER",
    "OPTIMIZATION_LEVELS",
    "execution_providers",
    "gpu_provider_options",
    "load_session",
    "providers_for",
    "run_session",
    "session_options",
    "session_tensor_infos",
]
