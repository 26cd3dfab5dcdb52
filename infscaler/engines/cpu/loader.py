"""What the ``cpu`` engine loads with: its availability check (onnxruntime's CPU
execution provider) and its session (the engine layer's onnxruntime loader with the cpu
engine's settings, :func:`infscaler.engines.onnxrt.loader.session_options`' defaults).
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from infscaler.engines.onnxrt.loader import CPU_PROVIDER, load_session

__all__ = ["open_cpu_session", "probe_cpu"]


def probe_cpu() -> tuple[bool, str]:
    """``(True, "onnxruntime <version> CPU EP")``, or ``(False, reason)`` when this
    onnxruntime has no CPU execution provider."""
    providers = ort.get_available_providers()
    if CPU_PROVIDER not in providers:
        return False, (
            f"onnxruntime {ort.__version__} has no {CPU_PROVIDER} (providers: {providers})"
            "; reinstall onnxruntime (pip install onnxruntime)"
        )
    return True, f"onnxruntime {ort.__version__} CPU EP"


def open_cpu_session(path: Path, threads: int) -> ort.InferenceSession:
    """The cpu engine's session of ``path`` on ``threads`` threads; raises as ``load_session``."""
    return load_session(path, engine="cpu", threads=threads)
