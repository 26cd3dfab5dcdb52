"""The most any configuration can serve at a P99 SLO: the M/D/c queueing bound.

Writes ``results/slo_bound.json`` and ``.png`` (``_quick``: 20,000 arrivals, 1 seed).

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``slo_bound.py``.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


def p99_response(gaps: np.ndarray, servers: int, rho: float, warm: int) -> float:
    """P99 of the response time in units of D for inter-arrival ``gaps`` (mean 1, in
    units of the mean gap) scaled to load ``rho`` on ``servers`` servers of service 1."""
    mean_gap = 1.0 / (rho * servers)  # in units of D
    free = [0.0] * servers
    t = 0.0
    resp = np.empty(len(gaps))
    for i, g in enumerate(gaps):
        t += g * mean_gap
        start = max(t, free[0])
        heapq.heapreplace(free, start + 1.0)
        resp[i] = start + 1.0 - t
    return float(np.percentile(resp[warm:], 99))


def max_load(gaps: np.ndarray, servers: int, k: float, warm: int) -> float:
    """The largest rho in (0, 1) with P99 response <= k (bisection to 1e-4)."""
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        if p99_response(gaps, servers, mid, warm) <= k:
            lo = mid
        else:
            hi = mid
    return lo


@functools.lru_cache(maxsize=256)
def _max_load_cached(servers: int, k: float, n: int, seed: int) -> float:
    gaps = np.random.default_rng(seed).exponential(1.0, n)
    return max_load(gaps, servers, k, n // 10)


def mdc_max_rate(
    servers: int, service_ms: float, slo_ms: float, n: int = 100_000, seed: int = 0
) -> float:
    """The M/D/c ceiling in requests/s: the largest Poisson arrival rate at which ``servers``
    FIFO servers of deterministic service time ``service_ms`` keep the P99 response time
    (wait + service) <= ``slo_ms``: ``max_load(k = slo / D) x servers / D``.

    Args:
        servers: c >= 1 (instances of the unit).
        service_ms: D > 0, ms per request.
        slo_ms: the P99 bound, ms; below D nothing can meet it (0.0 returned).
        n: simulated arrivals (10 % discarded); seed: of the exponential draws.

    Raises:
        ValueError: servers < 1 or service_ms <= 0.

    Source: the same simulation as :func:`max_load` (this module's docstring); the factor
    k is rounded to 3 decimals so repeated cells share one bisection (lru_cache).
    """
    if servers < 1 or not service_ms > 0:
        raise ValueError(f"need servers >= 1 and service_ms > 0, got {servers}, {service_ms}")
    k = round(slo_ms / service_ms, 3)
    if k < 1.0:
        return 0.0
    rho = _max_load_cached(int(servers), k, int(n), int(seed))
    return rho * servers * 1000.0 / service_ms


def chain_ceiling_rps(
    stages: list[tuple[int, float]], slo_ms: float, n: int = 100_000, seed: int = 0
) -> dict:
    """The M/D/c ceiling of a chain of units: each stage ``(servers, service_ms)`` (the
    service time per request: per item x items per request) is an M/D/c queue; a request's
    response is at least its own queue's response plus every other stage's service time,
    so a stage must keep its P99 response <= SLO - sum of the others' D. The chain's
    ceiling is the smallest of those per-stage ceilings (an upper bound: the other stages'
    waits are taken as 0, and a fan-out's items as one job).

    Returns:
        ``{"ceiling_rps", "bottleneck_stage" (index), "per_stage": [{servers, service_ms,
        budget_ms, max_rps}]}``; ceiling 0.0 when the service times alone exceed the SLO.

    Raises:
        ValueError: no stage, or a stage with servers < 1 / service_ms <= 0.
    """
    if not stages:
        raise ValueError("chain_ceiling_rps needs at least one stage")
    total = sum(d for _, d in stages)
    per = []
    for c, d in stages:
        budget = slo_ms - (total - d)
        per.append(
            {
                "servers": int(c),
                "service_ms": round(float(d), 3),
                "budget_ms": round(float(budget), 3),
                "max_rps": round(mdc_max_rate(c, d, budget, n, seed), 3),
            }
        )
    b = int(np.argmin([p["max_rps"] for p in per]))
    return {"ceiling_rps": per[b]["max_rps"], "bottleneck_stage": b, "per_stage": per}


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=0.0)
    ap.add_argument("--servers", default="1,2,4,8", help="c values (comma list)")
    ap.add_argument("--slos", default="1.5,2,3", help="SLO factors k (P99 <= k x D)")
    ap.add_argument("--n", type=int, default=400_000, help="arrivals per run")
    ap.add_argument("--seeds", type=int, default=3)

    def quick(a: argparse.Namespace) -> None:
        a.n, a.seeds = 20_000, 1

    a = harness.cli.parse(ap, argv, quick)
    res = harness.cli.start("slo_bound", a)
    res.summary["what"] = "M/D/c FIFO, Poisson arrivals: largest rho with P99 response <= k x D"
    for c in (int(s) for s in a.servers.split(",")):
        for k in (float(s) for s in a.slos.split(",")):
            loads = [
                max_load(np.random.default_rng(seed).exponential(1.0, a.n), c, k, a.n // 10)
                for seed in range(a.seeds)
            ]
            res.add(servers=c, slo_factor=k, max_load=round(float(np.median(loads)), 4),
                    spread=round(float(max(loads) - min(loads)), 4),
                    per_seed=[round(x, 4) for x in loads])  # fmt: skip
    harness.cli.finish(res, a, plot)
    cols = ["servers", "slo_factor", "max_load", "spread"]
    harness.print_table(cols, [[p[k] for k in cols] for p in res.points])
    return 0


def plot(data: dict, path: Path) -> None:
    """The largest load against the SLO factor, one line per server count."""
    harness.plot(data["points"], path, x="slo_factor", y="max_load", by="servers",
                 xlabel="SLO factor k (P99 <= k x D)", ylabel="max load rho")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
