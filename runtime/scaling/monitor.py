"""The SLO monitor: per pipeline and per unit metrics over a sliding window, and the
scaler's :class:`~infscaler.runtime.scaling.types.Snapshot` built from them (InfScaler §IV-A).

Reads the front end's statistics, tokens in flight, the supervisor's handles (PSS MB per
instance), the pool's mapped MB and host telemetry, without stopping anything. Memory used
(U^m) is the instances' PSS plus the pool's; busy cores bound the cpu. In full:
docs/scaling.md, "The monitor in full"."""

from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Any

import psutil

from infscaler.base.device import INSTANCE_OVERHEAD_MB  # USS of an idle instance, MB
from infscaler.base.levels import MAX_INSTANCES_PER_UNIT as MAX_PER_UNIT
from infscaler.runtime.scaling.control import ScaledService
from infscaler.runtime.scaling.types import (
    EngineOption,
    ResourceCap,
    Snapshot,
    UnitState,
    device_cap,
)

#: busy cores (:meth:`Monitor.cores_busy`) are measured over at most this long, s ...
BUSY_WINDOW_S = 5.0
#: ... and at least this long (shorter: not measured yet), s
BUSY_MIN_S = 1.0


@dataclass(frozen=True)
class UnitMetrics:
    """One unit over the monitor's window.

    Attributes:
        index / name / kind / engine: the unit.
        instances: live instances per engine. ready: instances ready to serve.
        queue_len: tokens in flight at the unit.
        items_per_s: items completed per second.
        compute_p50_ms / compute_p99_ms: service time per item, ms (an idle unit: over the
            statistics' horizon; None: no sample).
        queue_p99_ms: time items waited before the unit, ms.
        pss_mb: mean PSS of its ready instances, MB (None: none reported).
        step_ms: a fused unit's steps -> mean ms per call; empty otherwise."""

    index: int
    name: str
    kind: str
    engine: str
    instances: dict[str, int]
    ready: int
    queue_len: int
    items_per_s: float
    compute_p50_ms: float | None
    compute_p99_ms: float | None
    queue_p99_ms: float | None
    pss_mb: float | None
    step_ms: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineMetrics:
    """One pipeline over the monitor's window.

    Attributes:
        name: the pipeline. now: monotonic time, s. window_s: the window.
        arrival_rate / offered_rate / completion_rate: requests/s admitted, submitted
            (refused included), answered. p50_ms / p95_ms / p99_ms: end-to-end latency.
        pending: requests admitted and not answered. units: per unit.
        answered / late: requests answered over the window, and those slower than the SLO."""

    name: str
    now: float
    window_s: float
    arrival_rate: float
    completion_rate: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    pending: int
    units: tuple[UnitMetrics, ...] = field(default_factory=tuple)
    offered_rate: float | None = None
    slo_refused_rate: float = 0.0
    answered: int = 0
    late: int = 0


