"""The shared base every layer may import: it imports nothing of the layers above it.

Its modules: docs/architecture.md, "Layout".

Importing this package imports nothing heavy; each module imports its own dependencies
(onnxruntime and TensorRT only when an engine is built).
"""

#: The package version (also ``infscaler.__version__``; pyproject.toml's ``version``).
__version__ = "0.1.0"
