"""Latency statistics over sliding windows (P50 / P95 / P99), per pipeline and per unit.

Pure bookkeeping, no I/O: the front end feeds it from each request's trace (the
``__trace__`` rows every unit appends: unit, instance, start ns, end ns on
``CLOCK_MONOTONIC``), and the API / CLI read :meth:`PipelineStats.snapshot`. The field
names follow Triton's statistics extension where they overlap (``success``, ``fail``,
``queue``, ``compute_infer`` as count + ns), plus percentiles, which Triton users
otherwise compute from Prometheus.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable
from typing import Any

import numpy as np


class LatencyWindow:
    """The last ``size`` samples (ms) no older than ``horizon_s``, with totals.

    Args:
        size: samples kept. horizon_s: age limit of a sample, seconds.
    """

    def __init__(self, size: int = 2048, horizon_s: float = 60.0) -> None:
        self.size = size
        self.horizon_s = horizon_s
        self._t: collections.deque[float] = collections.deque(maxlen=size)
        self._ms: collections.deque[float] = collections.deque(maxlen=size)
        self.count = 0
        self.total_ms = 0.0

    def add(self, ms: float, now: float | None = None) -> None:
        self._t.append(time.monotonic() if now is None else now)
        self._ms.append(float(ms))
        self.count += 1
        self.total_ms += float(ms)

    def values(self, now: float | None = None, horizon_s: float | None = None) -> np.ndarray:
        """Samples (ms) no older than ``horizon_s`` (default: the window's own horizon)."""
        now = time.monotonic() if now is None else now
        cutoff = now - (self.horizon_s if horizon_s is None else min(horizon_s, self.horizon_s))
        return np.array([m for t, m in zip(self._t, self._ms, strict=True) if t >= cutoff])

    def summary(
        self, now: float | None = None, horizon_s: float | None = None, over_ms: float | None = None
    ) -> dict[str, Any]:
        """``count`` (all time), ``total_ms``, and over the window (or the last
        ``horizon_s`` s) ``window_count``, ``p50_ms``, ``p95_ms``, ``p99_ms``,
        ``mean_ms``, ``max_ms`` (None when empty); with ``over_ms`` also
        ``over_count``: the window's samples above it."""
        v = self.values(now, horizon_s)
        out: dict[str, Any] = {
            "count": self.count,
            "total_ms": round(self.total_ms, 3),
            "window_count": int(v.size),
        }
        if over_ms is not None:
            out["over_count"] = int((v > over_ms).sum())
        if v.size:
            p50, p95, p99 = np.percentile(v, [50, 95, 99])
            out.update(
                p50_ms=round(float(p50), 3),
                p95_ms=round(float(p95), 3),
                p99_ms=round(float(p99), 3),
                mean_ms=round(float(v.mean()), 3),
                max_ms=round(float(v.max()), 3),
            )
        else:
            out.update(p50_ms=None, p95_ms=None, p99_ms=None, mean_ms=None, max_ms=None)
        return out


class RateWindow:
    """Events per second over the last ``horizon_s`` seconds."""

    def __init__(self, horizon_s: float = 10.0) -> None:
        self.horizon_s = horizon_s
        self._t: collections.deque[float] = collections.deque()

    def add(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._t.append(now)
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._t and self._t[0] < now - self.horizon_s:
            self._t.popleft()

    def rate(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self._trim(now)
        return len(self._t) / self.horizon_s


class PipelineStats:
    """Per-pipeline request statistics and per-unit queue / compute times.

    Args:
        units: unit names in pipeline order.
    """

    def __init__(self, units: Iterable[str]) -> None:
        self.units = list(units)
        self._lock = threading.Lock()
        self.latency = LatencyWindow()
        self.arrivals = RateWindow()
        #: admitted and refused (shed / max_pending) requests: the offered load
        self.offered = RateWindow()
        #: requests refused at arrival because they could not meet the SLO
        self.slo_refused = RateWindow()
        self.success = 0
        self.fail: collections.Counter[int] = collections.Counter()
        self.rejected = 0
        #: wall-clock time of the last answered request (success or failure), ms since
        #: the epoch; 0: none yet (Triton's ``last_inference``)
        self.last_inference_ms = 0
        self.compute = [LatencyWindow() for _ in self.units]
        self.queue = [LatencyWindow() for _ in self.units]

    def offered_rate(self, now: float | None = None) -> float:
        """Requests/s offered (admitted and refused) over the last 10 s."""
        with self._lock:
            return self.offered.rate(now)

    def arrival(self) -> None:
        with self._lock:
            now = time.monotonic()
            self.arrivals.add(now)
            self.offered.add(now)

    def record_success(self, latency_ms: float, trace: np.ndarray | None, t_submit_ns: int) -> None:
        """A request answered: its end-to-end latency (ms) and the trace rows
        (``[unit, instance, start_ns, end_ns]``) of every unit that ran for it."""
        with self._lock:
            self.success += 1
            self.last_inference_ms = int(time.time() * 1e3)
            self.latency.add(latency_ms)
            self._record_trace(trace, t_submit_ns)

    def record_failure(self, status: int) -> None:
        with self._lock:
            self.fail[status] += 1
            self.last_inference_ms = int(time.time() * 1e3)

    def record_rejection(self, slo: bool = False) -> None:
        """A request refused before admission (queue bound, ``max_pending``, or with
        ``slo`` the SLO admission): it counts in the offered load, not in the arrivals."""
        with self._lock:
            self.rejected += 1
            now = time.monotonic()
            self.offered.add(now)
            if slo:
                self.slo_refused.add(now)

    def _record_trace(self, trace: np.ndarray | None, t_submit_ns: int) -> None:
        if trace is None or trace.size == 0:
            return
        rows = sorted(trace.tolist(), key=lambda r: r[2])
        prev_end: dict[int, int] = {}
        last_end = t_submit_ns
        for unit, _inst, start, end in rows:
            unit = int(unit)
            if not 0 <= unit < len(self.units):
                continue
            self.compute[unit].add((end - start) / 1e6)
            before = prev_end.get(unit - 1, last_end)
            self.queue[unit].add(max(0, start - before) / 1e6)
            prev_end[unit] = max(prev_end.get(unit, 0), end)
            last_end = end

    def totals(self) -> dict[str, Any]:
        """The all-time counters only, cheap (no percentiles; for a Prometheus scrape):
        ``success``, ``fail`` (status -> count), ``rejected``, ``latency_ms`` (sum over
        successes, ms), and per unit ``units``: ``[{"compute_count", "compute_ms",
        "queue_count", "queue_ms"}]`` (sums, ms)."""
        with self._lock:
            return {
                "success": self.success,
                "fail": dict(self.fail),
                "rejected": self.rejected,
                "latency_ms": self.latency.total_ms,
                "units": [
                    {
                        "compute_count": c.count,
                        "compute_ms": c.total_ms,
                        "queue_count": q.count,
                        "queue_ms": q.total_ms,
                    }
                    for c, q in zip(self.compute, self.queue, strict=True)
                ],
            }

    def snapshot(self) -> dict[str, Any]:
        """``{"success", "fail" (status -> count), "rejected", "arrival_rate_per_s",
        "latency": LatencyWindow.summary(), "units": [{"unit", "compute", "queue"}]}``."""
        with self._lock:
            return {
                "success": self.success,
                "fail": dict(self.fail),
                "rejected": self.rejected,
                "last_inference_ms": self.last_inference_ms,
                "arrival_rate_per_s": round(self.arrivals.rate(), 3),
                "latency": self.latency.summary(),
                "units": [
                    {
                        "unit": name,
                        "compute": self.compute[i].summary(),
                        "queue": self.queue[i].summary(),
                    }
                    for i, name in enumerate(self.units)
                ],
            }
