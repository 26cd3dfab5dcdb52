"""What the ``dla`` engine loads with: its availability check (:func:`probe_dla`: TensorRT,
pycuda, a CUDA device and DLA cores). The engine is built and cached by
:mod:`infscaler.engines.tensorrt.loader` with the DLA settings of the
:class:`~infscaler.engines.tensorrt.loader.BuildSpec` (``dla_core``, ``gpu_fallback``).
"""

from __future__ import annotations

from infscaler.engines.tensorrt.loader import DLA_ONLY_ON_JETSON, probe_tensorrt_host

__all__ = ["probe_dla"]


def probe_dla() -> tuple[bool, str]:
    """``(True, "TensorRT <version>, <n> DLA core(s) beside <GPU>")``, or ``(False, reason)``
    (what TensorRT lacks, or that the host has no DLA core)."""
    host = probe_tensorrt_host()
    if host["missing"]:
        return False, "; ".join(host["missing"]) + f"; {DLA_ONLY_ON_JETSON}"
    n = int(host.get("dla_cores", 0))
    if n <= 0:
        return False, (
            f"no DLA cores: {DLA_ONLY_ON_JETSON} (TensorRT {host['version']} on "
            f"{host['devices'][0]} reports builder.num_DLA_cores == 0)"
        )
    return True, f"TensorRT {host['version']}, {n} DLA core(s) beside {host['devices'][0]}"
