"""The TensorRT loader of the ``gpu`` and ``dla`` engines (Polygraphy's
``backend/trt/loader.py``; TensorRT 8.x / 10.x Python API): :func:`build_serialized_engine`,
:func:`load_or_build`, :func:`probe_tensorrt_host`.

More: docs/engines.md, "`infscaler/engines/tensorrt/loader.py`".
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infscaler.base.errors import ModelLoadError
from infscaler.engines.base import InferenceError, TensorInfo, format_shape
from infscaler.engines.tensorrt.cache import EngineCache
from infscaler.engines.tensorrt.cuda import CudaDevice, cuda_devices

__all__ = [
    "PYCUDA_MISSING",
    "TRT_MISSING",
    "WORKSPACE_BYTES",
    "BuildSpec",
    "ModelSignature",
    "bind_shapes",
    "build_serialized_engine",
    "import_pycuda",
    "import_tensorrt",
    "load_or_build",
    "network_flags",
    "probe_tensorrt_host",
    "read_signature",
    "trt_logger",
    "trt_version",
]

log = logging.getLogger("infscaler.engines.tensorrt")

WORKSPACE_BYTES = 1 << 30
"""TensorRT builder workspace limit (``MemoryPoolType.WORKSPACE``): 1 GiB, which fits the
smallest Jetson (Orin Nano 4 GB) next to the runtime."""

TRT_MISSING = (
    "tensorrt is not installed (pip install tensorrt, or JetPack's python3-libnvinfer on a Jetson)"
)
PYCUDA_MISSING = "pycuda is not installed (pip install pycuda; it needs the CUDA toolkit)"
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
    """What this host has for TensorRT (once per process): ``trt`` / ``cuda``, ``devices``,
    ``missing`` reasons, and with all three ``version``, ``fast_fp16``, ``fast_int8``,
    ``dla_cores``, ``strongly_typed_only``.
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
    """What the ONNX file says: ``inputs`` / ``outputs``, ``op_types`` (subgraphs included),
    ``float_types``, ``data_files`` (external data) and ``untyped`` outputs.
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
        ModelLoadError: not a readable ONNX model, or an input that is not a shaped tensor.
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


def bind_shapes(
    inputs: Sequence[TensorInfo], shapes: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    """The concrete shape of every input (``shapes[name]`` for dynamic ones; min = opt = max).

    Raises:
        InferenceError: an unknown or missing input, or a rank / fixed dim that differs or < 1.
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
    """Everything that changes the built engine (all in the cache key): ``precision``, ``shapes``,
    ``dla_core`` (None: GPU), ``gpu_fallback``, ``workspace_bytes``.
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
    """Build a TensorRT engine from an ONNX file (the device's context current).

    Returns:
        The serialised engine, and ``build_ms``, ``num_layers``, ``fallback_layers`` (DLA).

    Raises:
        ModelLoadError: the parser's or the build's errors.
        InferenceError: a shape-tensor input, or DLA-rejected layers without GPU fallback.
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


def load_or_build(
    trt: Any, model_path: Path, spec: BuildSpec, cache: EngineCache, *, rebuild: bool = False
) -> tuple[bytes, dict[str, Any]]:
    """The serialised engine from the cache, or built and cached; with ``cache_hit``,
    ``engine_path``, ``build_ms``, ``fallback_layers``.
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
