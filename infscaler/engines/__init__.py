"""Inference engines: one interface (load, infer, close; a Polygraphy-style runner) over the
``cpu``, ``gpu`` and ``dla`` kinds, each served by the backends of docs/engines.md,
"Backends" (the table of what runs each kind and its precisions).

More: docs/engines.md, "`infscaler/engines/__init__.py`".
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from infscaler.base.errors import ConfigError
from infscaler.engines.base import (
    ENGINE_KINDS,
    PRECISIONS,
    Engine,
    EngineUnavailable,
    InferenceError,
    TensorInfo,
    unavailable,
)

if TYPE_CHECKING:
    from infscaler.engines.cpu.runner import CPUEngine
    from infscaler.engines.dla.runner import DLAEngine
    from infscaler.engines.gpu.runner import GPUEngine

__all__ = [
    "ENGINE_KINDS",
    "PRECISIONS",
    "CPUEngine",
    "DLAEngine",
    "Engine",
    "EngineUnavailable",
    "GPUEngine",
    "InferenceError",
    "TensorInfo",
    "create_engine",
    "available",
    "engine_availability",
    "engine_backend",
    "engine_class",
    "require_engine",
]

_CLASSES = {"cpu": ("cpu", "CPUEngine"), "gpu": ("gpu", "GPUEngine"), "dla": ("dla", "DLAEngine")}


def engine_class(kind: str) -> type[Engine]:
    """The engine class for ``kind`` (one of :data:`ENGINE_KINDS`), whether or not this host has it.

    Raises:
        ConfigError: an unknown kind.
    """
    key = str(kind).lower()
    if key not in _CLASSES:
        raise ConfigError(
            f"unknown engine kind {kind!r}; engine kinds are {list(ENGINE_KINDS)}",
            hint="use cpu, gpu or dla",
        )
    module, name = _CLASSES[key]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def create_engine(kind: str, model_path: Any, **options: Any) -> Engine:
    """A new, unloaded ``engine_class(kind)(model_path, **options)``; ConfigError for an unknown kind."""
    return engine_class(kind)(model_path, **options)


def available(kind: str) -> tuple[bool, str]:
    """``(True, what runs it)`` or ``(False, reason)`` for engine ``kind`` (unknown kinds too);
    probed once per process; never raises.
    """
    key = str(kind).lower()
    if key not in _CLASSES:
        return False, f"unknown engine {kind!r}; engine kinds are {list(ENGINE_KINDS)}"
    return engine_class(key).availability()


def require_engine(kind: str) -> None:
    """Raise ConfigError (unknown kind) or EngineUnavailable (with :func:`available`'s reason)
    unless this host runs engine ``kind``.
    """
    engine_class(kind)  # ConfigError for an unknown kind
    ok, reason = available(kind)
    if not ok:
        raise unavailable(str(kind).lower(), reason)


def engine_backend(kind: str) -> str | None:
    """What serves ``kind`` here: ``onnxruntime-cpu``; ``onnxruntime-trt``, ``tensorrt`` or
    ``onnxruntime-cuda``; ``onnxruntime-trt-dla`` or ``tensorrt-dla``; None when missing.

    Raises:
        ConfigError: an unknown kind.
    """
    cls = engine_class(kind)
    if not cls.availability()[0]:
        return None
    if cls.kind == "cpu":
        return "onnxruntime-cpu"
    return cls.backend()  # type: ignore[attr-defined]


def engine_availability() -> dict[str, tuple[bool, str]]:
    """``{kind: (available, reason)}`` for every kind in :data:`ENGINE_KINDS`
    (:func:`available` of each)."""
    return {kind: available(kind) for kind in ENGINE_KINDS}


def __getattr__(name: str) -> Any:  # CPUEngine / GPUEngine / DLAEngine, imported on use
    for kind, (_, cls_name) in _CLASSES.items():
        if name == cls_name:
            return engine_class(kind)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