class Monitor:
    """Reads a running :class:`~infscaler.service.service.Service` (see the module docstring).

    Args:
        service: the started service.
        window_s: the sliding window for rates and percentiles, s.
    """

    def __init__(self, service: ScaledService, window_s: float = 10.0) -> None:
        self.service = service
        self.window_s = window_s
        # (monotonic s, {pid: CPU seconds}) samples for cores_busy
        self._cpu_samples: collections.deque[tuple[float, dict[int, float]]] = collections.deque()
        # (monotonic s, {pid: busy ms the instance reported}) samples for demand
        self._busy_samples: collections.deque[tuple[float, dict[int, float]]] = collections.deque()

    # -- metrics ---------------------------------------------------------------------------
    def pipeline(self, dep: Any, window_s: float | None = None) -> PipelineMetrics:
        """Metrics of one deployment over the last ``window_s`` s (default: the monitor's)."""
        w = self.window_s if window_s is None else window_s
        now = time.monotonic()
        route = dep.route
        stats = route.stats
        ch = self.service.channel.stats()["stages"]
        handles = [h for h in self.service.supervisor.handles() if h.key[0] == dep.name]
        with stats._lock:
            lat = stats.latency.summary(now, w, over_ms=dep.pipeline.config.slo_ms)
            rate = stats.arrivals.count_since(now - w) / w
            offered = stats.offered.count_since(now - w) / w
            slo_refused = stats.slo_refused.count_since(now - w) / w
            per_unit = []
            for i in range(len(stats.units)):
                comp = stats.compute[i].summary(now, w)
                if comp["p50_ms"] is None:  # idle now: the last service time known
                    last = stats.compute[i].summary(now)
                    comp = {**comp, "p50_ms": last["p50_ms"], "p99_ms": last["p99_ms"]}
                per_unit.append((comp, stats.queue[i].summary(now, w)))
        units = []
        for u in dep.pipeline.units:
            sid = route.stage_ids[u.index]
            mine = [
                h
                for h in handles
                if h.key == (dep.name, u.index) and h.state in ("starting", "ready")
            ]
            engines: dict[str, int] = {}
            for h in mine:
                engines[h.unit.engine] = engines.get(h.unit.engine, 0) + 1
            pss = [float(h.stats.get("pss_mb", 0.0)) for h in mine if h.stats.get("pss_mb")]
            comp, queue = per_unit[u.index]
            units.append(
                UnitMetrics(
                    index=u.index,
                    name=u.name,
                    kind=u.kind,
                    engine=u.engine,
                    instances=engines,
                    ready=sum(1 for h in mine if h.state == "ready"),
                    queue_len=int(ch.get(sid, {}).get("inflight", 0)) if sid else 0,
                    items_per_s=comp["window_count"] / w,
                    compute_p50_ms=comp["p50_ms"],
                    compute_p99_ms=comp["p99_ms"],
                    queue_p99_ms=queue["p99_ms"],
                    pss_mb=sum(pss) / len(pss) if pss else None,
                    step_ms={r["step"]: r["mean_ms"] for r in step_totals(u, mine)},
                )
            )
        return PipelineMetrics(
            name=dep.name,
            now=now,
            window_s=w,
            arrival_rate=rate,
            completion_rate=lat["window_count"] / w,
            p50_ms=lat["p50_ms"],
            p95_ms=lat["p95_ms"],
            p99_ms=lat["p99_ms"],
            pending=self.service.frontend.pending(route),
            units=tuple(units),
            offered_rate=offered,
            slo_refused_rate=slo_refused,
            answered=int(lat["window_count"]),
            late=int(lat.get("over_count", 0)),
        )

    def _unit_handles(self, dep: Any, index: int) -> list[Any]:
        """The starting or ready instances of unit ``index`` of ``dep``."""
        return [
            h
            for h in self.service.supervisor.handles()
            if h.key == (dep.name, index) and h.state in ("starting", "ready")
        ]

    @staticmethod
    def items_per_request(m: PipelineMetrics, um: UnitMetrics) -> float:
        """Items a unit runs per request answered over the window (1, or the fan-out's mean)."""
        if m.completion_rate > 0 and um.items_per_s > 0:
            return um.items_per_s / m.completion_rate
        return 1.0

    def memory_used_mb(self) -> float:
        """Sum of every live instance's PSS plus the pool's mapped MB (U^m for memory)."""
        total = 0.0
        for h in self.service.supervisor.handles():
            if h.state in ("starting", "ready"):
                mem = h.stats or h.info
                total += float(mem.get("pss_mb") or 0.0) or _estimate_mb(h.unit)
        return total + self.service.pool.stats()["mapped_bytes"] / 2**20

    def pinned_threads(self) -> int:
        """Threads pinned by starting or ready cpu model instances, all pipelines."""
        return sum(
            max(1, int(h.unit.threads))
            for h in self.service.supervisor.handles()
            if h.state in ("starting", "ready")
            and h.unit.kind == "model"
            and h.unit.engine == "cpu"
        )

    def cores_busy(self) -> float | None:
        """CPU cores kept busy by every live instance and the front end over the last
        :data:`BUSY_WINDOW_S` s: growth of their user + system CPU seconds over the wall
        seconds (a process started since counts over its age; one ended, nothing). None until
        two samples :data:`BUSY_MIN_S` apart exist."""
        now = time.monotonic()
        wall = time.time()
        pids = [os.getpid()] + [
            h.pid for h in self.service.supervisor.handles() if h.state in ("starting", "ready")
        ]
        sample: dict[int, float] = {}
        ages: dict[int, float] = {}
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                t = proc.cpu_times()
                ages[pid] = wall - proc.create_time()
            except (psutil.Error, OSError):
                continue  # gone between the listing and the read
            sample[pid] = t.user + t.system
        samples = self._cpu_samples
        while samples and now - samples[0][0] > BUSY_WINDOW_S:
            samples.popleft()
        busy = None
        if samples and now - samples[0][0] >= BUSY_MIN_S:
            t0, old = samples[0]
            used = sum(v - old[p] for p, v in sample.items() if p in old and v >= old[p])
            busy = used / (now - t0)
            busy += sum(
                v / max(ages[p], 0.1)
                for p, v in sample.items()
                if p not in old and ages.get(p, 0.0) > 0
            )
        samples.append((now, sample))
        return busy

    def demand(self) -> tuple[dict[tuple[str, int], float], float] | None:
        """Cores each unit's live instances keep busy, per ``(pipeline, index)`` and in all: per
        instance its busy fraction (``busy_ms`` growth over wall time, at most its CPU seconds
        per thread) x threads; a new instance counts its unit's share, else a core per thread.
        None until two samples :data:`BUSY_MIN_S` apart exist."""
        now = time.monotonic()
        live = [h for h in self.service.supervisor.handles() if h.state in ("starting", "ready")]
        sample: dict[int, tuple[float, float | None]] = {}
        for h in live:
            try:
                t = psutil.Process(h.pid).cpu_times()
                cpu: float | None = t.user + t.system
            except (psutil.Error, OSError):
                cpu = None  # gone, or not readable: the busy ms alone
            sample[h.pid] = (float(h.stats.get("busy_ms") or 0.0), cpu)
        samples = self._busy_samples
        while samples and now - samples[0][0] > BUSY_WINDOW_S:
            samples.popleft()
        out = None
        if samples and now - samples[0][0] >= BUSY_MIN_S:
            t0, old = samples[0]
            out = unit_demand(live, sample, old, (now - t0) * 1e3)
        samples.append((now, sample))
        return out

    def cap(self) -> ResourceCap:
        """R^m from the service's device profile with the memory in use now
        (:func:`~infscaler.runtime.scaling.types.device_cap` on this process's cores)."""
        profile = self.service.device_profile()
        return device_cap(
            profile, host_cores=len(_host_cores()), memory_used_mb=self.memory_used_mb()
        )

    # -- the scaler's view -----------------------------------------------------------------
    def snapshot(self, dep: Any, metrics: PipelineMetrics | None = None) -> Snapshot:
        """The :class:`Snapshot` :func:`~infscaler.runtime.scaling.scaler.decide` takes for ``dep``."""
        m = metrics or self.pipeline(dep)
        cap = self.cap()
        engines_used: dict[str, int] = {}
        for h in self.service.supervisor.handles():
            if h.state in ("starting", "ready") and h.unit.kind == "model":
                engines_used[h.unit.engine] = engines_used.get(h.unit.engine, 0) + 1
        cores_used = self.pinned_threads()
        units = []
        served = {u.index for u in dep.pipeline.served_units()}
        rate = m.arrival_rate
        for u, um in zip(dep.pipeline.units, m.units, strict=True):
            if u.index not in served:
                continue
            items_per_request = self.items_per_request(m, um)
            # a fused unit's plan latency is its model step's: add its function steps
            extra = sum((um.step_ms.get(s.name) or 0.0) for s in u.steps if s.kind == "function")
            plan_ms = _plan_ms(u)
            plan_ms = None if plan_ms is None else plan_ms + extra
            service = um.compute_p50_ms if um.compute_p50_ms is not None else plan_ms
            bottleneck = (service or 0.0) * items_per_request
            threads: dict[int, int] = {}
            probes: dict[int, list[float]] = {}
            for h in self._unit_handles(dep, u.index):
                if h.unit.engine == "cpu" and h.unit.kind == "model":
                    t = max(1, int(h.unit.threads))
                    threads[t] = threads.get(t, 0) + 1
                for k, ms in (h.info.get("warm_ms_by_threads") or {}).items():
                    if ms:
                        probes.setdefault(int(k), []).append(float(ms))
            options = []
            for engine in _engines_for(u, cap):
                lat = um.compute_p50_ms if engine == u.engine else None
                if lat is None and engine == u.engine and probes.get(int(u.threads)):
                    # nothing computed in the window yet: the instances' warm probe
                    lat = median(probes[int(u.threads)]) + extra
                if lat is None:
                    lat = _plan_ms(u, engine)
                    lat = None if lat is None else lat + extra
                if lat is None:
                    continue  # never invent a latency for an engine nobody measured
                mem = um.pss_mb if (um.pss_mb and engine == u.engine) else _estimate_mb(u)
                options.append(
                    EngineOption(
                        engine=engine,
                        latency_ms=float(lat),
                        memory_mb=float(mem),
                        cores=u.threads if engine == "cpu" else 0,
                    )
                )
            units.append(
                UnitState(
                    index=u.index,
                    name=u.name,
                    bottleneck=float(bottleneck),
                    instances=dict(um.instances),
                    options=tuple(options),
                    arrival_rate=rate * items_per_request,
                    queue_len=um.queue_len,
                    service_ms=um.compute_p50_ms,
                    min_instances=u.instances,
                    max_instances=min(u.max_instances or MAX_PER_UNIT, MAX_PER_UNIT),
                    threads=threads,
                    latency_ms_by_threads={k: median(v) for k, v in probes.items()},
                    min_threads=max(1, int(u.threads)),
                    max_threads=getattr(u, "max_threads", None),
                )
            )
        slo = dep.pipeline.config.slo_ms
        demand = self.demand()
        if demand is not None:
            units = [replace(u, busy=demand[0].get((dep.name, u.index), 0.0)) for u in units]
        busy = self.cores_busy()
        if busy is None and cap.physical_cores:
            # not measured yet: every pinned thread counts as busy
            busy = float(min(cores_used, cap.physical_cores))
        return Snapshot(
            now=m.now,
            slo_ms=float(slo) if slo is not None else float("inf"),
            p99_ms=m.p99_ms,
            arrival_rate=rate,
            units=tuple(units),
            cap=cap,
            cores_used=cores_used,
            instances_used=engines_used,
            pending=m.pending,
            offered_rate=m.offered_rate,
            slo_refused_rate=m.slo_refused_rate,
            cores_busy=busy,
            answered=m.answered,
            late=m.late,
            cores_demand=None if demand is None else demand[1],
            served_rate=m.completion_rate,
        )


