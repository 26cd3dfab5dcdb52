"""The ``gpu`` engine: a model on a CUDA GPU, through onnxruntime's TensorRT EP, native
TensorRT, or onnxruntime's CUDA EP.

More (details, why it is so, history, figures): docs/engines.md, "`infscaler/engines/gpu/__init__.py`".
"""

from infscaler.engines.gpu.runner import GPUEngine

__all__ = ["GPUEngine"]
