"""TensorRT code shared by the ``gpu`` and ``dla`` engines: build, cache, load, run.

Laid out like Polygraphy's TensorRT backend (``polygraphy/backend/trt/loader.py`` builds
a network from ONNX and an engine from the network; ``runner.py`` owns the execution
context and the buffers), written against the TensorRT Python API as documented for
TensorRT 8.x and 10.x (``docs.nvidia.com/deeplearning/tensorrt/api/python_api``) and pycuda:

- **Build** (:func:`build_serialized_engine`): ``trt.Builder`` -> ``create_network`` (the
  ``EXPLICIT_BATCH`` flag before TensorRT 10, where it became the only mode) ->
  ``trt.OnnxParser.parse_from_file`` (its errors become :class:`ModelLoadError`) -> a
  builder config with a workspace limit, the precision flags (``FP16`` where asked for and
  the platform has fast FP16; ``INT8`` for models with Q/DQ nodes; ``TF32`` cleared for
  fp32, so fp32 means fp32), one optimisation profile with min = opt = max = the concrete
  ``shapes`` of the dynamic inputs, and for DLA ``default_device_type = DeviceType.DLA``,
  ``DLA_core``, ``GPU_FALLBACK`` -> ``build_serialized_network``.
- **Cache** (:func:`load_or_build`): serialised engines are kept under ``cache_dir``, keyed
  (like trtexec's ``--saveEngine`` / jetson-inference's ``.engine`` files) by the model's
  SHA-256, the GPU name and compute capability, the TensorRT version, the precision, the
  DLA core and the build settings (shapes, GPU fallback, workspace). A file lock makes
  instances started together build once.
- **Run** (:class:`TrtRunner`): ``trt.Runtime`` (with ``DLA_core`` for DLA engines) ->
  ``deserialize_cuda_engine`` -> ``create_execution_context``; page-locked host buffers,
  device buffers and a stream from pycuda; ``set_tensor_address`` + ``execute_async_v3``
  (TensorRT 8.5+ / 10.x), or the bindings API (``execute_async_v2``) of older TensorRT 8.

Nothing here imports tensorrt or pycuda at module import: :func:`import_tensorrt` and
:func:`import_pycuda` do, when an engine is probed or loaded. Probing (availability)
initialises the CUDA driver in the calling process: fork()ed children cannot use CUDA
after that, so start GPU instances as new processes (the supervisor does).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from infscaler.base.errors import ModelLoadError
from infscaler.engines.base import (
    Engine,
    InferenceError,
    TensorInfo,
    format_shape,
    mib,
)

log = logging.getLogger("infscaler.engines.tensorrt")

WORKSPACE_BYTES = 1 << 30
"""TensorRT builder workspace limit (``MemoryPoolType.WORKSPACE``): 1 GiB, which fits the
smallest Jetson (Orin Nano 4 GB) next to the runtime."""

TRT_MISSING = (
    "tensorrt is not installed (pip install tensorrt, or JetPack's python3-libnvinfer on a Jetson)"
)
PYCUDA_MISSING = "pycuda is not installed (pip install pycuda; it needs the CUDA toolkit)"
DLA_ONLY_ON_JETSON = "DLA exists only on Jetson Xavier / Orin"
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


# --------------------------------------------------------------------------- imports


def import_tensorrt() -> tuple[Any, str]:
    """``(tensorrt module, "")`` or ``(None, reason)``; the reason says how to get it."""
    try:
        import tensorrt as trt
    except ImportError:
        return None, TRT_MISSING
    except Exception as exc:  # noqa: BLE001 - e.g. OSError: libnvinfer.so.10 not found
        return None, f"tensorrt cannot be imported ({type(exc).__name__}: {exc})"
    return trt, ""


def import_pycuda() -> tuple[Any, str]:
    """``(pycuda.driver, "")`` or ``(None, reason)``."""
    try:
        import pycuda.driver as cuda
    except ImportError:
        return None, PYCUDA_MISSING
    except Exception as exc:  # noqa: BLE001 - e.g. libcuda missing under pycuda
        return None, f"pycuda cannot be imported ({type(exc).__name__}: {exc})"
    return cuda, ""


def trt_version(trt: Any) -> tuple[int, ...]:
    """``trt.__version__`` as integers: ``(10, 3, 0, 26)``."""
    return tuple(int(p) for p in re.findall(r"\d+", str(trt.__version__))[:4])


# --------------------------------------------------------------------------- CUDA driver


class CudaDriver:
    """The few CUDA driver API calls the engines need, through ctypes on ``libcuda``.

    Used to find CUDA devices without pycuda (the onnxruntime CUDA EP path needs no
    pycuda) and to read a device's free memory (``cuMemGetInfo``) in its primary context,
    the context the CUDA runtime (TensorRT, onnxruntime) uses.

    Raises:
        OSError: ``libcuda.so.1`` cannot be loaded (no NVIDIA driver).
        RuntimeError: a driver call failed (message: the call and the driver's error).
    """

    def __init__(self) -> None:
        lib = None
        errors = []
        for name in ("libcuda.so.1", "libcuda.so"):
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError as exc:
                errors.append(str(exc))
        if lib is None:
            raise OSError("; ".join(errors))
        self.lib = lib
        self._check(lib.cuInit(0), "cuInit")

    def _check(self, rc: int, call: str) -> None:
        if rc == 0:
            return
        text = ctypes.c_char_p()
        with contextlib.suppress(Exception):
            self.lib.cuGetErrorString(rc, ctypes.byref(text))
        detail = text.value.decode(errors="replace") if text.value else f"CUresult {rc}"
        raise RuntimeError(f"{call} failed: {detail}")

    def _fn(self, *names: str) -> Any:
        for n in names:
            f = getattr(self.lib, n, None)
            if f is not None:
                return f
        raise RuntimeError(f"libcuda lacks {names[0]}")

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        self._check(self.lib.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
        return n.value

    def _device(self, index: int) -> ctypes.c_int:
        dev = ctypes.c_int(0)
        self._check(self.lib.cuDeviceGet(ctypes.byref(dev), int(index)), "cuDeviceGet")
        return dev

    def device_name(self, index: int) -> str:
        buf = ctypes.create_string_buffer(256)
        self._check(
            self.lib.cuDeviceGetName(buf, ctypes.c_int(256), self._device(index)),
            "cuDeviceGetName",
        )
        return buf.value.decode(errors="replace")

    def retain_primary(self, index: int) -> ctypes.c_void_p:
        """Retain device ``index``'s primary context (keeps it alive until
        :meth:`release_primary`)."""
        ctx = ctypes.c_void_p()
        retain = self._fn("cuDevicePrimaryCtxRetain")
        self._check(retain(ctypes.byref(ctx), self._device(index)), "cuDevicePrimaryCtxRetain")
        return ctx

    def release_primary(self, index: int) -> None:
        release = self._fn("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease")
        self._check(release(self._device(index)), "cuDevicePrimaryCtxRelease")

    def device_attribute(self, index: int, attribute: int) -> int:
        """``cuDeviceGetAttribute``: a ``CU_DEVICE_ATTRIBUTE_*`` value of device ``index``."""
        value = ctypes.c_int(0)
        self._check(
            self.lib.cuDeviceGetAttribute(
                ctypes.byref(value), ctypes.c_int(attribute), self._device(index)
            ),
            "cuDeviceGetAttribute",
        )
        return int(value.value)

    @contextlib.contextmanager
    def current(self, ctx: ctypes.c_void_p) -> Iterator[None]:
        """``ctx`` pushed as the calling thread's current context while in the block."""
        push = self._fn("cuCtxPushCurrent_v2", "cuCtxPushCurrent")
        pop = self._fn("cuCtxPopCurrent_v2", "cuCtxPopCurrent")
        self._check(push(ctx), "cuCtxPushCurrent")
        try:
            yield
        finally:
            popped = ctypes.c_void_p()
            pop(ctypes.byref(popped))

    def mem_free(self, ctx: ctypes.c_void_p) -> int:
        """Free bytes on the device of ``ctx`` (device-wide, all processes)."""
        get = self._fn("cuMemGetInfo_v2", "cuMemGetInfo")
        with self.current(ctx):
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            self._check(get(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
            return int(free.value)

    def host_register(self, ctx: ctypes.c_void_p, address: int, nbytes: int, flags: int) -> int:
        """Page-lock ``nbytes`` of host memory at ``address`` for the device of ``ctx``
        (``cuMemHostRegister``, ``CU_MEMHOSTREGISTER_*`` flags) and return its device
        address (``cuMemHostGetDevicePointer``; needs the DEVICEMAP flag)."""
        register = self._fn("cuMemHostRegister_v2", "cuMemHostRegister")
        pointer = self._fn("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer")
        with self.current(ctx):
            host = ctypes.c_void_p(address)
            self._check(
                register(host, ctypes.c_size_t(nbytes), ctypes.c_uint(flags)), "cuMemHostRegister"
            )
            device = ctypes.c_uint64(0)
            try:
                self._check(
                    pointer(ctypes.byref(device), host, ctypes.c_uint(0)),
                    "cuMemHostGetDevicePointer",
                )
            except RuntimeError:
                self.lib.cuMemHostUnregister(host)
                raise
            return int(device.value)

    def host_unregister(self, ctx: ctypes.c_void_p, address: int) -> None:
        """Undo :meth:`host_register` (``cuMemHostUnregister``)."""
        with self.current(ctx):
            self._check(
                self.lib.cuMemHostUnregister(ctypes.c_void_p(address)), "cuMemHostUnregister"
            )


def open_cuda_driver() -> tuple[CudaDriver | None, str]:
    """``(CudaDriver, "")`` when the NVIDIA driver loads and reports a device; else
    ``(None, reason)``, the reason starting with ``"no CUDA device: "`` and saying why (no
    driver library, the driver's error, zero devices)."""
    try:
        drv = CudaDriver()
    except OSError:
        return None, (
            "no CUDA device: the NVIDIA driver library libcuda.so.1 is not loadable "
            "(no NVIDIA GPU driver on this host)"
        )
    except Exception as exc:  # noqa: BLE001 - cuInit failure: no device, driver mismatch
        return None, f"no CUDA device: {exc}"
    try:
        n = drv.device_count()
    except Exception as exc:  # noqa: BLE001
        return None, f"no CUDA device: {exc}"
    if n == 0:
        return None, "no CUDA device: the NVIDIA driver reports 0 devices"
    return drv, ""


def cuda_devices() -> tuple[list[str], str]:
    """Names of this host's CUDA devices, in index order, and ``""``; or ``([], reason)``
    (:func:`open_cuda_driver`'s reason, or the driver's error naming a device)."""
    drv, why = open_cuda_driver()
    if drv is None:
        return [], why
    try:
        names = [drv.device_name(i) for i in range(drv.device_count())]
    except Exception as exc:  # noqa: BLE001
        return [], f"no CUDA device: {exc}"
    return names, ""


class CudaDevice:
    """A CUDA device's primary context through pycuda, made current only while in use.

    The CUDA runtime inside TensorRT uses whatever context is current, so pushing the
    device's primary context (``Device.retain_primary_context``) around build, load,
    inference and release keeps every TensorRT object on this device, from any thread.

    Raises:
        InferenceError: ``index`` is not a device of this host.
    """

    def __init__(self, cuda: Any, index: int) -> None:
        cuda.init()
        count = cuda.Device.count()
        if not 0 <= index < count:
            raise InferenceError(
                f"CUDA device {index} does not exist: this host has {count} (indices 0-{count - 1})"
            )
        self.cuda = cuda
        self.index = index
        self.device = cuda.Device(index)
        self.name = str(self.device.name())
        major, minor = self.device.compute_capability()
        self.compute_capability = f"{major}.{minor}"
        self.context = self.device.retain_primary_context()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        self.context.push()
        try:
            yield
        finally:
            self.cuda.Context.pop()

    def mem_free(self) -> int:
        """Free device memory in bytes (call inside :meth:`active`; device-wide)."""
        return int(self.cuda.mem_get_info()[0])

    def release(self) -> None:
        with contextlib.suppress(Exception):
            self.context.detach()


# --------------------------------------------------------------------------- TRT logger

_LOGGER: Any = None
_LOGGER_LOCK = threading.Lock()


def trt_logger(trt: Any) -> Any:
    """The process's ``trt.ILogger``: routes TensorRT's messages to Python logging and keeps
    the latest errors so build / load failures can quote them."""
    global _LOGGER
    with _LOGGER_LOCK:
        if _LOGGER is not None:
            return _LOGGER

        class _Logger(trt.ILogger):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                trt.ILogger.__init__(self)
                self._errors: deque[tuple[int, str]] = deque(maxlen=200)
                self._seq = 0
                self._lock = threading.Lock()

            def log(self, severity: Any, msg: str) -> None:
                level = int(severity)  # INTERNAL_ERROR 0, ERROR 1, WARNING 2, INFO 3, VERBOSE 4
                if level <= 1:
                    with self._lock:
                        self._seq += 1
                        self._errors.append((self._seq, msg))
                    log.error("TensorRT: %s", msg)
                elif level == 2:
                    log.warning("TensorRT: %s", msg)
                elif level == 3:
                    log.debug("TensorRT: %s", msg)

            def mark(self) -> int:
                with self._lock:
                    return self._seq

            def errors_since(self, mark: int) -> str:
                with self._lock:
                    msgs = [m for s, m in self._errors if s > mark]
                return "; ".join(msgs[-10:]) if msgs else "no error message from TensorRT"

        _LOGGER = _Logger()
        return _LOGGER


# --------------------------------------------------------------------------- host probe

_HOST: dict[str, Any] | None = None
_HOST_LOCK = threading.Lock()


def probe_tensorrt_host() -> dict[str, Any]:
    """What this host has for TensorRT, found once per process.

    Returns:
        ``trt`` / ``cuda`` (modules or None), ``devices`` (CUDA device names),
        ``missing`` (reasons, in the order tensorrt, pycuda, CUDA device), and when all
        three are there: ``version``, ``fast_fp16``, ``fast_int8``, ``dla_cores``
        (from a ``trt.Builder``), ``strongly_typed_only`` (TensorRT without the FP16
        builder flag, 11+).
    """
    global _HOST
    with _HOST_LOCK:
        if _HOST is not None:
            return _HOST
        trt, trt_reason = import_tensorrt()
        cuda, cuda_reason = import_pycuda()
        devices, dev_reason = cuda_devices()
        missing = [r for r in (trt_reason, cuda_reason, dev_reason) if r]
        host: dict[str, Any] = {"trt": trt, "cuda": cuda, "devices": devices, "missing": missing}
        if not missing:
            host["version"] = str(trt.__version__)
            try:
                dev = CudaDevice(cuda, 0)
                try:
                    with dev.active():
                        logger = trt_logger(trt)
                        mark = logger.mark()
                        builder = trt.Builder(logger)
                        if builder is None:
                            raise RuntimeError(logger.errors_since(mark))
                        # platform_has_fast_* are deprecated in TensorRT 10 and gone in 11,
                        # where precision follows the (strongly typed) model.
                        host["fast_fp16"] = bool(getattr(builder, "platform_has_fast_fp16", True))
                        host["fast_int8"] = bool(getattr(builder, "platform_has_fast_int8", True))
                        host["dla_cores"] = int(getattr(builder, "num_DLA_cores", 0))
                        del builder
                finally:
                    dev.release()
            except Exception as exc:  # noqa: BLE001 - no usable device after all
                host["missing"] = [f"TensorRT cannot create a builder on {devices[0]}: {exc}"]
            host["strongly_typed_only"] = not hasattr(trt.BuilderFlag, "FP16")
        _HOST = host
        return host


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class ModelSignature:
    """What the ONNX file says, read with ``onnx.load(load_external_data=False)``.

    Attributes:
        inputs / outputs: graph inputs (initializers excluded) and outputs.
        op_types: every operator type in the graph (subgraphs included).
        float_types: numpy names of the float types of inputs and initializers.
        data_files: external-data files the model references (part of its hash).
        untyped: outputs whose element type the file leaves undefined (the engine's is used).
    """

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    op_types: frozenset[str]
    float_types: frozenset[str]
    data_files: tuple[Path, ...] = ()
    untyped: frozenset[str] = frozenset()

    @property
    def has_qdq(self) -> bool:
        """True when the model carries QuantizeLinear / DequantizeLinear nodes (explicit
        quantization: TensorRT runs it in INT8 without calibration)."""
        return bool(self.op_types & _QDQ_OPS)


def _np_dtype(elem_type: int) -> np.dtype:
    from onnx import TensorProto, helper

    if elem_type == TensorProto.STRING:
        return np.dtype(object)
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _walk_nodes(graph: Any) -> Iterator[Any]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _walk_nodes(attr.g)
            for g in attr.graphs:
                yield from _walk_nodes(g)


def read_signature(path: Path) -> ModelSignature:
    """The inputs, outputs and operator types of an ONNX file.

    Raises:
        ModelLoadError: not a readable ONNX model (text, truncated), no graph, or an input
            that is not a tensor / has no shape.
    """
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf DecodeError and friends
        raise ModelLoadError(
            f"model {path} is not a readable ONNX model ({type(exc).__name__}: {exc})",
            hint="check the file with onnx.checker.check_model",
        ) from exc
    graph = model.graph
    if not model.HasField("graph") or not graph.output or not model.opset_import:
        raise ModelLoadError(
            f"model {path} is not a valid ONNX model (no graph outputs or no opset)",
            hint="check the file with onnx.checker.check_model",
        )
    init_names = {t.name for t in graph.initializer}

    def info(vi: Any, need_shape: bool) -> TensorInfo:
        if not vi.type.HasField("tensor_type"):
            raise ModelLoadError(f"model {path}: '{vi.name}' is not a tensor; engines take tensors")
        tt = vi.type.tensor_type
        if need_shape and not tt.HasField("shape"):
            raise ModelLoadError(
                f"model {path}: input '{vi.name}' has no shape (unknown rank)",
                hint="export the model with input shapes",
            )
        shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        dtype = _np_dtype(tt.elem_type) if tt.elem_type else np.dtype(np.float32)
        return TensorInfo(vi.name, dtype, shape)

    inputs = tuple(info(vi, True) for vi in graph.input if vi.name not in init_names)
    outputs = tuple(info(vi, False) for vi in graph.output)
    float_names = {"float16", "float32", "float64", "bfloat16"}
    floats = {t.dtype.name for t in inputs if t.dtype.name in float_names}
    for t in graph.initializer:
        with contextlib.suppress(Exception):
            name = _np_dtype(t.data_type).name
            if name in float_names:
                floats.add(name)
    files = []
    for t in graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = {e.key: e.value for e in t.external_data}.get("location")
            if loc:
                files.append(path.parent / loc)
    return ModelSignature(
        inputs=inputs,
        outputs=outputs,
        op_types=frozenset(n.op_type for n in _walk_nodes(graph)),
        float_types=frozenset(floats),
        data_files=tuple(sorted(set(files))),
        untyped=frozenset(
            vi.name
            for vi in graph.output
            if vi.type.HasField("tensor_type") and not vi.type.tensor_type.elem_type
        ),
    )


def model_sha256(path: Path, data_files: Sequence[Path] = ()) -> str:
    """SHA-256 of the model file and, in order, its external-data files (hex)."""
    h = hashlib.sha256()
    for p in (path, *data_files):
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def bind_shapes(
    inputs: Sequence[TensorInfo], shapes: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    """The concrete shape of every input: its own when static, ``shapes[name]`` when it
    has dynamic dimensions (TensorRT's optimisation profile uses min = opt = max = it).

    Raises:
        InferenceError: ``shapes`` names an unknown input; a dynamic input has no entry
            (the message lists every such input with its ONNX shape); an entry's rank or a
            fixed dimension differs from the model, or a dimension is < 1.
    """
    by_name = {t.name: t for t in inputs}
    unknown = [k for k in shapes if k not in by_name]
    if unknown:
        raise InferenceError(
            f"shapes names unknown input(s) {unknown}; the model's inputs are "
            + ", ".join(str(t) for t in inputs)
        )
    missing = [t for t in inputs if t.is_dynamic and t.name not in shapes]
    if missing:
        example = ", ".join(
            f"'{t.name}': [{', '.join('N' if d is None else str(d) for d in t.shape)}]"
            for t in missing
        )
        raise InferenceError(
            "TensorRT needs concrete shapes for the dynamic input(s) "
            + ", ".join(str(t) for t in missing)
            + f"; pass shapes={{{example}}} with numbers for the dynamic dimensions",
            hint="set `shapes:` on the stage (e.g. x: [1, 3, 48, 192]) or --shapes x:1x3x48x192",
        )
    bound: dict[str, tuple[int, ...]] = {}
    for t in inputs:
        if t.name not in shapes:
            bound[t.name] = tuple(int(d) for d in t.shape if d is not None)
            continue
        s = tuple(int(d) for d in shapes[t.name])
        if len(s) != len(t.shape):
            raise InferenceError(
                f"shapes['{t.name}'] = {list(s)} has rank {len(s)}, but input {t} has rank "
                f"{len(t.shape)}"
            )
        for axis, (want, got) in enumerate(zip(t.shape, s, strict=True)):
            if got < 1 or (want is not None and want != got):
                raise InferenceError(
                    f"shapes['{t.name}'] = {list(s)}: dimension {axis} is {got}, but input "
                    f"{t} takes {want if want is not None else 'a positive size'} there"
                )
        bound[t.name] = s
    return bound


# --------------------------------------------------------------------------- build


@dataclass(frozen=True)
class BuildSpec:
    """Everything that changes the engine TensorRT builds (all of it is in the cache key).

    Attributes:
        precision: ``fp32`` / ``fp16`` / ``int8``.
        shapes: the concrete shape of every input (:func:`bind_shapes`).
        dla_core: the DLA core, or None for a GPU engine.
        gpu_fallback: DLA only: layers the DLA cannot run go to the GPU.
        workspace_bytes: the builder's workspace limit.
    """

    precision: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    dla_core: int | None = None
    gpu_fallback: bool = True
    workspace_bytes: int = WORKSPACE_BYTES

    def to_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "shapes": {k: list(v) for k, v in self.shapes},
            "dla_core": self.dla_core,
            "gpu_fallback": self.gpu_fallback if self.dla_core is not None else None,
            "workspace_bytes": self.workspace_bytes,
        }


def network_flags(trt: Any) -> int:
    """``create_network`` flags: ``EXPLICIT_BATCH`` before TensorRT 10 (deprecated and
    ignored in 10, removed in 11: networks are always explicit-batch there)."""
    flag = getattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH", None)
    if flag is not None and trt_version(trt)[:1] < (10,):
        return 1 << int(flag)
    return 0


def _set_workspace(trt: Any, config: Any, nbytes: int) -> None:
    if hasattr(config, "set_memory_pool_limit"):  # TensorRT 8.4+
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(nbytes))
    else:  # older TensorRT 8
        config.max_workspace_size = int(nbytes)


def _set_precision(trt: Any, config: Any, precision: str, dla: bool) -> None:
    flags = trt.BuilderFlag
    if precision == "fp32":
        if hasattr(flags, "TF32"):  # TF32 is on by default on Ampere+: fp32 means fp32
            config.clear_flag(flags.TF32)
    elif precision == "fp16":
        if hasattr(flags, "FP16"):  # absent in strongly typed TensorRT (11+): the model is fp16
            config.set_flag(flags.FP16)
    elif precision == "int8":
        if hasattr(flags, "INT8"):  # Q/DQ models (explicit quantization), no calibrator
            config.set_flag(flags.INT8)
        if dla and hasattr(flags, "FP16"):  # the DLA runs no fp32 layer: the rest in fp16
            config.set_flag(flags.FP16)


def build_serialized_engine(
    trt: Any, model_path: Path, spec: BuildSpec
) -> tuple[bytes, dict[str, Any]]:
    """Build a TensorRT engine from an ONNX file (call with the target device's context
    current).

    Returns:
        The serialised engine, and ``build_ms``, ``num_layers``, ``fallback_layers``
        (DLA: names of the layers ``config.can_run_on_DLA`` rejects, which run on the GPU).

    Raises:
        ModelLoadError: the ONNX parser's errors, or the build failed (TensorRT's errors).
        InferenceError: an input is a shape tensor, or a DLA build has layers the DLA
            cannot run while GPU fallback is off.
    """
    logger = trt_logger(trt)
    mark = logger.mark()
    builder = trt.Builder(logger)
    if builder is None:
        raise ModelLoadError(f"TensorRT could not create a builder: {logger.errors_since(mark)}")
    network = builder.create_network(network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model_path)):
        errors = [str(parser.get_error(i)).strip() for i in range(parser.num_errors)]
        raise ModelLoadError(
            f"TensorRT's ONNX parser rejected {model_path}: "
            + ("; ".join(errors) or logger.errors_since(mark)),
            hint="run the model on engine 'cpu', or change the unsupported operators",
        )
    config = builder.create_builder_config()
    _set_workspace(trt, config, spec.workspace_bytes)
    _set_precision(trt, config, spec.precision, dla=spec.dla_core is not None)

    shapes = dict(spec.shapes)
    profile = None
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        dims = tuple(tensor.shape)
        if getattr(tensor, "is_shape_tensor", False):
            raise InferenceError(
                f"input '{tensor.name}' of {model_path.name} is a shape tensor; the TensorRT "
                "engines take execution tensors only",
                hint="run this model on engine 'cpu'",
            )
        if any(d < 0 for d in dims):
            if tensor.name not in shapes:
                raise InferenceError(
                    f"TensorRT sees input '{tensor.name}' as dynamic {format_shape(dims)}; "
                    "give its concrete shape in shapes="
                )
            if profile is None:
                profile = builder.create_optimization_profile()
            s = shapes[tensor.name]
            profile.set_shape(tensor.name, s, s, s)  # min = opt = max: one shape
    if profile is not None:
        config.add_optimization_profile(profile)

    fallback: list[str] = []
    if spec.dla_core is not None:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = int(spec.dla_core)
        if spec.gpu_fallback:
            config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            if not config.can_run_on_DLA(layer):
                fallback.append(layer.name)
        if fallback and not spec.gpu_fallback:
            shown = ", ".join(fallback[:10]) + (" ..." if len(fallback) > 10 else "")
            raise InferenceError(
                f"{len(fallback)} layer(s) of {model_path.name} cannot run on the DLA and "
                f"allow_gpu_fallback is False: {shown}",
                hint="allow GPU fallback, or partition the model so these layers run elsewhere",
            )

    t0 = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    build_ms = (time.perf_counter() - t0) * 1e3
    if serialized is None:
        where = f" for DLA core {spec.dla_core}" if spec.dla_core is not None else ""
        raise ModelLoadError(
            f"TensorRT could not build a {spec.precision} engine{where} from "
            f"{model_path}: {logger.errors_since(mark)}",
            hint="see the TensorRT messages in the log; try another precision or engine",
        )
    plan = bytes(memoryview(serialized))
    info = {
        "build_ms": build_ms,
        "num_layers": int(network.num_layers),
        "fallback_layers": fallback,
    }
    del parser, network, config, builder
    return plan, info


