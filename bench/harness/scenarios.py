"""MLPerf LoadGen's scenarios, driven through the package's own load generator
(:mod:`infscaler.api.loadgen`) on the service's Unix socket.

The scenarios (MLPerf Inference rules, "Scenarios"; LoadGen's ``TestScenario``):

* **single stream**: one request at a time, the next sent when the last is answered
  (loadgen concurrency 1); the figure is the latency (P90 in MLPerf; all percentiles here).
* **server**: Poisson arrivals at ``rate``/s (loadgen request rate, ``poisson``); a
  rate passes when the P99 latency, a refused or failed request counting as later than
  any, is within the bound (:func:`passes`); the figure is the largest passing rate
  (:func:`harness.search.max_rate_at_slo`).
* **offline**: every request available at once, throughput only; here a closed loop of
  ``concurrency`` requests in flight (loadgen concurrency N).

Each point is measured over ``duration_s``: 3 loadgen windows of ``duration_s / 3``
(perf_analyzer's stability rule is recorded, ``stable``, not waited for), after an
unmeasured warm-up of ``warmup_s`` at the same load. Latency is client-side, ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SINGLE_STREAM, SERVER, OFFLINE = "single_stream", "server", "offline"
#: windows per point (perf_analyzer's stability rule looks at the last 3)
WINDOWS = 3


def load_spec(scenario: str, value: float | None = None) -> Any:
    """The loadgen ``LoadSpec`` of a scenario: ``value`` is the rate (/s) for server, the
    requests in flight for offline, unused for single stream.

    Raises:
        ValueError: an unknown scenario, or a missing / non-positive value.
    """
    from infscaler.api.loadgen import LoadSpec

    if scenario == SINGLE_STREAM:
        return LoadSpec("concurrency", 1)
    if value is None or not (math.isfinite(value) and value > 0):
        raise ValueError(f"scenario {scenario}: needs a positive value, got {value!r}")
    if scenario == SERVER:
        return LoadSpec("request_rate", float(value), "poisson")
    if scenario == OFFLINE:
        return LoadSpec("concurrency", int(value))
    raise ValueError(f"unknown scenario {scenario!r}: use {SINGLE_STREAM}, {SERVER} or {OFFLINE}")


def p99_with_failures(latencies_ms: Sequence[float], failed: int) -> float:
    """The nearest-rank P99 of every request, the ``failed`` ones (refused, errors,
    unanswered) counting as later than any answer: ``inf`` when they are more than 1 %.

    >>> p99_with_failures([10.0] * 99, 1)
    10.0
    """
    n = len(latencies_ms) + failed
    if n == 0:
        return math.inf
    k = max(1, math.ceil(0.99 * n))
    if k > len(latencies_ms):
        return math.inf
    return float(sorted(latencies_ms)[k - 1])


def passes(point: Mapping[str, Any], bound_ms: float) -> bool:
    """The server scenario's rule: the point's :func:`p99_with_failures` is within
    ``bound_ms`` (and it answered something)."""
    p99 = point.get("p99_all_ms")
    return point.get("ok", 0) > 0 and p99 is not None and p99 <= bound_ms


def point_dict(result: Any, bound_ms: float | None) -> dict[str, Any]:
    """A loadgen ``PointResult`` as one flat point: offered load, throughput, goodput
    (answers within ``bound_ms`` per s; None without a bound), latency
    percentiles (answered requests), ``p99_all_ms`` (failures as late), counts, the
    server-side split, ``stable``, and ``passed`` when a bound is given."""
    s = result.summary
    lat = [x for w in result.windows[-WINDOWS:] for x in w.latencies_ms]
    failed = sum(
        sum(w.refused.values()) + sum(w.errors.values()) for w in result.windows[-WINDOWS:]
    )
    p = {
        "mode": result.spec.mode,
        "value": result.spec.value,
        "throughput_rps": round(s["throughput"], 3),
        "goodput_rps": None if s["goodput"] is None else round(s["goodput"], 3),
        **{f"{k}_ms": (round(v, 2) if v is not None else None) for k, v in s["latency_ms"].items()},
        "p99_all_ms": p99_with_failures(lat, failed),
        "ok": len(lat),
        "failed": failed,
        "refused_by_code": s["refused_by_code"],
        "errors_by_code": s["errors_by_code"],
        "server": s["server"],
        "measured_s": round(s["measured_s"], 2),
        "stable": result.stable,
        "totals": result.totals,
    }
    if bound_ms is not None:
        p["bound_ms"] = bound_ms
    if math.isinf(p["p99_all_ms"]):
        p["p99_all_ms"] = None  # more than 1 % failed (JSON has no infinity)
    if bound_ms is not None:
        p["passed"] = passes(p, bound_ms)
    return p


def run(
    sock: str,
    model: str,
    inputs: Mapping[str, np.ndarray],
    scenario: str,
    value: float | None = None,
    *,
    duration_s: float,
    warmup_s: float = 0.0,
    bound_ms: float | None = None,
    seed: int = 0,
    shared_memory: bool = False,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Measure one point of ``scenario`` against the served ``model`` (see the module
    docstring); returns :func:`point_dict` plus ``scenario``.

    Raises:
        InfScalerError: the service is unreachable or the model unknown (loadgen's).
        ValueError: a bad scenario or value (:func:`load_spec`).
    """
    from infscaler.api.loadgen import LoadGenerator, MeasureConfig

    spec = load_spec(scenario, value)
    gen = LoadGenerator(sock, model, inputs, shared_memory=shared_memory)
    if warmup_s > 0:
        warm = MeasureConfig(
            interval_ms=warmup_s * 1e3, max_trials=1, seed=seed + 1, timeout_s=timeout_s
        )
        gen.run([spec], warm)
    cfg = MeasureConfig(
        interval_ms=duration_s * 1e3 / WINDOWS,
        max_trials=WINDOWS,
        slo_ms=bound_ms,
        seed=seed,
        timeout_s=timeout_s,
    )
    (res,) = gen.run([spec], cfg)
    return {"scenario": scenario, **point_dict(res, bound_ms)}


