"""Offline bottleneck-aware partitioner (InfScaler §IV-A, Eq. 1).

Pipeline: :mod:`.loader` (load, check, concrete shapes) -> :mod:`.cost` (operator
complexity c_n) -> :mod:`.profiler` (per-operator time per engine, T_o, T_p; the runs as
served in :mod:`.sessions`, onnxruntime's per-node trace read in :mod:`.ortrace`) ->
:mod:`.graph` (operators in topological order, valid cuts, crossing tensors) ->
:mod:`.search` (Eq. 1, exact dynamic programming) -> :mod:`.extract` (sub-models and
chain verification) -> :mod:`.plan` (plan directory). :func:`partition_model` in
:mod:`.api` runs them in order; :mod:`.weights` lets its onnxruntime sessions read the
weights from the model file instead of copying them.
"""
