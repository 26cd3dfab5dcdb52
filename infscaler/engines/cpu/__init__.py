"""The ``cpu`` engine: onnxruntime's CPU execution provider on pinned cores.

Follows Polygraphy's onnxruntime backend (``polygraphy/backend/onnxrt/``: a session
loader, ``SessionFromOnnx``, and a runner, ``OnnxrtRunner``), with the settings InfScaler
needs for several single-model instances sharing a small CPU:

- ``intra_op_num_threads = threads``, ``inter_op_num_threads = 1``, ``ORT_SEQUENTIAL``:
  one operator at a time on the instance's own threads;
- ``graph_optimization_level = ORT_ENABLE_ALL``;
- ``session.intra_op.allow_spinning = "0"``: idle intra-op workers sleep instead of
  spinning. Measured in ``bench/HISTORY.md``: with spinning on, the workers of several
  sessions on a 2-core host steal the cores from each other (the chain of partitions took
  1.5-1.8x the whole model instead of 0.96-1.07x);
- ``cores`` pins the **whole process** with ``os.sched_setaffinity(0, cores)`` before the
  session (and so its thread pool) is created: InfScaler runs one engine per instance
  process.

More (details, why it is so, history, figures): docs/engines.md, "`infscaler/engines/cpu/__init__.py`".
"""

from infscaler.engines.cpu.loader import open_cpu_session, probe_cpu
from infscaler.engines.cpu.runner import CPUEngine

__all__ = ["CPUEngine", "open_cpu_session", "probe_cpu"]