def unit_demand(
    live: list[Any],
    now: dict[int, tuple[float, float | None]],
    old: dict[int, tuple[float, float | None]],
    wall_ms: float,
) -> tuple[dict[tuple[str, int], float], float]:
    """:meth:`Monitor.demand` from two samples of the instances' ``(busy ms, CPU s)``."""
    measured: dict[tuple[str, int], list[float]] = {}  # key -> [cores, threads]
    new: list[Any] = []
    for h in live:
        threads = max(1, int(getattr(h.unit, "threads", 1) or 1))
        if h.pid not in old or h.pid not in now or wall_ms <= 0:
            new.append(h)
            continue
        (busy1, cpu1), (busy0, cpu0) = now[h.pid], old[h.pid]
        frac = max(0.0, busy1 - busy0) / wall_ms
        if cpu1 is not None and cpu0 is not None:
            frac = min(frac, max(0.0, cpu1 - cpu0) * 1e3 / wall_ms / threads)
        acc = measured.setdefault(h.key, [0.0, 0.0])
        acc[0] += min(1.0, frac) * threads
        acc[1] += threads
    per_unit = {k: v[0] for k, v in measured.items()}
    for h in new:
        threads = max(1, int(getattr(h.unit, "threads", 1) or 1))
        acc = measured.get(h.key)
        per = acc[0] / acc[1] if acc and acc[1] > 0 else 1.0
        per_unit[h.key] = per_unit.get(h.key, 0.0) + per * threads
    return per_unit, sum(per_unit.values())


