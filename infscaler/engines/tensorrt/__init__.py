"""TensorRT for the ``gpu`` and ``dla`` engines: build, cache, load, run.

Laid out like Polygraphy's TensorRT backend (``polygraphy/backend/trt/``), against the
TensorRT Python API of TensorRT 8.x and 10.x and pycuda:

- :mod:`.loader`: importing tensorrt / pycuda, the host probe (:func:`probe_tensorrt_host`),
  the model's signature and bound shapes, the build (:func:`build_serialized_engine`) and
  :func:`load_or_build`;
- :mod:`.cache`: the engine cache (:class:`EngineCache`, :func:`default_cache_dir`, the
  model hash :func:`model_sha256`);
- :mod:`.runner`: the execution context and buffers (:class:`TrtRunner`) and
  :class:`TensorRTEngine`, the base of :class:`~infscaler.engines.gpu.GPUEngine` and
  :class:`~infscaler.engines.dla.DLAEngine`;
- :mod:`.cuda`: the CUDA driver through ctypes (:class:`CudaDriver`, :func:`open_cuda_driver`,
  :func:`cuda_devices`) and a device's primary context through pycuda (:class:`CudaDevice`).

TensorRT is the default path of the ``gpu`` engine wherever tensorrt, pycuda and a CUDA
device are all there, a Jetson with JetPack's TensorRT included, and the only path of the
``dla`` engine (Jetson Xavier / Orin). Nothing here imports tensorrt or pycuda at import
time: they are imported when an engine is probed or loaded.
"""

from infscaler.engines.tensorrt.cache import EngineCache, default_cache_dir, model_sha256
from infscaler.engines.tensorrt.cuda import (
    CudaDevice,
    CudaDriver,
    cuda_devices,
    open_cuda_driver,
)
from infscaler.engines.tensorrt.loader import (
    PYCUDA_MISSING,
    TRT_MISSING,
    WORKSPACE_BYTES,
    BuildSpec,
    ModelSignature,
    bind_shapes,
    build_serialized_engine,
    import_pycuda,
    import_tensorrt,
    load_or_build,
    network_flags,
    probe_tensorrt_host,
    read_signature,
    trt_logger,
    trt_version,
)
from infscaler.engines.tensorrt.runner import TensorRTEngine, TrtRunner

__all__ = [
    "PYCUDA_MISSING",
    "TRT_MISSING",
    "WORKSPACE_BYTES",
    "BuildSpec",
    "CudaDevice",
    "CudaDriver",
    "EngineCache",
    "ModelSignature",
    "TensorRTEngine",
    "TrtRunner",
    "bind_shapes",
    "build_serialized_engine",
    "cuda_devices",
    "default_cache_dir",
    "import_pycuda",
    "import_tensorrt",
    "load_or_build",
    "model_sha256",
    "network_flags",
    "open_cuda_driver",
    "probe_tensorrt_host",
    "read_signature",
    "trt_logger",
    "trt_version",
]