# --------------------------------------------------------------------------- cache


def default_cache_dir() -> Path:
    """``$INFSCALER_CACHE_DIR/engines``, or ``~/.cache/infscaler/engines`` (the root of
    :func:`infscaler.base.models.cache_dir`, read here from the environment: the engine layer
    imports no module above the base layer)."""
    root = os.environ.get("INFSCALER_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "infscaler") / "engines"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


@dataclass
class EngineCache:
    """Where a built engine lives: ``<dir>/<model>-<sha>-<gpu>-trt<ver>-<prec>[-dlaN]-<key>.engine``
    plus a ``.json`` beside it (the key, build time, DLA fallback layers).

    Attributes:
        directory: the cache directory.
        key: model SHA-256, GPU name and compute capability, TensorRT version and the
            :class:`BuildSpec`.
    """

    directory: Path
    key: dict[str, Any]
    stem: str
    _digest: str = field(init=False)

    def __post_init__(self) -> None:
        blob = json.dumps(self.key, sort_keys=True).encode()
        self._digest = hashlib.sha256(blob).hexdigest()[:12]

    @property
    def engine_path(self) -> Path:
        k = self.key
        dla = f"-dla{k['build']['dla_core']}" if k["build"]["dla_core"] is not None else ""
        name = (
            f"{_slug(self.stem)}-{k['model_sha256'][:12]}-{_slug(k['gpu'])}"
            f"-trt{k['tensorrt']}-{k['build']['precision']}{dla}-{self._digest}.engine"
        )
        return self.directory / name

    @property
    def meta_path(self) -> Path:
        return self.engine_path.with_suffix(".json")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive ``flock`` on ``<engine>.lock``, so that instances started together
        build the engine once; the others wait and then find it cached."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.engine_path.with_suffix(".lock"), os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as exc:
            log.warning("engine cache %s unusable (%s); building without it", self.directory, exc)
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def read(self) -> tuple[bytes, dict[str, Any]] | None:
        try:
            plan = self.engine_path.read_bytes()
        except OSError:
            return None
        meta: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads(self.meta_path.read_text())
        return plan, meta

    def write(self, plan: bytes, meta: dict[str, Any]) -> bool:
        """Store atomically (temp file + rename); False (and a warning) when it cannot."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for path, data in ((self.engine_path, plan), (self.meta_path, None)):
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                if data is None:
                    tmp.write_text(json.dumps({**meta, "key": self.key}, indent=1, sort_keys=True))
                else:
                    tmp.write_bytes(data)
                os.replace(tmp, path)
            return True
        except OSError as exc:
            log.warning("cannot write engine cache %s: %s", self.engine_path, exc)
            return False

    def drop(self) -> None:
        for p in (self.engine_path, self.meta_path):
            with contextlib.suppress(OSError):
                p.unlink()


def load_or_build(
    trt: Any, model_path: Path, spec: BuildSpec, cache: EngineCache, *, rebuild: bool = False
) -> tuple[bytes, dict[str, Any]]:
    """The serialised engine from the cache, or built (and cached).

    Returns:
        The plan, and ``cache_hit``, ``engine_path``, ``build_ms`` (of the build that made
        it, cached or not), ``fallback_layers``.
    """
    with cache.locked():
        if not rebuild:
            hit = cache.read()
            if hit is not None:
                plan, meta = hit
                return plan, {
                    "cache_hit": True,
                    "engine_path": str(cache.engine_path),
                    "build_ms": meta.get("build_ms"),
                    "fallback_layers": list(meta.get("fallback_layers", [])),
                }
        plan, info = build_serialized_engine(trt, model_path, spec)
        stored = cache.write(plan, info)
        return plan, {
            "cache_hit": False,
            "engine_path": str(cache.engine_path) if stored else None,
            "build_ms": info["build_ms"],
            "fallback_layers": info["fallback_layers"],
        }


# --------------------------------------------------------------------------- run


@dataclass
class _Binding:
    name: str
    is_input: bool
    dtype: np.dtype  # the engine's (TensorRT 8 binds ONNX int64 as int32)
    shape: tuple[int, ...]
    host: Any = None  # page-locked numpy array
    device: Any = None  # pycuda DeviceAllocation


class TrtRunner:
    """A deserialised engine, its execution context, buffers and stream.

    Every method must run with the engine's CUDA context current
    (:meth:`CudaDevice.active`); :class:`TensorRTEngine` does that.

    Args:
        trt / cuda: the tensorrt and pycuda.driver modules.
        plan: the serialised engine.
        dla_core: the DLA core the engine was built for (``IRuntime.DLA_core``), or None.
        shapes: the concrete shape of every input (set on the context once: one profile,
            min = opt = max).
    """

    def __init__(
        self,
        trt: Any,
        cuda: Any,
        plan: bytes,
        *,
        dla_core: int | None,
        shapes: Mapping[str, tuple[int, ...]],
    ) -> None:
        self.trt = trt
        self.cuda = cuda
        self.plan = plan
        self.dla_core = dla_core
        self.shapes = dict(shapes)
        self.api = ""
        self.runtime: Any = None
        self.engine: Any = None
        self.context: Any = None
        self.stream: Any = None
        self.bindings: list[_Binding] = []
        self.by_name: dict[str, _Binding] = {}
        self._addresses: list[int] = []

    def open(self) -> None:
        """Deserialise, create the context, set the input shapes, allocate buffers.

        Raises:
            ModelLoadError: the plan does not deserialise (stale or corrupt cache file, other
                TensorRT), no context (device memory), a data-dependent output shape, or a
                tensor type numpy lacks.
        """
        trt = self.trt
        logger = trt_logger(trt)
        mark = logger.mark()
        self.runtime = trt.Runtime(logger)
        if self.dla_core is not None:
            self.runtime.DLA_core = int(self.dla_core)
        self.engine = self.runtime.deserialize_cuda_engine(self.plan)
        if self.engine is None:
            raise ModelLoadError(
                f"TensorRT could not deserialise the engine: {logger.errors_since(mark)}"
            )
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise ModelLoadError(
                "TensorRT could not create an execution context (device memory?): "
                + logger.errors_since(mark)
            )
        self.stream = self.cuda.Stream()
        if hasattr(self.engine, "num_io_tensors") and hasattr(self.context, "execute_async_v3"):
            self._open_tensors()
        else:
            self._open_bindings()

    def _numpy_dtype(self, trt_dtype: Any, name: str) -> np.dtype:
        try:
            return np.dtype(self.trt.nptype(trt_dtype))
        except TypeError as exc:
            raise ModelLoadError(
                f"tensor '{name}' has TensorRT type {trt_dtype}, which numpy cannot hold"
            ) from exc

    def _allocate(self, b: _Binding) -> None:
        if any(d < 0 for d in b.shape):
            raise ModelLoadError(
                f"output '{b.name}' has a data-dependent shape {format_shape(b.shape)}; the "
                "TensorRT engines need static output shapes",
                hint="run this model (or the partition with this operator) on engine 'cpu'",
            )
        b.host = self.cuda.pagelocked_empty(b.shape, b.dtype)
        b.device = self.cuda.mem_alloc(max(int(b.host.nbytes), 1))
        self.bindings.append(b)
        self.by_name[b.name] = b

    def _open_tensors(self) -> None:
        """TensorRT 8.5+ / 10: named I/O tensors, ``set_tensor_address``."""
        trt, engine, context = self.trt, self.engine, self.context
        self.api = "tensors"
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        is_input = {n: engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        for n in names:
            dynamic = is_input[n] and any(d < 0 for d in tuple(engine.get_tensor_shape(n)))
            if dynamic and (n not in self.shapes or not context.set_input_shape(n, self.shapes[n])):
                raise InferenceError(
                    f"TensorRT rejected shape {list(self.shapes.get(n, ()))} for input '{n}'"
                )
        for n in names:
            b = _Binding(
                n,
                is_input[n],
                self._numpy_dtype(engine.get_tensor_dtype(n), n),
                tuple(int(d) for d in context.get_tensor_shape(n)),
            )
            self._allocate(b)
            context.set_tensor_address(n, int(b.device))

    def _open_bindings(self) -> None:
        """TensorRT 8 before 8.5: binding indices, ``execute_async_v2``."""
        engine, context = self.engine, self.context
        self.api = "bindings"
        n_bind = engine.num_bindings
        for i in range(n_bind):
            name = engine.get_binding_name(i)
            dynamic = engine.binding_is_input(i) and any(d < 0 for d in engine.get_binding_shape(i))
            if dynamic and (
                name not in self.shapes or not context.set_binding_shape(i, self.shapes[name])
            ):
                raise InferenceError(
                    f"TensorRT rejected shape {list(self.shapes.get(name, ()))} for input '{name}'"
                )
        for i in range(n_bind):
            name = engine.get_binding_name(i)
            b = _Binding(
                name,
                bool(engine.binding_is_input(i)),
                self._numpy_dtype(engine.get_binding_dtype(i), name),
                tuple(int(d) for d in context.get_binding_shape(i)),
            )
            self._allocate(b)
        self._addresses = [int(b.device) for b in self.bindings]

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """Copy ``feeds`` in, execute, copy ``outputs`` out (one stream, synchronised).

        Returns:
            New arrays in the engine's dtypes.

        Raises:
            InferenceError: a value that does not fit the engine's narrower type (int64
                beyond int32 on TensorRT 8), or the execution failed.
        """
        cuda, stream = self.cuda, self.stream
        logger = trt_logger(self.trt)
        mark = logger.mark()
        try:
            for b in self.bindings:
                if not b.is_input:
                    continue
                np.copyto(b.host, _to_engine_dtype(feeds[b.name], b.dtype, b.name))
                cuda.memcpy_htod_async(b.device, b.host, stream)
            if self.api == "tensors":
                ok = self.context.execute_async_v3(stream_handle=stream.handle)
            else:
                ok = self.context.execute_async_v2(
                    bindings=self._addresses, stream_handle=stream.handle
                )
            if not ok:
                raise InferenceError(f"TensorRT execution failed: {logger.errors_since(mark)}")
            for name in outputs:
                b = self.by_name[name]
                cuda.memcpy_dtoh_async(b.host, b.device, stream)
        finally:
            stream.synchronize()
        return {name: np.array(self.by_name[name].host, copy=True) for name in outputs}

    def device_memory_bytes(self) -> int:
        """The engine's activation memory (``device_memory_size_v2`` in TensorRT 10+)."""
        e = self.engine
        for attr in ("device_memory_size_v2", "device_memory_size"):
            with contextlib.suppress(Exception):
                v = getattr(e, attr, None)
                if v is not None:
                    return int(v)
        return 0

    def close(self) -> None:
        """Free buffers, context, engine and runtime (in that order)."""
        for b in self.bindings:
            with contextlib.suppress(Exception):
                b.device.free()
            with contextlib.suppress(Exception):
                b.host.base.free()
        self.bindings, self.by_name, self._addresses = [], {}, []
        self.stream = None
        self.context = None
        self.engine = None
        self.runtime = None


