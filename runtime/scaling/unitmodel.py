"""The capacity and latency model (:mod:`infscaler.runtime.queueing`) applied to a scaler
Snapshot: a unit's service time, items per request and capacity, the pipeline's
capacity, a unit's SLO share and the fewest instances whose approximate P99 fits it
(the P99 guard added to InferLine's scale-in). Why the median (M/D/c): docs/scaling.md,
"The queueing model"."""

from __future__ import annotations

import math

from infscaler.runtime.queueing import EPS, capacity_rps, p99_response_ms
from infscaler.runtime.scaling.types import Snapshot, UnitState

__all__ = [
    "budget_ms",
    "capacity_items",
    "fan_out",
    "instance_ms",
    "p99_needed",
    "pipeline_capacity_rps",
    "service_ms_at",
    "unit_service_ms",
]


def unit_service_ms(u: UnitState) -> float | None:
    """The unit's service time per item, ms: its live P50, else its fastest option's
    latency; None when neither is known."""
    if u.service_ms is not None and u.service_ms > 0:
        return u.service_ms
    lats = [o.latency_ms for o in u.options if o.latency_ms > 0]
    return min(lats) if lats else None


def fan_out(u: UnitState, s: Snapshot) -> float:
    """Items per request at ``u``: its arrival rate over the pipeline's (1 when the
    pipeline's rate is 0)."""
    return u.arrival_rate / s.arrival_rate if s.arrival_rate > 0 else 1.0


def pipeline_capacity_rps(snapshot: Snapshot) -> float | None:
    """Requests/s the pipeline finishes at its current instances
    (:func:`~infscaler.runtime.queueing.capacity_rps`); None when no unit bounds it."""
    us = snapshot.units
    cap = capacity_rps(
        [unit_service_ms(u) for u in us],
        [u.total_instances for u in us],
        [fan_out(u, snapshot) for u in us],
    )
    return None if math.isinf(cap) else cap


def service_ms_at(u: UnitState, threads: int) -> float | None:
    """Predicted service time of one item of ``u`` on a cpu instance at ``threads`` threads,
    ms (None: not measured): the live P50 scaled by the load-time ratio of ``threads`` to
    the count most instances run, else the load-time figure."""
    lat = u.latency_ms_by_threads
    ms = lat.get(threads)
    if ms is None or not ms > 0:
        return None
    ref = _ref_threads(u)
    if u.service_ms is not None and u.service_ms > 0 and ref is not None and lat.get(ref, 0) > 0:
        return u.service_ms * ms / lat[ref]
    return float(ms)


def _ref_threads(u: UnitState) -> int | None:
    live = {t: n for t, n in u.threads.items() if n > 0}
    if not live:
        return None
    return max(live.items(), key=lambda kv: (kv[1], -kv[0]))[0]


def capacity_items(u: UnitState) -> float:
    """Items per second the unit's running instances finish: per thread count when
    every count is measured (:func:`service_ms_at`), else instances x 1000 /
    :func:`unit_service_ms` (``inf`` when no service time is known)."""
    live = {t: n for t, n in u.threads.items() if n > 0}
    per = {t: service_ms_at(u, t) for t in live}
    if live and sum(live.values()) == u.total_instances and all(per.values()):
        return sum(n * 1000.0 / per[t] for t, n in live.items())  # type: ignore[operator]
    return capacity_rps([unit_service_ms(u)], [u.total_instances])


def instance_ms(u: UnitState) -> float | None:
    """One running instance's service time per item as the unit's capacity has it, ms:
    instances x 1000 / :func:`capacity_items` (the mean over mixed thread counts); the
    figure the P99 model takes. None without a running instance or a finite capacity."""
    n = u.total_instances
    cap = capacity_items(u)
    if n <= 0 or not 0 < cap < math.inf:
        return None
    return n * 1000.0 / cap


def budget_ms(s: Snapshot, u: UnitState) -> float:
    """The part of the SLO a unit's own wait + service may take: the SLO less the other
    served units' service times (one item each), ms."""
    others = 0.0
    for v in s.units:
        if v.index != u.index:
            others += unit_service_ms(v) or 0.0
    return s.slo_ms - others


def p99_needed(s: Snapshot, u: UnitState, items: float, svc: float) -> int:
    """The fewest instances of ``svc`` ms keeping the unit's approximate P99 at ``items``
    items/s within :func:`budget_ms`; 0 when no count can."""
    budget = budget_ms(s, u)
    if budget < svc:
        return 0
    n = max(1, math.ceil(items * svc / 1000.0 - EPS))
    for c in range(n, n + 64):
        if p99_response_ms(items, c, svc) <= budget:
            return c
    return 0
