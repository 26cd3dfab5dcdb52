"""Latency statistics over sliding windows (P50 / P95 / P99), per pipeline and per unit.

Pure bookkeeping, no I/O: the front end feeds it from each request's trace (the
``__trace__`` rows every unit appends: unit, instance, start ns, end ns on
``CLOCK_MONOTONIC``), and the API / CLI read :meth:`PipelineStats.snapshot`. The field
names follow Triton's statistics extension where they overlap (``success``, ``fail``,
``queue``, ``compute_infer`` as count + ns), plus percentiles, which Triton users
otherwise compute from Prometheus. The counters are the pipeline's, over its life
(:class:`PipelineLife`, shared by each configuration's :class:`PipelineStats`); the
windows are the configuration's that serves.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
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

    def rate(self, now: float | None = None, window_s: float | None = None) -> float:
        """Events per second over the last ``window_s`` s (None or more than the
        horizon: the horizon)."""
        now = time.monotonic() if now is None else now
        self._trim(now)
        if window_s is None or window_s >= self.horizon_s:
            return len(self._t) / self.horizon_s
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        return self.count_since(now - window_s) / window_s

    def count_since(self, cutoff: float) -> int:
        """Events at or after ``cutoff`` (monotonic s) among those kept (at most
        ``horizon_s`` old as of the last :meth:`add`)."""
        n = 0
        for t in reversed(self._t):
            if t < cutoff:
                break
            n += 1
        return n

    def times_since(self, cutoff: float) -> np.ndarray:
        """The events' times at or after ``cutoff`` (monotonic s, ascending; float64),
        among those kept: at most the last ``horizon_s`` s as of the last :meth:`add`."""
        n = self.count_since(cutoff)
        if n == 0:
            return np.empty(0, dtype=float)
        return np.fromiter(itertools.islice(self._t, len(self._t) - n, None), dtype=float, count=n)


#: Upper edges (s) of the idle-gap bins :class:`IdleSlowdown` sorts items into; the
#: first bin (an instance idle less than 20 ms: busy, or back to back) is the warm
#: reference, the last is open-ended.
IDLE_EDGES_S = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
#: Fewest items in a bin (and in the warm bin) before :meth:`IdleSlowdown.points` uses it.
IDLE_MIN_COUNT = 10


class IdleSlowdown:
    """How much longer a unit's items take, served, after their instance sat idle
    (the served counterpart of :func:`infscaler.partitioner.profiler.measure_idle`, for the
    simulator's :attr:`~infscaler.runtime.planning.simulator.EngineProfile.idle`).

    Fed one trace row per item (:meth:`add`): the instance's idle gap is the item's
    compute start minus the end of that instance's previous item (rows that arrive out
    of order are not binned). An item whose instance was already idle when its input was
    ready has a **wake** time, ready -> compute start; the last unit's rows also carry the
    **tail**, compute end -> the front end's answer. Why served, not in-process:
    docs/scaling.md, "What idle costs".

    Args:
        size: items kept per bin (the latest). horizon_s: age limit of an item, s.
    """

    def __init__(self, size: int = 512, horizon_s: float = 900.0) -> None:
        self.horizon_s = horizon_s
        # per bin: (time added, gap s, compute ms, wake ms or nan, tail ms or nan)
        self._bins: list[collections.deque[tuple[float, float, float, float, float]]] = [
            collections.deque(maxlen=size) for _ in range(len(IDLE_EDGES_S) + 1)
        ]
        self._last_end: dict[int, int] = {}

    def add(
        self,
        instance: int,
        start_ns: int,
        end_ns: int,
        ready_ns: int,
        tail_ns: int | None = None,
        now: float | None = None,
    ) -> None:
        """One item: its instance, compute start / end, when its input was ready (the
        previous unit's end, or the request's submission), all ``CLOCK_MONOTONIC`` ns, and
        for the last unit the answer's time minus ``end_ns`` (``tail_ns``)."""
        last = self._last_end.get(instance)
        if last is None or end_ns > last:
            self._last_end[instance] = end_ns
            if last is None and len(self._last_end) > 64:
                # instances come and go for months (restarts, scaling): forget the ones
                # idle past the horizon, whose next gap would land in the last bin anyway
                cutoff = end_ns - int(self.horizon_s * 1e9)
                for i in [i for i, e in self._last_end.items() if e < cutoff]:
                    del self._last_end[i]
        if last is None or start_ns < last:
            return
        gap_s = (start_ns - last) / 1e9
        wake = (start_ns - ready_ns) / 1e6 if last <= ready_ns <= start_ns else math.nan
        tail = tail_ns / 1e6 if tail_ns is not None and tail_ns >= 0 else math.nan
        b = bisect.bisect_right(IDLE_EDGES_S, gap_s)
        now = time.monotonic() if now is None else now
        self._bins[b].append((now, gap_s, (end_ns - start_ns) / 1e6, wake, tail))

    def _rows(self, now: float | None) -> list[np.ndarray]:
        now = time.monotonic() if now is None else now
        cutoff = now - self.horizon_s
        out = []
        for b in self._bins:
            rows = [r[1:] for r in b if r[0] >= cutoff]
            out.append(np.array(rows, dtype=float).reshape(-1, 4))
        return out

    def summary(self, now: float | None = None) -> dict[str, Any]:
        """``{"warm_compute_p50_ms", "bins": [{"idle_s": [lo, hi or None], "count",
        "gap_p50_s", "compute_p50_ms", "wake_count", "wake_p50_ms", "tail_p50_ms"}]}``
        (None where a bin has no such items)."""
        bins = self._rows(now)
        edges = (0.0, *IDLE_EDGES_S, None)

        def p50(v: np.ndarray) -> float | None:
            v = v[~np.isnan(v)]
            return round(float(np.median(v)), 3) if v.size else None

        rows = []
        for i, r in enumerate(bins):
            rows.append(
                {
                    "idle_s": [edges[i], edges[i + 1]],
                    "count": int(r.shape[0]),
                    "gap_p50_s": p50(r[:, 0]),
                    "compute_p50_ms": p50(r[:, 1]),
                    "wake_count": int((~np.isnan(r[:, 2])).sum()),
                    "wake_p50_ms": p50(r[:, 2]),
                    "tail_p50_ms": p50(r[:, 3]),
                }
            )
        return {"warm_compute_p50_ms": rows[0]["compute_p50_ms"], "bins": rows}

    def points(
        self, handover_ms: float, min_count: int = IDLE_MIN_COUNT, now: float | None = None
    ) -> tuple[tuple[float, float], ...]:
        """The simulator's ``EngineProfile.idle`` for this unit, from what it served:
        per bin past the warm one with ``min_count`` woken items, ``(gap p50 s, f)`` with
        ``f = (p50 of wake + compute [+ tail]) - hops x handover_ms) / warm compute p50``
        (hops: 1, 2 with the tail), clamped >= 1, so that the simulator's time for an item
        reaching an idle instance (its handovers + the warm time x f) is what was served.
        Empty without ``min_count`` warm items.

        Args:
            handover_ms: the simulator's time per hop (``planner.HANDOVER_MS``), ms.
        """
        bins = self._rows(now)
        warm = bins[0][:, 1]
        if warm.size < max(1, min_count):
            return ()
        base = float(np.median(warm))
        if not base > 0:
            return ()
        pts = []
        for r in bins[1:]:
            woken = r[~np.isnan(r[:, 2])]
            if woken.shape[0] < max(1, min_count):
                continue
            has_tail = ~np.isnan(woken[:, 3])
            total = woken[:, 1] + woken[:, 2] + np.where(has_tail, woken[:, 3], 0.0)
            hops = 1.0 + float(has_tail.mean())
            f = (float(np.median(total)) - hops * handover_ms) / base
            pts.append((round(float(np.median(woken[:, 0])), 4), round(max(1.0, f), 4)))
        out: list[tuple[float, float]] = []
        for g, f in sorted(pts):  # increasing gaps, distinct (EngineProfile's rule)
            if not out or g > out[-1][0]:
                out.append((g, f))
        return tuple(out)


