"""The engine interface shared by the CPU, GPU and DLA backends, modelled on Polygraphy's
runners (``polygraphy/backend/base/runner.py``): cheap construction, :meth:`Engine.load`
(``activate``), :meth:`Engine.infer` on ``{name: ndarray}`` dicts, :meth:`Engine.close`
(``deactivate``), a context manager. Feeds are checked, never cast. Heavy dependencies are
imported inside :meth:`Engine.load` / :meth:`Engine.availability`, never at import time.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from infscaler.base.errors import InfScalerError, ModelLoadError

log = logging.getLogger("infscaler.engines")

ENGINE_KINDS: tuple[str, ...] = ("cpu", "gpu", "dla")
"""Engine kinds: the host CPU (onnxruntime), the GPU (TensorRT or onnxruntime's CUDA EP),
a Jetson's DLA core (TensorRT)."""

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8")
"""Every precision an engine may be asked for; :attr:`Engine.precisions` says which of
them an engine runs on this host."""

_MIB = 1024.0 * 1024.0


class EngineUnavailable(InfScalerError):
    """This host lacks what the engine needs; the message is :meth:`Engine.availability`'s reason."""


def unavailable(kind: str, reason: str) -> EngineUnavailable:
    """The :class:`EngineUnavailable` for engine ``kind`` missing for ``reason`` (one
    message for :meth:`Engine.load` and :func:`~infscaler.engines.require_engine`)."""
    return EngineUnavailable(
        f"engine '{kind}' is not available on this host: {reason}",
        hint="use an engine this host has (`engine_availability()`), e.g. 'cpu'",
    )


class InferenceError(InfScalerError):
    """Bad feeds (unknown / missing input, wrong dtype, rank or fixed dimension: the
    message names the input with expected vs got), an option the engine cannot honour
    (precision, cores, shapes), or a failure while running the model."""


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output: ``name``, numpy ``dtype`` (``object`` for strings) and ``shape``
    (an ``int`` per dimension, ``None`` where dynamic).
    """

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(
            self,
            "shape",
            tuple(
                int(d)
                if isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0
                else None
                for d in self.shape
            ),
        )

    @property
    def is_dynamic(self) -> bool:
        """True when some dimension is ``None``."""
        return any(d is None for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form: ``{"name", "dtype": "float32", "shape": [None, 3, 48, 192]}``."""
        return {"name": self.name, "dtype": self.dtype.name, "shape": list(self.shape)}

    def __str__(self) -> str:
        return f"'{self.name}' {self.dtype.name} {format_shape(self.shape)}"


def format_shape(shape: Sequence[int | None]) -> str:
    """``[?, 3, 48, 192]``: a shape with ``?`` for dynamic dimensions."""
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


class _ClassProperty:
    """A read-only attribute computed from the class, readable on the class and on its
    instances (``CPUEngine.precisions`` and ``engine.precisions``)."""

    def __init__(self, fget: Any) -> None:
        self.fget = fget
        self.__doc__ = fget.__doc__

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        return self.fget(cls if cls is not None else type(obj))


_AVAILABILITY: dict[type, tuple[bool, str]] = {}
_AVAILABILITY_LOCK = threading.Lock()


def process_memory_bytes() -> int:
    """This process's unique set size (USS: pages no other process shares), or its RSS
    where USS cannot be read. Bytes; 0 when psutil cannot tell."""
    try:
        import psutil

        proc = psutil.Process()
        try:
            return int(proc.memory_full_info().uss)
        except (psutil.AccessDenied, AttributeError, OSError):
            return int(proc.memory_info().rss)
    except Exception:  # noqa: BLE001 - a measurement, never a reason to fail a load
        return 0


def pin_process(cores: Sequence[int]) -> list[int]:
    """Pin the calling process (all its threads) to ``cores``; returns the sorted core list.

    Raises:
        InferenceError: a core missing on this host or outside this process's cpuset.
    """
    wanted = sorted({int(c) for c in cores})
    n = os.cpu_count() or 1
    missing = [c for c in wanted if c < 0 or c >= n]
    if missing:
        raise InferenceError(
            f"cores {missing} do not exist on this host (it has cores 0-{n - 1})",
            hint="pick cores from the device profile's core set",
        )
    if not hasattr(os, "sched_setaffinity"):
        log.warning("this platform cannot pin threads to cores; cores=%s ignored", wanted)
        return wanted
    try:
        os.sched_setaffinity(0, wanted)
    except OSError as exc:
        allowed = sorted(os.sched_getaffinity(0))
        raise InferenceError(
            f"cannot pin this process to cores {wanted}: {exc.strerror or exc}; "
            f"this process may use cores {allowed}",
            hint="the cores must be inside this process's cgroup cpuset",
        ) from exc
    return wanted


class Engine(ABC):
    """One model on one engine: load, infer, close (a Polygraphy-style runner).

    Args:
        model_path: the ``.onnx`` file.
        threads: intra-op threads (default ``len(cores)``, or 1).
        cores: CPU cores to pin the whole process to at :meth:`load`.
        precision: ``fp32``, ``fp16`` or ``int8`` (see :attr:`precisions`).
        device_index: the CUDA device (gpu) or the DLA core (dla).
        cache_dir: TensorRT engine cache (default ``$INFSCALER_CACHE_DIR/engines``).
        shapes: ``{input: concrete shape}`` for dynamic inputs (TensorRT's profile).
        allow_gpu_fallback: dla only: layers the DLA cannot run go to the GPU.

    The constructor only stores the options. :meth:`infer` is thread-safe; :meth:`load` /
    :meth:`close` are not.
    """

    kind: ClassVar[str]

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        threads: int | None = None,
        cores: Sequence[int] | None = None,
        precision: str = "fp32",
        device_index: int = 0,
        cache_dir: Path | None = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        allow_gpu_fallback: bool = True,
    ) -> None:
        self.model_path = Path(model_path)
        self.cores: list[int] | None = list(cores) if cores else None
        self.threads = int(threads) if threads is not None else (len(self.cores or ()) or 1)
        self.precision = str(precision).lower()
        self.device_index = int(device_index)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.shapes: dict[str, tuple[int, ...]] = {
            str(k): tuple(int(d) for d in v) for k, v in (shapes or {}).items()
        }
        self.allow_gpu_fallback = bool(allow_gpu_fallback)
        self._loaded = False
        self._lock = threading.RLock()
        self._inputs: list[TensorInfo] = []
        self._outputs: list[TensorInfo] = []
        self._memory_mb: float | None = None
        self._load_ms: float | None = None

    # ----------------------------------------------------------------- availability

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        """``(True, what runs it)`` or ``(False, reason naming what is missing)``; cached per process."""
        with _AVAILABILITY_LOCK:
            if cls not in _AVAILABILITY:
                try:
                    _AVAILABILITY[cls] = cls._probe()
                except Exception as exc:  # noqa: BLE001 - a probe must answer, not raise
                    _AVAILABILITY[cls] = (False, f"probing failed: {type(exc).__name__}: {exc}")
            return _AVAILABILITY[cls]

    @classmethod
    @abstractmethod
    def _probe(cls) -> tuple[bool, str]:
        """Find out once whether the host runs this engine (see :meth:`availability`)."""
        raise NotImplementedError

    @classmethod
    def _host_precisions(cls) -> tuple[str, ...]:
        return ()

    @_ClassProperty
    def precisions(cls) -> tuple[str, ...]:  # noqa: N805 - a class-level property
        """Precisions this engine runs on this host (``()`` when it is unavailable)."""
        return cls._host_precisions() if cls.availability()[0] else ()

    # ----------------------------------------------------------------- lifecycle

    def load(self) -> Engine:
        """Check the options, pin the cores and load the model (once); returns ``self``.

        Raises:
            EngineUnavailable: this host lacks the engine.
            ModelLoadError: the model file is missing or invalid, or cannot be built / loaded.
            InferenceError: an option the engine cannot honour (precision, cores, threads, shapes).
        """
        with self._lock:
            if self._loaded:
                return self
            self._check_common_options()
            self._check_options()
            ok, reason = self.availability()
            if not ok:
                raise unavailable(self.kind, reason)
            if self.precision not in self.precisions:
                raise InferenceError(
                    f"engine '{self.kind}' does not run precision '{self.precision}' on "
                    f"this host; it runs {list(self.precisions)}",
                    hint=self._precision_hint(),
                )
            if self.cores:
                self.cores = pin_process(self.cores)
            t0 = time.perf_counter()
            self._load()
            self._load_ms = (time.perf_counter() - t0) * 1e3
            self._loaded = True
            log.debug("loaded %s on %s in %.1f ms", self.model_path, self.kind, self._load_ms)
            return self

    def _check_common_options(self) -> None:
        if self.threads < 1:
            raise InferenceError(f"threads must be >= 1, got {self.threads}")
        if self.precision not in PRECISIONS:
            raise InferenceError(
                f"unknown precision '{self.precision}'; precisions are {list(PRECISIONS)}"
            )
        if self.device_index < 0:
            raise InferenceError(f"device_index must be >= 0, got {self.device_index}")

    def _check_options(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Engine-specific checks that hold on every host (run before availability)."""

    def _precision_hint(self) -> str | None:
        return None

    @abstractmethod
    def _load(self) -> None:
        """Load the model; fill ``_inputs``, ``_outputs`` and ``_memory_mb``."""

    def infer(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run the model once on ``feeds`` (every input, exact dtype, rank and fixed dims).

        Returns:
            ``{output name: array}`` for ``outputs`` (default all), arrays the caller owns.

        Raises:
            InferenceError: not loaded / closed, bad feeds or output names, or the runtime failed.
        """
        if not self._loaded:
            raise InferenceError(
                f"engine '{self.kind}' for {self.model_path.name} is not loaded",
                hint="call load() first, or use the engine as a context manager",
            )
        wanted = self._check_output_names(outputs)
        arrays = check_feeds(self._inputs, feeds)
        if not wanted:
            return {}
        return self._infer(arrays, wanted)

    @abstractmethod
    def _infer(self, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """Run on checked feeds; return owned arrays for ``outputs``."""

    def close(self) -> None:
        """Release the model and its buffers; a second call does nothing. The engine
        can be loaded again afterwards."""
        with self._lock:
            if not self._loaded:
                return
            try:
                self._close()
            finally:
                self._loaded = False

    @abstractmethod
    def _close(self) -> None:
        """Release what :meth:`_load` took."""

    def __enter__(self) -> Engine:
        return self.load()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # best effort: device buffers must not outlive the engine
        try:
            if getattr(self, "_loaded", False) and not sys.is_finalizing():
                self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass

    # ----------------------------------------------------------------- metadata

    @property
    def loaded(self) -> bool:
        """True between :meth:`load` and :meth:`close`."""
        return self._loaded

    @property
    def inputs(self) -> list[TensorInfo]:
        """The model's inputs, in model order (after :meth:`load`)."""
        self._require_loaded("inputs")
        return list(self._inputs)

    @property
    def outputs(self) -> list[TensorInfo]:
        """The model's outputs, in model order (after :meth:`load`)."""
        self._require_loaded("outputs")
        return list(self._outputs)

    @property
    def memory_mb(self) -> float:
        """Measured footprint of the loaded model in MiB (0.0 before :meth:`load`): host
        USS growth across the load for cpu, device memory taken by the load for gpu/dla
        (see each engine)."""
        return float(self._memory_mb or 0.0)

    def describe(self) -> dict[str, Any]:
        """What runs, JSON-serialisable: ``kind``, ``model``, ``precision``, ``threads``, ``cores``,
        ``device_index``, ``loaded``, ``memory_mb``, ``load_ms``, ``inputs`` / ``outputs``, plus
        engine specifics.
        """
        d: dict[str, Any] = {
            "kind": self.kind,
            "model": str(self.model_path),
            "precision": self.precision,
            "threads": self.threads,
            "cores": list(self.cores) if self.cores else None,
            "device_index": self.device_index,
            "loaded": self._loaded,
            "memory_mb": None if self._memory_mb is None else round(self._memory_mb, 3),
            "load_ms": None if self._load_ms is None else round(self._load_ms, 3),
        }
        if self._loaded:
            d["inputs"] = [t.to_dict() for t in self._inputs]
            d["outputs"] = [t.to_dict() for t in self._outputs]
        d.update(self._describe())
        return d

    def _describe(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        state = "loaded" if self._loaded else "not loaded"
        return f"<{type(self).__name__} {self.model_path.name} {self.precision} ({state})>"

    # ----------------------------------------------------------------- helpers

    def _require_loaded(self, what: str) -> None:
        if not self._loaded:
            raise InferenceError(
                f"{what} of engine '{self.kind}' are known after load()",
                hint="call load() first",
            )

    def _model_file(self) -> Path:
        """The model path, checked to be a readable file."""
        p = self.model_path
        if not p.exists():
            raise ModelLoadError(f"model file not found: {p}")
        if not p.is_file():
            raise ModelLoadError(f"model path is not a file: {p}")
        if not os.access(p, os.R_OK):
            raise ModelLoadError(f"model file is not readable: {p}")
        return p

    def _check_output_names(self, outputs: Sequence[str] | None) -> list[str]:
        names = [t.name for t in self._outputs]
        if outputs is None:
            return names
        if isinstance(outputs, str):
            outputs = [outputs]
        unknown = [o for o in outputs if o not in names]
        if unknown:
            raise InferenceError(
                f"unknown output {', '.join(repr(u) for u in unknown)}; "
                f"the model's outputs are {names}"
            )
        return list(dict.fromkeys(outputs))


def _dtype_ok(expected: np.dtype, got: np.dtype) -> bool:
    if expected == got:
        return True
    # ONNX strings are object arrays in onnxruntime; accept numpy's str / bytes / object.
    return expected == np.dtype(object) and got.kind in "OUS"


def check_feeds(specs: Sequence[TensorInfo], feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``feeds`` as ``{name: ndarray}`` in ``specs`` order, checked without casting.

    Raises:
        InferenceError: an unknown or missing input, or a dtype, rank or fixed dimension
            differing (expected vs got).
    """
    if not isinstance(feeds, Mapping):
        raise InferenceError(
            f"feeds must be a mapping of input name to array, got {type(feeds).__name__}"
        )
    by_name = {t.name: t for t in specs}
    unknown = [k for k in feeds if k not in by_name]
    if unknown:
        raise InferenceError(
            f"unknown input {', '.join(repr(u) for u in unknown)}; the model's inputs are "
            + ", ".join(str(t) for t in specs)
        )
    missing = [t for t in specs if t.name not in feeds]
    if missing:
        raise InferenceError(
            "missing input " + ", ".join(str(t) for t in missing) + " (every input is required)"
        )
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        value = feeds[spec.name]
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        got = f"got {arr.dtype.name} {format_shape(arr.shape)}"
        want = f"expected {spec.dtype.name} {format_shape(spec.shape)}"
        if not _dtype_ok(spec.dtype, arr.dtype):
            raise InferenceError(
                f"input '{spec.name}': dtype {arr.dtype.name} but the model takes "
                f"{spec.dtype.name} ({want}, {got}); cast it explicitly",
            )
        if arr.ndim != len(spec.shape):
            raise InferenceError(
                f"input '{spec.name}': rank {arr.ndim} but the model takes rank "
                f"{len(spec.shape)} ({want}, {got})"
            )
        for axis, (w, g) in enumerate(zip(spec.shape, arr.shape, strict=True)):
            if w is not None and w != g:
                raise InferenceError(
                    f"input '{spec.name}': dimension {axis} is {g} but the model takes "
                    f"{w} ({want}, {got})"
                )
        out[spec.name] = arr
    return out


def mib(nbytes: float) -> float:
    """Bytes to MiB, never negative (a measured growth may be below zero when memory was
    returned to the OS during the load)."""
    return max(0.0, float(nbytes) / _MIB)
