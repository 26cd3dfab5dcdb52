"""onnxruntime's profiler: per-node kernel times of a traced run, graph optimisations off
(c_n with ``measure="time"``, InfScaler §IV-A). Trace format (onnxruntime 1.31.1,
"Profiling tools"): docs/architecture.md, "`partitioner/profiler.py`".
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from infscaler.engines.onnxrt.loader import session_options
from infscaler.partitioner.sessions import ort_session, run_session
from infscaler.partitioner.weights import StubModel

_KERNEL_SUFFIX = "_kernel_time"
_RUN_EVENTS = ("model_run", "SequentialExecutor::Execute")


def node_times_from_trace(
    events: list[dict[str, Any]], node_names: list[str], skip_runs: int = 0
) -> tuple[dict[str, float], dict[str, float], list[float]]:
    """Per-node median ms per run from a parsed onnxruntime profile trace, the first
    ``skip_runs`` runs dropped.

    Returns:
        ``(node_ms, unmatched_ms, run_totals_ms)``: node name -> median ms (0.0 when unseen);
        kernel name -> median ms for kernels naming no node; each run's kernel total, ms.
    """
    kernels = [
        e
        for e in events
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith(_KERNEL_SUFFIX)
    ]
    runs: list[tuple[float, float]] = []
    for run_name in _RUN_EVENTS:
        runs = sorted(
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
            for e in events
            if e.get("cat") == "Session" and e.get("name") == run_name and "ts" in e
        )
        if runs:
            break

    per_run: list[dict[str, float]]  # run -> kernel name -> µs
    if runs:
        per_run = [{} for _ in runs]
        starts = [r[0] for r in runs]
        for e in kernels:
            ts = float(e.get("ts", 0))
            idx = int(np.searchsorted(starts, ts, side="right")) - 1
            if idx < 0 or ts > runs[idx][1]:
                continue  # outside every run (should not happen)
            name = str(e["name"])[: -len(_KERNEL_SUFFIX)]
            per_run[idx][name] = per_run[idx].get(name, 0.0) + float(e.get("dur", 0))
    else:
        per_run = []
        seen: dict[str, int] = {}
        for e in kernels:
            name = str(e["name"])[: -len(_KERNEL_SUFFIX)]
            k = seen.get(name, 0)
            seen[name] = k + 1
            while len(per_run) <= k:
                per_run.append({})
            per_run[k][name] = per_run[k].get(name, 0.0) + float(e.get("dur", 0))

    measured = per_run[skip_runs:]
    known = set(node_names)
    node_ms: dict[str, float] = {}
    for name in node_names:
        node_ms[name] = (
            statistics.median(r.get(name, 0.0) for r in measured) / 1000.0 if measured else 0.0
        )
    unmatched_names = sorted({n for r in measured for n in r if n not in known})
    unmatched_ms = {
        n: statistics.median(r.get(n, 0.0) for r in measured) / 1000.0 for n in unmatched_names
    }
    totals = [sum(r.values()) / 1000.0 for r in measured]
    return node_ms, unmatched_ms, totals


def read_trace(trace_file: str | None) -> list[dict[str, Any]]:
    """The events of the trace file ``trace_file`` (a JSON list, or a Chrome trace
    object's ``traceEvents``); [] when there is none or it cannot be read."""
    if not trace_file:
        return []
    try:
        data = json.loads(Path(trace_file).read_text())
    except (OSError, ValueError):
        return []
    if isinstance(data, dict):  # Chrome trace "object" form
        data = data.get("traceEvents", [])
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def traced_node_times(
    source: bytes | str | StubModel,
    names: list[str],
    feeds: dict[str, np.ndarray],
    engine: str,
    threads: int,
    warmup: int,
    repeats: int,
) -> tuple[dict[str, float], dict[str, float], list[float], dict[str, np.ndarray]]:
    """``warmup + repeats`` runs with ``ORT_DISABLE_ALL`` and the profiler on (trace in
    a temporary directory, deleted), read by :func:`node_times_from_trace`: its triple
    and the last run's outputs by name."""
    with tempfile.TemporaryDirectory(prefix="infscaler-prof-") as tmp:
        so = session_options(
            threads, optimization="none", profile_prefix=os.path.join(tmp, "trace")
        )
        sess = ort_session(source, engine, so)
        out_names = [o.name for o in sess.get_outputs()]
        trace_file: str | None = None
        values: list = []
        try:
            for _ in range(warmup + repeats):
                values = run_session(sess, feeds, engine)
        finally:
            try:
                trace_file = sess.end_profiling()
            except Exception:
                trace_file = None
            del sess
        events = read_trace(trace_file)
        if trace_file:
            Path(trace_file).unlink(missing_ok=True)
    outputs = dict(zip(out_names, values, strict=True))
    node_ms, unmatched_ms, totals = node_times_from_trace(events, names, skip_runs=warmup)
    return node_ms, unmatched_ms, totals, outputs