def step_totals(unit: Any, handles: list[Any]) -> list[dict[str, Any]]:
    """A fused unit's steps, each with ``step``, ``kind``, ``served``, ``errors``, ``busy_ms``
    summed over ``handles`` and ``mean_ms`` (None before one ran); [] for an unfused unit."""
    out = []
    for step in getattr(unit, "steps", ()):
        rows = [
            r for h in handles for r in h.stats.get("steps") or () if r.get("step") == step.name
        ]
        served = sum(int(r.get("served", 0)) for r in rows)
        busy = sum(float(r.get("busy_ms", 0.0)) for r in rows)
        out.append(
            {
                "step": step.name,
                "kind": step.kind,
                "served": served,
                "errors": sum(int(r.get("errors", 0)) for r in rows),
                "busy_ms": round(busy, 3),
                "mean_ms": round(busy / served, 3) if served else None,
            }
        )
    return out


def _host_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _estimate_mb(unit: Any) -> float:
    """Memory of one instance before it reports: plan MB + the process overhead."""
    return float(unit.memory_mb or 0.0) + INSTANCE_OVERHEAD_MB


def _plan_ms(unit: Any, engine: str | None = None) -> float | None:
    """The plan's measured latency of ``unit`` on ``engine`` (default: its own), ms."""
    entry = (unit.plan_latency_ms or {}).get(engine or unit.engine)
    if isinstance(entry, dict):
        entry = entry.get("ms") if entry.get("available", True) else None
    return float(entry) if isinstance(entry, int | float) else None


def _engines_for(unit: Any, cap: ResourceCap) -> list[str]:
    """Engines a unit may be scaled onto: its own, and for model units every engine of
    the device the plan measured it on (function stages run on the cpu only)."""
    engines = [unit.engine]
    if unit.kind == "model":
        for e in unit.plan_latency_ms or {}:
            if e in cap.max_instances and e not in engines:
                engines.append(e)
    return engines