def model_inputs(
    sock: str, model: str, seed: int = 0, shapes: Mapping[str, Sequence[int]] | None = None
) -> dict[str, np.ndarray]:
    """Random inputs for the served ``model`` from its metadata (loadgen's
    ``input_tensors``: floats in [0, 1), dynamic dims 1 unless in ``shapes``)."""
    from infscaler.api.client import Client
    from infscaler.api.loadgen import input_tensors

    with Client(sock, timeout=30) as c:
        meta = c.model_metadata(model)
    return input_tensors(meta, shapes, seed=seed)


def poisson_times(rate_rps: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Send times (s from the start, sorted) of Poisson arrivals at ``rate_rps`` over
    ``duration_s``, for ``LoadGenerator.replay``; one seed gives the same gaps at every
    rate (common random numbers: a higher rate is the same pattern compressed in time).

    Raises:
        ValueError: a non-positive rate or duration.
    """
    if not (rate_rps > 0 and duration_s > 0):
        raise ValueError(f"need a positive rate and duration, got {rate_rps}, {duration_s}")
    gaps = np.random.default_rng(seed).exponential(1.0, int(rate_rps * duration_s * 1.5) + 20)
    t = np.cumsum(gaps) / rate_rps
    return t[t < duration_s]


def replay_summary(rows: Sequence[Mapping[str, Any]], bound_ms: float, span_s: float) -> dict:
    """Figures of ``LoadGenerator.replay`` rows (one span of them): requests, answered,
    refused, errors, goodput (answers within ``bound_ms`` per s of ``span_s``), P50 / P99
    of the answers and :func:`p99_with_failures`, ms."""
    ok = [r["ms"] for r in rows if r["outcome"] == "ok"]
    p99_all = p99_with_failures(ok, len(rows) - len(ok))
    return {
        "requests": len(rows),
        "answered": len(ok),
        "refused": sum(r["outcome"] == "refused" for r in rows),
        "errors": sum(r["outcome"] == "error" for r in rows),
        "goodput_rps": round(sum(x <= bound_ms for x in ok) / max(span_s, 1e-9), 3),
        "p50_ms": round(float(np.percentile(ok, 50)), 2) if ok else None,
        "p99_ms": round(float(np.percentile(ok, 99)), 2) if ok else None,
        "p99_all_ms": None if math.isinf(p99_all) else round(p99_all, 2),
    }
