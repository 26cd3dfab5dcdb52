"""Offline bottleneck-aware partitioner (InfScaler §IV-A, Eq. 1): :func:`partition_model`
(:mod:`.api`) runs loader -> cost -> profiler -> graph -> search -> extract -> plan; its
modules: docs/architecture.md, "Layout".
"""
