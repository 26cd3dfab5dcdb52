"""The onnxruntime loader of the engine layer: every ``InferenceSession`` of InfScaler is
built by :func:`load_session`. Nothing here imports onnxruntime at import time (fork
servers fork from processes that import this module).

More: docs/engines.md, "`infscaler/engines/onnxrt/loader.py`".
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infscaler.base.errors import ConfigError, ModelLoadError
from infscaler.engines import engine_backend, require_engine
from infscaler.engines.base import EngineUnavailable

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = [
    "CPU_PROVIDER",
    "CUDA_PROVIDER",
    "OPTIMIZATION_LEVELS",
    "TRT_PROVIDER",
    "execution_providers",
    "gpu_provider_options",
    "load_session",
    "open_ort_session",
    "providers_for",
    "session_options",
]


CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
TRT_PROVIDER = "TensorrtExecutionProvider"

OPTIMIZATION_LEVELS: dict[str, str] = {
    "none": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
"""Graph optimisation levels by name -> the member of onnxruntime's
``GraphOptimizationLevel`` (see
https://onnxruntime.ai/docs/performance/model-optimizations/graph-optimizations.html).
``none`` keeps every ONNX node as it is (per-node profiling, bit-exact verification)."""

_EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


def session_options(
    threads: int | None = 1,
    *,
    optimization: str = "all",
    spinning: bool | None = False,
    profile_prefix: str | None = None,
    optimized_model_path: str | os.PathLike[str] | None = None,
    external_data_folder: str | os.PathLike[str] | None = None,
) -> ort.SessionOptions:
    """onnxruntime session options (defaults: the serving cpu engine's; errors-only logging).

    Args:
        threads: ``intra_op_num_threads`` (inter-op 1, sequential); None: onnxruntime's default.
        optimization: a key of :data:`OPTIMIZATION_LEVELS`.
        spinning: ``session.intra_op.allow_spinning`` (None: onnxruntime's default, on).
        profile_prefix: turn the profiler on, its trace under this prefix.
        optimized_model_path: write the optimised graph here.
        external_data_folder: the folder external-data references of a bytes model are
            relative to.

    Raises:
        ConfigError: ``threads < 1`` or an unknown ``optimization``.
    """
    if optimization not in OPTIMIZATION_LEVELS:
        raise ConfigError(
            f"unknown graph optimisation level {optimization!r}; levels are "
            f"{list(OPTIMIZATION_LEVELS)}"
        )
    import onnxruntime as ort  # on first use: importing this module stays cheap

    so = ort.SessionOptions()
    if threads is not None:
        if int(threads) < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, OPTIMIZATION_LEVELS[optimization]
    )
    if spinning is not None:
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_prefix)
    if optimized_model_path is not None:
        so.optimized_model_filepath = str(optimized_model_path)
    if external_data_folder is not None:
        so.add_session_config_entry(_EXTERNAL_FOLDER_KEY, str(external_data_folder))
    so.log_severity_level = 3
    return so


def execution_providers() -> list[str]:
    """The execution providers this onnxruntime install was built with
    (``onnxruntime.get_available_providers()``), for reports. Informational only: whether
    an engine runs here is :func:`~infscaler.engines.available`."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


def gpu_provider_options(
    backend: str,
    *,
    device_index: int = 0,
    precision: str = "fp32",
    cache_dir: str | os.PathLike[str] | None = None,
    gpu_fallback: bool = True,
) -> list[Any]:
    """The onnxruntime providers, with options, of a gpu / dla ``backend``: the CUDA EP (TF32
    off), the TensorRT EP (engine cache under ``<cache_dir>/onnxruntime-trt``, fp16 when
    asked) or the TensorRT EP on DLA core ``device_index`` (fp16), then CUDA (dla: when
    ``gpu_fallback``) and CPU.

    Raises:
        ConfigError: an unknown backend.
    """
    from infscaler.engines.tensorrt.cache import default_cache_dir

    cuda_index = 0 if backend == "onnxruntime-trt-dla" else int(device_index)
    cuda = (CUDA_PROVIDER, {"device_id": str(cuda_index), "use_tf32": "0"})
    if backend == "onnxruntime-cuda":
        return [cuda, CPU_PROVIDER]
    if backend not in ("onnxruntime-trt", "onnxruntime-trt-dla"):
        raise ConfigError(f"no onnxruntime providers for backend {backend!r}")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache = root / "onnxruntime-trt"
    cache.mkdir(parents=True, exist_ok=True)
    trt: dict[str, str] = {
        "device_id": str(cuda_index),
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": str(cache),
    }
    if backend == "onnxruntime-trt-dla":
        trt.update(trt_dla_enable="1", trt_dla_core=str(int(device_index)), trt_fp16_enable="1")
        return [(TRT_PROVIDER, trt), *([cuda] if gpu_fallback else []), CPU_PROVIDER]
    if precision == "fp16":
        trt["trt_fp16_enable"] = "1"
    return [(TRT_PROVIDER, trt), cuda, CPU_PROVIDER]


def providers_for(
    engine: str = "cpu",
    *,
    device_index: int = 0,
    precision: str = "fp32",
    cache_dir: str | os.PathLike[str] | None = None,
    gpu_fallback: bool = True,
) -> list[Any]:
    """The onnxruntime execution providers that run ``engine`` (cpu, or
    :func:`gpu_provider_options` of its onnxruntime backend).

    Raises:
        ConfigError: an unknown engine kind.
        EngineUnavailable: missing on this host, or served by native TensorRT.
    """

    require_engine(engine)
    kind = str(engine).lower()
    if kind == "cpu":
        return [CPU_PROVIDER]
    backend = engine_backend(kind)
    if backend in ("onnxruntime-cuda", "onnxruntime-trt", "onnxruntime-trt-dla"):
        return gpu_provider_options(
            backend, device_index=device_index, precision=precision,
            cache_dir=cache_dir, gpu_fallback=gpu_fallback,
        )  # fmt: skip
    raise EngineUnavailable(
        f"engine '{kind}' is served by {backend} on this host, not by an onnxruntime session",
        hint=f"run it through create_engine('{kind}', model_path)",
    )


def _model_label(model: Any) -> str:
    if isinstance(model, bytes | bytearray | memoryview):
        return f"in-memory model ({len(model)} bytes)"
    return str(model)


def load_session(
    model: str | os.PathLike[str] | bytes | Any,
    *,
    engine: str = "cpu",
    threads: int | None = 1,
    optimization: str = "all",
    spinning: bool | None = False,
    options: ort.SessionOptions | None = None,
    external_data_folder: str | os.PathLike[str] | None = None,
    device_index: int = 0,
    precision: str = "fp32",
    cache_dir: str | os.PathLike[str] | None = None,
    gpu_fallback: bool = True,
) -> ort.InferenceSession:
    """An onnxruntime session of ``model`` on ``engine`` (Polygraphy's ``SessionFromOnnx``).

    Args:
        model: an ``.onnx`` path, serialised bytes, or an ``onnx.ModelProto``.
        threads, optimization, spinning: as :func:`session_options` (unless ``options``).
        options: ready ``SessionOptions``; ``external_data_folder`` is still applied.
        device_index: the CUDA device for ``gpu``, the DLA core for ``dla``.
        precision, cache_dir, gpu_fallback: :func:`gpu_provider_options`.

    Raises:
        ConfigError: an unknown engine, optimisation level or ``threads < 1``.
        EngineUnavailable: the engine is missing, not served by onnxruntime, or its
            provider failed to start.
        ModelLoadError: onnxruntime cannot read or run the model (its message).
    """
    providers = providers_for(
        engine, device_index=device_index, precision=precision,
        cache_dir=cache_dir, gpu_fallback=gpu_fallback,
    )  # fmt: skip
    if options is None:
        options = session_options(
            threads, optimization=optimization, spinning=spinning,
            external_data_folder=external_data_folder,
        )  # fmt: skip
    elif external_data_folder is not None:
        try:
            current = options.get_session_config_entry(_EXTERNAL_FOLDER_KEY)
        except RuntimeError:  # not set
            current = None
        if current != str(external_data_folder):  # (setting it twice logs a warning)
            options.add_session_config_entry(_EXTERNAL_FOLDER_KEY, str(external_data_folder))
    if hasattr(model, "SerializeToString"):
        try:
            model = model.SerializeToString()
        except ValueError as exc:  # protobuf refuses > 2 GB
            raise ModelLoadError(
                f"the model is too large to serialise in memory ({exc})",
                hint="pass the model's file path instead of a ModelProto",
            ) from None
    source = bytes(model) if isinstance(model, bytearray | memoryview) else model
    if not isinstance(source, bytes):
        source = str(Path(source))
    session = open_ort_session(source, options, providers, _model_label(model))
    first = providers[0][0] if isinstance(providers[0], tuple) else providers[0]
    if str(engine).lower() != "cpu" and session.get_providers()[:1] != [first]:
        raise EngineUnavailable(
            f"onnxruntime could not start {first} for engine '{engine}' (device / core "
            f"{device_index}) "
            f"(session providers: {session.get_providers()}); see onnxruntime's log",
            hint="check that the CUDA, cuDNN (and TensorRT) versions match the onnxruntime-gpu "
            "build",
        )
    return session


def open_ort_session(
    source: str | bytes, options: ort.SessionOptions, providers: Sequence[Any], label: str
) -> ort.InferenceSession:
    import onnxruntime as ort

    try:
        return ort.InferenceSession(source, sess_options=options, providers=list(providers))
    except Exception as exc:  # onnxruntime raises its own pybind exception types
        msg = str(exc).strip()
        kind = type(exc).__name__
        if "INVALID_PROTOBUF" in msg or kind == "InvalidProtobuf":
            what = "is not a readable ONNX model (protobuf parsing failed: not ONNX, or truncated)"
        elif "NOT_IMPLEMENTED" in msg or kind == "NotImplemented":
            what = "uses an operator onnxruntime does not implement"
        else:
            what = "cannot be loaded by onnxruntime"
        raise ModelLoadError(
            f"model {label} {what} (onnxruntime {ort.__version__}): {msg}",
            hint="check the file with `infscaler inspect` or onnx.checker.check_model",
        ) from exc
