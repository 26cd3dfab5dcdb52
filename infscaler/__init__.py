"""InfScaler-Edge: an edge inference runtime for multi-accelerator SoCs.

Layers, imports pointing down, and where to start reading: docs/architecture.md
("Layout"); ``.importlinter`` is the contract.

Importing :mod:`infscaler` (and :mod:`infscaler.cli`) is cheap: heavy dependencies
(onnxruntime, onnx, matplotlib, TensorRT, aiohttp, httpx) are imported by the modules
that need them, and the CLI loads a command's module only when it runs.
"""

from infscaler.base import __version__
from infscaler.base.errors import InfScalerError

__all__ = ["InfScalerError", "__version__"]
