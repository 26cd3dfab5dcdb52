"""The max-rate-at-SLO search: the largest offered rate a configuration serves within
its latency bound, by bisection (MLPerf LoadGen's server scenario finds its target QPS
the same way: raise while the P99 bound holds, lower when it does not).

Pure: the caller's ``measure(rate)`` deploys, loads and judges (typically
:func:`harness.scenarios.run` at the server scenario, and its ``passed``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def max_rate_at_slo(
    measure: Callable[[float], dict[str, Any]],
    high_rps: float,
    steps: int,
    low_rps: float = 0.0,
    first_rps: float | None = None,
) -> dict[str, Any]:
    """Bisect the rate in (``low_rps``, ``high_rps``) over ``steps`` measurements.

    Each step measures ``r`` (the first ``first_rps``, default the midpoint; then the
    midpoint of the interval left): ``measure(r)`` returns a point dict whose ``passed``
    says whether the bound held; a pass raises ``low`` to ``r``, a fail lowers ``high``
    to ``r``. Assumes a pass at ``r`` means a pass below it (throughput at SLO is not
    always monotone: bench/HISTORY.md, scaling.py at 1.5 x L0); the points are kept so a
    reader can see where it was not.

    Returns:
        ``{"max_rps": the highest passing rate (0.0 if none), "bracket": [low, high],
        "points": [the step's point + "step", "rate_rps"]}``.

    Raises:
        ValueError: ``steps`` < 1, or not ``0 <= low_rps < high_rps``, or a
            ``first_rps`` outside that interval.
    """
    if steps < 1:
        raise ValueError(f"max_rate_at_slo needs at least 1 step, got {steps}")
    if not 0.0 <= low_rps < high_rps:
        raise ValueError(f"need 0 <= low_rps < high_rps, got {low_rps}, {high_rps}")
    if first_rps is not None and not low_rps < first_rps < high_rps:
        raise ValueError(f"first_rps {first_rps} is not inside ({low_rps}, {high_rps})")
    lo, hi, best = low_rps, high_rps, 0.0
    points = []
    for i in range(steps):
        rate = first_rps if i == 0 and first_rps is not None else (lo + hi) / 2.0
        point = measure(rate)
        if "passed" not in point:
            raise ValueError("measure(rate) must return a point with 'passed'")
        points.append({"step": i + 1, "rate_rps": round(rate, 4), **point})
        if point["passed"]:
            lo = rate
            best = max(best, rate)
        else:
            hi = rate
    return {"max_rps": round(best, 4), "bracket": [round(lo, 4), round(hi, 4)], "points": points}
