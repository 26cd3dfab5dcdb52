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

The native build is like the GPU engine's (:mod:`infscaler.engines.tensorrt`) with, in the
builder config, ``default_device_type = trt.DeviceType.DLA``, ``DLA_core =
device_index`` and, when ``allow_gpu_fallback`` (the default), ``BuilderFlag.GPU_FALLBACK``:
layers the DLA cannot run (``config.can_run_on_DLA(layer)`` is False) go to the iGPU.
Their names are ``describe()["fallback_layers"]`` (kept with the cached engine). The
runtime gets ``IRuntime.DLA_core`` before deserialising.

The DLA computes in fp16 or int8 only:

- ``fp16``: the ``FP16`` builder flag (TensorRT 8 / 10);
- ``int8``: models quantized with Q/DQ nodes (INT8 flag, the rest fp16). TensorRT's
  implicit INT8 needs a calibrator fed with representative inputs, which this engine does
  not take: without Q/DQ nodes int8 is refused with an :class:`InferenceError`;
- ``fp32`` is refused.

DLA cores exist on Jetson AGX Xavier / Xavier NX (2), AGX Orin (2) and Orin NX (1-2); the
Orin Nano and every discrete GPU have none.

It is the only ``dla`` path; on a Jetson with DLA cores it runs beside the ``gpu`` engine
(the iGPU).

- :mod:`.loader`: the availability check (:func:`probe_dla`); the build is
  :func:`infscaler.engines.tensorrt.loader.build_serialized_engine` with a DLA core;
- :mod:`.runner`: :class:`DLAEngine`.
"""

from infscaler.engines.dla.loader import probe_dla
from infscaler.engines.dla.runner import DLAEngine

__all__ = ["DLAEngine", "probe_dla"]
