"""The scaler's queueing model of one unit: its service time per item, its items per
request, the approximate P99 of its instances, and the fewest instances that keep that
P99 within the unit's share of the SLO.

:func:`p99_response_ms` is the M/D/c approximation (Erlang C for the probability of
waiting, the heavy-traffic exponential tail of Kingman and Whitt, "Approximations for
the GI/G/m queue", 1993) behind the P99 guard the scaler adds to InferLine's scale-in
(§5, Algorithm 4): a unit gives an instance back, or a thread step, only when the rest
keep its P99 at the max rate over the horizon within the SLO less the other units'
service times (:func:`_budget_ms`, :func:`_p99_needed`). See
:func:`infscaler.runtime.scaling.scaler.decide`.

The policies feed it the live median service time alone (M/D/c). It also takes the
service time's 99th percentile (M/G/c with a shifted-exponential service,
:func:`service_moments`), which matches a simulated M/G/c within 20 % where the median
alone is up to 66 % optimistic; served live on a 2-core host (``bench/p99_model.py``)
neither form is closer on average (mean error 21 % vs 22 %: the front end and the load
share the cores with the instances, outside the unit's queue), so the policies keep the
median until a live check shows the tail helps.
"""

from __future__ import annotations

import math

from infscaler.runtime.scaling.types import Snapshot, UnitState

# slack for ceil / floor of products of floats (2.0000000000000004 replicas is 2)
_EPS = 1e-9


def _service_ms(u: UnitState) -> float | None:
    if u.service_ms is not None and u.service_ms > 0:
        return u.service_ms
    lats = [o.latency_ms for o in u.options if o.latency_ms > 0]
    return min(lats) if lats else None


def _fan_out(u: UnitState, s: Snapshot) -> float:
    return u.arrival_rate / s.arrival_rate if s.arrival_rate > 0 else 1.0


def service_moments(p50_ms: float, p99_ms: float | None = None) -> tuple[float, float]:
    """Mean service time (ms) and squared coefficient of variation ``c_s^2`` of a service
    time whose median is ``p50_ms`` and 99th percentile ``p99_ms``, fitted as a shifted
    exponential ``a + Exp(b)`` (a fixed compute plus an exponential stretch: interference,
    preemption): ``b = (P99 - P50) / ln 50``, ``a = P50 - b ln 2``, mean ``a + b``,
    ``c_s^2 = (b / (a + b))^2``. ``p99_ms`` None or <= ``p50_ms``: deterministic
    (``(p50_ms, 0)``). ``a`` is floored at 0 (an exponential service: ``c_s^2`` <= 1).
    """
    if p99_ms is None or not p99_ms > p50_ms:
        return p50_ms, 0.0
    b = (p99_ms - p50_ms) / math.log(50.0)
    a = max(0.0, p50_ms - b * math.log(2.0))
    if a == 0.0:  # the median of Exp(b) alone is b ln 2
        b = p50_ms / math.log(2.0)
    mean = a + b
    return mean, (b / mean) ** 2


def p99_response_ms(
    rate_items_s: float, servers: int, service_ms: float, service_p99_ms: float | None = None
) -> float:
    """Approximate P99 response time (wait + service) of one item at a unit of
    ``servers`` FIFO instances under Poisson arrivals of ``rate_items_s`` items/s, ms;
    ``inf`` at or above capacity. Each instance takes ``service_ms`` per item (the
    median), and ``service_p99_ms`` at its 99th percentile (None: always ``service_ms``,
    M/D/c).

    P(wait) is Erlang C (M/M/c's probability of waiting) at the mean service time, and
    the wait's tail is exponential with the heavy-traffic (diffusion) decay rate
    ``2 (c / E[S] - lambda) / (c_a^2 + c_s^2)`` with ``c_a^2 = 1`` (Poisson) and ``c_s^2``
    from :func:`service_moments` (0 for a deterministic service): P99 = max(the service's
    P99, E[S] + ln(P(wait) / 0.01) / decay) (Kingman; Whitt, "Approximations for the
    GI/G/m queue", 1993). For a deterministic service it is the M/D/c form: against a
    simulated M/D/c (``bench/slo_bound.py``'s method) for c = 1-4 and loads 0.1-0.8 it
    is within 20 %, above it (cautious) for c = 1; with a stretched service, against a
    simulated M/G/c of shifted-exponential services, the same
    (tests/unit/runtime/scaling/test_scaler_p99.py).

    Raises:
        ValueError: ``servers`` < 1 or ``service_ms`` <= 0.
    """
    if servers < 1 or not service_ms > 0:
        raise ValueError(f"need servers >= 1 and service_ms > 0, got {servers}, {service_ms}")
    mean_ms, cs2 = service_moments(service_ms, service_p99_ms)
    tail_ms = max(service_ms, service_p99_ms or service_ms)
    d = mean_ms / 1000.0
    a = max(0.0, rate_items_s) * d  # offered load in instances
    if a >= servers:
        return math.inf
    if a <= 0:
        return tail_ms
    term, total = 1.0, 0.0
    for k in range(servers):
        if k:
            term *= a / k
        total += term
    top = term * a / servers * servers / (servers - a)
    p_wait = top / (total + top)
    if p_wait <= 0.01:
        return tail_ms
    theta = 2.0 * (servers / d - rate_items_s) / (1.0 + cs2)  # per s
    return max(tail_ms, mean_ms + math.log(p_wait / 0.01) / theta * 1000.0)


def max_rate_within(servers: int, service_ms: float, budget_ms: float) -> float:
    """The largest arrival rate, items/s, at which :func:`p99_response_ms` of ``servers``
    instances of ``service_ms`` stays within ``budget_ms`` (the model's inverse, by
    bisection to 2^-48 of the capacity ``servers x 1000 / service_ms``: the P99 grows
    with the rate); 0 when the budget is below the service time (no rate meets it).

    Raises:
        ValueError: ``servers`` < 1 or ``service_ms`` <= 0.
    """
    if budget_ms < service_ms:
        p99_response_ms(0.0, servers, service_ms)  # the same argument checks
        return 0.0
    lo, hi = 0.0, servers * 1000.0 / service_ms
    for _ in range(48):
        mid = (lo + hi) / 2.0
        if p99_response_ms(mid, servers, service_ms) <= budget_ms:
            lo = mid
        else:
            hi = mid
    return lo


def _budget_ms(s: Snapshot, u: UnitState) -> float:
    """The part of the SLO a unit's own wait + service may take: the SLO less the other
    served units' service times (one item each), ms."""
    others = 0.0
    for v in s.units:
        if v.index != u.index:
            others += _service_ms(v) or 0.0
    return s.slo_ms - others


def _p99_needed(s: Snapshot, u: UnitState, items: float, svc: float) -> int:
    """The fewest instances of ``svc`` ms that keep the unit's approximate P99
    (:func:`p99_response_ms`) at ``items`` items/s within its share of the SLO
    (:func:`_budget_ms`); 0 when no count can (the SLO is below the service time: the
    utilisation rule alone decides then)."""
    budget = _budget_ms(s, u)
    if budget < svc:
        return 0
    n = max(1, math.ceil(items * svc / 1000.0 - _EPS))
    for c in range(n, n + 64):
        if p99_response_ms(items, c, svc) <= budget:
            return c
    return 0
