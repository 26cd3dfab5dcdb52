"""The ``dla`` engine: TensorRT on a Jetson's Deep Learning Accelerator, through
onnxruntime's TensorRT EP with a DLA core (``onnxruntime-trt-dla``, fp16, GPU fallback per
layer) or native TensorRT (``tensorrt-dla``) where onnxruntime has no TensorRT EP.

More (details, why it is so, history, figures): docs/engines.md, "`infscaler/engines/dla/__init__.py`".
"""

from infscaler.engines.dla.runner import DLAEngine

__all__ = ["DLAEngine"]