class PipelineLife:
    """A pipeline's cumulative counters over its whole life: every configuration it was
    served with (units replaced, K changed, instances added or removed) adds to the
    same counters, so Triton's statistics (``/v2/models/M/stats``, ``nv_inference_*``)
    never go back. Successive :class:`PipelineStats` of one pipeline share one (and
    one lock): what the old configuration still answers while it drains counts too.

    Attributes:
        success / fail (HTTP status -> count) / rejected: requests answered, failed,
            refused before admission (as :class:`PipelineStats` counts them).
        refused: refusals by reason code (``Refusal`` values and ``queue_timeout``;
            the front end counts them through ``Route.refusals``).
        latency_ms: the successes' end-to-end latency, ms summed.
        units: per unit name, ``[runs, compute ms, queue ms]`` summed (a unit of the
            same name in the next configuration goes on counting); :meth:`counters`
            sums them over every unit of every configuration.
        last_inference_ms: wall clock of the last answer, ms since the epoch (0: none).
        configurations: how many configurations have served (1 + switches).
    """

    def __init__(self) -> None:
        self.success = 0
        self.fail: collections.Counter[int] = collections.Counter()
        self.rejected = 0
        self.refused: collections.Counter[str] = collections.Counter()
        self.latency_ms = 0.0
        self.last_inference_ms = 0
        self.configurations = 1
        self.units: dict[str, list[float]] = {}

    def unit_totals(self, name: str) -> list[float]:
        """Unit ``name``'s ``[runs, compute ms, queue ms]``, to add to (call under the
        lock)."""
        return self.units.setdefault(name, [0, 0.0, 0.0])

    def counters(self) -> dict[str, Any]:
        """The counters as JSON-ready values (call under the lock): ``success``,
        ``fail`` (status -> count), ``rejected``, ``refused`` (code -> count),
        ``latency_count`` / ``latency_ms``, ``queue_count`` / ``queue_ms``,
        ``compute_count`` / ``compute_ms`` (ms summed), ``last_inference_ms``,
        ``configurations``."""
        runs = int(sum(u[0] for u in self.units.values()))
        return {
            "success": self.success,
            "fail": dict(self.fail),
            "rejected": self.rejected,
            "refused": dict(sorted(self.refused.items())),
            "latency_count": self.success,
            "latency_ms": self.latency_ms,
            "queue_count": runs,
            "queue_ms": sum(u[2] for u in self.units.values()),
            "compute_count": runs,
            "compute_ms": sum(u[1] for u in self.units.values()),
            "last_inference_ms": self.last_inference_ms,
            "configurations": self.configurations,
        }


