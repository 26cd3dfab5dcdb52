"""The ``dla`` engine: TensorRT on a Jetson's Deep Learning Accelerator.

Two backends, chosen once per host by the provider probe
(:mod:`infscaler.engines.gpu.probe`, a subprocess):

1. ``onnxruntime-trt-dla`` (the default on a Jetson with JetPack's onnxruntime-gpu):
   onnxruntime's TensorRT EP with ``trt_dla_enable = 1``, ``trt_dla_core =
   device_index`` and ``trt_fp16_enable = 1``; the EP builds with TensorRT's GPU fallback,
   so layers the DLA cannot run go to the iGPU, and nodes TensorRT cannot take at all go to
   the CUDA EP (when ``allow_gpu_fallback``) and the CPU EP. Why the default: the model
   always loads (per-node fallback), the engine is cached like the gpu engine's, no pycuda
   is needed, and the session is the one ONNX users already run. Precision: fp16 (the
   EP's int8 needs a calibration table, which this engine does not take).
2. ``tensorrt-dla``: native TensorRT, as below, where onnxruntime has no TensorRT EP.

More (details, why it is so, history, figures): docs/engines.md, "`infscaler/engines/dla/__init__.py`".
"""

from infscaler.engines.dla.loader import probe_dla
from infscaler.engines.dla.runner import DLAEngine

__all__ = ["DLAEngine", "probe_dla"]
