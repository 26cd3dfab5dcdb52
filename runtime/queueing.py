"""The runtime's one capacity model and one latency model, in plain numbers (no
snapshot types): every policy (admission, the scaler and the Tuner, arbitration, the
live check, the planner's resources, the model-less selector) computes through it.

* Capacity (:func:`capacity_rps`): a pipeline of FIFO stages finishes
  ``min_k instances_k x 1000 / (service_ms_k x items_k)`` requests/s (InferLine,
  Crankshaw et al., SoCC '20, §4: a pipeline's throughput is its slowest stage's), at
  most ``cores x 1000 / cpu_ms`` when the stages' CPU ms per request (threads x busy
  fraction, :func:`busy_cpu_ms`) share ``cores``.
* Latency: a unit's P99 response (wait + service) under Poisson arrivals
  (:func:`p99_response_ms`: Erlang C and the heavy-traffic tail of Kingman / Whitt, M/D/c
  or M/G/c), its inverse (:func:`max_rate_within`), and the deterministic drain of a
  known backlog (:func:`fifo_wait_ms`, :func:`drain_response_ms`, :func:`drain_backlog`:
  the same FIFO queue seen from a request behind ``ahead`` others; network calculus'
  delay bound, Le Boudec and Thiran Thm 1.4.2, for the backlog that drains within a
  budget). Accuracy figures and why: docs/scaling.md, "The queueing model".

Pure: no I/O, no clock. Units: ms, requests/s or items/s as named.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "EPS",
    "busy_cpu_ms",
    "capacity_rps",
    "drain_backlog",
    "drain_response_ms",
    "fifo_wait_ms",
    "max_rate_within",
    "p99_response_ms",
    "service_moments",
]

#: Slack for ceil / floor of products of floats (2.0000000000000004 replicas is 2).
EPS = 1e-9


def capacity_rps(
    service_ms: Sequence[float | None],
    instances: Sequence[float],
    items: Sequence[float] | None = None,
    *,
    cores: float | None = None,
    cpu_ms: float | None = None,
) -> float:
    """Requests/s a pipeline of FIFO stages finishes (saturation throughput):
    ``min_k instances[k] x 1000 / service_ms[k] / items[k]``, and at most
    ``cores x 1000 / cpu_ms`` when both are given.

    Args:
        service_ms: per stage, ms one instance takes per item (None or <= 0: not known;
            the stage does not bound it).
        instances: per stage, its instances (0: the stage finishes nothing, bound 0).
        items: per stage, items per request (None: 1 each; <= 0: the stage sees no
            items and does not bound it).
        cores: cores the stages share (None: not bounded by cores).
        cpu_ms: core-ms all stages keep busy per request (:func:`busy_cpu_ms`); <= 0
            or None: not bounded by cores.

    Returns:
        requests/s; ``inf`` when nothing bounds it.

    Raises:
        ValueError: the sequences differ in length.

    >>> capacity_rps([30.0, 10.0], [1, 1])
    33.333333333333336
    >>> capacity_rps([10.0], [2], [3.0])  # a per-item stage: 3 items a request
    66.66666666666667
    """
    if len(service_ms) != len(instances) or (items is not None and len(items) != len(instances)):
        raise ValueError(
            f"service_ms, instances and items must be one per stage, got "
            f"{len(service_ms)}, {len(instances)}, {None if items is None else len(items)}"
        )
    best = math.inf
    for k, (ms, n) in enumerate(zip(service_ms, instances, strict=True)):
        f = 1.0 if items is None else items[k]
        if ms is None or not ms > 0 or not f > 0:
            continue
        best = min(best, n * 1000.0 / ms / f)
    if cores is not None and cpu_ms is not None and cpu_ms > 0:
        best = min(best, cores * 1000.0 / cpu_ms)
    return best


def busy_cpu_ms(
    service_ms: Sequence[float],
    items: Sequence[float],
    threads: Sequence[float],
    share: Sequence[float] | None = None,
) -> float:
    """Core-ms the stages keep busy per request: ``sum_k items[k] x service_ms[k] x
    threads[k] x share[k]``, ``share`` a thread's busy fraction of its core (None: 1,
    every pinned thread busy while it computes; a measured fraction as
    :func:`infscaler.runtime.scaling.demand.fits_cores` counts demand)."""
    total = 0.0
    for k, (ms, f, t) in enumerate(zip(service_ms, items, threads, strict=True)):
        total += f * ms * t * (1.0 if share is None else share[k])
    return total


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
    """Approximate P99 response time (wait + service) of one item at a unit of ``servers``
    FIFO instances under Poisson arrivals of ``rate_items_s`` items/s, ms; ``inf`` at or
    above capacity. ``service_ms``: the median ms per item; ``service_p99_ms``: its 99th
    percentile (None: always ``service_ms``, M/D/c).

    P(wait) is Erlang C at the mean service time, the wait's tail exponential with the
    heavy-traffic decay ``2 (c / E[S] - lambda) / (c_a^2 + c_s^2)``: P99 = max(the
    service's P99, E[S] + ln(P(wait) / 0.01) / decay) (Kingman; Whitt, "Approximations for
    the GI/G/m queue", 1993). Accuracy: docs/scaling.md, "The queueing model".

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


def fifo_wait_ms(ahead: int, servers: int, service_ms: float) -> float:
    """Wait, ms, of a request behind ``ahead`` others at a unit of ``servers`` FIFO
    instances of a deterministic ``service_ms``, the ones in service just started: it
    starts once ``ahead - servers + 1`` have left, after ``floor(ahead / servers)``
    service times (0 when fewer than ``servers`` are ahead). ``servers`` < 1 counts as 1,
    a negative ``ahead`` as 0."""
    return (max(0, ahead) // max(1, int(servers))) * float(service_ms)


def drain_response_ms(ahead: int, service_ms: float, stages: Sequence[tuple[float, int]]) -> float:
    """Response time, ms, of a request behind ``ahead`` others when all of them queue at
    every stage: its own end-to-end service ``service_ms`` plus the longest
    :func:`fifo_wait_ms` over the ``stages`` (``(ms per request, instances)`` each), at
    least ``service_ms``: ``S + max_u floor(ahead / c_u) x S_u`` (InferLine's pipeline of
    FIFO stages, SoCC '20 §4)."""
    est = float(service_ms)
    for unit_ms, n in stages:
        est = max(est, service_ms + fifo_wait_ms(ahead, n, unit_ms))
    return est


def drain_backlog(capacity_rps: float, budget_ms: float) -> float:
    """Requests a server of ``capacity_rps`` drains within ``budget_ms`` (0 for a budget
    <= 0): ``capacity x budget / 1000``, the backlog a rate-latency service curve keeps
    within the delay bound (Le Boudec and Thiran, "Network Calculus", Thm 1.4.2)."""
    return capacity_rps * (max(0.0, budget_ms) / 1000.0)