class PipelineStats:
    """Per-pipeline request statistics and per-unit queue / compute times, for one
    configuration of the pipeline; the all-time counters (:attr:`life`) carry over to
    the next configuration's statistics (:meth:`successor`).

    The windows (latency, rates, per-unit compute / queue / idle) are this
    configuration's: the scaler judges the configuration that serves. The counters
    (``success``, ``fail``, ``rejected``, :meth:`totals`, the counts in
    :meth:`snapshot`) are the pipeline's, over its life.

    Args:
        units: unit names in pipeline order.
        life: the pipeline's cumulative counters (None: a new pipeline, from zero).
        lock: the lock that guards ``life`` (shared with the statistics it came from).
    """

    def __init__(
        self,
        units: Iterable[str],
        life: PipelineLife | None = None,
        lock: threading.Lock | None = None,
    ) -> None:
        self.units = list(units)
        self._lock = lock if lock is not None else threading.Lock()
        self.life = life if life is not None else PipelineLife()
        #: refusals by reason code, over the pipeline's life (``Route.refusals``)
        self.refused = self.life.refused
        with self._lock:
            self._unit_totals = [self.life.unit_totals(n) for n in self.units]
        self.latency = LatencyWindow()
        self.arrivals = RateWindow()
        #: admitted and refused (shed / max_pending) requests: the offered load
        self.offered = RateWindow()
        #: requests refused at arrival because they could not meet the SLO
        self.slo_refused = RateWindow()
        self.compute = [LatencyWindow() for _ in self.units]
        self.queue = [LatencyWindow() for _ in self.units]
        self.idle = [IdleSlowdown() for _ in self.units]

    def successor(self, units: Iterable[str]) -> PipelineStats:
        """The statistics of the pipeline's next configuration (``units``: its unit
        names, in order): new windows, the same all-time counters and lock, so the
        counts go on across the switch, including what this configuration still
        answers while it drains."""
        with self._lock:
            self.life.configurations += 1
        return PipelineStats(units, self.life, self._lock)

    @property
    def success(self) -> int:
        """Requests answered, over the pipeline's life."""
        return self.life.success

    @property
    def fail(self) -> collections.Counter[int]:
        """Requests failed after admission, by HTTP status, over the pipeline's life."""
        return self.life.fail

    @property
    def rejected(self) -> int:
        """Requests refused before admission, over the pipeline's life."""
        return self.life.rejected

    @property
    def last_inference_ms(self) -> int:
        """Wall-clock time of the last answered request (success or failure), ms since
        the epoch; 0: none yet (Triton's ``last_inference``)."""
        return self.life.last_inference_ms

    def offered_rate(self, now: float | None = None, window_s: float | None = None) -> float:
        """Requests/s offered (admitted and refused) over the last 10 s (or the last
        ``window_s`` s, at most 10)."""
        with self._lock:
            return self.offered.rate(now, window_s)

    def offered_times(self, since: float) -> np.ndarray:
        """Arrival times of the requests offered (admitted and refused) at or after
        ``since`` (monotonic s, ascending; float64): the arrival trace InferLine's Tuner
        builds its traffic envelope from (Crankshaw et al., SoCC '20, §5;
        :func:`infscaler.runtime.scaling.tuner.envelope`). Only the last 10 s are kept
        (the offered window's horizon), so at most that much comes back; a copy, taken
        under the statistics' lock."""
        with self._lock:
            return self.offered.times_since(since)

    def arrival(self) -> None:
        with self._lock:
            now = time.monotonic()
            self.arrivals.add(now)
            self.offered.add(now)

    def record_success(self, latency_ms: float, trace: np.ndarray | None, t_submit_ns: int) -> None:
        """A request answered: its end-to-end latency (ms) and the trace rows
        (``[unit, instance, start_ns, end_ns]``) of every unit that ran for it."""
        now = time.monotonic()  # one clock read for every window it adds to
        with self._lock:
            life = self.life
            life.success += 1
            life.last_inference_ms = int(time.time() * 1e3)
            life.latency_ms += latency_ms
            self.latency.add(latency_ms, now)
            self._record_trace(trace, t_submit_ns, t_submit_ns + int(latency_ms * 1e6), now)

    def record_failure(self, status: int) -> None:
        with self._lock:
            self.life.fail[status] += 1
            self.life.last_inference_ms = int(time.time() * 1e3)

    def record_rejection(self, slo: bool = False) -> None:
        """A request refused before admission (queue bound, ``max_pending``, or with
        ``slo`` the SLO admission): it counts in the offered load, not in the arrivals."""
        with self._lock:
            self.life.rejected += 1
            now = time.monotonic()
            self.offered.add(now)
            if slo:
                self.slo_refused.add(now)

    def _record_trace(
        self, trace: np.ndarray | None, t_submit_ns: int, t_done_ns: int, now: float
    ) -> None:
        if trace is None or trace.size == 0:
            return
        rows = sorted(trace.tolist(), key=lambda r: r[2])
        last_unit = max(int(r[0]) for r in rows)
        prev_end: dict[int, int] = {}
        last_end = t_submit_ns
        for unit, inst, start, end in rows:
            unit = int(unit)
            if not 0 <= unit < len(self.units):
                continue
            compute_ms, before = (end - start) / 1e6, prev_end.get(unit - 1, last_end)
            queue_ms = max(0, start - before) / 1e6
            self.compute[unit].add(compute_ms, now)
            self.queue[unit].add(queue_ms, now)
            u = self._unit_totals[unit]
            u[0] += 1
            u[1] += compute_ms
            u[2] += queue_ms
            tail = t_done_ns - end if unit == last_unit and unit == len(self.units) - 1 else None
            self.idle[unit].add(int(inst), int(start), int(end), int(before), tail, now)
            prev_end[unit] = max(prev_end.get(unit, 0), end)
            last_end = end

    def idle_summaries(self) -> list[dict[str, Any]]:
        """Per unit, :meth:`IdleSlowdown.summary` (what :meth:`snapshot` shows as ``idle``,
        without the rest of the snapshot)."""
        with self._lock:
            return [s.summary() for s in self.idle]

    def idle_points(self, handover_ms: float) -> list[tuple[tuple[float, float], ...]]:
        """Per unit, :meth:`IdleSlowdown.points` (the served idle slowdown; empty where
        too few items were seen)."""
        with self._lock:
            return [s.points(handover_ms) for s in self.idle]

    def totals(self) -> dict[str, Any]:
        """The all-time counters only, cheap (no percentiles; for a Prometheus scrape):
        :meth:`PipelineLife.counters` (over the pipeline's life, every configuration),
        and per unit of this configuration ``units``: ``[{"compute_count",
        "compute_ms", "queue_count", "queue_ms"}]`` (sums, ms, over the life of a unit
        of that name)."""
        with self._lock:
            out = self.life.counters()
            per = [self.life.units.get(name, (0, 0.0, 0.0)) for name in self.units]
            out["units"] = [
                {
                    "compute_count": int(u[0]),
                    "compute_ms": float(u[1]),
                    "queue_count": int(u[0]),
                    "queue_ms": float(u[2]),
                }
                for u in per
            ]
            return out

    def snapshot(self) -> dict[str, Any]:
        """:meth:`PipelineLife.counters` (the pipeline's life) and this
        configuration's windows: ``arrival_rate_per_s``, ``latency``
        (:meth:`LatencyWindow.summary`; its ``count`` / ``total_ms``: this
        configuration's), ``units``: ``[{"unit", "compute", "queue", "idle"}]``
        (``idle``: :meth:`IdleSlowdown.summary`)."""
        with self._lock:
            return {
                **self.life.counters(),
                "arrival_rate_per_s": round(self.arrivals.rate(), 3),
                "latency": self.latency.summary(),
                "units": [
                    {
                        "unit": name,
                        "compute": self.compute[i].summary(),
                        "queue": self.queue[i].summary(),
                        "idle": self.idle[i].summary(),
                    }
                    for i, name in enumerate(self.units)
                ],
            }
