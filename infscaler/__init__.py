"""InfScaler-Edge: an edge inference runtime for multi-accelerator SoCs.

Sub-packages (see ``shared/DESIGN.md``):

- :mod:`infscaler.partitioner` -- offline bottleneck-aware partitioning (InfScaler §IV-A, Eq. 1)
- :mod:`infscaler.runtime` -- engines, instances, scaler (Algorithm 1)
- :mod:`infscaler.shm` -- token-based zero-copy tensor sharing (§IV-B)
- :mod:`infscaler.ebpf` -- the eBPF control path and its user-space fallback

Importing :mod:`infscaler` is cheap: heavy dependencies (onnxruntime, matplotlib,
TensorRT) are imported by the modules that need them.
"""

from infscaler.base.errors import InfScalerError

__version__ = "0.1.0"

__all__ = ["InfScalerError", "__version__"]