def _to_engine_dtype(arr: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """``arr`` (already checked against the model's dtype) in the engine's binding dtype.

    TensorRT 8 binds ONNX int64 tensors as int32; values that do not fit are an error,
    never wrapped.
    """
    if arr.dtype == dtype:
        return arr
    out = arr.astype(dtype)
    if np.issubdtype(dtype, np.integer) and not np.array_equal(out, arr):
        info = np.iinfo(dtype)
        raise InferenceError(
            f"input '{name}': values outside {dtype.name} [{info.min}, {info.max}], which "
            "this TensorRT binds the input as"
        )
    return out


# --------------------------------------------------------------------------- engines


class TensorRTEngine(Engine):
    """What the ``gpu`` and ``dla`` engines share: options, build / cache / load on the
    TensorRT path, inference and release.

    ``memory_mb`` is the device memory the load took: free device memory (``cuMemGetInfo``
    in the engine's context) before deserialising minus after the context and buffers
    exist. It is device-wide, so another process allocating at that moment counts too; on
    a Jetson the device memory is the shared DRAM.
    """

    _dla: ClassVar[bool] = False

    def __init__(self, model_path: Any, **options: Any) -> None:
        super().__init__(model_path, **options)
        self._signature: ModelSignature | None = None
        self._runner: TrtRunner | None = None
        self._device: CudaDevice | None = None
        self._infer_lock = threading.Lock()
        self._trt_info: dict[str, Any] = {}
        self._onnx_dtypes: dict[str, np.dtype] = {}

    # options that hold on every host
    def _check_options(self) -> None:
        if self.precision == "int8":
            sig = self._read_signature()
            if not sig.has_qdq:
                raise InferenceError(
                    f"precision int8 on engine '{self.kind}' needs calibration data: "
                    f"{self.model_path.name} has no QuantizeLinear / DequantizeLinear nodes, "
                    "and TensorRT's implicit INT8 quantization calibrates on representative "
                    "inputs, which this engine does not take",
                    hint="quantize the model with your calibration data first (Q/DQ nodes, e.g. "
                    "onnxruntime.quantization.quantize_static or NVIDIA's TensorRT Model "
                    "Optimizer) and load that, or use fp16",
                )

    def _read_signature(self) -> ModelSignature:
        if self._signature is None:
            self._signature = read_signature(self._model_file())
        return self._signature

    def _check_strong_typing(self, host: Mapping[str, Any], sig: ModelSignature) -> None:
        if self.precision == "fp16" and host.get("strongly_typed_only"):
            wider = sorted(sig.float_types - {"float16"})
            if wider:
                raise InferenceError(
                    f"TensorRT {host.get('version')} builds strongly typed networks (no FP16 "
                    f"builder flag): precision fp16 needs a model typed fp16, but "
                    f"{self.model_path.name} has {wider} tensors",
                    hint="convert the model to fp16 first (onnxconverter-common's "
                    "float16.convert_float_to_float16), or use precision fp32",
                )

    def _load_tensorrt(self) -> None:
        host = probe_tensorrt_host()
        trt, cuda = host["trt"], host["cuda"]
        path = self._model_file()
        sig = self._read_signature()
        self._check_strong_typing(host, sig)
        shapes = bind_shapes(sig.inputs, self.shapes)
        dla_core = self.device_index if self._dla else None
        if dla_core is not None and dla_core >= host.get("dla_cores", 0):
            raise InferenceError(
                f"DLA core {dla_core} does not exist: this host has {host.get('dla_cores', 0)} "
                f"(cores 0-{host.get('dla_cores', 0) - 1})"
            )
        device = CudaDevice(cuda, 0 if self._dla else self.device_index)
        spec = BuildSpec(
            precision=self.precision,
            shapes=tuple(sorted(shapes.items())),
            dla_core=dla_core,
            gpu_fallback=self.allow_gpu_fallback,
        )
        cache = EngineCache(
            self.cache_dir if self.cache_dir is not None else default_cache_dir(),
            key={
                "model_sha256": model_sha256(path, sig.data_files),
                "gpu": device.name,
                "compute_capability": device.compute_capability,
                "tensorrt": str(trt.__version__),
                "build": spec.to_dict(),
            },
            stem=path.stem,
        )
        runner: TrtRunner | None = None
        try:
            with device.active():
                plan, info = load_or_build(trt, path, spec, cache)
                free0 = device.mem_free()
                t0 = time.perf_counter()
                try:
                    runner = TrtRunner(trt, cuda, plan, dla_core=dla_core, shapes=shapes)
                    runner.open()
                except ModelLoadError as exc:
                    if not info["cache_hit"]:
                        raise
                    # a cached plan that no longer deserialises: rebuild it once
                    log.warning(
                        "cached engine %s unusable (%s); rebuilding", cache.engine_path, exc
                    )
                    if runner is not None:
                        runner.close()
                    cache.drop()
                    plan, info = load_or_build(trt, path, spec, cache, rebuild=True)
                    free0 = device.mem_free()
                    t0 = time.perf_counter()
                    runner = TrtRunner(trt, cuda, plan, dla_core=dla_core, shapes=shapes)
                    runner.open()
                deserialize_ms = (time.perf_counter() - t0) * 1e3
                free1 = device.mem_free()
                activation = runner.device_memory_bytes()
                self._check_io(sig, runner)
        except BaseException:
            if runner is not None:
                with device.active():
                    runner.close()
            device.release()
            raise
        self._device, self._runner = device, runner
        self._memory_mb = mib(free0 - free1)
        self._onnx_dtypes = {
            t.name: runner.by_name[t.name].dtype if t.name in sig.untyped else t.dtype
            for t in (*sig.inputs, *sig.outputs)
        }
        self._inputs = [TensorInfo(t.name, t.dtype, shapes[t.name]) for t in sig.inputs]
        self._outputs = [
            TensorInfo(t.name, self._onnx_dtypes[t.name], runner.by_name[t.name].shape)
            for t in sig.outputs
        ]
        self._trt_info = {
            "backend": "tensorrt",
            "tensorrt_version": str(trt.__version__),
            "device": device.name,
            "compute_capability": device.compute_capability,
            "cache_hit": bool(info["cache_hit"]),
            "engine_path": info["engine_path"],
            "build_ms": None if info["build_ms"] is None else round(float(info["build_ms"]), 1),
            "deserialize_ms": round(deserialize_ms, 1),
            "activation_mb": round(mib(activation), 3),
            "io_api": runner.api,
            "shapes": {k: list(v) for k, v in shapes.items()},
        }
        if self._dla:
            self._trt_info.update(
                dla_core=dla_core,
                allow_gpu_fallback=self.allow_gpu_fallback,
                fallback_layers=list(info["fallback_layers"]),
            )

    def _check_io(self, sig: ModelSignature, runner: TrtRunner) -> None:
        missing = [t.name for t in (*sig.inputs, *sig.outputs) if t.name not in runner.by_name]
        if missing:
            raise ModelLoadError(
                f"the TensorRT engine for {self.model_path.name} lacks tensors {missing} of the "
                "ONNX model (an input that is also an output, or an unused input?)",
                hint="run this model on engine 'cpu'",
            )

    def _infer_tensorrt(
        self, feeds: dict[str, np.ndarray], outputs: list[str]
    ) -> dict[str, np.ndarray]:
        runner, device = self._runner, self._device
        if runner is None or device is None:
            raise InferenceError(f"engine '{self.kind}' was closed")
        with self._infer_lock, device.active():
            raw = runner.run(feeds, outputs)
        out = {}
        for name, arr in raw.items():
            want = self._onnx_dtypes.get(name, arr.dtype)
            out[name] = arr if arr.dtype == want else arr.astype(want)
        return out

    def _close_tensorrt(self, runner: TrtRunner | None = None) -> None:
        runner = runner or self._runner
        device = self._device
        self._runner = None
        if runner is not None:
            if device is not None:
                with self._infer_lock, device.active():
                    runner.close()
            else:
                runner.close()
        if device is not None:
            device.release()
        self._device = None
        self._signature = None  # read again on the next load (the file may have changed)

    def _describe(self) -> dict[str, Any]:
        d = dict(self._trt_info)
        if self._dla and "fallback_layers" not in d:
            d["fallback_layers"] = None  # known after load
        return d
