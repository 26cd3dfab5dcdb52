"""The TensorRT runner of the ``gpu`` and ``dla`` engines (Polygraphy's
``backend/trt/runner.py``) and :class:`TensorRTEngine`, what the two engines share. Nothing
here imports tensorrt or pycuda at import.

More: docs/engines.md, "`infscaler/engines/tensorrt/runner.py`".
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from infscaler.engines.tensorrt.cache import EngineCache, default_cache_dir, model_sha256
from infscaler.engines.tensorrt.cuda import CudaDevice
from infscaler.engines.tensorrt.loader import (
    BuildSpec,
    ModelSignature,
    bind_shapes,
    load_or_build,
    probe_tensorrt_host,
    read_signature,
    trt_logger,
)

__all__ = ["TensorRTEngine", "TrtRunner"]

log = logging.getLogger("infscaler.engines.tensorrt")


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
    """A deserialised ``plan``, its execution context, buffers and stream; every method runs with
    the engine's CUDA context current. ``dla_core``: ``IRuntime.DLA_core`` or None; ``shapes``:
    every input's concrete shape (one profile).
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
            ModelLoadError: the plan does not deserialise, no context, a data-dependent output
                shape, or a tensor type numpy lacks.
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
        """Copy ``feeds`` in, execute, copy ``outputs`` out; new arrays in the engine's dtypes.

        Raises:
            InferenceError: a value beyond the engine's narrower type (int64 on TensorRT 8), or
                the execution failed.
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
    """``arr`` in the engine's binding dtype (int64 -> int32 on TensorRT 8; overflow is an error)."""
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
    """What the ``gpu`` and ``dla`` engines share on the TensorRT path. ``memory_mb``: the
    device-wide free memory the load took (``cuMemGetInfo``).
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
