"""TensorRT for the ``gpu`` and ``dla`` engines: build, cache, load, run.

Laid out like Polygraphy's ``polygraphy/backend/trt/``: :mod:`.loader` (import, host probe,
build), :mod:`.cache` (the engine cache), :mod:`.runner` (:class:`~.runner.TensorRTEngine`),
:mod:`.cuda` (the CUDA driver through ctypes). Nothing here imports tensorrt or pycuda at
import time. More: docs/engines.md, "`infscaler/engines/tensorrt/__init__.py`".
"""
