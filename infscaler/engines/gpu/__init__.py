"""The ``gpu`` engine: a model on a CUDA GPU, through onnxruntime's TensorRT EP, native
TensorRT, or onnxruntime's CUDA EP.

Three backends, chosen once per host by :meth:`GPUEngine.availability` (the provider
probe of :mod:`.probe`, run in a short subprocess so that the service and the zygote never
initialise CUDA; a backend counts only when a session really started on it):

1. ``onnxruntime-trt`` (preferred): onnxruntime-gpu's ``TensorrtExecutionProvider``, where
   TensorRT's ``libnvinfer`` loads. Engines are built by the EP and cached under the engine
   cache dir (``trt_engine_cache_enable``, ``trt_engine_cache_path`` =
   ``<cache_dir>/onnxruntime-trt``); fp16 with ``trt_fp16_enable``. Nodes TensorRT does not
   take run on the CUDA EP, then the CPU EP (onnxruntime partitions the graph per node).
   Precisions: fp32, fp16.
2. ``tensorrt``: native TensorRT + pycuda + a CUDA device, when onnxruntime has no working
   TensorRT EP. The engine is built from the ONNX file and cached
   (:mod:`infscaler.engines.tensorrt`), then run with page-locked host buffers, device
   buffers and a CUDA stream. Precisions: fp32 (TF32 off), fp16 (where
   ``builder.platform_has_fast_fp16``), int8 (models with Q/DQ nodes). A model with an
   operator TensorRT cannot run fails to build: there is no per-node fallback.
3. ``onnxruntime-cuda``: onnxruntime-gpu's ``CUDAExecutionProvider`` where TensorRT is
   missing (e.g. a CUDA host without TensorRT); fp32 only (the model as typed, TF32 off).

On both onnxruntime backends inference goes through IOBinding
(:mod:`.iobinding`): inputs bound where they lie (an instance's pool slots, registered
with CUDA once per slab: read in place on a Jetson, one DMA on a discrete GPU), outputs
written into pre-allocated host arrays.

``describe()["backend"]`` says which one runs. **On a Jetson the default is
``onnxruntime-trt``** where JetPack's onnxruntime-gpu is installed (what ONNX users run
there; it links JetPack's TensorRT): TensorRT's speed and fp16, plus per-node fallback to
CUDA and CPU for the operators TensorRT lacks, and no pycuda build. Native ``tensorrt``
serves where onnxruntime has no TensorRT EP (JetPack's python3-libnvinfer with pycuda),
and the CUDA EP only where TensorRT is missing altogether.

- :mod:`.probe`: the subprocess provider probe (:func:`~.probe.probe_providers`);
- :mod:`.loader`: the backend probe (:func:`probe_gpu_backend`) and the onnxruntime
  session (:func:`open_ort_gpu_session`); the native TensorRT build is
  :mod:`infscaler.engines.tensorrt`'s;
- :mod:`.iobinding`: :class:`~.iobinding.BoundSession`;
- :mod:`.runner`: :class:`GPUEngine` (and :class:`~.runner.OrtGpuPath`, shared with dla).
"""

from infscaler.engines.gpu.loader import (
    ORT_CUDA_MISSING,
    open_cuda_ep_session,
    open_ort_gpu_session,
    probe_gpu_backend,
)
from infscaler.engines.gpu.runner import GPUEngine

__all__ = [
    "ORT_CUDA_MISSING",
    "GPUEngine",
    "open_cuda_ep_session",
    "open_ort_gpu_session",
    "probe_gpu_backend",
]
