"""The ``cpu`` engine: onnxruntime's CPU execution provider on pinned cores, one operator
at a time on the instance's own threads, idle workers sleeping (no spinning), the whole
instance process pinned to ``cores``.

More (details, why it is so, history, figures): docs/engines.md, "`infscaler/engines/cpu/__init__.py`".
"""

from infscaler.engines.cpu.runner import CPUEngine

__all__ = ["CPUEngine"]
