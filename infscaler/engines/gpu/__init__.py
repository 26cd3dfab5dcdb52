"""The ``gpu`` engine: TensorRT on a CUDA GPU, or onnxruntime's CUDA execution provider.

Two backends, chosen once per process by :meth:`GPUEngine.availability`
(:func:`probe_gpu_backend`):

1. ``tensorrt`` (preferred): tensorrt + pycuda + a CUDA device. The engine is built from
   the ONNX file and cached (:mod:`infscaler.engines.tensorrt`), then run with
   page-locked host buffers, device buffers and a CUDA stream. Precisions: fp32 (TF32
   off), fp16 (where ``builder.platform_has_fast_fp16``), int8 (models with Q/DQ nodes).
2. ``onnxruntime-cuda``: when the TensorRT path is missing but onnxruntime (the
   onnxruntime-gpu build) has the ``CUDAExecutionProvider``; fp32 only (the model as
   typed). Operators the CUDA EP lacks run on the CPU EP, as onnxruntime assigns them.

``describe()["backend"]`` says which one runs. On a Jetson the default is ``tensorrt``
(JetPack's TensorRT, with pycuda); the CUDA EP serves only where that path is missing.

- :mod:`.loader`: the backend probe (:func:`probe_gpu_backend`) and the CUDA EP session
  (:func:`open_cuda_ep_session`); the TensorRT build is :mod:`infscaler.engines.tensorrt`'s;
- :mod:`.runner`: :class:`GPUEngine`.
"""

from infscaler.engines.gpu.loader import ORT_CUDA_MISSING, open_cuda_ep_session, probe_gpu_backend
from infscaler.engines.gpu.runner import GPUEngine

__all__ = ["ORT_CUDA_MISSING", "GPUEngine", "open_cuda_ep_session", "probe_gpu_backend"]
