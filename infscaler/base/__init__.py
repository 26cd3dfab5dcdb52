"""The shared base every layer may import: it imports nothing of the layers above it.

- :mod:`~infscaler.base.errors` -- :class:`InfScalerError` (message + hint) and its kinds
- :mod:`~infscaler.base.config` -- the pipeline YAML schema (pydantic) and its loader
- :mod:`~infscaler.base.device` -- device profiles (SoC, accelerators, memory cap, limits)
- :mod:`~infscaler.base.models` -- model names -> ONNX files (bundled wheels, synthetic models)
- :mod:`~infscaler.base.slo` -- SLO strings (``"30ms"``, ``"p99<50ms"``) parsed
- :mod:`~infscaler.base.security` -- the Unix socket's rules: peers, allowed function
  modules, model-file paths (enforced by the server *and* by the runtime's pipeline
  compiler, so it lives here rather than in the facade)
- :mod:`~infscaler.base.procutil` -- subprocess command lines for ``python -m`` helpers
- :mod:`~infscaler.engines` -- the engine layer (Polygraphy's ``backend/``): the one
  place that builds onnxruntime / TensorRT sessions, shared by the partitioner's profiler,
  model probing and the runtime's instances

Importing this package imports nothing heavy; each module imports its own dependencies
(onnxruntime and TensorRT only when an engine is built).
"""

#: The package version (also ``infscaler.__version__``; pyproject.toml's ``version``).
__version__ = "0.1.0"
