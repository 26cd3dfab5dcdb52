"""A configuration's score, simulated (:func:`~infscaler.runtime.planning.simulator.simulate`
with CPU contention and the front end's CPU as a unit): with a rate, the goodput
(requests/s answered within the SLO); without, the largest rate whose simulated P99 <= SLO
(bisection below the analytic capacity). :func:`scaled_units` gives the units at the
ends of the measured uncertainty for the goodput interval; :func:`arrivals_for` the
sample arrival trace. Design: docs/planner.md. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from infscaler.runtime.planning import arrivals as _arrivals
from infscaler.runtime.planning.resources import capacity_rps
from infscaler.runtime.planning.simulator import SimResult, UnitConfig, UnitProfile, simulate

__all__ = [
    "ArrivalsArg",
    "Score",
    "Scorer",
    "SearchSettings",
    "arrivals_for",
    "fmt_num",
    "scaled_units",
]

ArrivalsArg = str | np.ndarray | Sequence[float] | Callable[[float, float, int], np.ndarray]

#: ``(goodput requests/s, the max rate within the SLO or None with a rate, the
#: simulation at that rate or None)``.
Score = tuple[float, float | None, SimResult | None]


def arrivals_for(
    arrivals: ArrivalsArg, rate: float, duration_s: float, seed: int = 0
) -> tuple[np.ndarray, str]:
    """``(times, label)`` for a spec (``poisson``, ``gamma:4``, ``azure``, ...; see
    :func:`infscaler.runtime.planning.arrivals.from_spec`), a callable ``f(rate, duration_s, seed)``,
    or explicit times."""
    if isinstance(arrivals, str):
        return _arrivals.from_spec(arrivals, rate, duration_s, seed), arrivals
    if callable(arrivals):
        return np.asarray(arrivals(rate, duration_s, seed), dtype=float), getattr(
            arrivals, "__name__", "custom"
        )
    a = np.asarray(arrivals, dtype=float)
    return a, f"trace ({a.size} requests)"


def fmt_num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


@dataclass(frozen=True)
class SearchSettings:
    """What :func:`~infscaler.runtime.planning.planner.search` was asked, checked: its
    arguments, ``cores`` (physical cores shared; 0: no contention) and ``incumbent`` (the
    identity planned before, as JSON; None: none)."""

    slo_ms: float
    rate: float | None
    arrivals: str
    requests: int
    seed: int
    handover_ms: float
    frontend_ms: float
    cores: int
    final_requests: int
    finalist_within: float
    finalists_max: int
    goodput_tie: float
    incumbent: str | None


@dataclass
class Scorer:
    """Scores configurations as the search does, counting its ``simulations`` and caching each
    score by (units, instances and batch, requests); ``settings``: the search's."""

    settings: SearchSettings
    simulations: int = 0
    _cache: dict[tuple[Any, ...], Score] = field(default_factory=dict, repr=False)
    # the units the cache keys by id, held while the cache holds their id
    _held: list[Sequence[UnitProfile]] = field(default_factory=list, repr=False)

    def simulate_at(
        self, units: list[UnitProfile], cfg: list[UnitConfig], r: float, n: int
    ) -> SimResult:
        """One simulation of ``n`` requests arriving at ``r`` requests/s."""
        s = self.settings
        self.simulations += 1
        times, _ = arrivals_for(s.arrivals, r, n / r, s.seed)
        return simulate(
            units,
            cfg,
            times,
            slo_ms=s.slo_ms,
            handover_ms=s.handover_ms,
            seed=s.seed,
            max_inflight="auto",
            cpu_cores=s.cores or None,
        )

    def score(
        self,
        units: Sequence[UnitProfile],
        cfg: Sequence[UnitConfig],
        n: int | None = None,
        guess: float | None = None,
    ) -> Score:
        """The score of ``cfg`` on a trace of ``n`` requests (None: the settings' ``requests``);
        ``guess``: where the max rate is expected, probed first, then stepped from until
        bracketed and bisected."""
        rate = self.settings.rate
        n = self.settings.requests if n is None else n
        key = (id(units), tuple((tuple(sorted(c.instances.items())), c.batch) for c in cfg), n)
        if key in self._cache:
            return self._cache[key]
        self._held.append(units)
        units_l, cfg_l = list(units), list(cfg)
        if rate is not None:
            res = self.simulate_at(units_l, cfg_l, rate, n)
            good = rate * (res.slo_attainment or 0.0)
            out: Score = (good, None, res)
        else:
            out = self._max_rate(units_l, cfg_l, n, guess)
        self._cache[key] = out
        return out

    def _max_rate(
        self, units: list[UnitProfile], cfg: list[UnitConfig], n: int, guess: float | None
    ) -> Score:
        """The largest rate whose simulated P99 meets the SLO, nothing refused: at most
        10 simulations, below the analytic capacity, to 2 % (see :meth:`score`)."""
        slo_ms = self.settings.slo_ms
        top = hi = capacity_rps(units, cfg, self.settings.cores)
        lo, best_res = 0.0, None
        step = 0.03
        for i in range(10):
            if guess is None or not 0 < guess < top:
                mid = hi * 0.95 if i == 0 else (lo + hi) / 2
            elif i == 0:
                mid = guess
            elif hi >= top:  # none failed yet: step up
                mid, step = min(lo * (1 + step), (lo + hi) / 2), step * 2
            elif lo <= 0:  # none passed yet: step down
                mid, step = hi * (1 - min(step, 0.5)), step * 2
            else:
                mid = (lo + hi) / 2
            res = self.simulate_at(units, cfg, mid, n)
            if res.p99_ms is not None and res.p99_ms <= slo_ms and res.rejected == 0:
                lo, best_res = mid, res
            else:
                hi = mid
            if lo and hi - lo < 0.02 * hi:
                break
        good = lo * (best_res.slo_attainment or 0.0) if best_res else 0.0
        return (good, lo, best_res)


def scaled_units(
    units: Sequence[UnitProfile], errs: Sequence[float], sign: float
) -> list[UnitProfile]:
    """``units`` with every engine's service times x (1 + ``sign`` x the unit's relative err)
    (``sign`` 1: pessimistic end, -1: optimistic); a unit with err 0 as it is."""
    out = []
    for u, err in zip(units, errs, strict=True):
        f = 1.0 + sign * float(err)
        if err <= 0 or f <= 0:
            out.append(u)
            continue
        engines = {
            e: replace(
                p,
                mean_ms=p.mean_ms * f,
                samples_ms=tuple(x * f for x in p.samples_ms),
                batch_ms={b: v * f for b, v in p.batch_ms.items()},
            )
            for e, p in u.engines.items()
        }
        out.append(replace(u, engines=engines))
    return out
