"""InfScaler-Edge: an edge inference runtime for multi-accelerator SoCs.

Layers, imports pointing down: facade (:mod:`infscaler.cli` -> :mod:`infscaler.api`,
:mod:`infscaler.service`; :mod:`infscaler.pipelines`) -> :mod:`infscaler.modelless` ->
:mod:`infscaler.runtime` -> :mod:`infscaler.shm`, :mod:`infscaler.partitioner` ->
:mod:`infscaler.ebpf` -> :mod:`infscaler.engines` -> :mod:`infscaler.base` ->
:mod:`infscaler.proto`. ``.importlinter`` is the contract
(``tests/integration/test_layers.py``); docs/architecture.md is the map (each folder's
role, the request path step by step).

Where to start reading: ``README.md``; then :class:`~infscaler.service.service.Service`
(``deploy``) and :mod:`infscaler.runtime.serving.pipeline` (what a pipeline compiles to).

Importing :mod:`infscaler` (and :mod:`infscaler.cli`) is cheap: heavy dependencies
(onnxruntime, onnx, matplotlib, TensorRT, aiohttp, httpx) are imported by the modules
that need them, and the CLI loads a command's module only when it runs.
"""

from infscaler.base import __version__
from infscaler.base.errors import InfScalerError

__all__ = ["InfScalerError", "__version__"]
